"""Policies written as a flat parameter vector (ProPS), and their batched evaluation.

``LinearPolicy``: a = sW + b with W ∈ R^{d_s×d_a}, b ∈ R^{d_a}; argmax over a for discrete actions, the raw
output clipped to the action box for continuous ones (the environments clip anyway; clipping here keeps
actions inside the declared space). The vector is W row-major followed by b:
``params[i*d_a + j] = W[i, j]``, ``params[d_s*d_a + j] = b[j]``.

``QTablePolicy``: a table Q[s, a] over a discrete state space, greedy action argmax_a Q[s, a] (the original's
FrozenLake variant); ``params[s*n_a + a] = Q[s, a]``.

Both render their own parameter count and layout (``layout_text``), so a prompt can never announce a different
number of parameters than the policy uses (the original's CartPole description announced 18 for 10).

``evaluate_params`` plays ``episodes`` episodes for each of P parameter vectors at once: one environment per
episode, all stepped in lockstep with one batched policy call per step. gymnasium's ``SyncVectorEnv`` steps
every sub-environment on every call and auto-resets finished ones, so with episode lengths from 10 to 500
(CartPole) most of its work would be discarded steps; this evaluator steps only the episodes still running.
``evaluate_params_loop`` is the plain one-episode-at-a-time reference (same seeds, same returns).

``QuadraticObjective`` evaluates the environment-free ``QuadraticTask`` behind the same interface
(``n_params``, ``policy``, ``returns(params, seeds, search_seeds=...)``, ``close``); ``objective_for`` picks the
evaluator of a task. Episodes run at the task's own horizon (``ControlTask.horizon``), the one its prompts state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from llmrl.envs.control import ControlTask, QuadraticTask, as_task, make_control_env
from llmrl.envs.functions import FunctionTask

__all__ = ["LinearPolicy", "QTablePolicy", "PlainVector", "Policy", "policy_for", "ParamEvaluator",
           "QuadraticObjective", "objective_for", "evaluate_params", "evaluate_params_loop", "render_episode"]


@dataclass(frozen=True)
class LinearPolicy:
    obs_dim: int
    act_dim: int  # number of discrete actions, or the action vector's size
    discrete: bool
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None

    @classmethod
    def from_spaces(cls, observation_space: gym.Space, action_space: gym.Space) -> LinearPolicy:
        if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
            raise ValueError(f"LinearPolicy needs a flat Box observation space, got {observation_space}")
        if isinstance(action_space, gym.spaces.Discrete):
            return cls(int(observation_space.shape[0]), int(action_space.n), True)
        if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            return cls(int(observation_space.shape[0]), int(action_space.shape[0]), False,
                       tuple(float(x) for x in action_space.low), tuple(float(x) for x in action_space.high))
        raise ValueError(f"LinearPolicy needs a Discrete or flat Box action space, got {action_space}")

    @property
    def n_params(self) -> int:
        return (self.obs_dim + 1) * self.act_dim

    def split(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(..., n_params) → W (..., obs_dim, act_dim), b (..., act_dim)."""
        params = np.asarray(params, dtype=np.float64)
        if params.shape[-1] != self.n_params:
            raise ValueError(f"params: expected {self.n_params} values, got {params.shape[-1]}")
        k = self.obs_dim * self.act_dim
        return params[..., :k].reshape(*params.shape[:-1], self.obs_dim, self.act_dim), params[..., k:]

    def outputs(self, obs: np.ndarray, params: np.ndarray) -> np.ndarray:
        """sW + b for a batch: obs (B, obs_dim), params (B, n_params) or (n_params,) → (B, act_dim)."""
        obs = np.asarray(obs, dtype=np.float64).reshape(-1, self.obs_dim)
        w, b = self.split(params)
        if w.ndim == 2:
            return obs @ w + b
        return np.einsum("bs,bsa->ba", obs, w) + b

    def act(self, obs: np.ndarray, params: np.ndarray) -> np.ndarray:
        out = self.outputs(obs, params)
        if self.discrete:
            return out.argmax(axis=-1)
        return np.clip(out, self.action_low, self.action_high).astype(np.float32)

    def param_names(self) -> list[str]:
        return [f"params[{i}]" for i in range(self.n_params)]

    def layout_text(self, state_names: Sequence[str] | None = None, action_names: Sequence[str] | None = None) -> str:
        """The parameter count and what each parameter multiplies, rendered from this policy's shape."""
        s_names = list(state_names) if state_names else [f"state[{i}]" for i in range(self.obs_dim)]
        a_names = list(action_names) if action_names else [f"action[{j}]" for j in range(self.act_dim)]
        if len(s_names) != self.obs_dim or len(a_names) != self.act_dim:
            raise ValueError(f"layout_text: {len(s_names)} state / {len(a_names)} action names for a "
                             f"{self.obs_dim}x{self.act_dim} policy")
        k = self.obs_dim * self.act_dim
        rule = ("the action taken is the one with the largest output" if self.discrete
                else "the outputs are the action")
        lines = [
            f"The policy has {self.n_params} parameters: a weight matrix W with {self.obs_dim} rows (state "
            f"variables) and {self.act_dim} columns (action outputs), stored row by row in params[0] to "
            f"params[{k - 1}], followed by a bias b of {self.act_dim} value(s) in params[{k}] to "
            f"params[{self.n_params - 1}]. Output j = sum_i state[i] * W[i, j] + b[j]; {rule}.",
        ]
        for i in range(self.obs_dim):
            for j in range(self.act_dim):
                lines.append(f"params[{i * self.act_dim + j}]: weight from {s_names[i]} to {a_names[j]}")
        for j in range(self.act_dim):
            lines.append(f"params[{k + j}]: bias of {a_names[j]}")
        return "\n".join(lines)


