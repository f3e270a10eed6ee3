"""Seeds side by side (llmrl.parallel.run_seeds): same outputs as one after another; a failing seed fails the call."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from llmrl.parallel import run_seeds


def train_tiny(seed: int, *, out: Path) -> None:
    """A seeded torch update written to disk: what a stage's per-seed run does, in miniature."""
    import torch

    from llmrl.files import save_torch

    torch.manual_seed(seed)
    net = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(16, 4)
    for _ in range(5):
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
    save_torch(net.state_dict(), out / f"seed-{seed}.pt")


def fail_on_two(seed: int) -> None:
    if seed == 2:
        raise RuntimeError("seed 2 broke")


def test_parallel_seeds_give_the_bytes_of_serial_seeds(tmp_path):
    serial, parallel = tmp_path / "serial", tmp_path / "parallel"
    serial.mkdir(), parallel.mkdir()
    run_seeds(functools.partial(train_tiny, out=serial), [0, 1, 2], workers=1)
    run_seeds(functools.partial(train_tiny, out=parallel), [0, 1, 2], workers=2)
    for f in serial.iterdir():
        assert (parallel / f.name).read_bytes() == f.read_bytes(), f.name
    assert len({f.read_bytes() for f in serial.iterdir()}) == 3  # the seeds differ


def test_a_failing_seed_fails_the_call():
    with pytest.raises(RuntimeError, match="seed 2 broke"):
        run_seeds(fail_on_two, [0, 1, 2, 3], workers=2)
    with pytest.raises(ValueError, match="workers"):
        run_seeds(fail_on_two, [0], workers=0)


def write_seed(seed: int, *, models: Path, plots: Path) -> None:
    if seed == 2:
        raise RuntimeError("seed 2 broke")
    (models / f"seed-{seed}.txt").write_text(f"model {seed}")
    (plots / f"seed-{seed}.txt").write_text(f"curve {seed}")


def test_seeds_into_folders_publish_together_or_not_at_all(tmp_path):
    from llmrl.parallel import run_seeds_into

    folders = {"models": tmp_path / "models" / "group", "plots": tmp_path / "plots" / "group"}
    run_seeds_into(folders, write_seed, [0, 1], workers=1)
    assert sorted(f.name for f in folders["models"].iterdir()) == ["seed-0.txt", "seed-1.txt"]
    assert (folders["plots"] / "seed-1.txt").read_text() == "curve 1"
    with pytest.raises(RuntimeError, match="seed 2 broke"):
        run_seeds_into(folders, write_seed, [3, 2], workers=1)
    # The failed item changed nothing: the previous seeds' folders stay whole, no temporary is left beside them.
    assert sorted(f.name for f in folders["models"].iterdir()) == ["seed-0.txt", "seed-1.txt"]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["group"]
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["group"]
