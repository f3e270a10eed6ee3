"""Stage kalm_ground@<benchmark>-<seed>: fine-tune the base LLM into KALM's grounded model of one benchmark with
one grounding seed (kalm.ground.seeds; one item per seed keeps each item under the 30-minute stage limit at the
study's size), and gate 0 on it.

Reads data/kalm/real/<benchmark>.h5 (KALM-A's kalm_data) to train on KALM's four patterns for ``kalm.ground.epochs``
passes (llmrl.algos.kalm_grounding), and data/kalm/real/<benchmark>_validation.h5 (validation starts) for the
held-out losses: action and observation losses on the episodes relabelled with training phrasings (the checkpoint
selector), the token loss on their own unseen phrasings (reported apart), the one-step state error on their
transitions beside copying the last state, and the goal sensitivity of the teacher-forced actions (agreement with the
expert under the episode's own goal and under another task's: a policy that ignores its goal scores both alike). Gate 0 (``kalm.ground.gate_episodes``): the model acts in the real
simulator on the training goals from validation starts, beside random actions and BC trained on the same real data
(llmrl.eval.kalm.closed_loop). Writes models/kalm/grounded/<benchmark>/<seed>/ (LoRA adapter + projections + heads
+ spec, train.json), metrics/kalm/ground/<benchmark>/<seed>.json (losses, state error, and gate 0's rows with
every episode's success, which kalm_gate0@<benchmark> pools over the seeds) and dvclive curves in
plots/kalm/ground/<benchmark>/<seed>/. Imagination and kalm_eval's grounded-LLM row read the first seed's model.

Several devices: ``accelerate launch --multi_gpu --num_processes N -m stages.kalm_ground <benchmark> <seed>`` trains
with DDP (``stages.launch``; without CUDA on CPU over gloo; ``--cpu`` would start one process). Every process builds
the same samples and batches and trains on its 1/N share of each batch (``llmrl.algos.kalm_grounding``); the main
process writes the outputs and runs gate 0.
"""

import contextlib
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from llmrl.agents.offline_policy import OfflinePolicy
from llmrl.algos.kalm_grounding import (autocast_dtype, build_samples, evaluate_losses, grounding_spec,
                                        goal_sensitivity, heldout_samples, offline_goal_sensitivity, state_error,
                                        train_grounding, update_steps)
from llmrl.algos.kalm_offline import bc_algo, build_dataset, fit_projection, make_learnable, train_offline
from llmrl.config.kalm import KalmEnvParams, KalmGroundParams
from llmrl.data.embeddings import EmbeddingTable
from llmrl.data.trajectories import read_episodes
from llmrl.envs import kalm_levels as kl
from llmrl.eval.kalm import (closed_loop, gate_goals, grounded_act, offline_act, random_act, success_summary,
                             swapped_goals)
from llmrl.fingerprint import fingerprint_line
from llmrl.files import atomic_path, write_json
from llmrl.llm.grounded import build_grounded
from llmrl.llm.load import dtype_name
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params
from stages.launch import launched

HEADLINE = ("loss", "obs_loss", "act_loss", "token_loss")
HELDOUT = ("heldout_selection_loss", "heldout_obs_loss", "heldout_act_loss", "unseen_token_loss")
REAL = paths.kalm_data().real