@dataclass(frozen=True)
class QTablePolicy:
    n_states: int
    n_actions: int
    discrete: bool = True

    @classmethod
    def from_spaces(cls, observation_space: gym.Space, action_space: gym.Space) -> QTablePolicy:
        if not (isinstance(observation_space, gym.spaces.Discrete) and isinstance(action_space, gym.spaces.Discrete)):
            raise ValueError(f"QTablePolicy needs Discrete spaces, got {observation_space}, {action_space}")
        return cls(int(observation_space.n), int(action_space.n))

    @property
    def n_params(self) -> int:
        return self.n_states * self.n_actions

    def outputs(self, obs: np.ndarray, params: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.int64).reshape(-1)
        params = np.asarray(params, dtype=np.float64)
        if params.shape[-1] != self.n_params:
            raise ValueError(f"params: expected {self.n_params} values, got {params.shape[-1]}")
        q = params.reshape(*params.shape[:-1], self.n_states, self.n_actions)
        if q.ndim == 2:
            return q[obs]
        return q[np.arange(len(obs)), obs]

    def act(self, obs: np.ndarray, params: np.ndarray) -> np.ndarray:
        return self.outputs(obs, params).argmax(axis=-1)

    def param_names(self) -> list[str]:
        return [f"params[{i}]" for i in range(self.n_params)]

    def layout_text(self, state_names: Sequence[str] | None = None, action_names: Sequence[str] | None = None) -> str:
        a_names = list(action_names) if action_names else [f"action {a}" for a in range(self.n_actions)]
        if len(a_names) != self.n_actions:
            raise ValueError(f"layout_text: {len(a_names)} action names for {self.n_actions} actions")
        lines = [f"The policy has {self.n_params} parameters: a table of values Q[s, a] for {self.n_states} "
                 f"states and {self.n_actions} actions, params[s*{self.n_actions} + a] = Q[s, a]; in state s the "
                 f"action with the largest Q[s, a] is taken."]
        for a, name in enumerate(a_names):
            lines.append(f"params[s*{self.n_actions} + {a}]: value of '{name}' in state s")
        return "\n".join(lines)


@dataclass(frozen=True)
class PlainVector:
    """A parameter vector with no policy behind it (the quadratic task's point)."""

    n_params: int

    def param_names(self) -> list[str]:
        return [f"params[{i}]" for i in range(self.n_params)]


Policy = LinearPolicy | QTablePolicy | PlainVector


def policy_for(task: str | ControlTask) -> Policy:
    """The task's policy family, shaped from its environment's spaces."""
    t = as_task(task)
    env = make_control_env(t)
    try:
        cls = QTablePolicy if t.policy == "qtable" else LinearPolicy
        return cls.from_spaces(env.observation_space, env.action_space)
    finally:
        env.close()


class ParamEvaluator:
    """Episode returns of many parameter vectors, all episodes stepped together (module doc).

    Environments are built once per needed batch size and reused; episode ``k`` of a call resets with
    ``seeds[k]``, so the same (params, seeds) give the same returns whatever the batch composition.
    """

    def __init__(self, task: str | ControlTask, *, max_episode_steps: int | None = None):
        self.task = as_task(task)
        self.max_episode_steps = max_episode_steps  # None: the task's horizon
        self.policy = policy_for(self.task)
        self._envs: list[gym.Env] = []

    @property
    def n_params(self) -> int:
        return self.policy.n_params

    def _ensure(self, n: int) -> list[gym.Env]:
        while len(self._envs) < n:
            self._envs.append(make_control_env(self.task, max_episode_steps=self.max_episode_steps))
        return self._envs[:n]

    def returns(self, params: np.ndarray, seeds: Sequence[int] | np.ndarray, *,
                search_seeds: Sequence[int] | None = None) -> np.ndarray:
        """params (P, n_params), seeds (P, E) or (E,) shared → returns (P, E) and step counts in ``last_steps``.
        ``search_seeds`` (one per row) matter to ``QuadraticObjective`` only: an environment's episodes are
        fixed by their reset seeds."""
        params = np.atleast_2d(np.asarray(params, dtype=np.float64))
        n_p = params.shape[0]
        seeds = np.asarray(seeds, dtype=np.int64)
        if seeds.ndim == 1:
            seeds = np.broadcast_to(seeds, (n_p, seeds.shape[0]))
        if seeds.shape[0] != n_p:
            raise ValueError(f"seeds: {seeds.shape[0]} rows for {n_p} parameter vectors")
        n_e = seeds.shape[1]
        flat_params = np.repeat(params, n_e, axis=0)
        flat_seeds = seeds.reshape(-1)
        envs = self._ensure(len(flat_seeds))
        obs = [env.reset(seed=int(s))[0] for env, s in zip(envs, flat_seeds)]
        total = np.zeros(len(envs))
        steps = np.zeros(len(envs), dtype=np.int64)
        active = np.arange(len(envs))
        while len(active):
            actions = self.policy.act(np.stack([obs[i] for i in active]), flat_params[active])
            still = []
            for i, a in zip(active, actions):
                o, r, term, trunc, _ = envs[i].step(a.item() if self.policy.discrete else a)
                obs[i] = o
                total[i] += float(r)
                steps[i] += 1
                if not (term or trunc):
                    still.append(i)
            active = np.asarray(still, dtype=np.int64)
        self.last_steps = steps.reshape(n_p, n_e)
        return total.reshape(n_p, n_e)

    def close(self) -> None:
        for env in self._envs:
            env.close()
        self._envs = []


