"""What the transfer's stages share (props_transfer, props_repeat_control): one item of their task x seed matrix,
read from the command line and checked against props.transfer."""

from llmrl.config.props import PropsTransferParams
from stages.common import stage_arguments, stage_params


def transfer_item(stage: str, argv: list[str] | None) -> tuple[str, int, int, PropsTransferParams]:
    """The task, the seed, the seed's position in props.transfer.seeds and props.transfer of a stage item of the
    transfer's matrix (props_transfer, props_repeat_control); a task or seed outside it exits naming the field."""
    args = stage_arguments(stage, argv, task="control task key (props.transfer.tasks)",
                           seed="search seed (props.transfer.seeds)")
    tr = stage_params("props.transfer", PropsTransferParams)
    if args.task not in tr.tasks:
        raise SystemExit(f"{stage}: task {args.task!r} is not among props.transfer.tasks {tr.tasks}")
    if args.seed not in [str(s) for s in tr.seeds]:
        raise SystemExit(f"{stage}: seed {args.seed!r} is not among props.transfer.seeds {tr.seeds}")
    i = [str(s) for s in tr.seeds].index(args.seed)
    return args.task, tr.seeds[i], i, tr
