"""KALM's goals, instruction phrasings, splits and levels on two benchmarks, and the observation success rule.

Benchmarks (``BENCHMARKS``):

- ``metaworld`` — continuous, 4-d actions in [-1, 1], 39-d observations (``llmrl.envs.metaworld_tasks``).
  Training tasks: KALM's ten (reach, push, pick-place, button-press, door-unlock, door-open, window-open,
  faucet-open, coffee-push, coffee-button), 12 phrasings each: 8 train, 2 validation, 2 test (*rephrase*).
  *easy*: reach-wall, push-wall, pick-place-wall, button-press-wall, door-lock, door-close, window-close,
  faucet-close. *hard*: hammer, soccer, make-coffee, locked-door-open (two-stage, composed here).
- ``babyai`` — discrete, 7 actions, 41-d compact states: agent, carried object, one position slot per
  (type, colour), each a categorical field (``llmrl.envs.kalm_babyai``). Stands in for CLEVR-Robot
  (as in KALM's follow-up ImagineBench). Task types go-to and pick-up over 3 object types × 6 colours.
  Training: every (colour, type) combination except ``HELD_OUT_COMBOS``, canonical and paraphrased missions
  (6 train templates per verb); validation: 2 held-out templates; *rephrase*: 2 further held-out templates on the
  training combinations; *easy*: the held-out combinations with training templates; *hard*: the unseen
  composition "pick up X, then go to Y holding it".

Splits: ``train`` (offline data and grounding only), ``validation`` (any selection of settings), ``test`` (the
three levels, evaluation only). A goal is a (benchmark, task, instruction) triple; the three splits share none,
and validation and test phrasings never occur in training (``tests/test_kalm_envs.py`` checks both).

Initial configurations are split too (``START_SPLITS``): every episode seed lies in the seed range of exactly one
of ``train`` (offline data), ``validation`` (held-out grounding losses), ``test`` (evaluation) and ``imagine``
(imagined rollouts' real initial states). Meta-World maps a seed to a task variation (object and goal positions)
of its own split only (``metaworld_variation``), so no two splits start from the same configuration; BabyAI draws
its room layout from the seed, and the ranges are disjoint. ``check_seed_range`` rejects a seed parameter whose
episodes would leave its split's range. Initial states of different splits never coincide (tested on both
benchmarks at the pipeline's parameters).

The observation success rule ``obs_success(goal, obs)`` decides success from one observation, so rewards are
labelled identically on real and imagined data (``label_rewards``) and imagined rollouts know when to stop:

- babyai: every step's object must be where the step puts it, read from the compact state
  (``kalm_babyai.compact_success``): go-to → the goal object is in the cell the agent faces; pick-up → the agent
  carries it. For "pick up X, then go to Y": carries X and faces Y.
- metaworld: the distance between the task's tracked point and the goal (obs[36:39]) on the axes metaworld's own
  success uses, below the same threshold (``METAWORLD_RULES``): e.g. reach — hand obs[0:3], all axes, 0.05;
  button-press — object obs[4:7], y only, 0.02; hammer — the nail obs[11:14], y, 0.01 (metaworld checks the nail
  joint > 0.09, not observed directly). Two-stage tasks use their second stage's rule, on observations whose
  goal height marks the second stage (``METAWORLD_STAGE_GUARD``).

Agreement of this rule with each env's own success on real scripted episodes is measured by ``kalm_data``
(``metrics/kalm/data.json``: ``rule_agreement``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np

from llmrl.envs import kalm_babyai as bab
from llmrl.envs import metaworld_tasks as mw

__all__ = ["BENCHMARKS", "LEVELS", "SPLITS", "UnknownLevelError", "ObservationSizeError", "Goal", "ActionSpec",
           "METAWORLD_TRAIN_TASKS", "METAWORLD_EASY_TASKS", "METAWORLD_PHRASINGS", "all_goals", "goals", "obs_dim",
           "obs_fields", "action_spec", "StartSplit", "START_SPLITS", "start_split", "check_seed_range",
           "metaworld_variation", "per_goal", "goal_schedule", "one_per_task", "obs_copies", "EnvSettings", "make_goal_env", "GoalEnvPool", "check_obs",
           "obs_success", "label_rewards"]

BENCHMARKS = ("metaworld", "babyai")
LEVELS = ("rephrase", "easy", "hard")
SPLITS = ("train", "validation", "test")
Benchmark = Literal["metaworld", "babyai"]


class UnknownLevelError(KeyError):
    """A benchmark, level or split name that does not exist; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError quotes its message; print it plainly
        return str(self.args[0])


