"""Stage kalm_imagine@<benchmark>-<level>: imaginary rollouts of the grounded LLM for one level's goals.

Levels: the test levels, and ``train`` (one phrasing per training task), the control that says whether the model
imagines at all. A level gets at least kalm.imagine.rollouts rollouts, every goal equally, from real initial states
of the imagine split, at most the benchmark's horizon (never past kalm.ground.window). The grounded model then names each rollout's
instruction (its trajectory -> instruction pattern); with kalm.imagine.labels = consistent only the rollouts it
names after their own task are written for offline RL. Every rollout is replayed in the simulator, as a diagnostic.
The model is the first grounding seed's (models/kalm/grounded/<benchmark>/<kalm.ground.seeds[0]>): one imagination
per grounding seed would multiply kalm_imagine and every offline run that reads it; the other seeds count in gate 0.

Writes data/kalm/imagine/<benchmark>/<level>.h5 (TrajectoryWriter; same layout as data/kalm/real,
info["imaginary"] = True, rewards from label_rewards; the rollouts that feed offline RL),
metrics/kalm/imagine_<benchmark>_<level>.json (headline: rollouts, the consistent share, imagined success and the
replay's true success, for all and for the consistent ones, per-step state error, seconds) and
data/kalm/imagine_report/<benchmark>_<level>.json (per-rollout table, the state error against the step index, the
time breakdown, a few rollouts as text, the names the model gave).
"""

import time

import torch

from llmrl.algos.kalm_imagine import (check_horizon, consistency, consistency_candidates, episode_text,
                                      imagine_level, level_goals, rollout_schedule)
from llmrl.config.kalm import KalmEnvParams, KalmGroundParams, KalmImagineParams
from llmrl.data.trajectories import TrajectoryWriter
from llmrl.envs import kalm_levels as kl
from llmrl.eval.kalm import rollout_quality
from llmrl.fingerprint import fingerprint_line
from llmrl.files import write_json
from llmrl.llm.grounded import GroundedLM, trajectory_prompt
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, stage_arguments, stage_params


def main(argv: list[str] | None = None) -> None:
    args = stage_arguments("kalm_imagine", argv, benchmark="babyai or metaworld", level="one of kalm.imagine.levels")
    benchmark, level = args.benchmark, args.level
    out = paths.kalm_imagine(benchmark, level)
    p = stage_params("kalm.imagine", KalmImagineParams)
    ground = stage_params("kalm.ground", KalmGroundParams)
    env_p = stage_params("kalm.env", KalmEnvParams)
    if level not in p.levels:
        raise SystemExit(f"kalm_imagine: level {level!r} is not in kalm.imagine.levels {p.levels}")
    goals = level_goals(benchmark, level)  # UnknownLevelError names a wrong benchmark/level before any write
    steps = check_horizon(p, ground, benchmark)
    torch.set_num_threads(p.threads)
    seed_everything(p.seed)
    settings = kl.EnvSettings.for_benchmark(env_p, benchmark)
    start = time.perf_counter()
    model = GroundedLM.load(paths.kalm_ground(benchmark, ground.seeds[0]).model)
    load_seconds = time.perf_counter() - start
    t0 = time.perf_counter()
    episodes = imagine_level(model, goals, p, settings, steps)
    imagine_seconds = time.perf_counter() - t0
    ep_goals = [goals[g] for g, _seed in rollout_schedule(goals, p)]
    t0 = time.perf_counter()
    verdicts = consistency(model, episodes, consistency_candidates(benchmark, level), ground.reverse_states,
                           p.consistency_candidates, p.seed)
    consistency_seconds = time.perf_counter() - t0
    consistent = [v["consistent"] for v in verdicts]
    t0 = time.perf_counter()
    summary, rows, curve = rollout_quality(episodes, ep_goals, settings, consistent)
    replay_seconds = time.perf_counter() - t0
    kept = [e for e, ok in zip(episodes, consistent) if ok or p.labels == "rule"]
    with TrajectoryWriter(out.data) as writer:
        writer.extend(kept)
    for row, v in zip(rows, verdicts):
        row |= {"named": v["named"], "own_rank": v["own_rank"], "competitors": v["competitors"]}
    steps_done = sum(len(e) for e in episodes)
    timing = {"load_seconds": round(load_seconds, 1), "imagine_seconds": round(imagine_seconds, 1),
              "consistency_seconds": round(consistency_seconds, 1), "replay_seconds": round(replay_seconds, 1)}
    write_json(out.report, {
        "params": p.model_dump(), "horizon": steps, "labels": p.labels, "summary": summary, "timing": timing,
        "mae_by_step": curve, "rollouts": rows,
        "examples": [{"prompt": trajectory_prompt(e.mission) + " # <s0>", **episode_text(e)}
                     for e in episodes[:p.examples]]})
    metrics = {**summary, "goals": len(goals), "written": len(kept), "imagined_steps": steps_done,
               "transitions_per_s": round(steps_done / imagine_seconds, 1),
               "seconds": round(sum(timing.values()), 1), "env": fingerprint_line()}
    write_json(out.metrics, metrics)
    log.info("%s_%s: %s", benchmark, level, metrics)


if __name__ == "__main__":
    main()
