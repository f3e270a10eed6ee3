"""One HDF5 layout for episodes of any environment, checksummed so that damage is detected, never read as data.

File layout (``SCHEMA_VERSION`` in the root attributes)::

    user block (512 bytes)  "llmrl-trajectories sha256 <hex digest of every byte after the user block>"
    /                     attrs: schema_version, format="llmrl-trajectories", n_episodes
    /episodes/000000      attrs: env_id, seed, policy, mission, length, info (JSON)
        observations/<key>  [T, ...] numeric, or [T] UTF-8 text (fixed-length byte strings)
        actions             [T] int64 (discrete) or [T, d] float32 (continuous)   (optional)
        action_text         [T] UTF-8 text                                          (optional)
        rewards             [T] float32
        terminated          [T] bool   (true only at a terminal last step)
        truncated           [T] bool   (true only at a time-limit last step)

Observation t is the one the action t was taken in. Writers go through a temporary file renamed on close,
so a reader never sees a half-written file.

Damage: every non-empty dataset is chunked with HDF5's Fletcher-32 filter, which HDF5 checks on every read of
a chunk (a damaged block fails naming its field, in any HDF5 tool). What the filter does not cover (attributes,
names, shapes, HDF5's own metadata) is covered by the sha256 of the whole file after its user block (a block
HDF5 reserves for the application and skips), written when the file is closed and checked before HDF5 parses
anything: damaged HDF5 metadata can crash the HDF5 library or send it into an endless loop (measured with
random byte damage), so it must never see a damaged file. Every error of h5py or HDF5 on the way surfaces as
``TrajectoryFormatError`` naming the file and the field: a damaged file either reads as written or fails; it
never reads as other data.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

__all__ = ["SCHEMA_VERSION", "FORMAT_NAME", "USER_BLOCK", "TrajectoryFormatError", "Episode", "TrajectoryWriter",
           "TrajectoryReader", "read_episodes", "to_pandas", "to_d3rlpy"]

SCHEMA_VERSION = 2  # 2: Fletcher-32 on every dataset, text as fixed-length UTF-8 bytes, the file's sha256
FORMAT_NAME = "llmrl-trajectories"
USER_BLOCK = 512  # bytes before HDF5's superblock: the file's digest
DIGEST_MAGIC = b"llmrl-trajectories sha256 "
META_ATTRS = ("env_id", "seed", "policy", "mission", "length", "info")
# gzip inflates at most ~1032:1, so a dataset larger than this multiple of its file is a damaged shape
MAX_INFLATION = 1100


class TrajectoryFormatError(ValueError):
    """A trajectory file that is damaged, of another schema version, or missing a field; the message names the
    file and the field."""


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


def _text_bytes(values: Sequence[str], field: str) -> np.ndarray:
    """Text as fixed-length UTF-8 byte strings: a dtype the Fletcher-32 filter takes (variable-length strings
    live in HDF5's global heap, out of any filter's reach)."""
    encoded = [str(v).encode("utf-8") for v in values]
    if any(e.endswith(b"\0") for e in encoded):
        raise ValueError(f"Episode.{field}: text ending in a NUL character cannot be stored")
    return np.array(encoded, dtype=f"S{max([1, *map(len, encoded)])}")


def _episode_fields(ep: Episode) -> dict[str, np.ndarray | list[str]]:
    """The stored fields by path, text as lists of str: what the writer stores and the reader returns."""
    fields: dict[str, np.ndarray | list[str]] = {}
    for key, arr in ep.observations.items():
        fields[f"observations/{key}"] = [str(x) for x in arr] if arr.dtype == object else arr
    if ep.actions is not None:
        fields["actions"] = ep.actions
    if ep.action_text is not None:
        fields["action_text"] = [str(x) for x in ep.action_text]
    fields.update(rewards=ep.rewards, terminated=ep.terminated, truncated=ep.truncated)
    return fields


def _file_digest(fh) -> str:
    """sha256 of an open file's bytes after the user block."""
    fh.seek(USER_BLOCK)
    h = hashlib.sha256()
    while chunk := fh.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()


