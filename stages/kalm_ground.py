"""Stage kalm_ground@<benchmark>: fine-tune the base LLM into KALM's grounded model of one benchmark.

Reads data/kalm/real/<benchmark>.h5 (KALM-A's kalm_data) to train on KALM's four patterns for ``kalm.ground.epochs``
passes (llmrl.algos.kalm_grounding), and data/kalm/real/<benchmark>_validation.h5 (validation phrasings from
validation initial states) for the before/after held-out losses. Writes
models/kalm/grounded/<benchmark>/ (LoRA adapter + projections + heads + spec, train.json), metrics/kalm/
ground_<benchmark>.json (losses before/after on held-out episodes, time, dtype) and dvclive curves in
plots/kalm/ground/<benchmark>.

Several devices: ``accelerate launch --multi_gpu --num_processes N -m stages.kalm_ground <benchmark>`` trains with
DDP (``stages.launch``; without CUDA on CPU over gloo; ``--cpu`` would start one process). Every process builds the
same samples and batches and trains on its 1/N share of each batch (``llmrl.algos.kalm_grounding``); the main
process writes the outputs.
"""

import contextlib
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from llmrl.algos.kalm_grounding import (autocast_dtype, build_samples, evaluate_losses, grounding_spec,
                                        train_grounding, update_steps, validation_params)
from llmrl.config.kalm import KalmGroundParams
from llmrl.data.trajectories import read_episodes
from llmrl.fingerprint import fingerprint_line
from llmrl.files import atomic_path, write_json
from llmrl.llm.grounded import build_grounded
from llmrl.llm.load import dtype_name
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params
from stages.launch import launched

HEADLINE = ("loss", "obs_loss", "act_loss", "token_loss")
REAL = paths.kalm_data().real


def main(argv: list[str] | None = None) -> None:
    benchmark = stage_arguments("kalm_ground", argv, benchmark="one of kalm.ground.benchmarks").benchmark
    p = stage_params("kalm.ground", KalmGroundParams)
    if benchmark not in p.benchmarks:
        raise SystemExit(f"kalm_ground: benchmark {benchmark!r} is not in kalm.ground.benchmarks {p.benchmarks}")
    out = paths.kalm_ground(benchmark)
    torch.set_num_threads(p.threads)
    launch = launched()
    accelerator, main_process = launch.accelerator, launch.is_main
    start = time.perf_counter()
    rng = seed_everything(p.seed)
    train = read_episodes(REAL / f"{benchmark}.h5")
    val = read_episodes(REAL / f"{benchmark}_validation.h5")
    model = build_grounded(grounding_spec(benchmark, train, p), lora=p.lora, device=launch.device)
    samples = build_samples(model, train, p, rng)
    val_samples = build_samples(model, val, validation_params(p), np.random.default_rng(p.seed + 1))
    before = evaluate_losses(model, val_samples, p)
    n_samples = sum(len(v) for v in samples.values())
    log.info("%s: %d train / %d held-out episodes, %d samples; held-out before %s", benchmark, len(train),
             len(val), n_samples, before)
    train_start = time.perf_counter()
    rows = []
    with open_live(out.plots) if main_process else contextlib.nullcontext() as live:
        for row in tqdm(train_grounding(model, samples, p, rng, accelerator=accelerator, validation=val_samples),
                        total=update_steps(p, n_samples), desc=f"ground {benchmark}", disable=not main_process):
            rows.append(row)
            if not main_process:
                continue
            live.step = row["step"]
            for key in (*HEADLINE, "lr", "obs_accuracy", "heldout_loss"):
                if key in row:
                    live.log_metric(key, row[key])
            if row["step"] % p.log_every == 0:
                log.info("%s step %d: %s", benchmark, row["step"], {k: round(row[k], 4) for k in HEADLINE})
    train_seconds = time.perf_counter() - train_start
    after = evaluate_losses(model, val_samples, p)
    if main_process:
        with atomic_path(out.model, is_dir=True) as folder:
            model.save(folder)
            write_json(folder / "train.json", {"before": before, "after": after, "curve": rows,
                                               "env": fingerprint_line()})
        metrics = {
            "heldout_loss_before": before["loss"], "heldout_loss_after": after["loss"],
            **{f"heldout_{k}_after": after[k] for k in ("obs_loss", "act_loss", "token_loss")},
            **({"heldout_obs_accuracy_after": after["obs_accuracy"]} if "obs_accuracy" in after else {}),
            "train_loss_last10": round(float(np.mean([r["loss"] for r in rows[-10:]])), 5),
            "samples": n_samples, "updates": len(rows), "epochs": p.epochs,
            "selected_update": rows[-1].get("selected", len(rows)),
            "dtype": dtype_name(autocast_dtype(p, model.llm.device)), "train_seconds": round(train_seconds, 1),
            "seconds": round(time.perf_counter() - start, 1), "env": fingerprint_line(),
        }
        write_json(out.metrics, metrics)
        log.info("%s: held-out after %s; %s", benchmark, after, metrics)
    if accelerator is not None:
        accelerator.end_training()


if __name__ == "__main__":
    main()
