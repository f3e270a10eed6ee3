"""TRL's GRPO with a LoRA adapter, for any data set of chat prompts and any reward functions.

``build_grpo_trainer(llm, dataset, reward_funcs, cfg, output_dir)`` returns a ``GRPORun``: the
``trl.GRPOTrainer`` and the number of prompts cut to ``cfg.max_prompt_tokens``. ``train(run)`` runs it and yields
one metrics row per optimiser step in the project's vocabulary (``step``, ``loss``, ``lr``, ``entropy``,
``approx_kl``, ``reward_mean``, ``reward_<function>``, ...). ``save_adapter`` writes the adapter so that the
same tensors give the same bytes on every machine.

What this adds to TRL, and why:
- TRL 1.16 has no ``max_prompt_length``: ``truncate_prompts`` measures each prompt with the model's own tokenizer
  after the chat template, exactly as the trainer will tokenise it, and cuts the start of the last message
  (the old TRL cut the start of the prompt, which for a chat would drop the template's own tokens).
- A chat may end with an assistant message that opens the answer (e.g. ProPS's ``params[0]:``): the completion
  continues it. TRL's templating would close that turn and open another, so such chats reach the trainer as
  their rendered text (``llmrl.llm.load.render_chat``); truncation cuts the message before the opening.
- TRL 1.16 turns ``bf16`` and ``gradient_checkpointing`` on by default: both are decided here (bf16 only where
  the device has it, checkpointing only when asked).
- The defaults that matter (``learning_rate``, ``loss_type``, ``beta``) are always passed explicitly.
- TRL's ``train()`` returns only at the end; ``train`` turns its log calls into a stream of rows, and can cut a run
  into parts that resume from full checkpoints (a part per DVC stage keeps long trainings under a stage's time).
- TRL selects no checkpoint on a reward: ``validate_every`` scores the policy on held-out prompts
  (``validation_replies``) during training and ``BestAdapter`` keeps the best adapter.
- TRL runs each row's whole prompt through the model to score its completion; with ``share_prompt_prefix`` a
  micro-batch's common prompt prefix runs once (``grpo_trainer_class``).
- TRL seeds each process apart and samples a batch from one stream; with ``per_completion_seeds`` each
  completion has its own stream, so N processes sample, score and train on one process's completions.
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from llmrl.config.grpo import GRPOTrainParams
from llmrl.files import atomic_path, write_checksums
from llmrl.llm.load import LLM, peft_lora_config, render_chat, stable_adapter_names

__all__ = ["RewardFunc", "completion_text", "completion_seed", "SeededRowSampler", "grpo_trainer_class",
           "opens_answer", "prompt_token_count", "truncate_prompt", "recording", "GRPORun", "build_grpo_trainer", "train",
           "part_end", "checkpoint_path", "gather_records", "save_adapter", "validation_replies", "BestAdapter", "validate_every"]

RewardFunc = Callable[..., list[float]]


def completion_text(completion) -> str:
    """TRL passes conversational completions as a list of messages, plain ones as a string."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


# ------------------------------------------------------------------------------------------------ prompts


def opens_answer(prompt: str | list[dict]) -> bool:
    """Whether ``prompt`` is a chat whose last message, from the assistant, opens the answer the model continues."""
    return not isinstance(prompt, str) and bool(prompt) and prompt[-1]["role"] == "assistant"


def prompt_token_count(tokenizer, prompt: str | list[dict]) -> int:
    """Tokens the trainer will feed for ``prompt``: the chat template with the generation prompt for a chat (an
    opened answer continued instead), the plain text otherwise (TRL tokenises plain prompts as they are)."""
    if isinstance(prompt, str) or opens_answer(prompt):
        text = prompt if isinstance(prompt, str) else render_chat(tokenizer, prompt)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
    return len(ids["input_ids"])