def gate_outcomes(benchmark: str, model, train, val, p: KalmGroundParams, seed: int, settings: kl.EnvSettings,
                  table: EmbeddingTable, egocentric: bool) -> tuple[dict[str, list[bool]], dict]:
    """Gate 0's episode successes of the grounded model, random actions and BC (trained here on ``train``; greedy,
    and sampled from its action distribution where actions are discrete: a greedy Markov policy that errs at a wall
    repeats the error until the episode times out, and the grounded model, greedy too, sees its history), on
    ``kalm.ground.gate_swap_benchmarks`` also the grounded model and the sampled BC under another task's
    instruction (``*_swapped``: success still judged on the episode's own goal), and BC's goal sensitivity on the
    held-out episodes ``val``. ``egocentric``: BC's input carries BabyAI's egocentric features, as the grounded
    model's does."""
    goals = gate_goals(benchmark)
    algo = bc_algo(benchmark, p.gate_bc_steps)
    projection = fit_projection(train, table, algo)
    learnable = make_learnable(algo, seed, p.threads)
    for _ in train_offline(learnable, build_dataset(train, table, benchmark, projection, egocentric=egocentric),
                           p.gate_bc_steps, p.gate_bc_steps):
        pass
    bc = OfflinePolicy(learnable, np.zeros(table.dim, np.float32), name="bc", projection=projection,
                       egocentric=egocentric)
    instructions = table.lookup([g.instruction for g in goals])
    rows = {"grounded": grounded_act(model, goals), "random": random_act(benchmark, seed),
            "bc": offline_act(bc, instructions)}
    discrete = kl.action_spec(benchmark).discrete
    if discrete:
        rows["bc_sampled"] = offline_act(bc, instructions, sample_seed=seed)
    if benchmark in p.gate_swap_benchmarks:  # each goal's episodes under another task's instruction
        swapped = swapped_goals(goals)
        rows["grounded_swapped"] = grounded_act(model, swapped)
        if discrete:
            rows["bc_sampled_swapped"] = offline_act(bc, table.lookup([g.instruction for g in swapped]),
                                                     sample_seed=seed)
    outcomes = closed_loop(rows, goals, settings, p.gate_episodes, p.gate_seed)
    return ({row: [o.success for o in outs] for row, outs in outcomes.items()},
            offline_goal_sensitivity(bc, val, benchmark, table))


def ground_seed(benchmark: str, seed: int, p: KalmGroundParams, train, val, launch, live, egocentric: bool
                ) -> tuple:
    """One grounding run, its curves logged to ``live`` (None off the main process): (model, train.json record,
    metrics). ``egocentric``: the model's input carries BabyAI's egocentric features."""
    accelerator, main_process = launch.accelerator, launch.is_main
    start = time.perf_counter()
    rng = seed_everything(seed)
    model = build_grounded(grounding_spec(benchmark, train, p, egocentric=egocentric), lora=p.lora,
                           device=launch.device)
    samples = build_samples(model, train, p, rng)
    selection, unseen = heldout_samples(model, val, benchmark, p, np.random.default_rng(seed + 1))
    before, unseen_before = evaluate_losses(model, selection, p), evaluate_losses(model, unseen, p)
    n_samples = sum(len(v) for v in samples.values())
    log.info("%s seed %d: %d train / %d held-out episodes, %d samples; held-out before %s", benchmark, seed,
             len(train), len(val), n_samples, before)
    train_start = time.perf_counter()
    rows = []
    for row in tqdm(train_grounding(model, samples, p, rng, accelerator=accelerator, validation=selection,
                                    unseen=unseen),
                    total=update_steps(p, n_samples), desc=f"ground {benchmark} seed {seed}",
                    disable=not main_process):
        rows.append(row)
        if not main_process:
            continue
        live.step = row["step"]
        for key in (*HEADLINE, *HELDOUT, "lr", "obs_accuracy"):
            if key in row:
                live.log_metric(key, row[key])
        if row["step"] % p.log_every == 0:
            log.info("%s seed %d step %d: %s", benchmark, seed, row["step"], {k: round(row[k], 4) for k in HEADLINE})
    train_seconds = time.perf_counter() - train_start
    after, unseen_after = evaluate_losses(model, selection, p), evaluate_losses(model, unseen, p)
    error = state_error(model, val)
    sensitivity = goal_sensitivity(model, val, benchmark)
    metrics = {
        "seed": seed,
        "heldout_selection_loss_before": before["selection_loss"], "heldout_selection_loss_after":
            after["selection_loss"],
        **{f"heldout_{k}_after": after[k] for k in ("obs_loss", "act_loss")},
        **({"heldout_obs_accuracy_after": after["obs_accuracy"]} if "obs_accuracy" in after else {}),
        "unseen_token_loss_before": unseen_before["token_loss"], "unseen_token_loss_after": unseen_after["token_loss"],
        "train_loss_last10": round(float(np.mean([r["loss"] for r in rows[-10:]])), 5),
        "samples": n_samples, "updates": len(rows), "epochs": p.epochs,
        "selected_update": rows[-1].get("selected", len(rows)),
        "state_error": error,  # one step on the held-out transitions, beside copying the last state
        "goal_sensitivity": sensitivity,  # teacher-forced actions under the own goal and another task's
        "train_seconds": round(train_seconds, 1), "seconds": round(time.perf_counter() - start, 1),
    }
    record = {"before": before, "after": after, "unseen_before": unseen_before, "unseen_after": unseen_after,
              "curve": rows}
    log.info("%s seed %d: held-out after %s; unseen phrasings %s", benchmark, seed, after, unseen_after)
    return model, record, metrics


