"""ProPS prompts and replies: Jinja templates, history rendering, token-budget trimming, the strict reply parser.

Templates live in ``llmrl/algos/props_templates/`` (package data): ``system.j2`` (the one system message of the
search and of GRPO fine-tuning: what to answer and in which format), ``numeric.j2`` (ProPS: black-box
maximisation of f(params)), ``semantic.j2`` (ProPS+: the same plus the environment description and the meaning
of each parameter, rendered from the policy object) and ``correction.j2`` (the re-ask after an unusable reply).

Reply format (the one the prompt asks for, one line): ``params[0]: 1.5; params[1]: -0.3; ...``. The format is
shown with placeholders (``params[0]: <value>; ...``), never with numbers: an example point would be a parseable
proposal that small models copy (SmolLM2-135M proposed the old example [1.5, -0.5, 2] in 8 of 15 accepted
MountainCar proposals), and a copied placeholder is rejected as ``example_copy``. The parser is strict: exactly
``n_params`` items with indices 0..n-1 once each, every value finite and inside the range, and the point different
from the current one. Anything else is a typed ``ParsedReply`` error whose ``detail`` goes into the correction
prompt. Where the answer is looked for: a ``<think>…</think>`` block (multi-line) is removed first and
``<policy>``/``</policy>`` tags are ignored, then the first line that mentions ``params[`` is the answer; a
trailing ``f(params): x`` item (models copy the history format) is ignored, also when the reply was cut inside
it (``f(par``): the parameters before it are complete.

``reply_token_cap`` sizes the reply: the tokens of the longest answer line the format allows (every value with
the widest integer part and one decimal more than asked), so a complete answer always fits.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import jinja2
import numpy as np

from llmrl.agents.linear_policy import Policy
from llmrl.envs.control import ControlTask, QuadraticTask

__all__ = ["TemplateName", "PLACEHOLDER", "history_line", "format_example", "PromptSettings", "render_system_prompt",
           "render_search_prompt", "search_messages", "render_correction", "ParseError", "PARSE_ERRORS",
           "ParsedReply", "parse_reply", "reply_token_cap", "chat_token_counter", "trim_history"]

TemplateName = Literal["numeric", "semantic"]

_ENV = jinja2.Environment(
    loader=jinja2.FunctionLoader(
        lambda name: resources.files("llmrl.algos").joinpath("props_templates", name).read_text(encoding="utf-8")
    ),
    undefined=jinja2.StrictUndefined,  # a missing variable is an error, not an empty string in the prompt
    keep_trailing_newline=False,
    autoescape=False,
)


def format_value(x: float, decimals: int = 4) -> str:
    """A number as the prompt shows it: rounded, no trailing zeros, no ``-0``."""
    s = f"{round(float(x), decimals):.{decimals}f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def format_params(params: Sequence[float], decimals: int = 4) -> str:
    return "; ".join(f"params[{i}]: {format_value(v, decimals)}" for i, v in enumerate(params))


def history_line(params: Sequence[float], value: float, decimals: int = 4) -> str:
    """One history entry: ``params[0]: 1.5; params[1]: -2; f(params): 35.25``."""
    return f"{format_params(params, decimals)}; f(params): {format_value(value, 2)}"


PLACEHOLDER = "<value>"


def format_example(n_params: int) -> str:
    """The answer format with a placeholder for every value: nothing in it is a point (module doc)."""
    if n_params <= 24:
        return "; ".join(f"params[{i}]: {PLACEHOLDER}" for i in range(n_params))
    return f"params[0]: {PLACEHOLDER}; params[1]: {PLACEHOLDER}; ...; params[{n_params - 1}]: {PLACEHOLDER}"


@dataclass(frozen=True)
class PromptSettings:
    """What a search prompt says besides the history (all logged as params by the stages)."""

    low: float
    high: float
    decimals: int
    step_size: float
    optimum: float | None  # None: the optimum hint is switched off
    episodes: int  # episodes behind each f(params)


def render_system_prompt(n_params: int) -> str:
    """The system message of every ProPS exchange, search and GRPO alike: the role and the answer format."""
    return _ENV.get_template("system.j2").render(n_params=n_params, format_example=format_example(n_params)).strip()


def render_search_prompt(
    template: TemplateName,
    *,
    task: ControlTask | QuadraticTask,
    policy: Policy,
    history: Sequence[tuple[Sequence[float], float]],
    iteration: int,
    total_iterations: int,
    settings: PromptSettings,
) -> str:
    """The user message of one search iteration; count and layout come from ``policy``."""
    if template not in ("numeric", "semantic"):
        raise ValueError(f"template: must be 'numeric' or 'semantic', got {template!r}")
    semantic = template == "semantic"
    if semantic and not isinstance(task, ControlTask):
        raise ValueError(f"template 'semantic' (ProPS+) describes an environment; task {task.key!r} has none")
    return _ENV.get_template(f"{template}.j2").render(
        n_params=policy.n_params,
        env_id=task.env_id if semantic else None,
        description=task.description if semantic else None,
        state_names=task.state_names if semantic else None,
        action_names=task.action_names if semantic else None,
        reward=task.reward if semantic else None,
        layout=policy.layout_text(task.state_names, task.action_names) if semantic else None,
        episodes=settings.episodes,
        low=format_value(settings.low),
        high=format_value(settings.high),
        decimals=settings.decimals,
        optimum=None if settings.optimum is None else format_value(settings.optimum),
        step_size=format_value(settings.step_size),
        iteration=iteration,
        total_iterations=total_iterations,
        history=[history_line(p, v) for p, v in history],
        format_example=format_example(policy.n_params),
    ).strip()


def search_messages(
    template: TemplateName,
    *,
    task: ControlTask | QuadraticTask,
    policy: Policy,
    history: Sequence[tuple[Sequence[float], float]],
    iteration: int,
    total_iterations: int,
    settings: PromptSettings,
) -> list[dict]:
    """The chat of one search iteration: the system message and the user message (``render_search_prompt``)."""
    user = render_search_prompt(template, task=task, policy=policy, history=history, iteration=iteration,
                                total_iterations=total_iterations, settings=settings)
    return [{"role": "system", "content": render_system_prompt(policy.n_params)}, {"role": "user", "content": user}]


def render_correction(detail: str, *, n_params: int, low: float, high: float,
                      current: Sequence[float] | None = None) -> str:
    """The re-ask message after an unusable reply (``detail`` from ``ParsedReply``)."""
    return _ENV.get_template("correction.j2").render(
        detail=detail, n_params=n_params, low=format_value(low), high=format_value(high),
        current=None if current is None else format_params(current), format_example=format_example(n_params),
    ).strip()


# ------------------------------------------------------------------------------------------------ parsing

ParseError = Literal["no_answer", "example_copy", "junk", "too_few", "too_many", "repeated_index", "non_finite",
                     "out_of_range", "same_as_current"]
PARSE_ERRORS: tuple[str, ...] = ParseError.__args__  # every kind, in the order the parser checks them

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
_ITEM = re.compile(rf"^params\[\s*(\d+)\s*\]\s*[:=]\s*({_NUMBER})$", re.IGNORECASE)
_F_ITEM = re.compile(rf"^f\(params\)\s*[:=]\s*({_NUMBER})$", re.IGNORECASE)
_ECHO = "f(params):"
_ECHO_VALUE = re.compile(r"^f\(params\)[:=][-+]?[\d.]*(?:e[-+]?\d*)?$", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"<\s*value|value\s*>", re.IGNORECASE)


def _is_echo(item: str) -> bool:
    """A trailing ``f(params): x`` item, complete or cut anywhere (``f(par``, ``f(params): -12.``)."""
    s = item.replace(" ", "").lower()
    return bool(s) and (_ECHO.startswith(s) or _ECHO_VALUE.match(s) is not None)


@dataclass(frozen=True)
class ParsedReply:
    """A reply's proposal (``params``) or why it was rejected (``error`` kind and a ``detail`` sentence)."""

    params: np.ndarray | None
    error: ParseError | None = None
    detail: str = ""
    answer_line: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_record(self) -> dict:
        return {"ok": self.ok, "error": self.error, "detail": self.detail, "answer_line": self.answer_line,
                "params": None if self.params is None else [float(x) for x in self.params]}


def parse_reply(
    text: str,
    n_params: int,
    low: float,
    high: float,
    current: Sequence[float] | None = None,
) -> ParsedReply:
    """Strictly parse a proposal (module doc). Never raises on any text."""
    body = _THINK.sub("", text).replace("<policy>", "\n").replace("</policy>", "\n")
    line = next((ln.strip() for ln in body.splitlines() if "params[" in ln.lower()), None)
    if line is None:
        return ParsedReply(None, "no_answer", "no line of the form 'params[0]: value; params[1]: value; ...' "
                                              "was found.")
    if _PLACEHOLDER.search(line):
        return ParsedReply(None, "example_copy", f"the reply copies the format's placeholder {PLACEHOLDER}; write a "
                                                 "number in place of each one.", line)
    items = [it.strip() for it in re.split(r"[;,]", line.strip().strip(".").strip("`")) if it.strip()]
    if items and (_F_ITEM.match(items[-1]) or _is_echo(items[-1])):
        items = items[:-1]
    values: dict[int, float] = {}
    for it in items:
        m = _ITEM.match(it)
        if m is None:
            return ParsedReply(None, "junk", f"'{it[:40]}' is not of the form 'params[i]: value'.", line)
        idx, raw = int(m.group(1)), m.group(2)
        if idx in values:
            return ParsedReply(None, "repeated_index", f"params[{idx}] is given more than once.", line)
        values[idx] = float(raw)
    extra = sorted(i for i in values if i >= n_params)
    if extra:
        return ParsedReply(None, "too_many", f"{len(values)} values were given with index up to params[{extra[-1]}]; "
                                             f"exactly {n_params} (params[0] to params[{n_params - 1}]) are needed.", line)
    missing = [i for i in range(n_params) if i not in values]
    if missing:
        return ParsedReply(None, "too_few", f"only {len(values)} of {n_params} values were given "
                                            f"(missing params[{missing[0]}]).", line)
    vec = np.array([values[i] for i in range(n_params)], dtype=np.float64)
    bad = [i for i, v in enumerate(vec) if not math.isfinite(v)]
    if bad:
        return ParsedReply(None, "non_finite", f"params[{bad[0]}] is not a finite number.", line)
    out = [i for i, v in enumerate(vec) if not low <= v <= high]
    if out:
        return ParsedReply(None, "out_of_range", f"params[{out[0]}] = {format_value(vec[out[0]])} is outside "
                                                 f"[{format_value(low)}, {format_value(high)}].", line)
    if current is not None and np.allclose(vec, np.asarray(current, dtype=np.float64), rtol=0, atol=1e-9):
        return ParsedReply(None, "same_as_current", "the point is the current point; propose a different one.", line)
    return ParsedReply(vec, None, "", line)


# ----------------------------------------------------------------------------------------- token budget


def reply_token_cap(tokenizer, n_params: int, low: float, high: float, decimals: int) -> int:
    """New tokens a complete answer needs at most: the answer line with every value at the widest integer part
    of the range and one decimal more than asked, counted with ``tokenizer``, and a line end."""
    digits = len(str(int(max(abs(low), abs(high)))))
    widest = "-" + "9" * digits + "." + "9" * (decimals + 1)
    line = "; ".join(f"params[{i}]: {widest}" for i in range(n_params))
    return len(tokenizer(line + "\n", add_special_tokens=False)["input_ids"]) + 2


def chat_token_counter(tokenizer) -> Callable[[str | list[dict]], int]:
    """Tokens of a user message (or a whole conversation) after the tokenizer's chat template, generation
    prompt included: what the model is actually fed."""

    def count(prompt: str | list[dict]) -> int:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if getattr(tokenizer, "chat_template", None):
            rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            rendered = "\n".join(m["content"] for m in messages)
        return len(tokenizer(rendered, add_special_tokens=False)["input_ids"])

    return count


def trim_history(
    render: Callable[[Sequence], str | list[dict]],
    history: Sequence,
    count_tokens: Callable[[str | list[dict]], int],
    budget: int,
) -> tuple[str | list[dict], int, int]:
    """Drop the oldest history entries until ``render(kept)`` (a user message or a whole chat) fits ``budget``
    tokens.

    Returns (prompt, entries dropped, tokens). With every entry dropped and the prompt still too long it
    raises ``ValueError``: the fixed part of the template alone exceeds the budget.
    """
    history = list(history)
    # Binary search over how many oldest entries to drop: the rendered length grows with the entries kept.
    lo, hi = 0, len(history)
    best: tuple[str, int, int] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        prompt = render(history[mid:])
        n = count_tokens(prompt)
        if n <= budget:
            best = (prompt, mid, n)
            hi = mid - 1
        else:
            lo = mid + 1
    if best is None:
        raise ValueError(f"prompt_token_budget: {budget} tokens cannot hold the prompt even without history "
                         f"({count_tokens(render([]))} tokens)")
    return best
