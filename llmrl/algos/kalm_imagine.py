"""KALM's imaginary rollouts for a level's goals, which of them to trust, and their quality against the simulator.

Rollouts: at least ``rollouts`` per level, every goal the same number (``rollout_schedule``), each from a
real initial state of the *imagine* initial-state split (seed ``p.seed + j``; never a training, validation or
evaluation configuration). As in KALM, the grounded model continues the instruction -> trajectory prompt from the
real s_0 greedily, one (a_t, s_{t+1}) at a time through its KV cache (``GroundedLM.imagine``), and stops at the
horizon or at the first imagined s_{t+1} that satisfies the level's observation rule (``obs_success``). The horizon
never exceeds the trajectory window the model was trained on (``check_horizon``: the original trains on whole
trajectories and imagines up to the same length). Rewards and terminals come from ``label_rewards`` through
``llmrl.envs.kalm_episodes.labelled_episode``: the same rule as the real data.

Which rollouts to trust, without the simulator (``consistency``): the grounded model reads each imagined
trajectory with its trajectory -> instruction pattern and scores candidate instructions: the rollout's own and one
phrasing of other tasks (the level's tasks and every training task; all of them, or a seeded draw of
``consistency_candidates``); a rollout is *consistent* when its own instruction scores highest. With
``labels: consistent`` only consistent rollouts feed offline RL.

The ``train`` level (one phrasing per training task, from imagine-split starts) is a control: its replay success
says whether the model imagines at all, before any claim about unseen goals; it never feeds offline RL.

Quality, as a diagnostic only (never a label), is measured against the simulator by
``llmrl.eval.kalm.rollout_quality``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from llmrl.config.kalm import KalmGroundParams, KalmImagineParams
from llmrl.data.trajectories import Episode
from llmrl.envs import kalm_levels as kl
from llmrl.envs.kalm_episodes import labelled_episode
from llmrl.llm.grounded import GroundedLM

__all__ = ["horizon", "check_horizon", "level_goals", "rollout_schedule", "imagine_level", "consistency_candidates",
           "consistency", "episode_text"]


def horizon(p: KalmImagineParams, benchmark: str) -> int:
    return p.metaworld_horizon if benchmark == "metaworld" else p.babyai_horizon


def check_horizon(p: KalmImagineParams, ground: KalmGroundParams, benchmark: str) -> int:
    """The benchmark's imagination horizon; ``ValueError`` naming both params when it exceeds the grounding window
    (the model would imagine steps it was never trained to continue)."""
    T = horizon(p, benchmark)
    if T > ground.window:
        raise ValueError(f"kalm.imagine.{benchmark}_horizon = {T} exceeds kalm.ground.window = {ground.window}: "
                         "imagination must not run past the trajectory length the model was trained on")
    return T


def level_goals(benchmark: str, level: str) -> list[kl.Goal]:
    """The goals imagined for ``level``: a test level's goals, or for ``train`` the first phrasing of each
    training task (the control)."""
    return kl.one_per_task(kl.goals(benchmark, "train")) if level == "train" else kl.goals(benchmark, level)


def rollout_schedule(goals: Sequence[kl.Goal], p: KalmImagineParams) -> list[tuple[int, int]]:
    """(goal index, initial-state seed) of every rollout of a level."""
    return kl.goal_schedule(len(goals), kl.per_goal(len(goals), p.rollouts), p.seed)


def imagine_level(model: GroundedLM, goals: Sequence[kl.Goal], p: KalmImagineParams, settings,
                  steps: int) -> list[Episode]:
    """At least ``p.rollouts`` imagined episodes over ``goals`` (all of one benchmark), every goal equally often, of
    at most ``steps`` steps, labelled by the real-data rule; episode order is ``rollout_schedule``'s."""
    if not goals:
        raise kl.UnknownLevelError("imagine_level: no goals")
    benchmark = goals[0].benchmark
    if model.spec.obs_dim != kl.obs_dim(benchmark):
        raise kl.ObservationSizeError(f"grounded model obs_dim {model.spec.obs_dim}, {benchmark} observations "
                                      f"have size {kl.obs_dim(benchmark)}")
    schedule = rollout_schedule(goals, p)
    kl.check_seed_range("imagine", p.seed, len(schedule), "kalm.imagine.seed")
    with kl.GoalEnvPool(settings) as envs:
        starts = [(goals[g], seed, envs.reset(goals[g], seed)[1]) for g, seed in schedule]
    gen = torch.Generator().manual_seed(p.seed)
    episodes = []
    for lo in tqdm(range(0, len(starts), p.batch_size), desc=f"imagine {benchmark}/{goals[0].level}"):
        chunk = starts[lo:lo + p.batch_size]
        chunk_goals = [g for g, _, _ in chunk]

        def stop(_t, nxt, chunk_goals=chunk_goals):
            return [kl.obs_success(g, o) for g, o in zip(chunk_goals, nxt, strict=True)]

        acts, nexts, lengths = model.imagine([g.instruction for g in chunk_goals],
                                             np.stack([s for _, _, s in chunk]), steps, greedy=p.greedy,
                                             temperature=p.temperature, generator=gen, stop=stop)
        for j, (goal, seed, s0) in enumerate(chunk):
            n = int(lengths[j])
            nxt = nexts[j, :n].astype(np.float32)
            obs = np.concatenate([s0[None], nxt[:-1]], 0)
            episodes.append(labelled_episode(goal, obs, acts[j, :n], nxt, seed=seed, policy="grounded-llm",
                                             info={"imaginary": True, "greedy": p.greedy}))
    return episodes


