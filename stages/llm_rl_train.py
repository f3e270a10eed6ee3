"""Stage llm_rl_train@<variant>-<seed>: RL on the math train split, variant reinforce_kl (ours) or grpo (TRL),
one training seed of llm_rl.train.seeds (``python -m stages.llm_rl_train <variant> [<seed>]``; without a seed, the
first of them).

The seed is the run's one seed (``ReinforceTrainParams.for_seed``): Python, NumPy and torch, the order problems
are drawn in and every sampled answer. Writes models/llm_rl/<variant>/seed-<seed>/ (the LoRA adapter or the whole
model, every sampled episode or completion in rollouts.jsonl, the rendered prompt of the first problem),
metrics/llm_rl/train/<variant>/seed-<seed>.json and dvclive curves under plots/llm_rl/train/<variant>/seed-<seed>/.

Several devices: ``accelerate launch --multi_gpu --num_processes N -m stages.llm_rl_train <variant> [<seed>]``
trains with DDP (``stages.launch``). REINFORCE-KL (``ReinforceKL``'s accelerator): every process collects the same
episodes and trains on its share of each micro-batch; the result equals one process at the same
``common.micro_batch``, tested with 2 CPU processes. GRPO (TRL's own DDP): each process samples and scores its 1/N of
every micro-batch (``llmrl.algos.grpo``), so the budget equals one process's, the samples do not; the main process
gathers every process's completions. The main process writes the outputs; such a run keeps no restart point.
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch

from llmrl.agents.math_solver import build_messages, write_policy
from llmrl.algos import llm_rl_grpo, reinforce_kl
from llmrl.checkpoint import project_sources, run_identity
from llmrl.config.llm_rl import ReinforceTrainParams
from llmrl.envs.word_problems.datasets import read_jsonl
from llmrl.eval.llm_rl import training_summary
from llmrl.files import atomic_path, write_json, write_text
from llmrl.llm.load import load_model
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, model_spec, open_live, stage_params
from stages.launch import launched
from stages.paths import RESUME, ROOT

VARIANTS = ("reinforce_kl", "grpo")
DATA = paths.llm_rl_data().data
# What each iteration (REINFORCE-KL) or optimiser step (GRPO) logs as a dvclive curve, where its row has it.
CURVES = {"reinforce_kl": ("average_reward", "answer_rate", "loss", "policy_loss", "divergence", "grad_norm", "lr",
                           "mean_lines"),
          "grpo": ("average_reward", "loss", "grad_norm", "lr")}


def log_row(variant: str, row: dict) -> None:
    if variant == "reinforce_kl":
        log.info("iteration %d: reward %.3f, answered %.2f, loss %.4f, KL %.4f (collect %.0fs, update %.0fs)",
                 row["iteration"], row["average_reward"], row["answer_rate"], row["loss"], row["divergence"],
                 row["collect_s"], row["update_s"])
    else:
        log.info("step %d: reward %s, loss %.4f", row["step"], row.get("average_reward"), row["loss"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.llm_rl_train")
    parser.add_argument("variant", nargs="?", default="reinforce_kl", choices=VARIANTS)
    parser.add_argument("seed", nargs="?", help="one of llm_rl.train.seeds (default: the first)")
    args = parser.parse_args(argv)
    variant = args.variant
    section = stage_params("llm_rl.train", ReinforceTrainParams)
    seed_arg = args.seed if args.seed is not None else str(section.seeds[0])
    if not seed_arg.isdigit():
        raise SystemExit(f"llm_rl_train: seed {seed_arg!r} is not one of llm_rl.train.seeds {section.seeds}")
    try:
        p = section.for_seed(int(seed_arg))
    except ValueError as err:
        raise SystemExit(f"llm_rl_train: {err}") from None
    c = p.common
    seed_everything(c.seed)
    torch.set_num_threads(c.threads)
    train = read_jsonl(DATA / "train.jsonl")
    if len(train) <= c.few_shot:
        raise SystemExit(f"llm_rl.train.common.few_shot={c.few_shot} leaves no train problems")
    shots, problems = train[: c.few_shot], train[c.few_shot:]
    spec = model_spec(c.model)
    # REINFORCE-KL shares each micro-batch through its own Accelerator; TRL's GRPO trainer starts its own.
    launch = launched(c.device, own_loop=variant == "reinforce_kl")
    # GRPO: TRL attaches the adapter itself (peft_config), so the model is handed over plain.
    llm = load_model(spec, device=launch.device, dtype=c.dtype, lora=c.lora if variant == "reinforce_kl" else None,
                     trainable=c.lora is None)
    if not launch.is_main:  # a worker process of a multi-process run: it shares the updates, the main one records
        if variant == "reinforce_kl":
            for _ in reinforce_kl.train(llm, problems, p, shots=shots, accelerator=launch.accelerator):
                pass
        else:
            with tempfile.TemporaryDirectory() as workdir:
                for _ in llm_rl_grpo.train(llm, problems, p, shots=shots, output_dir=workdir):
                    pass
        return
    outputs = paths.llm_rl_train(variant, c.seed)
    out = outputs.model
    # Resume point (reinforce_kl): scratch, not a DVC out; resumed only by the same run (params, base model and
    # data contents, the source of every project module loaded), removed once the outputs are written.
    checkpoint = RESUME / "llm_rl_train" / variant / f"seed-{c.seed}" / "checkpoint.pt"
    # the seeds list itself is left out: adding a seed keeps another seed's restart point valid
    identity = run_identity({"variant": variant, "params": p.model_dump(mode="json", exclude={"seeds"})},
                            inputs={"base_model": spec, "train": DATA / "train.jsonl"}
                            if Path(spec).is_dir() else {"train": DATA / "train.jsonl"},
                            code=project_sources(ROOT))
    t0 = time.perf_counter()
    history: list[dict] = []
    samples: list[dict] = []  # every sampled episode (REINFORCE-KL) or completion (GRPO)
    with open_live(outputs.live) as live, atomic_path(out, is_dir=True) as tmp:
        rows = (reinforce_kl.train(llm, problems, p, shots=shots, record=samples, accelerator=launch.accelerator,
                                   checkpoint=checkpoint if launch.processes == 1 else None, identity=identity)
                if variant == "reinforce_kl" else
                llm_rl_grpo.train(llm, problems, p, shots=shots, output_dir=tmp / "trl", record=samples))
        for row in rows:
            history.append(row)
            for k in CURVES[variant]:
                if k in row:
                    live.log_metric(f"train/{k}", row[k])
            live.next_step()
            log_row(variant, row)
        shutil.rmtree(tmp / "trl", ignore_errors=True)
        seconds = time.perf_counter() - t0
        write_policy(llm, tmp, base_model=c.model)
        write_text(tmp / "rollouts.jsonl", "".join(json.dumps(r) + "\n" for r in samples))
        write_text(tmp / "prompt_example.txt", llm.render(build_messages(problems[0]["problem"], shots)))
    # Headline figures; the per-iteration history is the dvclive plot and the adapter folder's rollouts.
    summary = training_summary(history, samples, answer_tokens=c.answer_tokens, dtype=llm.dtype_name,
                               seconds=seconds)
    write_json(outputs.metrics, summary)
    checkpoint.unlink(missing_ok=True)  # the outputs are written: the restart point has served
    log.info("%s seed %d: %d samples in %.0f s, reward %.3f -> %.3f", variant, c.seed, len(samples), seconds,
             summary["reward_first"], summary["reward_last"])


if __name__ == "__main__":
    main()