def truncate_prompt(tokenizer, prompt: str | list[dict], max_tokens: int) -> tuple[str | list[dict], bool]:
    """``prompt`` cut to at most ``max_tokens`` tokens by dropping the start of its last message (the one before
    an opened answer; of the text for a plain prompt); returns the prompt and whether it was cut. The template,
    the other messages and the opened answer stay.

    Raises ``ValueError`` naming ``max_prompt_tokens`` when even an empty last message does not fit.
    """
    total = prompt_token_count(tokenizer, prompt)
    if total <= max_tokens:
        return prompt, False
    at = len(prompt) - (2 if opens_answer(prompt) else 1)  # the message cut, in a chat
    content = prompt if isinstance(prompt, str) else prompt[at]["content"]
    ids = tokenizer(content, add_special_tokens=False)["input_ids"]

    def with_content(text: str):
        return text if isinstance(prompt, str) else [*prompt[:at], {**prompt[at], "content": text}, *prompt[at + 1:]]

    keep = len(ids) - (total - max_tokens)
    # Re-tokenising decoded text can merge or split tokens at the cut: shorten until the prompt fits.
    while keep > 0:
        cut = with_content(tokenizer.decode(ids[len(ids) - keep:], skip_special_tokens=False))
        if prompt_token_count(tokenizer, cut) <= max_tokens:
            return cut, True
        keep -= 1
    raise ValueError(f"max_prompt_tokens={max_tokens} is smaller than the prompt's fixed part "
                     f"({prompt_token_count(tokenizer, with_content(''))} tokens with an empty last message)")


def truncate_prompts(dataset, tokenizer, max_tokens: int | None):
    """The data set with every ``prompt`` cut to ``max_tokens`` and the number of prompts that were cut; chats
    that open the answer become their rendered text (TRL would close the opened turn)."""
    prompts = dataset["prompt"]
    cut = [truncate_prompt(tokenizer, p, max_tokens) if max_tokens is not None else (p, False) for p in prompts]
    n_cut = sum(was_cut for _, was_cut in cut)
    opened = [opens_answer(p) for p in prompts]
    if any(opened):
        if not all(opened):  # one column holds either chats or text
            raise ValueError("prompt: either every chat opens the answer (ends with an assistant message) or none")
        texts = [render_chat(tokenizer, p) for p, _ in cut]  # a new column: a chat column cannot hold text
        dataset = dataset.map(lambda _, i: {"prompt_text": texts[i]}, with_indices=True, remove_columns="prompt")
        dataset = dataset.rename_column("prompt_text", "prompt")
    elif n_cut:
        dataset = dataset.map(lambda _, i: {"prompt": cut[i][0]}, with_indices=True)
    return dataset, n_cut


def recording(reward_funcs: Sequence[RewardFunc], record: list[dict], keys: Sequence[str] = ()) -> list[RewardFunc]:
    """The same reward functions (same names, same values), also appending one row per completion to ``record``:
    the optimiser step, the dataset columns named in ``keys``, the completion text and every function's reward
    (LLM outputs are data). TRL calls the functions one after another on the same batch; the last one writes.
    """
    funcs = list(reward_funcs)
    batch: dict[str, list[float]] = {}

    def wrap(fn: RewardFunc, last: bool) -> RewardFunc:
        def reward(*args, completions, trainer_state=None, **kwargs):
            out = fn(*args, completions=completions, trainer_state=trainer_state, **kwargs)
            batch[fn.__name__] = out
            if last:
                step = trainer_state.global_step if trainer_state is not None else None
                for i, c in enumerate(completions):
                    record.append({"step": step, **{k: kwargs[k][i] for k in keys},
                                   "completion": completion_text(c),
                                   **{f"reward_{name}": values[i] for name, values in batch.items()}})
                batch.clear()
            return out

        reward.__name__ = fn.__name__
        reward.__doc__ = fn.__doc__
        return reward

    return [wrap(fn, i == len(funcs) - 1) for i, fn in enumerate(funcs)]


# ------------------------------------------------------------------------------------------------ trainer


def use_bf16(cfg: GRPOTrainParams, llm: LLM) -> bool:
    """bf16 mixed precision where it is wished and the LLM computes in bf16 (its dtype, resolved by
    ``llmrl.llm.load.resolve_dtype``: CUDA with bf16, or a CPU that runs bf16 natively when asked)."""
    return cfg.bf16 and llm.dtype == torch.bfloat16


@dataclass
class GRPORun:
    trainer: object  # trl.GRPOTrainer (imported lazily: trl is slow to import)
    truncated_prompts: int
    prompts: int


