"""REINFORCE-KL's validation curve beyond the CPU default: does more training move accuracy?

Trains REINFORCE-KL (``llmrl.algos.reinforce_kl.ReinforceKL``) with params.yaml's ``llm_rl.train`` settings, for
more iterations than the pipeline's default, on several training seeds, and measures greedy accuracy every
``--every`` iterations on a validation slice: the last ``--val`` problems of the train split, which this run
never trains on (nor uses as few-shot examples). The test split is never read, so no figure here selects
anything the pipeline reports on it.

Greedy decoding of the base model is one fixed answer sheet, so the gain at an iteration is paired per problem
(trained minus base) and its interval is over training seeds (``llmrl.eval.seeds.aggregate_seeds``).

Kernels are not pinned: ``--dtype auto`` gives bf16 where the CPU runs it natively (the recorded ``dtype``),
about twice the fp32 training speed; ``--pin`` reproduces the stages' fp32 path.

Needs ``data/llm_rl/train.jsonl`` (``dvc repro llm_rl_data``) and ``models/base_llm`` (or ``--model``).
Writes bench/results/llm_rl_curve.json (a record of this measurement, not a DVC metric).

Usage: python scripts/llm_rl_curve.py [--iterations 24] [--every 6] [--seeds 0 1] [--val 100] [--workers 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmrl.kernels import pin_cpu_kernels  # noqa: E402

if "--pin" in sys.argv:
    pin_cpu_kernels()  # the stages' float path (stages/common.py), before torch's first kernel

import numpy as np  # noqa: E402
import torch  # noqa: E402

from llmrl.agents.math_solver import solve  # noqa: E402
from llmrl.algos.reinforce_kl import ReinforceKL  # noqa: E402
from llmrl.config import load_section, read_params  # noqa: E402
from llmrl.config.llm_rl import ReinforceTrainParams  # noqa: E402
from llmrl.envs.word_problems.datasets import read_jsonl  # noqa: E402
from llmrl.eval.seeds import aggregate_seeds  # noqa: E402
from llmrl.files import write_json  # noqa: E402
from llmrl.llm.generate import SamplingConfig
from llmrl.llm.load import load_model
from llmrl.process import keep_caches_under  # noqa: E402
from llmrl.seeding import seed_everything  # noqa: E402

OUT = ROOT / "bench" / "results" / "llm_rl_curve.json"


def greedy_correct(llm, problems, shots, cap: int) -> list[float]:
    records = solve(llm, problems, shots, SamplingConfig(max_new_tokens=cap, temperature=0.0, seed=0),
                    batch_size=25, progress=False)
    return [float(r["correct"]) for r in records]


def interval(per_seed: list[list[float]], rate: bool) -> dict:
    a = aggregate_seeds(per_seed, rate=rate)
    return {"value": round(a.value, 4), "lo": round(a.ci_low, 4), "hi": round(a.ci_high, 4), "seeds": a.n_seeds}


def run_seed(seed: int, args: argparse.Namespace, section: dict, shots, problems, val, cap: int,
             checkpoints: list[int]) -> dict:
    """One training seed: REINFORCE-KL for ``args.iterations``, greedy validation accuracy at the checkpoints."""
    keep_caches_under(ROOT / ".cache")
    torch.set_num_threads(args.threads)
    cfg = load_section({"llm_rl": {"train": {**section, "seeds": args.seeds, "common": {
        **section["common"], "iterations": args.iterations, "dtype": args.dtype,
        "threads": args.threads}}}}, "llm_rl.train", ReinforceTrainParams).for_seed(seed)
    seed_everything(seed)
    llm = load_model(args.model, dtype=cfg.common.dtype, lora=cfg.common.lora)
    algo = ReinforceKL(llm, cfg, problems, shots)
    curve, rewards, t0 = [], [], time.perf_counter()
    for it in range(args.iterations + 1):
        if it in checkpoints:
            llm.model.eval()
            with torch.no_grad():
                correct = greedy_correct(llm, val, shots, cap)
            llm.model.train()
            curve.append({"iteration": it, "samples": it * cfg.common.problems_per_iteration
                          * cfg.common.group_size, "correct": correct,
                          "accuracy": round(float(np.mean(correct)), 4),
                          "seconds": round(time.perf_counter() - t0, 1)})
            print(f"seed {seed} iteration {it}: validation accuracy {curve[-1]['accuracy']:.3f} "
                  f"({curve[-1]['seconds']:.0f} s)", flush=True)
        if it < args.iterations:
            stats, _ = algo.step()
            rewards.append(round(stats["average_reward"], 4))
            print(f"seed {seed}   iteration {it}: reward {stats['average_reward']:.3f}, "
                  f"KL {stats['divergence']:.4f}", flush=True)
    return {"seed": seed, "dtype": llm.dtype_name, "train_reward": rewards, "curve": curve}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iterations", type=int, default=24)
    ap.add_argument("--every", type=int, default=6, help="validate every N iterations")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--val", type=int, default=100, help="validation problems: the last N of the train split")
    ap.add_argument("--model", default=str(ROOT / "models" / "base_llm"))
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per seed")
    ap.add_argument("--workers", type=int, default=1, help="seeds run side by side in processes")
    ap.add_argument("--pin", action="store_true", help="pin the kernels to AVX2 as the stages do (fp32)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.iterations < 1 or args.every < 1 or args.val < 1:
        raise SystemExit("--iterations, --every and --val must be >= 1")
    keep_caches_under(ROOT / ".cache")
    torch.set_num_threads(args.threads)
    section = read_params(ROOT / "params.yaml")["llm_rl"]["train"]
    train = read_jsonl(ROOT / "data" / "llm_rl" / "train.jsonl")
    few = section["common"]["few_shot"]
    if len(train) < few + args.val + section["common"]["problems_per_iteration"]:
        raise SystemExit(f"--val {args.val}: the train split has only {len(train)} problems")
    shots, problems, val = train[:few], train[few:-args.val], train[-args.val:]
    cap = section["common"]["answer_tokens"]
    checkpoints = sorted({0, *range(args.every, args.iterations + 1, args.every), args.iterations})
    jobs = [(seed, args, section, shots, problems, val, cap, checkpoints) for seed in args.seeds]
    if args.workers > 1:  # one process per seed (each with --threads): the seeds are independent runs
        with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            runs = list(pool.map(run_seed, *zip(*jobs)))
    else:
        runs = [run_seed(*job) for job in jobs]
    base = runs[0]["curve"][0]["correct"]  # greedy base answers do not depend on the training seed
    table = []
    for k, it in enumerate(checkpoints):
        acc = [r["curve"][k]["correct"] for r in runs]
        gain = [list(np.subtract(a, base)) for a in acc]
        table.append({"iteration": it, "samples": runs[0]["curve"][k]["samples"],
                      "accuracy": interval(acc, rate=True), "gain_over_base": interval(gain, rate=False)})
    for r in runs:  # per problem, in validation order: "1" correct, "0" not (the pairing the gain needs)
        for point in r["curve"]:
            point["correct"] = "".join(str(int(c)) for c in point["correct"])
    write_json(args.out, {
        "what": "REINFORCE-KL greedy validation accuracy by iteration (llm_rl.train settings, more iterations)",
        "validation": f"the last {args.val} problems of data/llm_rl/train.jsonl (never trained on)",
        "settings": {k: v for k, v in vars(args).items() if k not in ("out",)} | {"model": args.model},
        "kernels": "AVX2 (pinned)" if args.pin else os.environ.get("ONEDNN_MAX_CPU_ISA", "the CPU's own"),
        "per_seed": runs, "table": table})
    for row in table:
        a, g = row["accuracy"], row["gain_over_base"]
        print(f"iteration {row['iteration']:>3} ({row['samples']} samples): accuracy {a['value']:.3f} "
              f"[{a['lo']:.3f}, {a['hi']:.3f}], gain {g['value']:+.3f} [{g['lo']:+.3f}, {g['hi']:+.3f}]")


if __name__ == "__main__":
    main()
