"""Stage llm_rl_train@<variant>: RL on the math train split, variant reinforce_kl (ours) or grpo (TRL).

Writes models/llm_rl/<variant>/ (the LoRA adapter or the whole model, every sampled episode or completion in
rollouts.jsonl, the rendered prompt of the first problem), metrics/llm_rl/train_<variant>.json and dvclive
curves under plots/llm_rl/train_<variant>/.

Several devices: ``accelerate launch --multi_gpu --num_processes N stages/llm_rl_train.py <variant>`` trains with
DDP. REINFORCE-KL (``ReinforceKL``'s accelerator): every process collects the same episodes and trains on its share
of each micro-batch; the result equals one process at the same ``common.micro_batch``, tested with 2 CPU
processes. GRPO (TRL's own DDP): each process samples and scores its 1/N of every micro-batch
(``llmrl.algos.grpo``), so the budget equals one process's, the samples do not; the main process gathers every
process's completions. The main process writes the outputs; such a run keeps no restart point.
"""

from common import ROOT, log, model_spec, open_live, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip
from paths import RESUME  # isort: skip

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from llmrl.agents.math_solver import build_messages, write_policy
from llmrl.checkpoint import project_sources, run_identity
from llmrl.config.llm_rl import ReinforceTrainParams
from llmrl.envs.word_problems.datasets import read_jsonl
from llmrl.files import atomic_path, write_json, write_text
from llmrl.llm import load_model
from llmrl.seeding import seed_everything

VARIANTS = ("reinforce_kl", "grpo")
DATA = paths.llm_rl_data().data


def train_reinforce_kl(p: ReinforceTrainParams, llm, problems, shots, live, checkpoint, identity, accelerator=None):
    from llmrl.algos.reinforce_kl import ReinforceKL

    algo = ReinforceKL(llm, p, problems, shots, accelerator=accelerator)
    history, rollouts = [], []
    for stats, episodes in algo.train(checkpoint=checkpoint, identity=identity):
        if live is None:  # a worker process of a multi-process run: the main process records
            continue
        history.append(stats)
        rollouts += [{"iteration": stats["iteration"], **ep.as_record()} for ep in episodes]
        for k in ("average_reward", "answer_rate", "loss", "policy_loss", "divergence", "grad_norm", "lr", "mean_lines"):
            live.log_metric(f"train/{k}", stats[k])
        live.next_step()
        log.info("iteration %d: reward %.3f, answered %.2f, loss %.4f, KL %.4f (collect %.0fs, update %.0fs)",
                 stats["iteration"], stats["average_reward"], stats["answer_rate"], stats["loss"],
                 stats["divergence"], stats["collect_s"], stats["update_s"])
    return llm, history, rollouts


def train_grpo(p: ReinforceTrainParams, llm, problems, shots, live, workdir):
    """TRL's GRPO; ``live`` None in a worker process of a multi-process run (the main process records)."""
    from llmrl.algos.grpo import gather_records, train
    from llmrl.algos.llm_rl_grpo import build_trainer, trainer_params

    rollouts: list[dict] = []
    cfg = trainer_params(p.common, p.grpo, bf16=llm.dtype == torch.bfloat16)
    run = build_trainer(llm, problems, shots, cfg, output_dir=workdir, record=rollouts)
    history = []
    for row in train(run):
        # one row per optimiser step; rewards only on the steps that start a generation round
        stats = {"step": row["step"] - 1, "loss": row["loss"], "grad_norm": row["grad_norm"], "lr": row["lr"],
                 "step_time": row.get("step_time")}
        if "reward_mean" in row:
            stats.update(average_reward=row["reward_mean"], mean_length=row.get("completion_length"))
        history.append(stats)
        if live is None:
            continue
        for k in ("average_reward", "loss", "grad_norm", "lr"):
            if k in stats:
                live.log_metric(f"train/{k}", stats[k])
        live.next_step()
        log.info("step %d: reward %s, loss %.4f", stats["step"], stats.get("average_reward"), stats["loss"])
    llm.model = run.trainer.model
    return llm, history, gather_records(rollouts)


