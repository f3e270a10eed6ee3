"""Stage kalm_offline_real@<algo>: d3rlpy's runs of ``algo`` (a key of kalm.offline.algos) on the real offline data alone,
one per seed (stages/kalm_offline_common.py).

Usage: python -m stages.kalm_offline_real <benchmark> <algo>.
"""

from stages.kalm_offline_common import run


def main(argv: list[str] | None = None) -> None:
    run("real", argv)


if __name__ == "__main__":
    main()
