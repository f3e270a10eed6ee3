"""Damaged trajectory files are detected, never read as other data.

Without the file's digest, HDF5 itself crashed (SIGSEGV) or looped without end on some of these damages (measured:
of four runs of up to 1,500 random damages, two ended in a crash and two in a hang); with it, HDF5 never parses a
damaged file.

A written file is corrupted at random byte ranges (overwritten with random bytes, bit-flipped or zeroed, from one
byte to 4 KB); every read of the damaged copy must return the original episodes exactly or raise
``TrajectoryFormatError`` naming the file: never a bare h5py/HDF5 error, never different data.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmrl.data.trajectories import Episode, SCHEMA_VERSION, TrajectoryFormatError, TrajectoryReader, TrajectoryWriter
from llmrl.data.trajectories import FORMAT_NAME, USER_BLOCK


def _episodes() -> list[Episode]:
    """Every kind of field: image and scalar observations, text observations, discrete and continuous actions,
    action text, a compressed (large) observation, non-ASCII text, an empty info and an episode of one step."""
    rng = np.random.default_rng(0)
    out = []
    for i, T in enumerate((6, 1, 40)):
        term = np.zeros(T, bool)
        term[-1] = i != 1
        obs = {"image": rng.integers(0, 11, (T, 7, 7, 3), dtype=np.uint8), "direction": rng.integers(0, 4, T),
               "text": [f"you see a {'rouge' if t % 2 else 'grün'} ball {t} steps away" for t in range(T)]}
        if i == 2:
            obs["features"] = rng.normal(size=(T, 200)).astype(np.float32)  # > 4096 values: gzip + Fletcher-32
        continuous = i == 1
        actions = rng.normal(size=(T, 2)).astype(np.float32) if continuous else rng.integers(0, 6, T)
        out.append(Episode(observations=obs, actions=actions,
                           action_text=None if continuous else [f"turn {a}" for a in actions],
                           rewards=rng.random(T), terminated=term, truncated=np.zeros(T, bool),
                           mission=f"go to the ball {i}", env_id="BabyAI-GoToLocal-v0", seed=100 + i, policy="bot",
                           info={"success": bool(i % 2)} if i else {}))
    return out


def _same(a: Episode, b: Episode) -> bool:
    arrays = lambda e: {"rewards": e.rewards, "terminated": e.terminated, "truncated": e.truncated,  # noqa: E731
                        **({"actions": e.actions} if e.actions is not None else {}),
                        **{f"obs/{k}": v for k, v in e.observations.items()}}
    x, y = arrays(a), arrays(b)
    return (x.keys() == y.keys()
            and all(x[k].dtype == y[k].dtype and x[k].shape == y[k].shape
                    and (list(x[k]) == list(y[k]) if x[k].dtype == object else x[k].tobytes() == y[k].tobytes())
                    for k in x)
            and (a.action_text, a.mission, a.env_id, a.seed, a.policy, a.info)
            == (b.action_text, b.mission, b.env_id, b.seed, b.policy, b.info))


class _Written(tuple):
    """(path, bytes, episodes, folder) of the written file; a short repr in hypothesis' failure reports."""

    def __repr__(self) -> str:
        return f"<{self[0].name}: {len(self[1])} bytes, {len(self[2])} episodes>"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traj")
    path = folder / "demos.h5"
    episodes = _episodes()
    with TrajectoryWriter(path) as w:
        w.extend(episodes)
    return _Written((path, path.read_bytes(), episodes, folder))


def test_every_dataset_carries_fletcher32_and_the_file_its_digest(written):
    import hashlib

    import h5py

    path, original, episodes, _ = written
    with h5py.File(path, "r") as f:
        assert f.attrs["schema_version"] == SCHEMA_VERSION and f.attrs["format"] == FORMAT_NAME
        assert f.userblock_size == USER_BLOCK
        datasets = []
        f.visititems(lambda name, obj: datasets.append(obj) if isinstance(obj, h5py.Dataset) else None)
        assert len(datasets) == 8 + 7 + 9  # 3 observations + 5 fields; no action_text in 1; one more observation in 2
        assert all(ds.fletcher32 and ds.chunks for ds in datasets)
    digest = hashlib.sha256(original[USER_BLOCK:]).hexdigest().encode()
    assert original.startswith(b"llmrl-trajectories sha256 " + digest)
    with TrajectoryReader(path) as r:
        assert all(_same(a, b) for a, b in zip(episodes, r, strict=True))


def _read_all(path):
    with TrajectoryReader(path) as r:
        return [r[i] for i in range(len(r))]


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_damage_reads_as_written_or_fails_by_name(written, data):
    path, original, episodes, folder = written
    start = data.draw(st.integers(0, len(original) - 1), label="offset")
    length = data.draw(st.sampled_from([1, 2, 4, 8, 16, 64, 512, 4096]), label="length")
    end = min(len(original), start + length)
    how = data.draw(st.sampled_from(["random", "flip", "zero"]), label="how")
    if how == "random":
        patch = data.draw(st.binary(min_size=end - start, max_size=end - start), label="bytes")
    elif how == "flip":
        patch = bytes(b ^ 0xFF for b in original[start:end])
    else:
        patch = bytes(end - start)
    damaged = folder / "damaged.h5"
    damaged.write_bytes(original[:start] + patch + original[end:])
    try:
        back = _read_all(damaged)
    except TrajectoryFormatError as err:
        assert "damaged.h5" in str(err)
        return
    assert len(back) == len(episodes) and all(_same(a, b) for a, b in zip(episodes, back)), \
        f"{how} damage of bytes {start}..{end} read as other data"


def test_damaged_metadata_is_named(written):
    """An attribute HDF5 does not checksum (an episode's seed), changed in place: the file's digest names it."""
    import h5py

    path, original, _, folder = written
    copy = folder / "meta.h5"
    copy.write_bytes(original)
    with h5py.File(copy, "r+") as f:
        f["episodes/000001"].attrs["seed"] = 7
    with pytest.raises(TrajectoryFormatError, match=r"meta.h5: field 'sha256' does not match the file's content"):
        TrajectoryReader(copy)
