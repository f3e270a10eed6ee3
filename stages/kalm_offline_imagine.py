"""Stage kalm_offline_imagine@<algo>: d3rlpy's runs of ``algo`` (a key of kalm.offline.algos) on real data mixed with the grounded model's imagined rollouts (kalm.offline.mix_ratio),
one per seed (stages/kalm_offline_common.py).

Usage: python -m stages.kalm_offline_imagine <benchmark> <algo>.
"""

from stages.kalm_offline_common import run


def main(argv: list[str] | None = None) -> None:
    run("imagine", argv)


if __name__ == "__main__":
    main()
