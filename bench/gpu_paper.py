"""Every method's paper profile on a lent GPU for a few minutes, through the switch `dvc exp run -S <method>=paper`
uses, run as the pipeline runs it: each stage's ``main``, on the stage items DVC resolves from the composed params.

    python bench/gpu_paper.py prepare                          # here: writes .gpu/ (params, stage items, tokenizer)
    python bench/gpu_paper.py run --seconds 480 --out DIR      # on the GPU machine, in a copy of this repository

Two steps because the device machine has no DVC, no hub and no network. ``prepare`` composes conf/ with
``<method>=paper`` for every method and ``ON_GPU`` on top, validates it with the stages' pydantic models, resolves
the stage items of ``STAGES`` through DVC, checks that every input they read from another stage is written by one of
them (or is the model folder ``run`` builds), and exports the embedded model's tokenizer. ``ON_GPU`` keeps what
decides a paper run's speed and memory (the fine-tuning mode, precision, batch shapes, reply and prompt lengths,
episode horizons, number of environments) and cuts what only multiplies time (iterations, seeds, tasks, samples,
episodes, updates), aiming at a few minutes of each method's stages on one H100.

``run`` stands a model of ``--shape`` (random weights of Qwen2.5-0.5B's shape with the embedded model's tokenizer,
``bench/gpu.py``'s ``SHAPES``) in for every hub model as ``models/base_llm``: the paper models cannot reach a device
machine, and the embedded GGUF is larger than what travels there. Its replies are noise, so every parse fails and
the fallbacks run: the figures are speeds and memory, never results. Per stage it records the seconds, the peak GPU
memory torch allocated, the stage's metrics files and any error (a failing stage ends its method; each method runs in
a process of its own), and writes ``DIR/gpu_paper_<method>.json`` after every stage, so a run cut short by its lease
keeps what finished.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / ".gpu"
METHODS = ("props", "kalm", "llm4teach", "llm_rl", "glam")  # in the order they run: never measured on a GPU first

# The stage items run per method (dvc.yaml's names; every item of a foreach stage). props_baselines and props_eval
# (random search, CEM and SB3 PPO on CPU, and the tables), GLAM's BC, symbolic and evaluation stages use no GPU.
STAGES = {
    "props": ("props_quadratic", "props_search", "props_grpo_part", "props_grpo", "props_heldout", "props_transfer"),
    "kalm": ("kalm_data", "kalm_ground", "kalm_imagine", "kalm_offline_real", "kalm_offline_imagine", "kalm_eval"),
    "llm4teach": ("llm4teach_plans", "llm4teach_train", "llm4teach_train_mpe", "llm4teach_eval"),
    "llm_rl": ("llm_rl_data", "llm_rl_train", "llm_rl_eval"),
    "glam": ("glam_train",),
}
MODEL = "models/base_llm"
GSM8K = ".gpu/gsm8k"  # local files in GSM8K's format standing in for the hub's GSM8K (written by prepare)

# Keys set on top of the paper profiles (Hydra overrides; lists replace the profile's, `~key` drops one).
ON_GPU: dict[str, dict] = {
    "props": {
        "llm": {"spec": MODEL},
        "search": {"tasks": ["mountaincar_continuous"], "seeds": [0], "iterations": 2, "max_reasks": 1,
                   "eval_episodes": 10, "video": False},
        "baselines": {"cem": {"population": 2}},  # divides the shorter search's episodes (props_baselines not run)
        "transfer": {"tasks": ["mountaincar_continuous"]},
        "quadratic": {"iterations": 3, "seeds": [0, 1], "cem": {"population": 3}},
        "grpo": {"model": MODEL, "vectors": 10, "episodes": 2, "seeds": [0],
                 "trainer": {"gradient_accumulation_steps": 2, "max_steps": 4}},
        "heldout": {"dims": [2], "functions_per_dim": 4, "validation_functions_per_dim": 2, "iterations": 6,
                    "base_reps": 1, "reps": 1, "hill_steps": [1.0], "cem": {"population": 3}},
    },
    "kalm": {
        "data": {"metaworld_episodes_per_task": 2, "babyai_episodes_per_task": 2, "validation_episodes_per_task": 1,
                 "agreement_test_episodes": 0, "embed_model": MODEL},
        # windows and horizons of 25 and 10 steps instead of 100 and 64: a grounding sample's length and a
        # rollout's forward passes grow with them
        "ground": {"model": MODEL, "trajectory_samples": 32, "dynamics_samples": 32, "goal_samples": 16,
                   "reverse_samples": 16, "reverse_states": 4, "window": 25, "epochs": 1.0, "log_every": 4},
        "imagine": {"levels": ["easy"], "rollouts": 16, "batch_size": 16, "metaworld_horizon": 10, "babyai_horizon": 10,
                    "consistency_candidates": 2, "examples": 2},
        "offline": {"seeds": [0], "imagined_levels": ["easy"], "log_every": 100},
        "eval": {"levels": ["easy"], "babyai_episodes": 5, "metaworld_episodes": 5, "random_seeds": 1,
                 "grounded_episodes": 2},
    },
    "llm4teach": {
        "teacher": {"spec": MODEL},
        "train": {"envs": ["simpledoorkey"], "teachers": ["llm", "none"], "seeds": [0],
                  "ppo": {"total_frames": 2048}, "distill": {"until_iteration": 2}, "curve_points": 2,
                  "curve_episodes": 5},
        "mpe": {"teachers": ["llm"], "seeds": [0], "ppo": {"total_frames": 1600}, "distill": {"until_iteration": 2}},
        "eval": {"episodes": 100},
    },
    "llm_rl": {
        "data": {"train_path": f"{GSM8K}/train.jsonl", "test_path": f"{GSM8K}/test.jsonl"},
        "train": {"seeds": [0], "common": {"model": MODEL, "iterations": 2}},
        "eval": {"n_problems": 25},
    },
    "glam": {
        "model": MODEL,
        "train": {"variants": ["full"], "seeds": [0], "updates": 1},
    },
}
# The offline learners kept: one discrete and the continuous ones only a paper run trains (CQL, IQL).
KALM_ALGOS_KEPT = ("babyai-dcql", "metaworld-cql", "metaworld-iql")
OFFLINE_STEPS = 200


# What the paper profile asks of a GPU, undone for ``prepare --on-cpu`` (a smoke test of this script without one).
ON_CPU = {"props": {"grpo": {"device": None, "dtype": "auto", "trainer": {"bf16": False}}},
          "llm_rl": {"train": {"common": {"device": None, "dtype": "auto"}}}}
def compose_on_gpu(on_cpu: bool = False) -> dict:
    from pipelines.tiers import compose, overrides

    base = [*(f"{m}=paper" for m in METHODS), *overrides(ON_GPU), *overrides(ON_CPU if on_cpu else {})]
    algos = compose(base)["kalm"]["offline"]["algos"]
    dropped = [f"~kalm.offline.algos.{name}" for name in algos if name not in KALM_ALGOS_KEPT]
    steps = overrides({"kalm": {"offline": {"algos": {name: {"steps": OFFLINE_STEPS} for name in KALM_ALGOS_KEPT}}}})
    return compose([*base, *dropped, *steps])


def gsm8k_files(folder: Path, n_train: int = 200, n_test: int = 50) -> None:
    """Word problems in GSM8K's format (question, rationale, ``#### answer``) as ``folder``/{train,test}.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n, first in (("train", n_train, 2), ("test", n_test, 500)):
        rows = []
        for a in range(first, first + n):
            b = a % 7 + 2
            rows.append({"question": f"A shop sells {a} pens a day. How many pens does it sell in {b} days?",
                         "answer": f"It sells {a} * {b} = <<{a}*{b}={a * b}>>{a * b} pens.\n#### {a * b}"})
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def resolve_plan(params: dict) -> dict[str, list]:
    """Per method, [stage item, argv after ``python -m``] of its ``STAGES`` as DVC resolves them from ``params``, in
    run order; exits naming the first stage that reads another stage's output the plan does not write before it."""
    import tempfile

    import yaml
    from dvc.repo import Repo

    from pipelines.workspace import copy_workspace

    with tempfile.TemporaryDirectory() as tmp:
        root = copy_workspace(Path(tmp) / "ws", skip=("data", "models", "metrics", "plots", "reports"))
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        with contextlib.chdir(root), Repo(str(root)) as repo:
            stages = [s for s in repo.index.stages if Path(s.dvcfile.path) == root / "dvc.yaml"]
            produced = {str(Path(o.fs_path).relative_to(root)): s.addressing for s in stages for o in s.outs}
            plan, written = {}, {MODEL}
            for method in METHODS:
                items = [s for s in stages if s.addressing.split("@")[0] in STAGES[method]]
                items.sort(key=lambda s: STAGES[method].index(s.addressing.split("@")[0]))
                plan[method] = [[s.addressing, s.cmd.split()[2:]] for s in items]
                for s in items:
                    for dep in s.deps:
                        rel = str(Path(dep.fs_path).relative_to(root))
                        owner = next((o for o in produced if rel == o or rel.startswith(o + "/")), None)
                        if owner is not None and not any(owner == w or owner.startswith(w + "/") for w in written):
                            raise SystemExit(f"{s.addressing} reads {rel}, written by {produced[owner]}, which the "
                                             f"plan does not run before it")
                    written |= {str(Path(o.fs_path).relative_to(root)) for o in s.outs}
    return plan


