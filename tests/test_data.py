import h5py
import numpy as np
import pytest

from llmrl.data.trajectories import (Episode, read_episodes, to_d3rlpy, to_pandas, TrajectoryFormatError,
                                     TrajectoryReader, TrajectoryWriter, USER_BLOCK)


def _episode(T=5, seed=0, text=True, continuous=False):
    rng = np.random.default_rng(seed)
    obs = {"image": rng.integers(0, 10, (T, 7, 7, 3), dtype=np.uint8), "direction": rng.integers(0, 4, T)}
    if text:
        obs["text"] = [f"You see a wall {i} steps forward" for i in range(T)]
    actions = rng.normal(size=(T, 2)).astype(np.float32) if continuous else rng.integers(0, 6, T)
    term = np.zeros(T, bool)
    term[-1] = True
    return Episode(observations=obs, actions=actions, action_text=None if continuous else [f"a{a}" for a in actions],
                   rewards=np.r_[np.zeros(T - 1), 0.8], terminated=term, truncated=np.zeros(T, bool),
                   mission="go to the red ball", env_id="BabyAI-GoToLocal-v0", seed=seed, policy="bot",
                   info={"success": True})


def test_round_trip_and_append(tmp_path):
    path = tmp_path / "d.h5"
    eps = [_episode(5, 0), _episode(7, 1)]
    with TrajectoryWriter(path) as w:
        w.extend(eps)
    with TrajectoryWriter(path, append=True) as w:
        w.append(_episode(3, 2))
    back = read_episodes(path)
    assert len(back) == 3
    for a, b in zip(eps, back):
        for k in a.observations:
            np.testing.assert_array_equal(a.observations[k], b.observations[k])
        np.testing.assert_array_equal(a.actions, b.actions)
        assert a.action_text == b.action_text and a.mission == b.mission and b.info == {"success": True}
        np.testing.assert_array_equal(a.rewards, b.rewards)
    assert back[2].seed == 2 and back[0].observations["text"][1] == "You see a wall 1 steps forward"
    with TrajectoryReader(path) as r:  # lazy: index without reading everything
        assert len(r) == 3 and len(r[1]) == 7


def test_interrupted_writer_keeps_previous_file(tmp_path):
    path = tmp_path / "d.h5"
    with TrajectoryWriter(path) as w:
        w.append(_episode(4))
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with TrajectoryWriter(path) as w:
            w.append(_episode(5))
            raise RuntimeError("killed")
    assert path.read_bytes() == before
    assert not list(tmp_path.glob(".*.tmp"))


def _reseal(path) -> None:
    """Write the file's digest again after editing it with h5py, as the writer does (the user block's format), so
    the reader's own checks of a structurally wrong file are reached."""
    import hashlib

    data = path.read_bytes()
    header = b"llmrl-trajectories sha256 " + hashlib.sha256(data[USER_BLOCK:]).hexdigest().encode() + b"\n"
    path.write_bytes(header.ljust(USER_BLOCK, b"\0") + data[USER_BLOCK:])


def test_corrupt_and_wrong_schema(tmp_path):
    bad = tmp_path / "corrupt.h5"
    bad.write_bytes(b"not an hdf5 file at all")
    with pytest.raises(TrajectoryFormatError, match="corrupt.h5"):
        TrajectoryReader(bad)
    path = tmp_path / "v.h5"
    with TrajectoryWriter(path) as w:
        w.append(_episode(3))
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 99
    with pytest.raises(TrajectoryFormatError, match="v.h5: field 'sha256' does not match"):
        TrajectoryReader(path)  # an edit the writer did not seal
    _reseal(path)
    with pytest.raises(TrajectoryFormatError, match="v.h5: field 'schema_version' is 99"):
        TrajectoryReader(path)
    path2 = tmp_path / "missing.h5"
    with TrajectoryWriter(path2) as w:
        w.append(_episode(3))
    with h5py.File(path2, "a") as f:
        del f["episodes/000000/rewards"]
    _reseal(path2)
    with pytest.raises(TrajectoryFormatError, match="missing.h5: episodes/000000: missing field 'rewards'"):
        read_episodes(path2)


def test_episode_length_mismatch():
    with pytest.raises(ValueError, match="Episode.terminated"):
        Episode(observations={}, rewards=np.zeros(3), terminated=np.zeros(2), truncated=np.zeros(3))


def test_d3rlpy_and_pandas(tmp_path):
    eps = [_episode(5, 0), _episode(6, 1)]
    ds = to_d3rlpy(eps, ["image", "direction"])
    assert ds.size() == 2
    ep0 = ds.episodes[0]
    assert ep0.observations.shape == (5, 7 * 7 * 3 + 1)
    np.testing.assert_array_equal(ep0.actions[:, 0], eps[0].actions)
    assert bool(ep0.terminated)
    cont = to_d3rlpy([_episode(4, 3, continuous=True)], ["direction"])
    assert cont.episodes[0].actions.shape == (4, 2)
    df = to_pandas(eps)
    assert len(df) == 11 and {"episode", "step", "reward", "action", "obs_text", "mission"} <= set(df.columns)
    with pytest.raises(TrajectoryFormatError, match="'text'"):
        to_d3rlpy(eps, ["text"])


def test_damaged_data_block_names_file_and_field(tmp_path):
    """Bytes of one dataset's chunk overwritten on disk: the file's digest fails first; in a file whose digest was
    written over the damage, HDF5's Fletcher-32 check fails the read, named as TrajectoryFormatError (any HDF5
    tool reading the file without llmrl sees the Fletcher-32 error too)."""
    path = tmp_path / "damaged.h5"
    ep = Episode(observations={"image": np.arange(4000, dtype=np.float32).reshape(1000, 4)},
                 rewards=np.ones(1000), terminated=np.zeros(1000, bool), truncated=np.zeros(1000, bool))
    with TrajectoryWriter(path) as w:
        w.append(ep)
    with h5py.File(path, "r") as f:
        assert f["episodes/000000/rewards"].fletcher32
        offset = f["episodes/000000/rewards"].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(offset + 8)
        fh.write(b"\xff" * 16)
    with pytest.raises(TrajectoryFormatError, match=r"damaged.h5: field 'sha256' does not match"):
        TrajectoryReader(path)
    with h5py.File(path, "r") as f, pytest.raises(OSError, match="filter returned failure"):
        assert f["episodes/000000/rewards"].compression is None  # Fletcher-32 is its only filter
        f["episodes/000000/rewards"][()]
    _reseal(path)
    with TrajectoryReader(path) as r, pytest.raises(TrajectoryFormatError, match=r"damaged.h5: episodes/000000: "
                                                                             r"field 'rewards' is unreadable"):
        r[0]