class ObservationSizeError(ValueError):
    """An observation whose size is not the benchmark's ``obs_dim``."""


@dataclass(frozen=True)
class Goal:
    """One goal: ``task`` is the machine-readable task (metaworld name or BabyAI task string)."""

    benchmark: str
    task: str
    instruction: str
    level: str  # "train", "validation", or a test level ("rephrase", "easy", "hard")
    split: str  # "train", "validation" or "test"


@dataclass(frozen=True)
class ActionSpec:
    discrete: bool
    n: int  # number of actions (discrete) or action dimension (continuous)
    low: float = -1.0
    high: float = 1.0


# ------------------------------------------------------------------------------------------------ Meta-World

METAWORLD_TRAIN_TASKS = ("reach", "push", "pick-place", "button-press", "door-unlock", "door-open",
                         "window-open", "faucet-open", "coffee-push", "coffee-button")
METAWORLD_EASY_TASKS = ("reach-wall", "push-wall", "pick-place-wall", "button-press-wall", "door-lock",
                        "door-close", "window-close", "faucet-close")
METAWORLD_HARD_TASKS = ("hammer", "soccer", "make-coffee", "locked-door-open")

# 12 phrasings per training task: [0:8] train, [8:10] validation, [10:12] test (rephrase).
METAWORLD_PHRASINGS: dict[str, tuple[str, ...]] = {
    "reach": ("reach the goal position", "move your hand to the goal", "put the gripper at the target point",
              "reach to the target", "bring the hand to the goal location", "move the arm to the target spot",
              "reach toward the marked position", "go to the goal with the end effector",
              "extend the arm to the goal", "position the gripper over the target",
              "stretch out and touch the goal point", "get the hand onto the target location"),
    "push": ("push the puck to the goal", "slide the puck to the target", "push the block to the goal position",
             "move the puck by pushing it to the target", "shove the object to the goal",
             "push the small object to the marked spot", "nudge the puck until it reaches the goal",
             "slide the object along the table to the target", "push the puck over to the goal location",
             "drive the block to the target by pushing", "press the puck forward until it sits on the goal",
             "get the puck to the target without lifting it"),
    "pick-place": ("pick up the puck and place it at the goal", "grasp the object and put it on the target",
                   "lift the puck and move it to the goal", "pick the block up and set it at the target",
                   "take the puck and place it at the goal position", "grab the object and drop it at the goal",
                   "pick and place the puck at the target", "carry the puck to the goal in the gripper",
                   "hold the puck and bring it to the target spot", "lift the object over to the goal",
                   "raise the puck and deliver it to the marked point", "seize the block and leave it at the goal"),
    "button-press": ("press the button", "push the button in", "press down the button from the front",
                     "hit the button", "push the button on the box", "press the button all the way",
                     "poke the button", "push in the button with the gripper", "depress the button",
                     "press the switch on the box", "jab the button until it clicks",
                     "use the hand to push the button home"),
    "door-unlock": ("unlock the door", "turn the lock to unlock the door", "open the lock on the door",
                    "rotate the door lock to unlock it", "release the door lock", "unlock the door's latch",
                    "twist the lock to the unlocked position", "disengage the lock on the door",
                    "unbolt the door", "free the door by unlocking it", "switch the door lock off",
                    "undo the lock of the door"),
    "door-open": ("open the door", "pull the door open", "swing the door open", "open the door by its handle",
                  "pull the door handle to open it", "open the cabinet door", "grab the handle and open the door",
                  "pull open the door all the way", "draw the door open", "move the door to the open position",
                  "haul the door wide open", "get the door open using the handle"),
    "window-open": ("open the window", "slide the window open", "push the window open sideways",
                    "open the sliding window", "move the window to open it", "slide the window pane open",
                    "open the window by sliding its handle", "push the window handle to open it",
                    "shift the window open", "slide open the glass pane", "glide the window to the open side",
                    "draw the window pane aside to open it"),
    "faucet-open": ("open the faucet", "turn the faucet on", "rotate the faucet handle to open it",
                    "turn on the tap", "open the tap", "twist the faucet handle open",
                    "turn the faucet handle to the open side", "switch the faucet on",
                    "rotate the tap handle to turn it on", "start the water by turning the faucet",
                    "spin the faucet lever open", "get the tap running by turning its handle"),
    "coffee-push": ("push the mug under the coffee machine", "slide the cup to the coffee machine",
                    "move the mug below the coffee spout", "push the cup under the machine",
                    "put the mug in place under the coffee machine", "slide the mug to the coffee maker",
                    "push the coffee cup to the machine", "bring the mug under the coffee nozzle",
                    "shove the cup beneath the coffee maker", "position the mug under the spout by pushing",
                    "nudge the mug until it sits under the coffee machine", "glide the cup into the coffee machine"),
    "coffee-button": ("press the coffee machine button", "push the button on the coffee machine",
                      "start the coffee machine", "press the button to make coffee", "hit the coffee button",
                      "turn on the coffee maker with its button", "push the coffee maker's button",
                      "press the start button of the coffee machine", "depress the coffee machine switch",
                      "activate the coffee machine by pressing its button", "poke the coffee maker's switch",
                      "jab the button on the front of the coffee machine"),
}
METAWORLD_TEST_PHRASINGS: dict[str, tuple[str, ...]] = {
    "reach-wall": ("reach the goal behind the wall", "move the hand over the wall to the target"),
    "push-wall": ("push the puck around the wall to the goal", "slide the puck past the wall to the target"),
    "pick-place-wall": ("pick up the puck and place it at the goal behind the wall",
                        "lift the block over the wall onto the target"),
    "button-press-wall": ("press the button behind the wall", "push the button that sits behind a wall"),
    "door-lock": ("lock the door", "turn the lock to lock the door"),
    "door-close": ("close the door", "push the door shut"),
    "window-close": ("close the window", "slide the window shut"),
    "faucet-close": ("close the faucet", "turn the faucet off"),
    "hammer": ("hammer the nail into the wall", "use the hammer to drive the nail in"),
    "soccer": ("kick the ball into the goal", "push the soccer ball into the net"),
    "make-coffee": ("make coffee: push the mug under the machine, then press its button",
                    "put the cup under the coffee machine and then start it"),
    "locked-door-open": ("unlock the door and then open it", "open the locked door"),
}

