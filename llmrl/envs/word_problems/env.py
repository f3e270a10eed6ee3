"""Math word problems as a language environment (LLM_RL's stepwise GSM8K setting).

State: the problem and the solution lines written so far. Action: one line of text. The episode ends when a
line states the final answer ("The answer is: X"), when the policy ends its turn (an empty line), or after
``max_steps`` lines (truncated). Reward: 1 on the final step if the stated answer equals the gold answer.

Answers are extracted and compared by ``answers``; the optional calculator (``calculator``) rewrites
``<<48/2=24>>`` annotations before the line is judged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from llmrl.envs.word_problems.answers import ANSWER_RE, answers_match, extract_answer
from llmrl.envs.word_problems.calculator import apply_calculator

__all__ = ["MathEnv"]


class MathEnv(gym.Env):
    """Stepwise solving of a fixed list of problems (dicts with ``problem`` and ``answer``).

    ``reset(seed=s)`` draws a problem with the seeded RNG; ``reset(options={"index": i})`` picks problem i.
    Observation: ``{"problem": str, "solution": str}`` where ``solution`` is the lines so far, each ending in
    a newline. ``step(line)`` keeps the text before the first newline, applies the calculator if enabled and
    appends it. ``info`` carries the appended line, the parsed answer and ``success``.
    """

    metadata = {"render_modes": []}

    def __init__(self, problems: Sequence[dict[str, Any]], max_steps: int = 10, calculator: bool = False,
                 calculator_calls: int = 4):
        if not problems:
            raise ValueError("MathEnv: problems is empty")
        for i, p in enumerate(problems):
            if "problem" not in p or "answer" not in p:
                raise ValueError(f"MathEnv: problems[{i}] needs 'problem' and 'answer' fields, has {sorted(p)}")
        if max_steps <= 0:
            raise ValueError(f"MathEnv: max_steps must be > 0, got {max_steps}")
        self.problems = list(problems)
        self.max_steps = max_steps
        self.calculator = calculator
        self.calculator_calls = calculator_calls
        self.observation_space = gym.spaces.Dict({"problem": gym.spaces.Text(100_000),
                                                  "solution": gym.spaces.Text(100_000)})
        self.action_space = gym.spaces.Text(10_000)
        self.index = 0
        self.lines: list[str] = []

    @property
    def current(self) -> dict[str, Any]:
        return self.problems[self.index]

    def _obs(self) -> dict[str, str]:
        return {"problem": self.current["problem"], "solution": "".join(line + "\n" for line in self.lines)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "index" in options:
            index = int(options["index"])
            if not 0 <= index < len(self.problems):
                raise IndexError(f"MathEnv.reset: index {index} outside [0, {len(self.problems)})")
            self.index = index
        else:
            self.index = int(self.np_random.integers(len(self.problems)))
        self.lines = []
        return self._obs(), {"id": self.current.get("id", self.index), "answer": self.current["answer"]}

    def step(self, action: str):
        line = action.split("\n", 1)[0].rstrip()
        calls = 0
        if self.calculator and line:
            line, calls = apply_calculator(line, self.calculator_calls)
        info: dict[str, Any] = {"line": line, "calculator_calls": calls, "parsed_answer": None, "success": False}
        if not line.strip():
            # An empty line means the policy ended its turn (end-of-turn token or a blank line).
            return self._obs(), 0.0, True, False, {**info, "end": "end_of_turn"}
        self.lines.append(line)
        if ANSWER_RE.search(line):
            parsed = extract_answer(line)
            success = answers_match(parsed, str(self.current["answer"]))
            info.update(parsed_answer=parsed, success=success, end="answer")
            return self._obs(), float(success), True, False, info
        truncated = len(self.lines) >= self.max_steps
        return self._obs(), 0.0, False, truncated, {**info, "end": "max_steps" if truncated else None}
