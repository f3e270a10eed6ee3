"""Stage kalm_ground: fine-tune the base LLM into KALM's grounded model, one per benchmark.

Reads data/kalm/real/<benchmark>.h5 (KALM-A's kalm_data); holds out ``kalm.ground.validation_episodes`` of the
episodes for the before/after losses; trains on KALM's four patterns (llmrl.algos.kalm_grounding). Writes
models/kalm/grounded/<benchmark>/ (LoRA adapter + projections + heads + spec), metrics/kalm/ground.json (headline
losses before/after on held-out episodes, time, dtype) and dvclive curves in plots/kalm/ground/<benchmark>.

Several devices: ``accelerate launch --multi_gpu --num_processes N stages/kalm_ground.py`` trains with DDP (without
CUDA on CPU over gloo; ``--cpu`` would start one process). Every process builds the same samples and batches and
trains on its 1/N share of each batch (``llmrl.algos.kalm_grounding``); the main process writes the outputs.
"""

from common import log, open_live, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

import contextlib
import os
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from llmrl.algos.kalm_grounding import autocast_dtype, build_samples, evaluate_losses, train_grounding
from llmrl.config.kalm import KalmGroundParams
from llmrl.data.trajectories import read_episodes
from llmrl.envs import kalm_levels as kl
from llmrl.fingerprint import fingerprint_line
from llmrl.files import atomic_path, write_json
from llmrl.llm.grounded import GroundingSpec, build_grounded
from llmrl.llm.load import dtype_name
from llmrl.seeding import seed_everything

HEADLINE = ("loss", "obs_loss", "act_loss", "token_loss")
OUT = paths.kalm_ground()
REAL = paths.kalm_data().real


def main() -> None:
    p = stage_params("kalm.ground", KalmGroundParams)
    torch.set_num_threads(p.threads)
    accelerator = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # started by `accelerate launch --num_processes N`
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=not torch.cuda.is_available())
    main_process = accelerator is None or accelerator.is_main_process
    device = str(accelerator.device) if accelerator is not None else "cpu"
    metrics: dict = {"env": fingerprint_line()}
    with atomic_path(OUT.model, is_dir=True) if main_process else contextlib.nullcontext() as out:
        for benchmark in p.benchmarks:
            start = time.perf_counter()
            rng = seed_everything(p.seed)
            episodes = read_episodes(REAL / f"{benchmark}.h5")
            order = rng.permutation(len(episodes))
            n_val = max(1, round(p.validation_episodes * len(episodes)))
            val = [episodes[i] for i in order[:n_val]]
            train = [episodes[i] for i in order[n_val:]]
            obs = np.concatenate([np.concatenate([e.observations["obs"], e.observations["next_obs"]]) for e in train])
            kl.check_obs(benchmark, obs, f"{REAL / (benchmark + '.h5')} observations")
            spec_a = kl.action_spec(benchmark)
            spec = GroundingSpec(obs_dim=kl.obs_dim(benchmark), action_dim=spec_a.n, discrete=spec_a.discrete,
                                 action_low=float(spec_a.low), action_high=float(spec_a.high), base_model=p.model,
                                 finetune="lora" if p.lora is not None else "full",
                                 obs_mean=obs.mean(0).tolist(), obs_std=obs.std(0).tolist())
            model = build_grounded(spec, lora=p.lora, device=device)
            metrics["dtype"] = dtype_name(autocast_dtype(p, model.llm.device))
            samples = build_samples(model, train, p, rng)
            val_p = p.model_copy(update={k: max(1, v // 8) for k, v in {
                "trajectory_samples": p.trajectory_samples, "dynamics_samples": p.dynamics_samples,
                "goal_samples": p.goal_samples, "reverse_samples": p.reverse_samples}.items()})
            val_samples = build_samples(model, val, val_p, np.random.default_rng(p.seed + 1))
            before = evaluate_losses(model, val_samples, p)
            log.info("%s: %d train / %d held-out episodes, %d samples; held-out before %s", benchmark, len(train),
                     len(val), sum(len(v) for v in samples.values()), before)
            train_start = time.perf_counter()
            rows = []
            with open_live(OUT.plots / benchmark) if main_process else contextlib.nullcontext() as live:
                for row in tqdm(train_grounding(model, samples, p, rng, accelerator=accelerator), total=p.steps,
                                desc=f"ground {benchmark}", disable=not main_process):
                    rows.append(row)
                    if not main_process:
                        continue
                    live.step = row["step"]
                    for key in (*HEADLINE, "lr"):
                        live.log_metric(key, row[key])
                    if row["step"] % p.log_every == 0:
                        log.info("%s step %d: %s", benchmark, row["step"],
                                 {k: round(row[k], 4) for k in HEADLINE})
            train_seconds = time.perf_counter() - train_start
            after = evaluate_losses(model, val_samples, p)
            if not main_process:
                continue
            model.save(out / benchmark)
            write_json(out / benchmark / "train.json", {"before": before, "after": after, "curve": rows,
                                                        "env": fingerprint_line()})
            metrics[benchmark] = {
                "heldout_loss_before": before["loss"], "heldout_loss_after": after["loss"],
                **{f"heldout_{k}_after": after[k] for k in ("obs_loss", "act_loss", "token_loss")},
                "train_loss_last10": round(float(np.mean([r["loss"] for r in rows[-10:]])), 5),
                "samples": sum(len(v) for v in samples.values()), "updates": p.steps,
                "train_seconds": round(train_seconds, 1), "seconds": round(time.perf_counter() - start, 1),
            }
            log.info("%s: held-out after %s; %s", benchmark, after, metrics[benchmark])
    if main_process:
        write_json(OUT.metrics, metrics)
    if accelerator is not None:
        accelerator.end_training()


if __name__ == "__main__":
    main()