def consistency_candidates(benchmark: str, level: str) -> list[kl.Goal]:
    """One instruction per task a consistency check chooses among: the level's tasks (their first phrasing at the
    level) and every training task (its first training phrasing), so a rollout that merely replays a trained skill
    is named after that skill."""
    return kl.one_per_task(level_goals(benchmark, level) + kl.goals(benchmark, "train"))


def consistency(model: GroundedLM, episodes: Sequence[Episode], candidates: Sequence[kl.Goal], states: int,
                others: int = 0, seed: int = 0) -> list[dict]:
    """Per episode: whether the model scores the episode's own instruction above every competitor (``consistent``),
    the instruction it scores highest (``named``) and the own instruction's rank. Competitors: the candidates of
    other tasks, all of them (``others`` = 0) or ``others`` drawn for episode i with ``default_rng([seed, i])``.
    Score: mean log-probability per token of the instruction after the trajectory -> instruction prompt with
    ``states`` states (``GroundedLM.instruction_logprobs``)."""
    out = []
    for i, ep in enumerate(tqdm(episodes, desc="consistency", leave=False)):
        rivals = [c for c in candidates if c.task != ep.info["task"]]
        if others and others < len(rivals):
            pick = np.random.default_rng([seed, i]).choice(len(rivals), others, replace=False)
            rivals = [rivals[j] for j in sorted(pick)]
        texts = [ep.mission] + [c.instruction for c in rivals]
        scores = model.instruction_logprobs(ep.observations["obs"], ep.actions, ep.observations["next_obs"][-1],
                                            texts, states)
        rank = int((scores[1:] > scores[0]).sum()) + 1
        out.append({"consistent": rank == 1, "named": texts[int(np.argmax(scores))], "own_rank": rank,
                    "competitors": len(rivals)})
    return out


def episode_text(ep: Episode, limit: int = 6) -> dict:
    """A readable dump of one imagined episode (first ``limit`` steps)."""
    return {"instruction": ep.mission, "seed": ep.seed, "length": len(ep),
            "imagined_success": bool(ep.terminated[-1]),
            "actions": np.asarray(ep.actions[:limit]).round(3).tolist(),
            "next_obs": np.asarray(ep.observations["next_obs"][:limit]).round(3).tolist()}
