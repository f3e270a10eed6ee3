"""The processes a training stage runs in: one (``python -m stages.<name>``) or N started by
``accelerate launch --multi_gpu --num_processes N -m stages.<name> <args>`` (DDP: over NCCL on GPUs, over gloo on CPU).

The stages that train with DDP (glam_train, kalm_ground, llm_rl_train, props_grpo) ask ``launched`` which process
they are; the main process writes the outputs, the others only share the updates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Launch", "launched"]


@dataclass(frozen=True)
class Launch:
    """This process of a stage's run."""

    device: str | None  # the device to put the model on: the process's own under accelerate, else the params' choice
    is_main: bool  # the process that writes the stage's outputs
    processes: int  # how many processes share the run
    accelerator: Any = None  # an ``accelerate.Accelerator`` where the stage's own loop shares the work (own_loop)


def launched(device: str | None = None, *, own_loop: bool = True) -> Launch:
    """Which process of the run this is. ``device`` is the params' device (None: CUDA where there is one).

    Under ``accelerate launch --num_processes N`` (``WORLD_SIZE`` > 1): with ``own_loop`` (the stage's training loop
    shares each batch through an ``Accelerator``) an Accelerator over the processes; without it (TRL's trainer
    starts its own Accelerator) accelerate's shared ``PartialState`` only. Either way on CPU when ``device`` says
    cpu or, without a device, where CUDA is missing: accelerate's state for processes on CPU needs ``cpu=True``,
    without it and without CUDA every process would run alone as if it were the only one.
    """
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    if processes <= 1:
        return Launch(device=device, is_main=True, processes=1)
    import torch

    cpu = device == "cpu" if device is not None else not torch.cuda.is_available()
    if own_loop:
        from accelerate import Accelerator

        accelerator = Accelerator(cpu=cpu)
        state = accelerator.state
    else:
        from accelerate import PartialState

        accelerator, state = None, PartialState(cpu=cpu)
    return Launch(device=str(state.device), is_main=state.is_main_process, processes=processes,
                  accelerator=accelerator)