def _seal(path: Path) -> None:
    """Write the digest of the closed HDF5 file ``path`` into its user block."""
    with open(path, "r+b") as fh:
        header = DIGEST_MAGIC + _file_digest(fh).encode() + b"\n"
        fh.seek(0)
        fh.write(header.ljust(USER_BLOCK, b"\0"))


def _check_seal(path: Path) -> None:
    """The file's bytes are those its writer sealed, or ``TrajectoryFormatError`` naming the file."""
    with open(path, "rb") as fh:
        head = fh.read(USER_BLOCK)
        if not head.startswith(DIGEST_MAGIC):
            raise TrajectoryFormatError(f"{path}: field 'sha256' (the user block's digest) is missing: not a "
                                        f"trajectory file of schema {SCHEMA_VERSION} (re-run the stage that wrote "
                                        "it), or damaged")
        stored = head[len(DIGEST_MAGIC):len(DIGEST_MAGIC) + 64].decode("ascii", "replace")
        if _file_digest(fh) != stored:
            raise TrajectoryFormatError(f"{path}: field 'sha256' does not match the file's content: the file is "
                                        "damaged")


def _meta(ep: Episode) -> dict[str, Any]:
    return {"env_id": str(ep.env_id), "seed": int(ep.seed), "policy": str(ep.policy), "mission": str(ep.mission),
            "length": len(ep), "info": json.dumps(ep.info, sort_keys=True, default=str)}


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
            self.file = h5py.File(self.tmp, "w", userblock_size=USER_BLOCK)
            self.file.attrs["schema_version"] = SCHEMA_VERSION
            self.file.attrs["format"] = FORMAT_NAME
            self.file.create_group("episodes")
        self.n = len(self.file["episodes"])
        self.file.attrs["n_episodes"] = self.n

    def append(self, ep: Episode) -> None:
        fields = _episode_fields(ep)
        g = self.file["episodes"].create_group(f"{self.n:06d}")
        g.attrs.update(_meta(ep))
        for name, value in fields.items():
            data = _text_bytes(value, name) if isinstance(value, list) else value
            filters = {"fletcher32": True, "compression": "gzip" if data.size > 4096 else None} if data.size else {}
            g.create_dataset(name, data=data, **filters)
        self.n += 1
        self.file.attrs["n_episodes"] = self.n

    def extend(self, episodes: Sequence[Episode]) -> None:
        for ep in episodes:
            self.append(ep)

    def close(self) -> None:
        self.file.close()
        _seal(self.tmp)
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
    """Lazy access to a trajectory file: the file's digest is checked on opening, then episodes are read from disk
    one at a time (HDF5 checks each dataset's Fletcher-32 on reading it)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise FileNotFoundError(f"trajectory file {self.path} not found")
        _check_seal(self.path)
        self.file = None
        try:
            with self._reading(str(self.path), "the file's HDF5 structure"):
                self.file = h5py.File(self.path, "r")
            self._limit = MAX_INFLATION * self.path.stat().st_size + (1 << 20)
            with self._reading(str(self.path), "format"):
                attrs = self.file.attrs
                fmt = attrs.get("format")
            if fmt != FORMAT_NAME:
                raise TrajectoryFormatError(f"{self.path}: attribute 'format' is {fmt!r}, expected {FORMAT_NAME!r}")
            with self._reading(str(self.path), "schema_version"):
                version = attrs.get("schema_version")
                version = version.item() if isinstance(version, np.generic) else version
            if version != SCHEMA_VERSION:
                raise TrajectoryFormatError(f"{self.path}: field 'schema_version' is {version!r}; this llmrl reads "
                                            f"version {SCHEMA_VERSION} (re-run the stage that wrote the file)")
            with self._reading(str(self.path), "episodes"):
                if "episodes" not in self.file:
                    raise TrajectoryFormatError(f"{self.path}: missing group 'episodes'")
                names = sorted(self.file["episodes"].keys())
                n = attrs.get("n_episodes")
                n = n.item() if isinstance(n, np.generic) else n
            if names != [f"{i:06d}" for i in range(len(names))] or n != len(names):
                raise TrajectoryFormatError(f"{self.path}: group 'episodes' holds {len(names)} episodes named "
                                            f"{names[:3]}...; attribute 'n_episodes' says {n!r}")
        except BaseException:
            if self.file is not None:
                self.file.close()
            raise
        self._names = names

    @contextlib.contextmanager
    def _reading(self, where: str, field: str) -> Iterator[None]:
        """h5py and HDF5 errors (and numpy's on a damaged shape or dtype) as ``TrajectoryFormatError``."""
        try:
            yield
        except TrajectoryFormatError:
            raise
        except Exception as err:  # noqa: BLE001 - any failure to read a damaged file is named, never bare
            raise TrajectoryFormatError(f"{where}: field {field!r} is unreadable ({type(err).__name__}: "
                                        f"{err})") from err

    def __len__(self) -> int:
        return len(self._names)

    def _dataset(self, where: str, field: str, ds, length: int) -> np.ndarray | list[str]:
        with self._reading(where, field):
            shape, dtype = ds.shape, ds.dtype
            if not shape or shape[0] != length:
                raise TrajectoryFormatError(f"{where}: field {field!r} has shape {shape}, the episode's length is "
                                            f"{length}")
            if int(np.prod(shape, dtype=np.float64)) * dtype.itemsize > self._limit:
                raise TrajectoryFormatError(f"{where}: field {field!r} claims shape {shape} of {dtype}, more than "
                                            "the file could hold")
            data = ds[()]
            if dtype.kind == "S":
                return [bytes(x).decode("utf-8") for x in data]
            if dtype.kind not in "biuf":
                raise TrajectoryFormatError(f"{where}: field {field!r} has dtype {dtype}, not numeric or text")
            return data

    def __getitem__(self, i: int) -> Episode:
        name = self._names[i]
        where = f"{self.path}: episodes/{name}"
        with self._reading(where, "episodes/" + name):
            g = self.file["episodes"][name]
            attrs = {k: g.attrs[k] for k in g.attrs}
            members = {k: g[k] for k in g}
            obs_members = dict(g["observations"].items()) if isinstance(members.get("observations"), h5py.Group) \
                else None
        for required in ("observations", "rewards", "terminated", "truncated"):
            if required not in members:
                raise TrajectoryFormatError(f"{where}: missing field {required!r}")
        if obs_members is None:
            raise TrajectoryFormatError(f"{where}: field 'observations' is not a group")
        for required in META_ATTRS:
            if required not in attrs:
                raise TrajectoryFormatError(f"{where}: missing attribute {required!r}")
        with self._reading(where, "attributes"):
            meta = {k: (int(attrs[k]) if k in ("seed", "length") else str(attrs[k])) for k in META_ATTRS}
        length = meta["length"]
        fields = {f"observations/{k}": self._dataset(where, f"observations/{k}", ds, length)
                  for k, ds in sorted(obs_members.items())}
        for key in ("actions", "action_text", "rewards", "terminated", "truncated"):
            if key in members:
                fields[key] = self._dataset(where, key, members[key], length)
        try:
            info = json.loads(meta["info"])
            obs = {k.removeprefix("observations/"): np.asarray(v, dtype=object) if isinstance(v, list) else v
                   for k, v in fields.items() if k.startswith("observations/")}
            return Episode(observations=obs, rewards=fields["rewards"], terminated=fields["terminated"],
                           truncated=fields["truncated"], actions=fields.get("actions"),
                           action_text=fields.get("action_text"), mission=meta["mission"], env_id=meta["env_id"],
                           seed=meta["seed"], policy=meta["policy"], info=info)
        except (ValueError, TypeError) as err:
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
