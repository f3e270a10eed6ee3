"""One HDF5 layout for episodes of any environment.

File layout (``SCHEMA_VERSION`` in the root attributes)::

    /                     attrs: schema_version, format="llmrl-trajectories", n_episodes
    /episodes/000000      attrs: env_id, seed, policy, mission, length, info (JSON)
        observations/<key>  [T, ...] numeric, or [T] UTF-8 strings (text observations)
        actions             [T] int64 (discrete) or [T, d] float32 (continuous)   (optional)
        action_text         [T] UTF-8 strings                                       (optional)
        rewards             [T] float32
        terminated          [T] bool   (true only at a terminal last step)
        truncated           [T] bool   (true only at a time-limit last step)

Observation t is the one the action t was taken in. Writers go through a temporary file renamed on close,
so a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

__all__ = ["SCHEMA_VERSION", "TrajectoryFormatError", "Episode", "TrajectoryWriter", "TrajectoryReader",
           "read_episodes", "to_pandas", "to_d3rlpy"]

SCHEMA_VERSION = 1
FORMAT_NAME = "llmrl-trajectories"
_STR = h5py.string_dtype(encoding="utf-8")


class TrajectoryFormatError(ValueError):
    """A trajectory file that is corrupt, of another schema version, or missing a field."""


@dataclass
class Episode:
    """One episode. Arrays have the episode length T as first axis."""

    observations: dict[str, np.ndarray]
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    actions: np.ndarray | None = None
    action_text: list[str] | None = None
    mission: str = ""
    env_id: str = ""
    seed: int = -1
    policy: str = ""
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rewards = np.asarray(self.rewards, dtype=np.float32)
        self.terminated = np.asarray(self.terminated, dtype=bool)
        self.truncated = np.asarray(self.truncated, dtype=bool)
        self.observations = {k: _as_obs_array(v) for k, v in self.observations.items()}
        if self.actions is not None:
            a = np.asarray(self.actions)
            self.actions = a.astype(np.int64) if np.issubdtype(a.dtype, np.integer) else a.astype(np.float32)
        T = len(self.rewards)
        for name, arr in [("terminated", self.terminated), ("truncated", self.truncated),
                          *[(f"observations/{k}", v) for k, v in self.observations.items()],
                          *([("actions", self.actions)] if self.actions is not None else []),
                          *([("action_text", self.action_text)] if self.action_text is not None else [])]:
            if len(arr) != T:
                raise ValueError(f"Episode.{name}: length {len(arr)} differs from rewards' length {T}")

    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def total_return(self) -> float:
        return float(self.rewards.sum())

    @property
    def success(self) -> bool:
        return bool(self.info.get("success", bool(self.terminated[-1]) and self.rewards[-1] > 0)) if len(self) else False


def _as_obs_array(v: Any) -> np.ndarray:
    arr = np.asarray(v)
    if arr.dtype.kind in ("U", "S", "O"):
        return np.asarray([str(x) for x in v], dtype=object)
    return arr


class TrajectoryWriter:
    """Append episodes to ``path`` atomically.

    Work happens on a temporary copy (the existing file's episodes kept when ``append``); ``close()`` renames
    it over ``path``. An exception inside ``with`` discards the temporary and leaves ``path`` as it was.
    """

    def __init__(self, path: str | os.PathLike, *, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp")
        if append and self.path.exists():
            TrajectoryReader(self.path).close()  # validates before copying
            shutil.copyfile(self.path, self.tmp)
            self.file = h5py.File(self.tmp, "a")
        else:
            self.file = h5py.File(self.tmp, "w")
            self.file.attrs["schema_version"] = SCHEMA_VERSION
            self.file.attrs["format"] = FORMAT_NAME
            self.file.create_group("episodes")
        self.n = len(self.file["episodes"])
        self.file.attrs["n_episodes"] = self.n

    def append(self, ep: Episode) -> None:
        g = self.file["episodes"].create_group(f"{self.n:06d}")
        g.attrs.update(env_id=ep.env_id, seed=ep.seed, policy=ep.policy, mission=ep.mission, length=len(ep),
                       info=json.dumps(ep.info, sort_keys=True, default=str))
        obs = g.create_group("observations")
        for key, arr in ep.observations.items():
            if arr.dtype == object:
                obs.create_dataset(key, data=arr.astype(str).tolist(), dtype=_STR)
            else:
                obs.create_dataset(key, data=arr, compression="gzip" if arr.size > 4096 else None)
        if ep.actions is not None:
            g.create_dataset("actions", data=ep.actions)
        if ep.action_text is not None:
            g.create_dataset("action_text", data=list(ep.action_text), dtype=_STR)
        g.create_dataset("rewards", data=ep.rewards)
        g.create_dataset("terminated", data=ep.terminated)
        g.create_dataset("truncated", data=ep.truncated)
        self.n += 1
        self.file.attrs["n_episodes"] = self.n

    def extend(self, episodes: Sequence[Episode]) -> None:
        for ep in episodes:
            self.append(ep)

    def close(self) -> None:
        self.file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        self.file.close()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class TrajectoryReader:
    """Lazy access to a trajectory file: episodes are read from disk one at a time."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.file = h5py.File(self.path, "r")
        except FileNotFoundError:
            raise
        except OSError as err:
            raise TrajectoryFormatError(f"{self.path}: not a readable HDF5 trajectory file ({err})") from err
        attrs = self.file.attrs
        if attrs.get("format") != FORMAT_NAME:
            self.file.close()
            raise TrajectoryFormatError(f"{self.path}: attribute 'format' is {attrs.get('format')!r}, "
                                        f"expected {FORMAT_NAME!r}")
        version = attrs.get("schema_version")
        version = version.item() if isinstance(version, np.generic) else version
        if version != SCHEMA_VERSION:
            self.file.close()
            raise TrajectoryFormatError(f"{self.path}: field 'schema_version' is {version!r}; "
                                        f"this llmrl reads version {SCHEMA_VERSION}")
        if "episodes" not in self.file:
            self.file.close()
            raise TrajectoryFormatError(f"{self.path}: missing group 'episodes'")
        self._names = sorted(self.file["episodes"].keys())

    def __len__(self) -> int:
        return len(self._names)

    def __getitem__(self, i: int) -> Episode:
        name = self._names[i]
        g = self.file["episodes"][name]
        where = f"{self.path}: episodes/{name}"
        for required in ("observations", "rewards", "terminated", "truncated"):
            if required not in g:
                raise TrajectoryFormatError(f"{where}: missing field {required!r}")
        for required in ("env_id", "seed", "policy", "mission", "info"):
            if required not in g.attrs:
                raise TrajectoryFormatError(f"{where}: missing attribute {required!r}")
        def read(field: str, ds, *, text: bool = False):
            # A damaged data block surfaces in h5py as a bare OSError ("Can't read data"): name file and field.
            try:
                return ds.asstr()[()] if text else ds[()]
            except (OSError, KeyError, ValueError) as err:
                raise TrajectoryFormatError(f"{where}: field {field!r} is unreadable ({err})") from err

        obs = {}
        for key in g["observations"]:
            ds = g["observations"][key]
            obs[key] = (np.asarray(read(f"observations/{key}", ds, text=True), dtype=object)
                        if ds.dtype.kind == "O" else read(f"observations/{key}", ds))
        fields = {name: read(name, g[name]) for name in ("rewards", "terminated", "truncated")}
        actions = read("actions", g["actions"]) if "actions" in g else None
        action_text = list(read("action_text", g["action_text"], text=True)) if "action_text" in g else None
        try:
            info = json.loads(g.attrs["info"])
        except (json.JSONDecodeError, TypeError) as err:
            raise TrajectoryFormatError(f"{where}: attribute 'info' is not JSON ({err})") from err
        try:
            return Episode(observations=obs, **fields, actions=actions, action_text=action_text,
                           mission=str(g.attrs["mission"]), env_id=str(g.attrs["env_id"]),
                           seed=int(g.attrs["seed"]), policy=str(g.attrs["policy"]), info=info)
        except ValueError as err:
            raise TrajectoryFormatError(f"{where}: inconsistent fields ({err})") from err

    def __iter__(self) -> Iterator[Episode]:
        for i in range(len(self)):
            yield self[i]

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> TrajectoryReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_episodes(path: str | os.PathLike) -> list[Episode]:
    with TrajectoryReader(path) as r:
        return list(r)


def to_pandas(episodes: Sequence[Episode]):
    """One row per step: episode index, step, metadata, rewards, flags, actions and scalar/text observations.

    Image-like observations (more than one value per step) are left out; use the arrays for those.
    """
    import pandas as pd

    frames = []
    for i, ep in enumerate(episodes):
        T = len(ep)
        cols: dict[str, Any] = {
            "episode": np.full(T, i), "step": np.arange(T), "env_id": ep.env_id, "seed": ep.seed,
            "policy": ep.policy, "mission": ep.mission, "reward": ep.rewards,
            "terminated": ep.terminated, "truncated": ep.truncated,
        }
        if ep.actions is not None:
            cols["action"] = list(ep.actions) if ep.actions.ndim > 1 else ep.actions
        if ep.action_text is not None:
            cols["action_text"] = ep.action_text
        for key, arr in ep.observations.items():
            if arr.dtype == object or arr.ndim == 1:
                cols[f"obs_{key}"] = arr
        frames.append(pd.DataFrame(cols))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def to_d3rlpy(episodes: Sequence[Episode], observation_keys: Sequence[str] | None = None, *,
              discrete: bool | None = None, condition=None, action_size: int | None = None):
    """A d3rlpy ``MDPDataset``: chosen numeric observation keys flattened and concatenated per step.

    ``condition(episode) -> [c]`` (optional) appends one fixed vector to every step of an episode, e.g. an
    instruction embedding for goal-conditioned policies (KALM). ``action_size`` fixes the number of discrete
    actions (d3rlpy otherwise infers max action + 1 from the data, which differs between datasets).
    """
    from d3rlpy.dataset import MDPDataset

    if not episodes:
        raise ValueError("to_d3rlpy: no episodes")
    keys = list(observation_keys) if observation_keys else [
        k for k, v in episodes[0].observations.items() if v.dtype != object
    ]
    obs, acts, rews, terms, touts = [], [], [], [], []
    for ep in episodes:
        if ep.actions is None:
            raise TrajectoryFormatError(f"to_d3rlpy: episode of {ep.env_id!r} seed {ep.seed} has no field 'actions'")
        for k in keys:
            if k not in ep.observations or ep.observations[k].dtype == object:
                raise TrajectoryFormatError(f"to_d3rlpy: observation field {k!r} missing or not numeric")
        parts = [ep.observations[k].reshape(len(ep), -1).astype(np.float32) for k in keys]
        if condition is not None:
            c = np.asarray(condition(ep), dtype=np.float32).reshape(1, -1)
            parts.append(np.repeat(c, len(ep), axis=0))
        obs.append(np.concatenate(parts, 1))
        acts.append(ep.actions)
        rews.append(ep.rewards)
        terms.append(ep.terminated.astype(np.float32))
        tout = ep.truncated.astype(np.float32)
        if not ep.terminated[-1] and not ep.truncated[-1]:
            tout[-1] = 1.0  # an episode cut short by the recorder still needs a boundary for d3rlpy
        touts.append(tout)
    actions = np.concatenate(acts)
    if discrete is None:
        discrete = np.issubdtype(actions.dtype, np.integer)
    from d3rlpy.constants import ActionSpace

    return MDPDataset(
        observations=np.concatenate(obs),
        actions=actions.reshape(-1, 1) if discrete else actions.reshape(len(actions), -1),
        rewards=np.concatenate(rews).reshape(-1, 1),
        terminals=np.concatenate(terms),
        timeouts=np.concatenate(touts),
        action_space=ActionSpace.DISCRETE if discrete else ActionSpace.CONTINUOUS,
        action_size=action_size,
    )