class SeededRowSampler:
    """Logits processor that samples row i of a batch from its own seeded stream: argmax(log softmax(scores) +
    Gumbel noise) is a draw from softmax(scores) (the Gumbel-max trick), and row i's noise comes from
    ``generators[i]`` alone. Greedy decoding after it therefore samples each completion independently of which
    rows share its batch or its process. (transformers draws every row from one global stream, and TRL gives
    each process its own seed, so over N processes the completions differ from one process's.)"""

    def __init__(self, generators: list[torch.Generator]):
        self.generators = generators

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        uniform = torch.stack([torch.rand(scores.size(-1), generator=g) for g in self.generators])
        gumbel = -torch.log(-torch.log(uniform))  # rand is in [0, 1): a 0 gives -inf, never chosen
        return torch.log_softmax(scores.float(), dim=-1) + gumbel.to(scores.device)


def completion_seed(seed: int, generation_round: int, row: int) -> int:
    """The sampling seed of completion ``row`` (its index in the round's batch over all processes)."""
    import numpy as np

    return int(np.random.SeedSequence([seed, generation_round, row]).generate_state(1)[0])


def grpo_trainer_class(share_prompt_prefix: bool, per_completion_seeds: bool, stop_at_newline: bool = False):
    """``trl.GRPOTrainer``, or a subclass with one or more of:

    - ``share_prompt_prefix``: completions scored with the micro-batch's common prompt prefix computed once
      (``llmrl.llm.prefix.completion_logprobs``). TRL runs every row's whole prompt through the model for the
      old-policy and the training log-probs; a few-shot math prompt is ~3/4 shared, so that is most of its time
      on CPU. Same log-probs and entropies as TRL's own (tested); text-only models (images take TRL's path).
    - ``per_completion_seeds``: each completion sampled from its own stream, seeded by (``seed``, generation
      round, its index in the round over all processes) (``SeededRowSampler``), so N processes sample the same
      completions as one. TRL has no such option; this replaces its transformers ``generate`` path for text-only
      models (TRL's own path otherwise) with the same sampling settings (temperature, top-k, top-p, min-p).
      With ``share_prompt_prefix`` too, a round whose prompts share a prefix (a group: one prompt, G times)
      computes that prefix's KV cache once and samples from it (same tokens as without: tested).
    - ``stop_at_newline`` (with ``per_completion_seeds``): each completion ends after its first token holding a
      line break, as the ProPS search stops its replies (its answer is line 1); the tokens after it would be
      trained on without ever being read.
    """
    from trl import GRPOTrainer

    if stop_at_newline and not per_completion_seeds:
        raise ValueError("stop_at_newline needs per_completion_seeds (the generation path that can stop a row)")
    if not (share_prompt_prefix or per_completion_seeds):
        return GRPOTrainer
    from transformers import (DynamicCache, GenerationConfig, LogitsProcessorList, MinPLogitsWarper,
                              TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
    from trl.models import unwrap_model_for_generation
    from trl.trainer.utils import pad

    from llmrl.llm.prefix import common_prefix_length, completion_logprobs

    class LLMRLGRPOTrainer(GRPOTrainer):
        _generation_rounds = 0  # generation calls so far, the same count on every process (set on resuming)
        _line_end_cache: list[int] | None = None

        def _line_end_ids(self) -> list[int]:
            """Every token id whose text holds a line break."""
            if self._line_end_cache is None:
                tok = self._tokenizer
                self._line_end_cache = [i for i in range(len(tok)) if "\n" in tok.decode([i])]
            return self._line_end_cache

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **vision):
            if not share_prompt_prefix or compute_aux_loss or any(v is not None for v in vision.values()):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **vision)
            batch_size = batch_size or input_ids.size(0)
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                with self.accelerator.autocast():
                    lp, ent = completion_logprobs(model, input_ids[start:start + batch_size],
                                                  attention_mask[start:start + batch_size], logits_to_keep,
                                                  pad_id=self.processing_class.pad_token_id,
                                                  temperature=self.temperature, entropy=compute_entropy)
                logps.append(lp)
                entropies.append(ent)
            return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations,
                                  has_tool_images=False):
            if (not per_completion_seeds or self.use_vllm or self.use_transformers_continuous_batching
                    or images is not None or multimodal_fields):
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                     has_tool_images)
            device = self.accelerator.device
            first_row = self.accelerator.process_index * len(prompt_ids)  # TRL's process slice of the round
            generators = [torch.Generator().manual_seed(completion_seed(self.args.seed, self._generation_rounds,
                                                                        first_row + i))
                          for i in range(len(prompt_ids))]
            self._generation_rounds += 1
            g = self.generation_config
            warpers = [TemperatureLogitsWarper(g.temperature)] if g.temperature not in (None, 1.0) else []
            warpers += [TopKLogitsWarper(g.top_k)] if g.top_k else []
            warpers += [TopPLogitsWarper(g.top_p)] if g.top_p is not None and g.top_p < 1.0 else []
            warpers += [MinPLogitsWarper(g.min_p)] if g.min_p is not None else []
            stop_ids = self._line_end_ids() if stop_at_newline else []
            ends_at = [*self.eos_token_ids, *stop_ids]
            greedy = GenerationConfig(**{**self.generation_kwargs, "do_sample": False, "temperature": None,
                                         "top_p": None, "top_k": None, "min_p": None,
                                         **({"eos_token_id": ends_at} if stop_ids else {})}, disable_compile=True)
            prompts = [torch.tensor(ids) for ids in prompt_ids]
            inputs = {
                "input_ids": pad(prompts, padding_value=self._tokenizer.pad_token_id, padding_side="left",
                                 pad_to_multiple_of=self.pad_to_multiple_of).to(device),
                "attention_mask": pad([torch.ones_like(t) for t in prompts], padding_value=0, padding_side="left",
                                      pad_to_multiple_of=self.pad_to_multiple_of).to(device)}
            with (unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                              gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                              generation_kwargs=self.generation_kwargs,
                                              gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)
                  as unwrapped_model, torch.no_grad(), self._dist.summon_full_params(self.model_wrapped,
                                                                                       recurse=False)):
                shared = 0
                if share_prompt_prefix and bool(inputs["attention_mask"].all()):  # no padding: rows align
                    shared = common_prefix_length(inputs["input_ids"].tolist())
                if shared:  # the prefix's KV cache, repeated over the rows; generate computes the rest
                    cache = unwrapped_model(input_ids=inputs["input_ids"][:1, :shared], past_key_values=DynamicCache(),
                                            use_cache=True, logits_to_keep=1).past_key_values
                    cache.batch_repeat_interleave(len(prompt_ids))
                    inputs["past_key_values"] = cache
                sampler = LogitsProcessorList([*warpers, SeededRowSampler(generators)])
                out = unwrapped_model.generate(**inputs, generation_config=greedy, logits_processor=sampler)
            completions = out[:, inputs["input_ids"].size(1):].cpu()
            # each completion up to and including its first EOS (or line end, when asked), as TRL cuts them
            is_end = torch.isin(completions, torch.tensor(ends_at))
            ends = torch.where(is_end.any(1), is_end.int().argmax(1), completions.size(1))
            return [row[:end + 1].tolist() for row, end in zip(completions, ends.tolist())], None

    return LLMRLGRPOTrainer


