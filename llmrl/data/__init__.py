"""Trajectory data: one HDF5 layout for every environment, with d3rlpy and pandas conversions (``trajectories``), and
the frozen instruction embeddings (``embeddings``).

Import from the module that defines a name: importing this package loads neither.
"""

__all__: list[str] = []