# (tracked point, axes, threshold): point "hand" = obs[0:3], "obj" = obs[4:7], "obj2" = obs[11:14]; goal obs[36:39].
_XYZ, _X, _Y, _Z = (0, 1, 2), (0,), (1,), (2,)
METAWORLD_RULES: dict[str, tuple[str, tuple[int, ...], float]] = {
    "reach": ("hand", _XYZ, 0.05), "reach-wall": ("hand", _XYZ, 0.05),
    "push": ("obj", _XYZ, 0.05), "push-wall": ("obj", _XYZ, 0.07),
    "pick-place": ("obj", _XYZ, 0.07), "pick-place-wall": ("obj", _XYZ, 0.07),
    "button-press": ("obj", _Y, 0.02), "button-press-wall": ("obj", _Y, 0.03),
    "coffee-button": ("obj", _Y, 0.02), "coffee-push": ("obj", _XYZ, 0.07),
    "door-unlock": ("obj", _X, 0.02), "door-lock": ("obj", _Z, 0.02),
    "door-open": ("obj", _X, 0.08), "door-close": ("obj", _XYZ, 0.08),
    "window-open": ("obj", _X, 0.05), "window-close": ("obj", _X, 0.05),
    "faucet-open": ("obj", _XYZ, 0.07), "faucet-close": ("obj", _XYZ, 0.07),
    "hammer": ("obj2", _Y, 0.01), "soccer": ("obj", _XYZ, 0.07),
    "make-coffee": ("obj", _Y, 0.02),          # second stage: coffee-button
    "locked-door-open": ("obj", _X, 0.08),     # second stage: door-open
}
_POINTS = {"hand": slice(0, 3), "obj": slice(4, 7), "obj2": slice(11, 14)}
# Two-stage tasks: the rule counts only on a second-stage observation, told apart by the goal's height
# (coffee-push's goal lies on the table, z ~ 0, coffee-button's at the button, z ~ 0.3; door-unlock's goal at the
# lock, z ~ 0.21, door-open's at handle height, z = 0.15). Without it the door-open rule fires during unlocking.
METAWORLD_STAGE_GUARD: dict[str, tuple[float, float]] = {
    "make-coffee": (0.2, 1.0), "locked-door-open": (0.0, 0.18),
}

