"""The d3rlpy runs of stages kalm_offline_real@<algo> and kalm_offline_imagine@<algo> (one stage per data kind, so that
an imagine run depends on its own benchmark's imagined rollouts: a foreach over kalm.offline.algos names an item's
benchmark, a matrix item cannot): one run per seed of kalm.offline.seeds, ``kalm.offline.workers`` at a time (each
alone in a single-threaded process).

Reads data/kalm/real/<benchmark>.h5 and embeddings.npz; the imagine run (real + imagined) also
data/kalm/imagine/<benchmark>/<level>.h5 for each of kalm.offline.imagined_levels. Writes, per seed k,
models/kalm/offline/<benchmark>/<algo>-<data>/seed-k/ (model.d3, loadable with d3rlpy.load_learnable; projection.npz, the
instruction projection it reads, applied by OfflinePolicy.load's policy; policy_input.json: whether its input
carries BabyAI's egocentric features, kalm.env.babyai_egocentric_input; train.json: curve, mix, time) and a
dvclive loss curve under plots/kalm/offline/<benchmark>/<algo>-<data>/seed-k/; the item's folders are published
together.
"""

import functools
import time
from pathlib import Path

from llmrl.agents.offline_policy import save_learnable
from llmrl.algos.kalm_offline import build_dataset, fit_projection, make_learnable, mix_episodes, train_offline
from llmrl.config.kalm import DataKind, KalmEnvParams, KalmOfflineParams
from llmrl.data.trajectories import read_episodes
from llmrl.fingerprint import fingerprint_line
from llmrl.data.embeddings import EmbeddingTable
from llmrl.files import write_json
from llmrl.parallel import run_seeds_into
from stages import paths
from stages.common import log, open_live, stage_arguments, stage_params

REAL = paths.kalm_data().real


def imagined_paths(benchmark: str, levels) -> list:
    return [paths.kalm_imagine(benchmark, level).data for level in levels]


def run_seed(name: str, data: str, seed: int, *, models: Path, plots: Path) -> None:
    p = stage_params("kalm.offline", KalmOfflineParams)
    algo = p.algos[name]
    egocentric = stage_params("kalm.env", KalmEnvParams).egocentric_input(algo.benchmark)
    run = f"{name}-{data}-{seed}"
    episodes = read_episodes(REAL / f"{algo.benchmark}.h5")
    table = EmbeddingTable.load(REAL / "embeddings.npz")
    projection = fit_projection(episodes, table, algo)  # on the real training instructions, for both arms
    mix = None
    if data == "imagine":
        imagined = []
        for path in imagined_paths(algo.benchmark, p.imagined_levels):
            if not path.is_file():
                raise FileNotFoundError(f"kalm_offline {run}: imagined data file {path} is missing (stage "
                                        "kalm_imagine)")
            imagined += read_episodes(path)
        episodes, stats = mix_episodes(episodes, imagined, p.mix_ratio, seed)
        # generated and passed-filter counts per level are kalm_imagine's (rollouts, written); used is this mix's
        mix = {"real_steps": stats.real_steps, "imagined_steps": stats.imagined_steps,
               "imagined_passed": stats.imagined_available, "imagined_used": stats.imagined_episodes,
               "imagined_share": round(stats.imagined_share, 4), "mix_ratio": p.mix_ratio}
        log.info("%s: real + imagined dataset %s", run, mix)
    dataset = build_dataset(episodes, table, algo.benchmark, projection, egocentric=egocentric)
    learnable = make_learnable(algo, seed, p.threads)
    rows = []
    start = time.perf_counter()
    with open_live(plots / f"seed-{seed}") as live:
        for row in train_offline(learnable, dataset, algo.steps, p.log_every):
            rows.append(row)
            live.step = row["step"]
            for key, value in row.items():
                if key != "step":
                    live.log_metric(key, value)
    seconds = time.perf_counter() - start
    out = models / f"seed-{seed}"
    out.mkdir(parents=True)
    # with its folder's checksums, checked by OfflinePolicy.load
    save_learnable(learnable, out / "model.d3", projection, egocentric=egocentric)
    write_json(out / "train.json", {
        "algo": algo.algo, "benchmark": algo.benchmark, "data": data, "seed": seed, "steps": algo.steps,
        "transitions": dataset.transition_count, "episodes": len(episodes), "mix": mix,
        "seconds": round(seconds, 2), "updates_per_s": round(algo.steps / seconds, 1),
        "curve": rows, "env": fingerprint_line()})
    log.info("%s: %d updates in %.1fs (%.0f/s)", run, algo.steps, seconds, algo.steps / seconds)


def run(data: DataKind, argv: list[str] | None = None) -> None:
    """The stage kalm_offline_<data>: ``argv`` is <benchmark> <algo>, as dvc.yaml's cmd gives them."""
    stage = f"kalm_offline_{data}"
    args = stage_arguments(stage, argv, benchmark="the algorithm's benchmark", algo="a key of kalm.offline.algos")
    p = stage_params("kalm.offline", KalmOfflineParams)
    if args.algo not in p.algos:
        raise SystemExit(f"{stage}: algo {args.algo!r} is not in kalm.offline.algos ({sorted(p.algos)})")
    if p.algos[args.algo].benchmark != args.benchmark:
        raise SystemExit(f"{stage}: algo {args.algo!r} trains on {p.algos[args.algo].benchmark}, not "
                         f"{args.benchmark!r} (kalm.offline.algos.{args.algo}.benchmark)")
    run_seeds_into(dict(paths.kalm_offline(args.benchmark, args.algo, data)),
                   functools.partial(run_seed, args.algo, data), p.seeds, p.workers)
