"""Stage base_llm: materialise the base model spec into models/base_llm/ (safetensors + tokenizer)."""

import torch

from llmrl.config import BaseLLMParams
from llmrl.llm.load import load_model, save_model
from stages import paths
from stages.common import log, stage_arguments, stage_params

OUT = paths.base_llm().model


def main(argv: list[str] | None = None) -> None:
    stage_arguments("base_llm", argv)
    p = stage_params("base_llm", BaseLLMParams)
    torch.set_num_threads(p.threads)
    llm = load_model(p.spec, device="cpu", dtype="float32")
    model = llm.model
    save_model(model, llm.tokenizer, OUT)
    n = sum(t.numel() for t in model.parameters())
    log.info("saved %s (%.1fM parameters) to %s", p.spec, n / 1e6, OUT)


if __name__ == "__main__":
    main()