# ------------------------------------------------------------------------------------------------ BabyAI

HELD_OUT_COMBOS = (("red", "ball"), ("green", "key"), ("blue", "box"), ("purple", "ball"), ("yellow", "key"))
# Templates per verb: [0:6] train, [6:8] validation, [8:10] test (rephrase). {o} = "<colour> <type>".
BABYAI_TEMPLATES = {
    "goto": ("go to the {o}", "walk to the {o}", "move to the {o}", "go next to the {o}",
             "head to the {o}", "navigate to the {o}", "approach the {o}", "get close to the {o}",
             "make your way over to the {o}", "stand in front of the {o}"),
    "pickup": ("pick up the {o}", "grab the {o}", "take the {o}", "pick the {o} up", "collect the {o}",
               "lift the {o}", "get the {o}", "fetch the {o}", "seize the {o} and hold it",
               "carry the {o} in your hand"),
}
BABYAI_HARD_TEMPLATES = ("pick up the {a}, then go to the {b} with it", "bring the {a} over to the {b}")
_N_HARD_PAIRS = 12


def _babyai_goals() -> list[Goal]:
    combos = [(c, t) for t in bab.OBJECT_TYPES for c in bab.COLOURS]
    trained = [ct for ct in combos if ct not in HELD_OUT_COMBOS]
    out: list[Goal] = []
    for verb, temps in BABYAI_TEMPLATES.items():
        for colour, kind in combos:
            task, o = f"{verb}:{colour}:{kind}", f"{colour} {kind}"
            if (colour, kind) in HELD_OUT_COMBOS:
                out += [Goal("babyai", task, t.format(o=o), "easy", "test") for t in temps[:2]]
                continue
            out += [Goal("babyai", task, t.format(o=o), "train", "train") for t in temps[:6]]
            out += [Goal("babyai", task, t.format(o=o), "validation", "validation") for t in temps[6:8]]
            out += [Goal("babyai", task, t.format(o=o), "rephrase", "test") for t in temps[8:10]]
    # Hard: compositions of two trained single steps, a fixed deterministic choice of pairs of distinct objects.
    rng = np.random.default_rng(0)
    pairs: list[tuple[tuple[str, str], tuple[str, str]]] = []
    while len(pairs) < _N_HARD_PAIRS:
        a, b = (trained[i] for i in rng.choice(len(trained), 2, replace=False))
        if (a, b) not in pairs:
            pairs.append((a, b))
    for (ca, ta), (cb, tb) in pairs:
        task = f"pickup:{ca}:{ta}>goto:{cb}:{tb}"
        out += [Goal("babyai", task, t.format(a=f"{ca} {ta}", b=f"{cb} {tb}"), "hard", "test")
                for t in BABYAI_HARD_TEMPLATES]
    return out