def main(argv: list[str] | None = None) -> None:
    args = stage_arguments("kalm_ground", argv, benchmark="one of kalm.ground.benchmarks",
                           seed="one of kalm.ground.seeds")
    benchmark = args.benchmark
    p = stage_params("kalm.ground", KalmGroundParams)
    env_p = stage_params("kalm.env", KalmEnvParams)
    if benchmark not in p.benchmarks:
        raise SystemExit(f"kalm_ground: benchmark {benchmark!r} is not in kalm.ground.benchmarks {p.benchmarks}")
    if not args.seed.lstrip("-").isdigit() or int(args.seed) not in p.seeds:
        raise SystemExit(f"kalm_ground: seed {args.seed!r} is not in kalm.ground.seeds {p.seeds}")
    seed = int(args.seed)
    if p.gate_episodes:  # before hours of training: a gate that cannot run fails now
        kl.check_seed_range("validation", p.gate_seed,
                            len(gate_goals(benchmark)) * kl.per_goal(len(gate_goals(benchmark)), p.gate_episodes),
                            "kalm.ground.gate_seed")
    out = paths.kalm_ground(benchmark, seed)
    torch.set_num_threads(p.threads)
    launch = launched()
    accelerator, main_process = launch.accelerator, launch.is_main
    start = time.perf_counter()
    train = read_episodes(REAL / f"{benchmark}.h5")
    val = read_episodes(REAL / f"{benchmark}_validation.h5")
    # only the main process writes the curves
    with open_live(out.plots) if main_process else contextlib.nullcontext() as live:
        model, record, metrics = ground_seed(benchmark, seed, p, train, val, launch, live,
                                             env_p.egocentric_input(benchmark))
    if main_process:
        if p.gate_episodes:
            t0 = time.perf_counter()
            table = EmbeddingTable.load(REAL / "embeddings.npz")
            flags, bc_sensitivity = gate_outcomes(benchmark, model, train, val, p, seed,
                                                  kl.EnvSettings.for_benchmark(env_p, benchmark), table,
                                                  env_p.egocentric_input(benchmark))
            # every episode's success, so that kalm_gate0 pools the seeds' episodes (not their rates)
            metrics["gate0"] = {"rows": {row: success_summary(f) for row, f in flags.items()}, "episodes": flags,
                                "goals": len(gate_goals(benchmark)), "first_seed": p.gate_seed,
                                "bc_goal_sensitivity": bc_sensitivity,
                                "seconds": round(time.perf_counter() - t0, 1)}
            log.info("%s seed %d gate 0: %s", benchmark, seed, metrics["gate0"]["rows"])
        with atomic_path(out.model, is_dir=True) as folder:
            model.save(folder)
            write_json(folder / "train.json", {**record, "env": fingerprint_line()})
        metrics |= {"dtype": dtype_name(autocast_dtype(p, model.llm.device)),
                    "seconds": round(time.perf_counter() - start, 1), "env": fingerprint_line()}
        write_json(out.metrics, metrics)
        log.info("%s seed %d: %s", benchmark, seed, {k: v for k, v in metrics.items() if k != "gate0"})
    if accelerator is not None:
        accelerator.end_training()


if __name__ == "__main__":
    main()