class QuadraticObjective:
    """The exact f of ``QuadraticTask`` or ``FunctionTask`` behind ``ParamEvaluator``'s interface: no episodes, so
    each row's E "returns" are its one value repeated; the row's ``search_seeds`` entry picks its function."""

    def __init__(self, task: QuadraticTask | FunctionTask):
        self.task = task
        self.policy = PlainVector(task.n_params)

    @property
    def n_params(self) -> int:
        return self.task.n_params

    def returns(self, params: np.ndarray, seeds: Sequence[int] | np.ndarray, *,
                search_seeds: Sequence[int] | None = None) -> np.ndarray:
        params = np.atleast_2d(np.asarray(params, dtype=np.float64))
        seeds = np.asarray(seeds)
        n_e = seeds.shape[-1]
        if search_seeds is None or len(search_seeds) != params.shape[0]:
            raise ValueError(f"search_seeds: the quadratic task needs one search seed per parameter vector "
                             f"({params.shape[0]}), got {None if search_seeds is None else len(search_seeds)}")
        values = np.array([self.task.values(p, s) for p, s in zip(params, search_seeds)])
        return np.repeat(values[:, None], n_e, axis=1)

    def close(self) -> None:
        pass


def objective_for(task: str | ControlTask | QuadraticTask | FunctionTask) -> ParamEvaluator | QuadraticObjective:
    """The evaluator of a task's parameter vectors: episodes of its environment, or an objective's exact f."""
    if isinstance(task, (QuadraticTask, FunctionTask)):
        return QuadraticObjective(task)
    return ParamEvaluator(task)


def evaluate_params(
    task: str | ControlTask,
    params: np.ndarray,
    seeds: Sequence[int],
    *,
    max_episode_steps: int | None = None,
) -> np.ndarray:
    """Returns (P, len(seeds)) of each parameter vector over the episodes seeded by ``seeds`` (batched)."""
    ev = ParamEvaluator(task, max_episode_steps=max_episode_steps)
    try:
        return ev.returns(params, seeds)
    finally:
        ev.close()


def evaluate_params_loop(
    task: str | ControlTask,
    params: np.ndarray,
    seeds: Sequence[int],
    *,
    max_episode_steps: int | None = None,
) -> np.ndarray:
    """The plain reference: one environment, one episode after another, one policy call per step."""
    t = as_task(task)
    policy = policy_for(t)
    params = np.atleast_2d(np.asarray(params, dtype=np.float64))
    env = make_control_env(t, max_episode_steps=max_episode_steps)
    out = np.zeros((params.shape[0], len(seeds)))
    try:
        for p, vec in enumerate(params):
            for e, seed in enumerate(seeds):
                obs, _ = env.reset(seed=int(seed))
                done = False
                while not done:
                    a = policy.act(np.asarray([obs]), vec)[0]
                    obs, r, term, trunc, _ = env.step(a.item() if policy.discrete else a)
                    out[p, e] += float(r)
                    done = term or trunc
    finally:
        env.close()
    return out


def render_episode(
    task: str | ControlTask,
    params: np.ndarray,
    seed: int,
    *,
    max_episode_steps: int | None = None,
) -> tuple[list[np.ndarray], float]:
    """RGB frames (``render_mode='rgb_array'``) and the return of one episode of ``params``."""
    t = as_task(task)
    policy = policy_for(t)
    env = make_control_env(t, max_episode_steps=max_episode_steps, render_mode="rgb_array")
    try:
        obs, _ = env.reset(seed=int(seed))
        frames = [env.render()]
        total, done = 0.0, False
        while not done:
            a = policy.act(np.asarray([obs]), np.asarray(params, dtype=np.float64))[0]
            obs, r, term, trunc, _ = env.step(a.item() if policy.discrete else a)
            total += float(r)
            frames.append(env.render())
            done = term or trunc
    finally:
        env.close()
    return frames, total