def _metaworld_goals() -> list[Goal]:
    out: list[Goal] = []
    for task, phr in METAWORLD_PHRASINGS.items():
        out += [Goal("metaworld", task, p, "train", "train") for p in phr[:8]]
        out += [Goal("metaworld", task, p, "validation", "validation") for p in phr[8:10]]
        out += [Goal("metaworld", task, p, "rephrase", "test") for p in phr[10:12]]
    level_of = dict.fromkeys(METAWORLD_EASY_TASKS, "easy") | dict.fromkeys(METAWORLD_HARD_TASKS, "hard")
    for task, phr in METAWORLD_TEST_PHRASINGS.items():
        level = level_of[task]
        out += [Goal("metaworld", task, p, level, "test") for p in phr]
    return out


_ALL: dict[str, list[Goal]] = {}


def all_goals(benchmark: str) -> list[Goal]:
    if benchmark not in BENCHMARKS:
        raise UnknownLevelError(f"benchmark {benchmark!r}: known are {list(BENCHMARKS)}")
    if benchmark not in _ALL:
        _ALL[benchmark] = _metaworld_goals() if benchmark == "metaworld" else _babyai_goals()
    return list(_ALL[benchmark])


def goals(benchmark: str, level_or_split: str) -> list[Goal]:
    """Goals of a split (``train``, ``validation``, ``test``) or a test level (``rephrase``, ``easy``, ``hard``).

    Raises ``UnknownLevelError`` for any other name (or benchmark).
    """
    every = all_goals(benchmark)
    if level_or_split in SPLITS:
        return [g for g in every if g.split == level_or_split]
    if level_or_split in LEVELS:
        return [g for g in every if g.level == level_or_split]
    raise UnknownLevelError(f"level {level_or_split!r} of {benchmark!r}: known are {list(SPLITS + LEVELS)}")


def obs_dim(benchmark: str) -> int:
    if benchmark not in BENCHMARKS:
        raise UnknownLevelError(f"benchmark {benchmark!r}: known are {list(BENCHMARKS)}")
    return mw.OBS_DIM if benchmark == "metaworld" else bab.OBS_DIM


def obs_fields(benchmark: str) -> list[tuple[int, int, str]]:
    """Categorical fields of the benchmark's observation as (first dim, classes, kind): every field of BabyAI's
    compact state (``kalm_babyai.obs_fields``); none for Meta-World (continuous)."""
    if benchmark not in BENCHMARKS:
        raise UnknownLevelError(f"benchmark {benchmark!r}: known are {list(BENCHMARKS)}")
    return [] if benchmark == "metaworld" else bab.obs_fields()


def obs_copies(benchmark: str) -> list[tuple[int, int]]:
    """(dim of s', dim of s) pairs a step copies exactly. Meta-World: the previous-frame block [18:36] of s' is
    [0:18] of s, and the goal [36:39] stays (within a single-stage task: the composed two-stage tasks change their
    goal at the stage switch, which a copy cannot follow; they are test goals only). BabyAI: none (its categorical
    heads predict every field, the unchanged ones included)."""
    if benchmark not in BENCHMARKS:
        raise UnknownLevelError(f"benchmark {benchmark!r}: known are {list(BENCHMARKS)}")
    if benchmark == "babyai":
        return []
    return [(mw.FRAME + i, i) for i in range(mw.FRAME)] + [(g, g) for g in mw.GOAL]


def action_spec(benchmark: str) -> ActionSpec:
    if benchmark not in BENCHMARKS:
        raise UnknownLevelError(f"benchmark {benchmark!r}: known are {list(BENCHMARKS)}")
    return ActionSpec(False, mw.ACTION_DIM) if benchmark == "metaworld" else ActionSpec(True, bab.N_ACTIONS, 0, 6)


# ------------------------------------------------------------------------------------------------ initial states


