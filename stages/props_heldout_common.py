"""What the held-out test's stages share (props_heldout_tuned, props_heldout_reference, props_heldout): their
params and one LLM optimizer's searches written as a stage output."""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
from pathlib import Path

import torch

from llmrl.algos.props_search import build_optimizer_llm
from llmrl.config.props import PropsGRPOParams, PropsHeldoutParams, PropsLLMParams, PropsSearchParams, \
    PropsSpaceParams
from llmrl.eval.props_heldout_runs import optimizer_runs
from llmrl.files import atomic_path, write_json
from llmrl.llm.faults import FaultGuard
from llmrl.seeding import seed_everything
from stages.common import stage_params
from stages.paths import ROOT, Outputs


@dataclasses.dataclass(frozen=True)
class HeldoutParams:
    search: PropsSearchParams
    llm: PropsLLMParams
    space: PropsSpaceParams
    grpo: PropsGRPOParams
    heldout: PropsHeldoutParams

    @classmethod
    def load(cls) -> HeldoutParams:
        return cls(search=stage_params("props.search", PropsSearchParams),
                   llm=stage_params("props.llm", PropsLLMParams),
                   space=stage_params("props.space", PropsSpaceParams),
                   grpo=stage_params("props.grpo", PropsGRPOParams),
                   heldout=stage_params("props.heldout", PropsHeldoutParams))

    @property
    def local_llm(self) -> PropsLLMParams:
        """The optimizer in-process: the model GRPO's adapters were trained on, for the base and the tuned alike."""
        return self.llm.model_copy(update={"backend": "local", "spec": self.grpo.model})


def write_runs(folder: Path, runs: list[dict], records: list[dict], **extra) -> None:
    """runs.json (``extra`` beside the runs) and records.jsonl, replacing ``folder`` whole."""
    with atomic_path(folder, is_dir=True) as tmp:
        write_json(tmp / "runs.json", {**extra, "runs": runs})
        (tmp / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def run_optimizer(p: HeldoutParams, out: Outputs, method: str, *, rep: int, adapter: Path | None,
                  log: logging.Logger) -> tuple[list[dict], list[dict]]:
    """One LLM optimizer (``adapter`` None: the base model) on every test function, sampling stream ``rep``, its
    replies cached under ``out.replies``; returns (runs, records)."""
    seed_everything(0)
    torch.set_num_threads(p.llm.threads)
    llm_p = p.local_llm
    opt = build_optimizer_llm(llm_p, adapter=adapter.relative_to(ROOT).as_posix() if adapter else None,
                              cache_dir=out.replies, guard=FaultGuard(p.llm.faults, "props.llm.faults"))
    runs, records = optimizer_runs(opt, method, rep, p.grpo, p.heldout, p.search, p.space, llm_p, log=log)
    del opt
    gc.collect()
    return runs, records