_GRPO_CONFIG_NAMES = ("learning_rate", "loss_type", "beta", "num_iterations", "epsilon", "scale_rewards",
                      "reward_weights", "num_generations", "gradient_accumulation_steps", "steps_per_generation",
                      "num_train_epochs", "max_completion_length", "temperature", "top_p", "lr_scheduler_type",
                      "max_grad_norm", "seed")


def build_grpo_trainer(llm: LLM, dataset, reward_funcs: RewardFunc | Sequence[RewardFunc], cfg: GRPOTrainParams,
                       output_dir: str | os.PathLike) -> GRPORun:
    """A ``trl.GRPOTrainer`` over ``dataset`` (a ``datasets.Dataset`` with a ``prompt`` column of chats or
    strings; every other column reaches the reward functions as a keyword argument).

    ``llm.model`` must be plain (no peft adapter): TRL attaches ``cfg.lora`` itself. TRL writes nothing but
    ``output_dir`` (no checkpoints, no report_to); the caller removes it.

    Over N processes (``accelerate launch``; TRL's trainer runs DDP itself) ``cfg.per_device_train_batch_size``
    stays the micro-batch of the whole run: each process takes 1/N of it, so every optimiser step and generation
    round holds as many completions as with one process. With ``cfg.per_completion_seeds`` (the default) they are
    one process's completions too, and the run equals one process's up to float rounding (LoRA dropout 0); without
    it each process samples its own. The reward functions see their process's completions.
    """
    from accelerate import PartialState
    from transformers import PrinterCallback
    from trl import GRPOConfig

    if llm.model.__class__.__name__.startswith("Peft"):
        raise ValueError("build_grpo_trainer: llm.model already carries a peft adapter; pass the plain model")
    processes = PartialState().num_processes
    if cfg.per_device_train_batch_size % processes:
        raise ValueError(f"per_device_train_batch_size={cfg.per_device_train_batch_size} (the micro-batch over all "
                         f"processes) must be divisible by the {processes} processes")
    dataset, n_cut = truncate_prompts(dataset, llm.tokenizer, cfg.max_prompt_tokens)
    args = GRPOConfig(
        # the settings whose names are GRPOConfig's own (llmrl.config.grpo), passed as they are
        **{name: getattr(cfg, name) for name in _GRPO_CONFIG_NAMES},
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.per_device_train_batch_size // processes,
        max_steps=cfg.max_steps or -1,
        data_seed=cfg.seed,
        bf16=use_bf16(cfg, llm),
        # transformers 5 renamed gradient_checkpointing (TRL's default: on); the new name silences the deprecation
        activation_checkpointing=cfg.gradient_checkpointing,
        use_cpu=llm.device.type == "cpu",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer_class = grpo_trainer_class(cfg.share_prompt_prefix, cfg.per_completion_seeds, cfg.stop_at_newline)
    trainer = trainer_class(
        model=llm.model,
        reward_funcs=list(reward_funcs) if isinstance(reward_funcs, Sequence) else reward_funcs,
        args=args,
        train_dataset=dataset,
        processing_class=llm.tokenizer,
        peft_config=peft_lora_config(cfg.lora, llm.model) if cfg.lora is not None else None,
    )
    trainer.remove_callback(PrinterCallback)  # rows reach the caller through train(); no prints of raw logs
    return GRPORun(trainer=trainer, truncated_prompts=n_cut, prompts=len(dataset))


# ------------------------------------------------------------------------------------------------ training

# TRL's log keys -> the project's metric names (rewards/<name>/mean becomes reward_<name>).
_RENAMES = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm", "entropy": "entropy",
            "kl": "approx_kl", "reward": "reward_mean", "reward_std": "reward_std",
            "frac_reward_zero_std": "frac_reward_zero_std", "completions/mean_length": "completion_length",
            "completions/clipped_ratio": "completion_clipped", "clip_ratio/region_mean": "clip_fraction",
            "step_time": "step_time"}