@dataclass(frozen=True)
class StartSplit:
    """Episode seeds ``first_seed <= s < end_seed`` and the Meta-World task variations they may start from."""

    name: str
    first_seed: int
    end_seed: int
    metaworld_variations: tuple[int, ...]


START_SPLITS: dict[str, StartSplit] = {s.name: s for s in (
    StartSplit("train", 0, 10_000, tuple(range(0, 25))),
    StartSplit("validation", 10_000, 20_000, tuple(range(25, 30))),
    StartSplit("test", 20_000, 30_000, tuple(range(30, 40))),
    StartSplit("imagine", 30_000, 40_000, tuple(range(40, 50))),
)}


def start_split(seed: int) -> StartSplit:
    """The split whose seed range holds ``seed``; ``ValueError`` outside every range."""
    for split in START_SPLITS.values():
        if split.first_seed <= seed < split.end_seed:
            return split
    raise ValueError(f"episode seed {seed} lies in no initial-state split "
                     f"({', '.join(f'{s.name} {s.first_seed}..{s.end_seed - 1}' for s in START_SPLITS.values())})")


def check_seed_range(split: str, first_seed: int, count: int, what: str) -> None:
    """Raise ``ValueError`` naming ``what`` unless seeds ``first_seed .. first_seed + count - 1`` are all in ``split``."""
    s = START_SPLITS[split]
    if not (s.first_seed <= first_seed and first_seed + count <= s.end_seed):
        raise ValueError(f"{what}: seeds {first_seed}..{first_seed + count - 1} must lie in the {split} initial-state "
                         f"range {s.first_seed}..{s.end_seed - 1} (llmrl.envs.kalm_levels.START_SPLITS)")


def metaworld_variation(seed: int) -> int:
    """The Meta-World task variation of episode ``seed``: one of its own split's variations, in turn."""
    split = start_split(seed)
    return split.metaworld_variations[(seed - split.first_seed) % len(split.metaworld_variations)]


def per_goal(n_goals: int, at_least: int) -> int:
    """Episodes per goal so that a level of ``n_goals`` goals gets at least ``at_least`` episodes, every goal the
    same number (one at least)."""
    return max(1, math.ceil(at_least / n_goals))


def goal_schedule(n_goals: int, per_goal: int, first_seed: int) -> list[tuple[int, int]]:
    """(goal index, episode seed) for ``per_goal`` episodes of each of ``n_goals`` goals: round k plays every goal
    once, episode j = k * n_goals + g has seed ``first_seed + j`` (every goal played equally, seeds distinct)."""
    return [(g, first_seed + k * n_goals + g) for k in range(per_goal) for g in range(n_goals)]


def one_per_task(goals: Sequence[Goal]) -> list[Goal]:
    """The first goal of each task, in order (one phrasing per task)."""
    seen: set[str] = set()
    return [g for g in goals if not (g.task in seen or seen.add(g.task))]


@dataclass(frozen=True)
class EnvSettings:
    """Per-benchmark env settings shared by data and evaluation (the horizon is a param)."""

    max_steps: int = 100
    room_size: int = 8
    num_distractors: int = 4

    @classmethod
    def for_benchmark(cls, env_params, benchmark: str) -> EnvSettings:
        """One benchmark's settings from the ``kalm.env`` params (``llmrl.config.kalm.KalmEnvParams``)."""
        if benchmark == "metaworld":
            return cls(max_steps=env_params.metaworld_max_steps)
        return cls(max_steps=env_params.babyai_max_steps, room_size=env_params.babyai_room_size,
                   num_distractors=env_params.babyai_num_distractors)