def main() -> None:
    variant = sys.argv[1] if len(sys.argv) > 1 else "reinforce_kl"
    if variant not in VARIANTS:
        raise SystemExit(f"llm_rl_train: unknown variant {variant!r}; known: {VARIANTS}")
    p = stage_params("llm_rl.train", ReinforceTrainParams)
    c = p.common
    seed_everything(c.seed)
    torch.set_num_threads(c.threads)
    train = read_jsonl(DATA / "train.jsonl")
    if len(train) <= c.few_shot:
        raise SystemExit(f"llm_rl.train.common.few_shot={c.few_shot} leaves no train problems")
    shots, problems = train[: c.few_shot], train[c.few_shot:]
    lora = c.lora
    spec = model_spec(c.model)
    accelerator, device, main_process = None, c.device, True
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # started by `accelerate launch --num_processes N`
        # accelerate's state for processes on CPU needs cpu=True: without it and without CUDA every process runs
        # alone (DistributedType.NO) as if it were the only one
        cpu = c.device == "cpu" if c.device is not None else not torch.cuda.is_available()
        if variant == "reinforce_kl":
            from accelerate import Accelerator

            accelerator = Accelerator(cpu=cpu)
            state = accelerator.state
        else:  # TRL's trainer starts its own Accelerator over the processes
            from accelerate import PartialState

            state = PartialState(cpu=cpu)
        device, main_process = str(state.device), state.is_main_process
    # GRPO: TRL attaches the adapter itself (peft_config), so the model is handed over plain.
    llm = load_model(spec, device=device, dtype=c.dtype, lora=lora if variant == "reinforce_kl" else None,
                     trainable=lora is None)
    if not main_process:
        if variant == "reinforce_kl":
            train_reinforce_kl(p, llm, problems, shots, None, None, None, accelerator)
        else:
            with tempfile.TemporaryDirectory() as workdir:
                train_grpo(p, llm, problems, shots, None, Path(workdir))
        return
    outputs = paths.llm_rl_train(variant)
    out = outputs.model
    # Resume point (reinforce_kl): scratch, not a DVC out; resumed only by the same run (params, base model and
    # data contents, the source of every project module loaded), removed once the outputs are written.
    checkpoint = RESUME / "llm_rl_train" / variant / "checkpoint.pt"
    if variant == "reinforce_kl":
        import llmrl.algos.reinforce_kl  # noqa: F401  (loaded before project_sources: its code is in the identity)
    identity = run_identity({"variant": variant, "params": p.model_dump(mode="json")},
                            inputs={"base_model": spec, "train": DATA / "train.jsonl"}
                            if Path(spec).is_dir() else {"train": DATA / "train.jsonl"},
                            code=project_sources(ROOT))
    t0 = time.perf_counter()
    with open_live(outputs.live) as live, atomic_path(out, is_dir=True) as tmp:
        if variant == "reinforce_kl":
            llm, history, rollouts = train_reinforce_kl(p, llm, problems, shots, live,
                                                        checkpoint if accelerator is None else None, identity,
                                                        accelerator)
        else:
            llm, history, rollouts = train_grpo(p, llm, problems, shots, live, tmp / "trl")
            shutil.rmtree(tmp / "trl", ignore_errors=True)
        seconds = time.perf_counter() - t0
        write_policy(llm, tmp, base_model=c.model)
        write_text(tmp / "rollouts.jsonl", "".join(json.dumps(r) + "\n" for r in rollouts))
        write_text(tmp / "prompt_example.txt", llm.render(build_messages(problems[0]["problem"], shots)))
    rewards = [h["average_reward"] for h in history if "average_reward" in h]
    steps = sum(h["optimizer_steps"] for h in history) if variant == "reinforce_kl" else len(history)
    tokens = [r["tokens"] for r in rollouts if r.get("tokens") is not None]
    # Headline figures; the per-iteration history is the dvclive plot and the adapter folder's rollouts. The
    # budget fields let a reader check the two variants were compared on equal terms.
    write_json(outputs.metrics, {
        "samples": len(rollouts), "optimizer_steps": steps, "answer_tokens": c.answer_tokens,
        "tokens": round(float(np.mean(tokens)), 1) if tokens else None,  # generated per sample
        "reward_first": round(rewards[0], 4), "reward_last": round(rewards[-1], 4), "dtype": llm.dtype_name,
        "seconds": round(seconds, 1)})
    checkpoint.unlink(missing_ok=True)  # the outputs are written: the restart point has served
    log.info("%s: %d samples in %.0f s, reward %.3f -> %.3f", variant, len(rollouts), seconds, rewards[0],
             rewards[-1])


if __name__ == "__main__":
    main()
