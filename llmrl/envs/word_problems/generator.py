"""Procedurally generated GSM-style word problems: the embedded default data set, made for machines offline.

Problems take one or two operations on small whole numbers, so a 135M-parameter chat model gets some right
and reinforcement learning has a signal. Solutions follow GSM8K's style: one step per line, arithmetic
annotated ``<<expr=result>>``, and a closing "The answer is: X".

Train and test share no arithmetic. Every problem's operations are the calculations of its solution, one
``(operator, left, right)`` per line, with the operands of + and * sorted (3 + 5 and 5 + 3 are one calculation;
mul and price problems share the calculations of *). Test problems are drawn first; a training problem is drawn only
where none of its calculations is a test problem's, so every calculation of every test problem is unseen in
training (``operations``, ``seen_arithmetic``; tests/test_word_problems.py). Keys (template and numbers, names
ignored) are unique across both splits. The share of two-operation problems is exact in each split, not sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from llmrl.envs.word_problems.answers import ANSWER_PHRASE

__all__ = ["Problem", "generate_problems", "generated_splits", "operations", "seen_arithmetic"]

NAMES = [("Tom", "He", "he"), ("Anna", "She", "she"), ("Ben", "He", "he"), ("Lily", "She", "she"),
         ("Sam", "He", "he"), ("Mia", "She", "she"), ("Leo", "He", "he"), ("Zoe", "She", "she"),
         ("Max", "He", "he"), ("Emma", "She", "she"), ("Jack", "He", "he"), ("Sara", "She", "she")]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells", "balloons", "toys"]
THINGS = [("pen", "pens"), ("ticket", "tickets"), ("notebook", "notebooks"), ("cake", "cakes"),
          ("toy car", "toy cars"), ("ball", "balls")]


@dataclass(frozen=True)
class Problem:
    key: tuple
    problem: str
    solution_lines: tuple[str, ...]
    answer: int

    @property
    def solution(self) -> str:
        return "\n".join(self.solution_lines)


def _add(rng, hi):
    (n, pr, _), item = NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))]
    a, b = (int(x) for x in rng.integers(1, hi + 1, size=2))
    r = a + b
    return (("add", a, b),
            f"{n} has {a} {item}. {pr} gets {b} more. How many {item} does {n} have now?",
            (f"{n} has {a} + {b} = <<{a}+{b}={r}>>{r} {item}.", f"{ANSWER_PHRASE} {r}"), r)


def _sub(rng, hi):
    (n, pr, _), item = NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))]
    a = int(rng.integers(2, hi + 1))
    b = int(rng.integers(1, a))
    r = a - b
    return (("sub", a, b),
            f"{n} has {a} {item}. {pr} gives away {b} of them. How many {item} does {n} have left?",
            (f"{n} has {a} - {b} = <<{a}-{b}={r}>>{r} {item} left.", f"{ANSWER_PHRASE} {r}"), r)


def _mul(rng, hi):
    item = ITEMS[rng.integers(len(ITEMS))]
    a, b = (int(x) for x in rng.integers(2, min(hi, 12) + 1, size=2))
    r = a * b
    return (("mul", a, b),
            f"There are {a} boxes. Each box has {b} {item}. How many {item} are there in all?",
            (f"There are {a} * {b} = <<{a}*{b}={r}>>{r} {item}.", f"{ANSWER_PHRASE} {r}"), r)


def _div(rng, hi):
    (n, _, _), item = NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))]
    a, r = (int(x) for x in rng.integers(2, min(hi, 12) + 1, size=2))
    total = a * r
    return (("div", a, r),
            f"{n} shares {total} {item} equally among {a} friends. How many {item} does each friend get?",
            (f"Each friend gets {total} / {a} = <<{total}/{a}={r}>>{r} {item}.", f"{ANSWER_PHRASE} {r}"), r)


def _price(rng, hi):
    one, many = THINGS[rng.integers(len(THINGS))]
    a, b = (int(x) for x in rng.integers(2, min(hi, 12) + 1, size=2))
    r = a * b
    return (("price", a, b),
            f"One {one} costs ${a}. How many dollars do {b} {many} cost?",
            (f"{b} {many} cost {a} * {b} = <<{a}*{b}={r}>>{r} dollars.", f"{ANSWER_PHRASE} {r}"), r)


def _add_sub(rng, hi):
    (n, pr, pl), item = NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))]
    a, b = (int(x) for x in rng.integers(1, hi + 1, size=2))
    c = int(rng.integers(1, a + b))
    s, r = a + b, a + b - c
    return (("add_sub", a, b, c),
            f"{n} has {a} {item}. {pr} buys {b} more and then gives {c} to a friend. "
            f"How many {item} does {pl} have now?",
            (f"After buying, {n} has {a} + {b} = <<{a}+{b}={s}>>{s} {item}.",
             f"After giving, {pl} has {s} - {c} = <<{s}-{c}={r}>>{r} {item}.", f"{ANSWER_PHRASE} {r}"), r)


def _mul_add(rng, hi):
    (n, pr, pl), item = NAMES[rng.integers(len(NAMES))], ITEMS[rng.integers(len(ITEMS))]
    a, b = (int(x) for x in rng.integers(2, min(hi, 12) + 1, size=2))
    c = int(rng.integers(1, hi + 1))
    m, r = a * b, a * b + c
    return (("mul_add", a, b, c),
            f"{n} buys {a} packs of {item} with {b} {item} in each pack. {pr} already had {c} {item}. "
            f"How many {item} does {pl} have now?",
            (f"The packs hold {a} * {b} = <<{a}*{b}={m}>>{m} {item}.",
             f"{n} has {m} + {c} = <<{m}+{c}={r}>>{r} {item}.", f"{ANSWER_PHRASE} {r}"), r)


def _add_add(rng, hi):
    n, _, _ = NAMES[rng.integers(len(NAMES))]
    a, b, c = (int(x) for x in rng.integers(1, hi + 1, size=3))
    s, r = a + b, a + b + c
    return (("add_add", a, b, c),
            f"{n} reads {a} pages on Monday, {b} pages on Tuesday and {c} pages on Wednesday. "
            f"How many pages does {n} read in all?",
            (f"On Monday and Tuesday {n} reads {a} + {b} = <<{a}+{b}={s}>>{s} pages.",
             f"In all {n} reads {s} + {c} = <<{s}+{c}={r}>>{r} pages.", f"{ANSWER_PHRASE} {r}"), r)


ONE_STEP: list[Callable] = [_add, _sub, _mul, _div, _price]
TWO_STEP: list[Callable] = [_add_sub, _mul_add, _add_add]


def operations(key: Sequence) -> frozenset[tuple[str, int, int]]:
    """The calculations a problem's solution makes, from its key (a ``Problem.key`` or a record's ``key`` string
    "family|a|b[|c]"): ``(operator, left, right)``, the operands of + and * in ascending order."""
    family, *nums = key.split("|") if isinstance(key, str) else key
    a, b, *rest = (int(x) for x in nums)

    def op(sym: str, x: int, y: int) -> tuple[str, int, int]:
        return (sym, *sorted((x, y))) if sym in "+*" else (sym, x, y)

    calcs = {"add": [op("+", a, b)], "sub": [op("-", a, b)], "mul": [op("*", a, b)], "price": [op("*", a, b)],
             "div": [op("/", a * b, a)],
             "add_sub": lambda c: [op("+", a, b), op("-", a + b, c)],
             "mul_add": lambda c: [op("*", a, b), op("+", a * b, c)],
             "add_add": lambda c: [op("+", a, b), op("+", a + b, c)]}
    if family not in calcs:
        raise ValueError(f"operations: unknown problem family {family!r} in key {key!r}")
    out = calcs[family]
    return frozenset(out(*rest) if callable(out) else out)


def seen_arithmetic(train: Sequence[dict], test: Sequence[dict]) -> list[float]:
    """Per test record (in order), the share of its calculations that some training record makes (records with a
    generator ``key``)."""
    seen = set().union(*(operations(r["key"]) for r in train))
    return [len(ops & seen) / len(ops) for ops in (operations(r["key"]) for r in test)]


def _draw(rng: np.random.Generator, n: int, two_step_fraction: float, max_number: int, seen: set[tuple],
          allowed: Callable[[tuple], bool] = lambda key: True) -> list[Problem]:
    """``n`` problems with keys not in ``seen`` (added to it) that ``allowed`` accepts, ``round(n *
    two_step_fraction)`` of them with two operations, in a seeded random order."""
    out: list[Problem] = []
    n_two = round(n * two_step_fraction)
    for family, count in ((ONE_STEP, n - n_two), (TWO_STEP, n_two)):
        made, attempts = 0, 0
        while made < count:
            attempts += 1
            if attempts > 50 * count + 1000:
                raise ValueError(f"generate_problems: cannot find {n} distinct problems with max_number={max_number}"
                                 f" and two_step_fraction={two_step_fraction}; raise max_number or lower n")
            key, text, lines, answer = family[rng.integers(len(family))](rng, max_number)
            if key in seen or not allowed(key):
                continue
            seen.add(key)
            out.append(Problem(key=key, problem=text, solution_lines=lines, answer=answer))
            made += 1
    return [out[i] for i in rng.permutation(len(out))]


def _check_args(n: int, two_step_fraction: float, max_number: int) -> None:
    if n <= 0:
        raise ValueError(f"generate_problems: n must be > 0, got {n}")
    if not 0 <= two_step_fraction <= 1:
        raise ValueError(f"generate_problems: two_step_fraction must be in [0, 1], got {two_step_fraction}")
    if max_number < 3:
        raise ValueError(f"generate_problems: max_number must be >= 3, got {max_number}")


def generate_problems(n: int, seed: int, two_step_fraction: float = 0.3, max_number: int = 20) -> list[Problem]:
    """``n`` problems with unique keys from a seeded stream (the same arguments give the same list)."""
    _check_args(n, two_step_fraction, max_number)
    return _draw(np.random.default_rng(seed), n, two_step_fraction, max_number, set())


def generated_splits(n_train: int, n_test: int, seed: int, two_step_fraction: float = 0.3,
                     max_number: int = 20) -> tuple[list[dict], list[dict]]:
    """Train and test lists of records ``{id, problem, solution, answer, source, key}`` that share no calculation:
    the test problems are drawn first, then training problems none of whose calculations a test problem makes."""
    _check_args(n_train, two_step_fraction, max_number)
    _check_args(n_test, two_step_fraction, max_number)
    rng = np.random.default_rng(seed)
    seen: set[tuple] = set()
    test = _draw(rng, n_test, two_step_fraction, max_number, seen)
    held_out = set().union(*(operations(p.key) for p in test))
    train = _draw(rng, n_train, two_step_fraction, max_number, seen, lambda key: not operations(key) & held_out)

    def record(p: Problem, split: str, i: int) -> dict:
        return {"id": f"gen-{seed}-{split}-{i}", "problem": p.problem, "solution": p.solution,
                "answer": str(p.answer), "source": "generated", "key": "|".join(map(str, p.key))}

    return [record(p, "train", i) for i, p in enumerate(train)], [record(p, "test", i) for i, p in enumerate(test)]