def make_goal_env(goal: Goal, seed: int = 0, settings: EnvSettings | None = None) -> gym.Env:
    """The goal's environment, reset once with ``seed``; ``info["success"]`` is the level's own checker.

    Observations are flat float32 vectors of ``obs_dim(goal.benchmark)``. Meta-World: episode seed s uses task
    variation ``metaworld_variation(s)``. BabyAI: the seed draws the room layout. Both truncate at
    ``settings.max_steps``.
    """
    s = settings or EnvSettings()
    if goal.benchmark == "metaworld":
        env = mw.make_task_env(goal.task, seed, s.max_steps, metaworld_variation)
    elif goal.benchmark == "babyai":
        env = bab.make_babyai_env(goal.task, goal.instruction, room_size=s.room_size,
                                  num_distractors=s.num_distractors, max_steps=s.max_steps)
    else:
        raise UnknownLevelError(f"benchmark {goal.benchmark!r}: known are {list(BENCHMARKS)}")
    env.reset(seed=seed)
    return env


class GoalEnvPool:
    """Goal environments built on first use and kept: ``env(goal, slot)`` is one instance per (goal, slot), so
    episodes of one goal running side by side use different slots. ``reset(seed=s)`` of a kept env starts where a
    fresh ``make_goal_env(goal, s)`` does, and a Meta-World build costs ~0.7 s of CPU, so reuse pays."""

    def __init__(self, settings: EnvSettings):
        self.settings = settings
        self._envs: dict[tuple[Goal, int], gym.Env] = {}

    def env(self, goal: Goal, slot: int = 0, seed: int = 0) -> gym.Env:
        key = (goal, slot)
        if key not in self._envs:
            self._envs[key] = make_goal_env(goal, seed, self.settings)
        return self._envs[key]

    def reset(self, goal: Goal, seed: int, slot: int = 0) -> tuple[gym.Env, np.ndarray]:
        env = self.env(goal, slot, seed)
        obs, _ = env.reset(seed=seed)
        return env, check_obs(goal.benchmark, obs, "initial observation")

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()

    def __enter__(self) -> GoalEnvPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_obs(benchmark: str, obs: np.ndarray, what: str = "observation") -> np.ndarray:
    """``obs`` as float32 [..., d]; raises ``ObservationSizeError`` naming ``what`` when d is not obs_dim."""
    arr = np.asarray(obs, dtype=np.float32)
    d = obs_dim(benchmark)
    if arr.ndim == 0 or arr.shape[-1] != d:
        raise ObservationSizeError(f"{what}: shape {arr.shape}, {benchmark} observations have size {d}")
    return arr


def obs_success(goal: Goal, obs: np.ndarray) -> bool:
    """The documented success rule (module docstring) on one observation."""
    o = check_obs(goal.benchmark, obs)
    if o.ndim != 1:
        raise ObservationSizeError(f"obs_success: one observation expected, got shape {o.shape}")
    if goal.benchmark == "babyai":
        return bab.compact_success(goal.task, o)
    point, axes, threshold = METAWORLD_RULES[goal.task]
    if goal.task in METAWORLD_STAGE_GUARD:
        low, high = METAWORLD_STAGE_GUARD[goal.task]
        if not low <= float(o[38]) <= high:
            return False
    diff = o[_POINTS[point]] - o[36:39]
    return bool(np.linalg.norm(diff[list(axes)]) <= threshold)


def label_rewards(goal: Goal, observations_next: Sequence[np.ndarray] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rewards and terminal flags for a trajectory from its next observations.

    Step t gets reward 1.0 and ``terminated`` when ``observations_next[t]`` satisfies ``obs_success`` and no
    earlier step did; the trajectory ends there, so the arrays are cut to that step + 1 (the caller cuts its own
    observations and actions the same way). Otherwise all rewards are 0 and nothing terminates.
    """
    nxt = check_obs(goal.benchmark, np.asarray(observations_next), "observations_next")
    if nxt.ndim != 2:
        raise ObservationSizeError(f"observations_next: shape {nxt.shape}, expected [T, {obs_dim(goal.benchmark)}]")
    T = len(nxt)
    for t in range(T):
        if obs_success(goal, nxt[t]):
            rewards = np.zeros(t + 1, np.float32)
            rewards[t] = 1.0
            terminated = np.zeros(t + 1, bool)
            terminated[t] = True
            return rewards, terminated
    return np.zeros(T, np.float32), np.zeros(T, bool)
