"""Trajectory data: one HDF5 layout for every environment, with d3rlpy and pandas conversions."""

from llmrl.data.trajectories import (
    SCHEMA_VERSION,
    Episode,
    TrajectoryFormatError,
    TrajectoryReader,
    TrajectoryWriter,
    read_episodes,
    to_d3rlpy,
    to_pandas,
)

__all__ = [
    "SCHEMA_VERSION", "Episode", "TrajectoryFormatError", "TrajectoryReader", "TrajectoryWriter",
    "read_episodes", "to_d3rlpy", "to_pandas",
]
