"""Stage base_llm: materialise the base model spec into models/base_llm/ (safetensors + tokenizer)."""

from common import log, prepare_stage_process, stage_params  # isort: skip

prepare_stage_process()

import paths  # isort: skip

import torch

from llmrl.config import BaseLLMParams
from llmrl.llm import load_model, save_model

OUT = paths.base_llm().model


def main() -> None:
    p = stage_params("base_llm", BaseLLMParams)
    torch.set_num_threads(p.threads)
    llm = load_model(p.spec, device="cpu", dtype="float32")
    model = llm.model
    save_model(model, llm.tokenizer, OUT)
    n = sum(t.numel() for t in model.parameters())
    log.info("saved %s (%.1fM parameters) to %s", p.spec, n / 1e6, OUT)


if __name__ == "__main__":
    main()
