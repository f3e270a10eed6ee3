"""Stage kalm_data: expert episodes on KALM's training goals and the frozen instruction embeddings.

Writes data/kalm/real/<benchmark>.h5 (train-split goals only, from train initial states; layout in
llmrl.envs.kalm_episodes), data/kalm/real/<benchmark>_validation.h5 (validation phrasings of the training tasks, from
validation initial states: the grounding's held-out set), data/kalm/real/embeddings.npz
(every goal's instruction on both benchmarks, all splits: a cache of a frozen function, not training data), and
metrics/kalm/data.json (episodes, steps, expert success, agreement of the observation success rule with each env's
own success on the training data and on a few expert episodes per test task, time).
"""

import time

import numpy as np
import torch
from tqdm.auto import tqdm

from llmrl.config.kalm import KalmDataParams, KalmEnvParams
from llmrl.envs.kalm_episodes import episode_seeds, expert_episodes, rule_agreement
from llmrl.data.trajectories import TrajectoryWriter
from llmrl.envs import kalm_levels as kl
from llmrl.fingerprint import fingerprint_line
from llmrl.files import atomic_path, write_json
from llmrl.llm.embed import build_table
from llmrl.llm.load import load_model
from llmrl.seeding import seed_everything
from stages import paths
from stages.common import log, stage_arguments, stage_params

OUT = paths.kalm_data().real


def main(argv: list[str] | None = None) -> None:
    stage_arguments("kalm_data", argv)
    p = stage_params("kalm.data", KalmDataParams)
    env_p = stage_params("kalm.env", KalmEnvParams)
    seed_everything(p.seed)
    metrics: dict = {"env": fingerprint_line()}
    with atomic_path(OUT, is_dir=True) as out:
        for benchmark in p.benchmarks:
            start = time.perf_counter()
            n_per_task = p.metaworld_episodes_per_task if benchmark == "metaworld" else p.babyai_episodes_per_task
            train_goals = kl.goals(benchmark, "train")
            kl.check_seed_range("train", p.seed, episode_seeds(train_goals, n_per_task), "kalm.data.seed")
            kl.check_seed_range("validation", p.validation_seed,
                                episode_seeds(kl.goals(benchmark, "validation"), p.validation_episodes_per_task),
                                "kalm.data.validation_seed")
            settings = kl.EnvSettings.for_benchmark(env_p, benchmark)
            episodes = []
            with TrajectoryWriter(out / f"{benchmark}.h5") as writer:
                for ep in tqdm(expert_episodes(benchmark, train_goals, n_per_task, seed=p.seed,
                                               settings=settings, action_noise=p.action_noise),
                               desc=f"kalm_data {benchmark}", total=n_per_task * len({g.task for g in train_goals})):
                    writer.append(ep)
                    episodes.append(ep)
            with TrajectoryWriter(out / f"{benchmark}_validation.h5") as writer:
                validation = list(expert_episodes(benchmark, kl.goals(benchmark, "validation"),
                                                  p.validation_episodes_per_task, seed=p.validation_seed,
                                                  settings=settings, action_noise=p.action_noise))
                writer.extend(validation)
            seconds = time.perf_counter() - start
            test_eps = []
            if p.agreement_test_episodes:
                test_goals = [g for g in kl.goals(benchmark, "test") if g.level != "rephrase"]
                test_eps = list(expert_episodes(benchmark, test_goals, p.agreement_test_episodes, seed=p.seed,
                                                settings=settings, action_noise=p.action_noise))
            steps = int(sum(len(e) for e in episodes))
            metrics[benchmark] = {
                "episodes": len(episodes), "steps": steps, "validation_episodes": len(validation),
                "expert_success": round(float(np.mean([e.info["success"] for e in episodes])), 4),
                "rule_success": round(float(np.mean([e.info["rule_success"] for e in episodes])), 4),
                "rule_agreement_train": rule_agreement(episodes)["agreement"],
                "rule_agreement_test": rule_agreement(test_eps)["agreement"] if test_eps else None,
                "seconds": round(seconds, 1),
            }
            write_json(out / f"{benchmark}_rule_agreement.json",
                       {"train": rule_agreement(episodes), "test_levels": rule_agreement(test_eps) if test_eps else None})
            log.info("%s: %d episodes, %d steps in %.1fs; %s", benchmark, len(episodes), steps, seconds,
                     metrics[benchmark])
        start = time.perf_counter()
        torch.set_num_threads(p.threads)
        llm = load_model(p.embed_model, device="cpu", dtype="float32")
        texts = [g.instruction for b in kl.BENCHMARKS for g in kl.all_goals(b)]
        table = build_table(llm, texts, p.embed_batch_size)
        table.save(out / "embeddings.npz")
        metrics["embeddings"] = {"instructions": len(table), "dim": table.dim,
                                 "seconds": round(time.perf_counter() - start, 1)}
        log.info("embedded %d instructions (dim %d)", len(table), table.dim)
    write_json(paths.kalm_data().metrics, metrics)


if __name__ == "__main__":
    main()