def prepare(args) -> None:
    import yaml

    from llmrl.config.profiles import validate_params
    from llmrl.files import atomic_path
    from llmrl.llm.load import load_tokenizer

    params = compose_on_gpu(args.on_cpu)
    validate_params(params)
    plan = resolve_plan(params)
    with atomic_path(PLAN, is_dir=True) as tmp:  # a bad plan leaves the previous .gpu/ as it was
        (tmp / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        (tmp / "stages.json").write_text(json.dumps(plan, indent=1))
        load_tokenizer("embedded:smollm2-135m-instruct").save_pretrained(tmp / "tokenizer")
        gsm8k_files(tmp / Path(GSM8K).relative_to(PLAN.name))
    for method, items in plan.items():
        print(f"{method}: {', '.join(name for name, _ in items)}")


def build_model_folder(shape: str) -> dict:
    """``models/base_llm`` as the base_llm stage writes it, with random weights of ``shape`` (``bench/gpu.py``)."""
    import torch
    from gpu import shape_config
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from llmrl.llm.load import save_model

    tok = AutoTokenizer.from_pretrained(PLAN / "tokenizer")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        net = Qwen2ForCausalLM(shape_config(shape, tok, max_positions=32768))  # ProPS's prompts reach 24,576
    save_model(net.to("cpu"), tok, ROOT / MODEL)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the stages' processes measure their own peaks
    return {"shape": shape, "parameters_m": round(sum(p.numel() for p in net.parameters()) / 1e6, 1)}


def stage_metrics(name: str, argv: list[str]) -> dict:
    """The stage's small JSON outputs under metrics/ (its headline numbers), by path."""
    from pipelines.workspace import stage_outputs

    found = {}
    for out in stage_outputs(ROOT, name, argv):
        files = [out] if out.is_file() else sorted(out.rglob("*.json")) if out.is_dir() else []
        for f in files:
            rel = f.relative_to(ROOT)
            if rel.parts[0] == "metrics" and f.suffix == ".json" and f.stat().st_size < 20_000:
                found[str(rel)] = json.loads(f.read_text())
    return found


def run(args) -> None:
    """Build the model folder, then each method's stages in a process of its own: a CUDA fault (a device-side
    assert poisons its process's context) ends only its method."""
    import signal
    import subprocess

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a lease's end puts .dvc and .git back too
    start = time.perf_counter()
    os.environ.pop("LLMRL_TIER", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    (ROOT / "params.yaml").write_text((PLAN / "params.yaml").read_text())
    from stages.common import prepare_stage_process

    prepare_stage_process()
    with dvc_repo_hidden():
        t = time.perf_counter()
        model = {**build_model_folder(args.shape), "build_s": round(time.perf_counter() - t, 1)}
        print(f"model {model}", flush=True)
        for method in args.methods or METHODS:
            left = args.seconds - (time.perf_counter() - start)
            subprocess.run([sys.executable, __file__, "run-method", method, "--seconds", f"{left:.1f}",
                            "--min-left", str(args.min_left), "--out", args.out, "--model", json.dumps(model)],
                           check=False)


@contextlib.contextmanager
def dvc_repo_hidden():
    """Without DVC's whole install (the device machine carries dvclive and the few of DVC's modules it imports),
    dvclive must find neither this DVC repository (it would open it) nor its Git repository (it would ``dvc init``
    it): ``.dvc`` and ``.git`` are moved aside for the run and put back after it."""
    try:
        from dvc.repo import Repo

        Repo(str(ROOT)).close()
        opens = True
    except ImportError:
        opens = False
    if opens:
        yield
        return
    moved = [(ROOT / name, ROOT / f"{name}-hidden-by-gpu-paper") for name in (".dvc", ".git") if (ROOT / name).exists()]
    for path, aside in moved:
        path.rename(aside)
    try:
        yield
    finally:
        for path, aside in moved:
            aside.rename(path)


def run_method(args) -> None:
    """One method's stage items in turn, in this process, as the pipeline's stages run; the record after each."""
    import importlib
    import multiprocessing

    # The stages run one after another in this process, after CUDA and thread pools started: a stage's worker
    # processes must not be forked from it (the pipeline starts every stage fresh, where forking is safe).
    multiprocessing.set_start_method("spawn", force=True)
    from stages.common import prepare_stage_process

    prepare_stage_process()
    import torch

    from gpu import device_record

    from llmrl.files import write_json

    start = time.perf_counter()
    plan = json.loads((PLAN / "stages.json").read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    method = args.method
    record = {"benchmark": f"{method}'s paper profile (conf/{method}/paper.yaml) on a GPU, bench/gpu_paper.py's "
                           "ON_GPU budgets on top: speeds and memory, not results",
              **device_record(), "model": json.loads(args.model), "stages": []}
    failed = False
    for name, argv in plan[method]:
        left = args.seconds - (time.perf_counter() - start)
        row = {"stage": name}
        if failed or left < args.min_left:
            row["skipped"] = ("an earlier stage failed" if failed
                              else f"the run's time was spent ({max(left, 0):.0f} s left)")
            record["stages"].append(row)
            continue
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        try:
            importlib.import_module(argv[0]).main(argv[1:])
        except (Exception, SystemExit) as err:  # the method's later stages read this one's outputs
            row["error"] = "".join(traceback.format_exception(err))[-3000:]
            print(row["error"], file=sys.stderr, flush=True)
            failed = True
        row["seconds"] = round(time.perf_counter() - t, 1)
        if torch.cuda.is_available():
            row["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if not failed:
            row["metrics"] = stage_metrics(name, argv)
        record["stages"].append(row)
        print(f"{name}: {row['seconds']} s, {row.get('peak_gpu_gib')} GiB{' FAILED' if failed else ''}", flush=True)
        write_json(out / f"gpu_paper_{method}.json", record)
    write_json(out / f"gpu_paper_{method}.json", record)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step")
    p = sub.add_parser("prepare", help="compose, validate and resolve the plan into .gpu/ (needs DVC and the "
                       "embedded model)")
    p.add_argument("--on-cpu", action="store_true", help="the plan for a smoke test of this script on a CPU")
    r = sub.add_parser("run", help="build the model folder and run the plan's stages (on the GPU machine)")
    r.add_argument("--shape", default="qwen2.5-0.5b",
                   help="random weights of this shape (bench/gpu.py's SHAPES)")
    r.add_argument("--seconds", type=float, default=480, help="the whole run's budget: no stage starts after it")
    r.add_argument("--min-left", type=float, default=20, help="no stage starts with fewer seconds than this left")
    r.add_argument("--methods", nargs="*", choices=METHODS, help="default: all, in METHODS' order")
    r.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for gpu_paper_<method>.json")
    m = sub.add_parser("run-method", help="one method's stages (run starts one such process per method)")
    m.add_argument("method", choices=METHODS)
    m.add_argument("--seconds", type=float, required=True, help="what is left of the run's budget")
    m.add_argument("--min-left", type=float, required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--model", required=True, help="the model folder's record (JSON)")
    args = ap.parse_args()
    if args.step is None:  # `make bench` runs every script: this one is two steps, the second on a GPU machine
        print("bench/gpu_paper.py: skipped (run `prepare` here, then `run` on a GPU machine: docs/gpu.md)")
        return
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # the stages and pipelines packages; bench/gpu.py
    {"prepare": prepare, "run": run, "run-method": run_method}[args.step](args)


if __name__ == "__main__":
    main()
