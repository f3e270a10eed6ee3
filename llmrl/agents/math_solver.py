"""The few-shot stepwise math solver: its prompt, whole-solution generation, and saving/loading trained policies.

The prompt is LLM_RL's: a system prompt asking for one step per line with ``<<expr=result>>`` annotations and a
closing "The answer is: X", k solved train problems as user/assistant pairs, then the problem. A partial
solution is an assistant message that the chat template continues (``LLM.render``), so the state after n
lines is the state after n-1 lines plus one line: one sequence holds a whole episode.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tqdm.auto import tqdm

from llmrl.envs.word_problems.answers import ANSWER_PHRASE, answers_match, extract_answer, through_first_answer
from llmrl.llm.generate import SamplingConfig
from llmrl.llm.load import LLM, load_adapter, load_model, stable_adapter_names
from llmrl.files import verify_checksums, write_checksums
from llmrl.llm.prefix import generate_shared_prefix

__all__ = ["build_messages", "render_state", "solve", "write_policy", "load_policy"]

SYSTEM_PROMPT = (
    "You solve math word problems step by step. Write one short step per line. Write every calculation as "
    f"<<expression=result>>. The last line must be '{ANSWER_PHRASE} X' where X is the final number."
)


def build_messages(problem: str, shots: Sequence[dict]) -> list[dict]:
    """System prompt, the few-shot pairs (train problems with their solutions), then ``problem``."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    for shot in shots:
        messages += [{"role": "user", "content": shot["problem"]},
                     {"role": "assistant", "content": shot["solution"]}]
    return messages + [{"role": "user", "content": problem}]


def render_state(llm: LLM, messages: list[dict], solution: str) -> str:
    """The text the model continues: the chat prompt, with ``solution`` (lines so far) as a partial reply."""
    if not solution:
        return llm.render(messages)
    return llm.render([*messages, {"role": "assistant", "content": solution}])


def answer_line_complete(text: str) -> bool:
    """Whether ``text`` holds a whole answer line: what follows it is never read (``through_first_answer``)."""
    stated = through_first_answer(text)
    return stated is not None and stated.endswith("\n")


def solve(llm: LLM, problems: Sequence[dict], shots: Sequence[dict], sampling: SamplingConfig, *,
          batch_size: int = 16, progress: bool = True) -> list[dict]:
    """Whole solutions to ``problems`` (records with id, problem, answer), each with its parsed answer.

    Returns one record per problem: id, rendered prompt, response, parsed answer, gold answer, correct,
    finish reason and token count.
    """
    prompts = [render_state(llm, build_messages(p["problem"], shots), "") for p in problems]
    gens = []
    for start in tqdm(range(0, len(prompts), batch_size), desc="solve", disable=not progress, leave=False):
        chunk = SamplingConfig(**{**sampling.as_dict(), "seed": sampling.seed + start})
        gens += generate_shared_prefix(llm, prompts[start:start + batch_size], chunk, batch_size=batch_size,
                                       done=answer_line_complete)
    out = []
    for p, g in zip(problems, gens):
        # The answer is the first one stated, as in training (MathEnv ends an episode at its first answer line).
        stated = through_first_answer(g.text)
        response = g.text if stated is None else stated
        parsed = extract_answer(response)
        # Cut by the cap: no answer line, or the cap fell inside the answer line itself.
        cut = g.finish_reason == "length" and (stated is None or stated == g.text)
        out.append({"id": p["id"], "prompt": g.prompt, "response": response, "parsed_answer": parsed,
                    "answer": str(p["answer"]), "correct": answers_match(parsed, str(p["answer"])),
                    "finish_reason": "length" if cut else ("answer" if stated is not None else g.finish_reason),
                    "n_tokens": g.n_tokens})
    return out


def write_policy(llm: LLM, folder: str | os.PathLike, base_model: str | None = None) -> None:
    """Write the policy into ``folder`` (the caller makes it atomic): a LoRA adapter for a PeftModel, else the
    whole model, and the tokenizer, and their checksums (``SHA256SUMS``, checked by ``load_policy``).

    For an adapter, ``base_model`` replaces the base path peft would record (the absolute path of this clone)
    in its config and model card, and the target modules are written sorted (peft keeps a set), so the same
    training gives the same bytes on every machine.
    """
    if getattr(llm.model, "peft_config", None) and base_model is not None:
        stable_adapter_names(llm.model, base_model)
    llm.model.save_pretrained(folder, safe_serialization=True)
    llm.tokenizer.save_pretrained(folder)
    write_checksums(folder)


def load_policy(base_spec: str, folder: str | os.PathLike | None, *, device: str | None = None,
                dtype: str | None = None) -> LLM:
    """The base model, with a saved adapter merged in when ``folder`` holds one, or the saved model itself; the
    folder's checksums are checked first (a damaged file is a ``DamagedFileError`` naming it)."""
    if folder is None:
        return load_model(base_spec, device=device, dtype=dtype)
    folder = Path(folder)
    verify_checksums(folder)
    if not (folder / "adapter_config.json").is_file():
        return load_model(str(folder), device=device, dtype=dtype)
    llm = load_model(base_spec, device=device, dtype=dtype)
    llm.model = load_adapter(llm.model, folder).merge_and_unload()
    llm.model.eval()
    llm.model.requires_grad_(False)
    return llm
