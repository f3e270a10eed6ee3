"""Stage kalm_imagine@<benchmark>-<level>: imaginary rollouts of the grounded LLM for one level's goals.

Writes data/kalm/imagine/<benchmark>_<level>.h5 (TrajectoryWriter; same layout as data/kalm/real, info["imaginary"]
= True, rewards from label_rewards), metrics/kalm/imagine_<benchmark>_<level>.json (headline: imagined and true
success of the open-loop replay, per-step state error, total seconds) and
data/kalm/imagine_report/<benchmark>_<level>.json (per-rollout table, time breakdown, a few rollouts as text).
"""

from common import log, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

import sys
import time

import torch

from llmrl.algos.kalm_imagine import episode_text, horizon, imagine_level, rollout_quality
from llmrl.config.kalm import KalmEnvParams, KalmImagineParams
from llmrl.data.trajectories import TrajectoryWriter
from llmrl.envs import kalm_levels as kl
from llmrl.fingerprint import fingerprint_line
from llmrl.files import write_json
from llmrl.llm.grounded import GroundedLM, trajectory_prompt
from llmrl.seeding import seed_everything


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: kalm_imagine.py <benchmark> <level>")
    benchmark, level = sys.argv[1], sys.argv[2]
    out = paths.kalm_imagine(benchmark, level)
    p = stage_params("kalm.imagine", KalmImagineParams)
    env_p = stage_params("kalm.env", KalmEnvParams)
    goals = kl.goals(benchmark, level)  # UnknownLevelError names a wrong benchmark/level before any write
    torch.set_num_threads(p.threads)
    seed_everything(p.seed)
    settings = kl.EnvSettings.for_benchmark(env_p, benchmark)
    start = time.perf_counter()
    model = GroundedLM.load(paths.kalm_ground().model / benchmark)
    load_seconds = time.perf_counter() - start
    t0 = time.perf_counter()
    episodes = imagine_level(model, goals, p, settings)
    imagine_seconds = time.perf_counter() - t0
    steps = sum(len(e) for e in episodes)
    t0 = time.perf_counter()
    ep_goals = [goals[i % len(goals)] for i in range(len(episodes))]
    summary, rows = rollout_quality(episodes, None, settings, goals=ep_goals)
    replay_seconds = time.perf_counter() - t0
    with TrajectoryWriter(out.data) as writer:
        writer.extend(episodes)
    # The time breakdown lives in the plain-out report; the headline keeps one `seconds` column like every stage.
    timing = {"load_seconds": round(load_seconds, 1), "imagine_seconds": round(imagine_seconds, 1),
              "replay_seconds": round(replay_seconds, 1)}
    write_json(out.report, {
        "params": p.model_dump(), "horizon": horizon(p, benchmark), "summary": summary, "timing": timing,
        "rollouts": rows,
        "examples": [{"prompt": trajectory_prompt(e.mission) + " # <s0>", **episode_text(e)}
                     for e in episodes[:p.examples]]})
    metrics = {**summary, "goals": len(goals), "imagined_steps": steps,
               "transitions_per_s": round(steps / imagine_seconds, 1),
               "seconds": round(load_seconds + imagine_seconds + replay_seconds, 1), "env": fingerprint_line()}
    write_json(out.metrics, metrics)
    log.info("%s_%s: %s", benchmark, level, metrics)


if __name__ == "__main__":
    main()