def metrics_row(step: int, logs: dict) -> dict:
    """One TRL log record in the project's vocabulary; reward keys only on steps that generated."""
    row: dict = {"step": step}
    for key, value in logs.items():
        if value is None:
            continue
        if key in _RENAMES:
            row[_RENAMES[key]] = float(value)
        elif key.startswith("rewards/") and key.endswith("/mean"):
            row["reward_" + key[len("rewards/"):-len("/mean")]] = float(value)
    return row


def train(run: GRPORun, *, resume_from: str | os.PathLike | None = None,
          stop_after: int | None = None) -> Iterator[dict]:
    """Run the trainer, yielding one metrics row per optimiser step as TRL logs it.

    TRL's ``train()`` only returns at the end, so it runs in a worker thread and its ``on_log`` callback hands
    the rows over; an exception in training is re-raised here.

    A run can be cut into parts: ``stop_after`` ends it at that optimiser step with a full checkpoint (adapter,
    optimiser, schedule, random states; ``checkpoint_path``), and ``resume_from`` (such a checkpoint) continues
    it. The parts together equal the uncut run (tested): the learning-rate schedule spans the whole
    ``max_steps``, the data order and random states are restored, and the per-completion sampling streams
    continue from the checkpoint's step.
    """
    from transformers import TrainerCallback

    rows: queue.Queue = queue.Queue()
    done = object()
    trainer = run.trainer
    a = trainer.args
    if (resume_from is not None or stop_after is not None) and (
            getattr(trainer, "num_iterations", 1) > 1 or a.steps_per_generation != a.gradient_accumulation_steps):
        # TRL keeps a generation round's completions across optimiser steps then; a part boundary inside a round
        # would generate it again
        raise ValueError("train: parts need one generation round per optimiser step (num_iterations 1, "
                         "steps_per_generation = gradient_accumulation_steps)")

    class _Rows(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            # one generation round per steps_per_generation x num_iterations micro-batches
            per_round = args.steps_per_generation * getattr(trainer, "num_iterations", 1)
            trainer._generation_rounds = state.global_step * args.gradient_accumulation_steps // per_round

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and "train_runtime" not in logs:
                rows.put(metrics_row(state.global_step, logs))

        def on_step_end(self, args, state, control, **kwargs):
            if stop_after is not None and state.global_step >= stop_after:
                control.should_training_stop = True
                control.should_save = True

    failure: list[BaseException] = []

    def work():
        try:
            trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
        except BaseException as err:  # noqa: BLE001 - handed to the consuming thread
            failure.append(err)
        finally:
            rows.put(done)

    callback = _Rows()
    trainer.add_callback(callback)
    worker = threading.Thread(target=work, name="grpo-train", daemon=True)
    worker.start()
    try:
        while (row := rows.get()) is not done:
            yield row
    finally:
        worker.join()
        trainer.remove_callback(callback)
    if failure:
        raise failure[0]


def part_end(part: int, of: int, total: int) -> int:
    """The last optimiser step of part ``part`` (1-based) of a ``total``-step run cut into ``of`` parts."""
    if not 1 <= part <= of <= total:
        raise ValueError(f"part_end: expected 1 <= part <= of <= total, got part={part}, of={of}, total={total}")
    return -(-part * total // of)


def checkpoint_path(run: GRPORun) -> Path:
    """The full checkpoint ``train(run, stop_after=...)`` wrote (TRL's ``checkpoint-<step>`` under the run's
    output folder)."""
    step = run.trainer.state.global_step
    path = Path(run.trainer.args.output_dir) / f"checkpoint-{step}"
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint at step {step} under {run.trainer.args.output_dir}")
    return path


def gather_records(record: list[dict]) -> list[dict]:
    """Every process's recorded completions (``recording``), in process order, on every process; the list itself
    in a one-process run. Each process scores only the completions it sampled."""
    from accelerate import PartialState
    from accelerate.utils import gather_object

    return gather_object(record) if PartialState().num_processes > 1 else record


def save_adapter(model, folder: str | os.PathLike, *, base_model: str) -> None:
    """Write a peft model's adapter to ``folder`` atomically, byte-stable across machines and runs.

    peft records the base model's path (this clone's absolute path) and keeps target modules in a set (order
    varies with the hash seed): the base model is named as given (``base_model``, e.g. the params value) and the
    modules are sorted before writing. Embedding layers are never saved: the adapters here do not train them, and
    peft's "auto" check compares the vocabulary with a config it loads from ``base_model``.
    """
    configs = getattr(model, "peft_config", None)
    if not configs:
        raise ValueError("save_adapter: the model carries no peft adapter")
    stable_adapter_names(model, base_model)
    with atomic_path(Path(folder), is_dir=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, save_embedding_layers=False)
        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors creates its file owner-only; published outputs get the usual permissions
        write_checksums(tmp)  # checked by llmrl.llm.load.load_adapter


# ------------------------------------------------------------------------------------------------ selection


def validation_replies(llm: LLM, records: Sequence[dict], reward_funcs: Sequence[RewardFunc], *, samples: int,
                       max_new_tokens: int, temperature: float, top_p: float, stop_at_newline: bool, seed: int,
                       weights: Sequence[float] | None = None, batch_size: int = 16) -> list[dict]:
    """``samples`` replies of ``llm`` (its current weights) to each record's ``prompt``, sampled as training samples
    them (temperature, top-p, line stop) from fixed seeds, so every checkpoint meets the same draws; each scored by
    ``reward_funcs`` with the record's other columns, as TRL scores a completion. One row per reply: the record's
    ``id``, the sample, the completion, each function's reward and ``reward`` (their sum weighted by ``weights``,
    TRL's total)."""
    from llmrl.llm.generate import SamplingConfig
    from llmrl.llm.prefix import generate_shared_prefix

    funcs = list(reward_funcs)
    w = list(weights) if weights is not None else [1.0] * len(funcs)
    if len(w) != len(funcs):
        raise ValueError(f"weights: {len(w)} for {len(funcs)} reward functions")
    rows = [r for r in records for _ in range(samples)]
    sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                              stop=("\n",) if stop_at_newline else (), seed=seed)
    # the prompts share their system message and rules: computed once per batch
    gens = generate_shared_prefix(llm, [llm.render(r["prompt"]) for r in rows], sampling, batch_size=batch_size)
    completions = [g.text for g in gens]
    columns = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
    scores = {f.__name__: f(completions=completions, **columns) for f in funcs}
    out = []
    for i, (r, c) in enumerate(zip(rows, completions)):
        per = {name: float(v[i]) for name, v in scores.items()}
        out.append({"id": r.get("id"), "sample": i % samples, "completion": c, **{f"reward_{k}": v for k, v in per.items()},
                    "reward": float(sum(wi * per[f.__name__] for wi, f in zip(w, funcs)))})
    return out


class BestAdapter:
    """Checkpoint selection on a validation score: the adapter weights of the best score so far (the earliest on a
    tie), and every validation's step and score. ``save``/``load`` carry it from one part of a run to the next."""

    def __init__(self) -> None:
        self.history: list[dict] = []
        self.best_step: int | None = None
        self.best_score = float("-inf")
        self.state: dict[str, torch.Tensor] | None = None

    def consider(self, step: int, score: float, model, **extra) -> bool:
        """Record a validation of ``model`` at ``step``; keep its adapter weights if the score is the best."""
        from peft import get_peft_model_state_dict

        if not np.isfinite(score):
            raise ValueError(f"validation score at step {step} is not finite: {score}")
        self.history.append({"step": int(step), "score": float(score), **extra})
        if score > self.best_score:
            self.best_step, self.best_score = int(step), float(score)
            self.state = {k: v.detach().clone().cpu() for k, v in get_peft_model_state_dict(model).items()}
            return True
        return False

    def restore(self, model) -> None:
        """Load the best adapter weights into ``model`` (a peft model)."""
        from peft import set_peft_model_state_dict

        if self.state is None:
            raise ValueError("BestAdapter.restore: no validation was recorded")
        set_peft_model_state_dict(model, self.state)

    def save(self, folder: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        (folder / "selection.json").write_text(json.dumps({"history": self.history, "best_step": self.best_step,
                                                           "best_score": self.best_score}, indent=1))
        if self.state is not None:
            save_file(self.state, folder / "best_adapter.safetensors")

    @classmethod
    def load(cls, folder: str | os.PathLike) -> BestAdapter:
        from safetensors.torch import load_file

        folder = Path(folder)
        d = json.loads((folder / "selection.json").read_text())
        sel = cls()
        sel.history, sel.best_step, sel.best_score = d["history"], d["best_step"], float(d["best_score"])
        if (folder / "best_adapter.safetensors").is_file():
            sel.state = load_file(folder / "best_adapter.safetensors")
        return sel


def validate_every(run: GRPORun, every: int, last_step: int, evaluate: Callable[[int], None]) -> None:
    """Call ``evaluate(step)`` at step 0 (the untrained adapter, when the run starts there), every ``every`` steps
    (0: never between) and at ``last_step``, from inside the trainer (the model as it is at that step)."""
    from transformers import TrainerCallback

    class _Validate(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if state.global_step == 0:
                evaluate(0)

        def on_step_end(self, args, state, control, **kwargs):
            step = state.global_step
            if step == last_step or (every and step % every == 0):
                evaluate(step)

    run.trainer.add_callback(_Validate())
