"""KALM evaluation: goal-conditioned policies on a level's goals, many episodes stepped in lockstep.

Protocol: every goal of a level is played ``per_goal`` times (``kalm_levels.goal_schedule``: episode
j = k * len(goals) + g plays goal g from ``reset(seed=first_seed + j)``), from initial states of the *test* split
(``kalm_levels.START_SPLITS``: never a training, validation or imagination configuration), so every policy meets the
same goals and initial states and no goal is left out. Episodes run until the env terminates (its own success
checker) or truncates at the level's step cap. All live episodes are stepped together so a d3rlpy policy predicts
one batch per step (the gymnasium vector envs need one env class per vector, and our episodes mix goals).
Environments are built once per (goal, round) and reused across policies (Meta-World builds take ~1-2 s each).

Results aggregate over training seeds with ``llmrl.eval.seeds.aggregate_seeds`` (seed = unit); each row also
records its success per goal.

Imagined rollouts (``llmrl.algos.kalm_imagine``) are measured here too, as a diagnostic only: ``rollout_quality``
replays each imagined action sequence open-loop in the real env from the same seed and reports the env's own
success of the replay and the per-step error between imagined and simulated states against the step index (beside
the error of copying the real initial state, ``copy_mae``), for all rollouts and for the consistent ones, beside the success of as many uniformly random actions from the same starts
(the reference the replay must beat: ``imagines`` says whether the replay's interval clears the random one's).

Gate 0, before any imagination (``gate_goals``, ``closed_loop``, ``gate0``): the grounded model acting as a policy
in the real simulator on the *training* goals (one phrasing per task) from *validation* starts, beside random
actions and BC trained on the same real data from the same starts. An imagined rollout is this policy's actions
through this model's dynamics: if the policy does not beat random actions on real states, no imagined rollout can.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmrl.data.trajectories import Episode
from llmrl.envs import kalm_levels as kl
from llmrl.eval.paired import mean_bootstrap
from llmrl.eval.stats import compare_intervals, wilson_interval

__all__ = ["BatchAct", "EpisodeOutcome", "run_level", "offline_act", "random_act", "grounded_act",
           "evaluate_benchmark", "ReplayResult", "replay", "rollout_quality", "gate_goals", "closed_loop",
           "success_summary", "gate0", "pool_gate0", "swapped_goals"]

# act(obs [n, d], goal indices [n], episode indices [n]) -> actions [n, ...]
BatchAct = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass
class EpisodeOutcome:
    goal: int
    seed: int
    success: bool
    length: int


def run_level(act: BatchAct, goals: Sequence[kl.Goal], pool: kl.GoalEnvPool, per_goal: int, first_seed: int
              ) -> list[EpisodeOutcome]:
    """Play ``per_goal`` episodes of every goal in lockstep (``goal_schedule``); outcomes in episode order."""
    schedule = kl.goal_schedule(len(goals), per_goal, first_seed)
    episodes = len(schedule)
    envs = [pool.env(goals[g], j // len(goals), seed) for j, (g, seed) in enumerate(schedule)]
    obs = np.stack([env.reset(seed=seed)[0] for env, (_g, seed) in zip(envs, schedule)]).astype(np.float32)
    live = np.ones(episodes, bool)
    lengths = np.zeros(episodes, int)
    success = np.zeros(episodes, bool)
    goal_idx = np.asarray([g for g, _ in schedule])
    while live.any():
        idx = np.flatnonzero(live)
        actions = act(obs[idx], goal_idx[idx], idx)
        for k, j in enumerate(idx):
            nxt, _r, terminated, truncated, info = envs[j].step(actions[k])
            obs[j] = nxt
            lengths[j] += 1
            if terminated or truncated:
                live[j] = False
                success[j] = bool(info.get("success", False))
    return [EpisodeOutcome(int(goal_idx[j]), schedule[j][1], bool(success[j]), int(lengths[j]))
            for j in range(episodes)]


def offline_act(policy, embeddings: np.ndarray, sample_seed: int | None = None) -> BatchAct:
    """A ``BatchAct`` from an ``OfflinePolicy``; ``embeddings[g]`` is goal g's instruction embedding. Greedy, or
    with ``sample_seed`` drawn from the policy's action distribution (``OfflinePolicy.action_probs``: DiscreteBC),
    seeded per episode as ``random_act``."""
    if sample_seed is None:
        def act(obs, goals, _episodes):
            return policy.act_batch(obs, embeddings[goals])
        return act
    rngs: dict[int, np.random.Generator] = {}

    def sampled(obs, goals, episodes):
        probs = policy.action_probs(obs, embeddings[goals])
        return np.asarray([rngs.setdefault(int(j), np.random.default_rng([sample_seed, int(j)])).choice(
            probs.shape[1], p=row / row.sum()) for j, row in zip(episodes, probs.astype(np.float64), strict=True)])
    return sampled


def random_act(benchmark: str, seed: int) -> BatchAct:
    """Uniform random actions (discrete: all actions; continuous: uniform in [-1, 1]^d), seeded per episode."""
    spec = kl.action_spec(benchmark)
    rngs: dict[int, np.random.Generator] = {}

    def act(obs, _goals, episodes):
        out = []
        for j in episodes:
            rng = rngs.setdefault(int(j), np.random.default_rng([seed, int(j)]))
            out.append(int(rng.integers(spec.n)) if spec.discrete
                       else rng.uniform(spec.low, spec.high, spec.n).astype(np.float32))
        return np.asarray(out)
    return act


def grounded_act(model, goals: Sequence[kl.Goal]) -> BatchAct:
    """A ``BatchAct`` of KALM's grounded LLM (``GroundedLM``) acting greedily: the first call starts every episode
    of the level as one batch, later calls append each live episode's (a_t, s_{t+1}) to its row of the KV cache.
    Stepping the episodes together costs a few batched forwards per step instead of one forward per episode."""
    held: dict = {}

    def act(obs, goal_idx, episodes):
        episodes = [int(j) for j in episodes]
        if not held:
            state, h = model.start_episodes([goals[g].instruction for g in goal_idx], obs)
        else:
            state, last = held["state"], held["actions"]
            if episodes != held["episodes"]:  # some episodes ended: drop their rows
                keep = [held["episodes"].index(j) for j in episodes]
                state, last = model.select_rows(state, keep), last[keep]
            state, h = model.feed(state, last, obs)
        actions = model.actions_from_hidden(h, greedy=True)
        held.update(state=state, actions=actions, episodes=episodes)
        return actions
    return act


log = logging.getLogger("llmrl.kalm.eval")


@dataclass
class ReplayResult:
    success: bool  # the env's own checker during the open-loop replay
    mae: list[float]  # per step: mean |imagined s_{t+1} - simulated s_{t+1}| over dimensions
    l2: list[float]  # per step: ||imagined - simulated||_2
    copy_mae: list[float]  # per step: mean |s_0 - simulated s_{t+1}|: the last real state copied, the baseline


def replay(episode: Episode, goal: kl.Goal, envs: kl.GoalEnvPool, actions=None) -> ReplayResult:
    """Replay the imagined actions (or ``actions`` instead) open-loop in the real env from the episode's seed."""
    env, obs = envs.reset(goal, episode.seed)
    start = np.asarray(obs, np.float32)
    success, mae, l2, copy = False, [], [], []
    imagined = episode.observations["next_obs"]
    for t, a in enumerate(episode.actions if actions is None else actions):
        obs, _r, terminated, truncated, info = env.step(int(a) if np.ndim(a) == 0 else np.asarray(a, np.float32))
        diff = np.asarray(obs, np.float32) - imagined[t]
        mae.append(float(np.abs(diff).mean()))
        l2.append(float(np.linalg.norm(diff)))
        copy.append(float(np.abs(np.asarray(obs, np.float32) - start).mean()))
        success = success or bool(info.get("success", False))
        if terminated or truncated:
            break
    return ReplayResult(success, mae, l2, copy)


def _rate(flags: Sequence[bool]) -> float | None:
    return round(float(np.mean(flags)), 4) if len(flags) else None


def _random_actions(goal: kl.Goal, n: int, seed: int) -> np.ndarray:
    spec = kl.action_spec(goal.benchmark)
    rng = np.random.default_rng([seed, n])
    if spec.discrete:
        return rng.integers(0, spec.n, n)
    return rng.uniform(spec.low, spec.high, (n, spec.n)).astype(np.float32)


def _wilson(flags: Sequence[bool]) -> dict:
    low, high = wilson_interval(int(sum(flags)), len(flags)) if len(flags) else (0.0, 1.0)
    return {"ci_low": round(low, 4), "ci_high": round(high, 4)}


def rollout_quality(episodes: Sequence[Episode], goals: Sequence[kl.Goal], settings,
                    consistent: Sequence[bool] | None = None) -> tuple[dict, list[dict], list[dict]]:
    """Headline quality figures of a level's imagined episodes, a per-episode table and the per-step error
    against the step index (mean over the rollouts whose replay reached that step).

    ``goals[i]`` is episode i's goal; ``consistent[i]`` its consistency verdict (``consistency``), if checked.
    """
    rows, succ, rule, maes, l2s, rand = [], [], [], [], [], []
    by_step: dict[int, list[float]] = {}
    copy_by_step: dict[int, list[float]] = {}
    with kl.GoalEnvPool(settings) as envs:
        for i, ep in enumerate(episodes):
            r = replay(ep, goals[i], envs)
            rand.append(replay(ep, goals[i], envs, _random_actions(goals[i], len(ep), ep.seed)).success)
            succ.append(r.success)
            rule.append(bool(ep.terminated[-1]))
            maes.extend(r.mae)
            l2s.extend(r.l2)
            for t, (v, c) in enumerate(zip(r.mae, r.copy_mae)):
                by_step.setdefault(t, []).append(v)
                copy_by_step.setdefault(t, []).append(c)
            rows.append({"task": goals[i].task, "instruction": ep.mission, "seed": ep.seed, "length": len(ep),
                         "imagined_success": bool(ep.terminated[-1]), "replay_success": r.success,
                         "consistent": None if consistent is None else bool(consistent[i]),
                         "mae_mean": round(float(np.mean(r.mae)), 5) if r.mae else None,
                         "mae_first": round(r.mae[0], 5) if r.mae else None,
                         "mae_last": round(r.mae[-1], 5) if r.mae else None})
    n = len(episodes)
    curve = [{"step": t + 1, "mae": round(float(np.mean(v)), 5),
              "copy_mae": round(float(np.mean(copy_by_step[t])), 5), "rollouts": len(v)}
             for t, v in sorted(by_step.items())]
    replay_ci, random_ci = _wilson(succ), _wilson(rand)
    summary = {
        "rollouts": n,
        "imagined_success": _rate(rule),
        "replay_success": _rate(succ),
        "replay_success_ci": [replay_ci["ci_low"], replay_ci["ci_high"]],
        "random_replay_success": _rate(rand),
        "random_replay_success_ci": [random_ci["ci_low"], random_ci["ci_high"]],
        "imagines": compare_intervals(replay_ci, random_ci) == "higher",
        "replay_success_given_imagined": _rate([s for s, r in zip(succ, rule) if r]),
        "step_mae": round(float(np.mean(maes)), 5) if maes else None,
        "step_l2": round(float(np.mean(l2s)), 5) if l2s else None,
        "first_step_mae": curve[0]["mae"] if curve else None,
        "last_step_mae": curve[-1]["mae"] if curve else None,
        "first_step_copy_mae": curve[0]["copy_mae"] if curve else None,
        "last_step_copy_mae": curve[-1]["copy_mae"] if curve else None,
        "mean_length": round(float(np.mean([len(e) for e in episodes])), 2) if n else None,
    }
    if consistent is not None:
        kept = [i for i in range(n) if consistent[i]]
        summary |= {"consistent": len(kept), "consistent_share": _rate(list(consistent)),
                    "imagined_success_consistent": _rate([rule[i] for i in kept]),
                    "replay_success_consistent": _rate([succ[i] for i in kept])}
    return summary, rows, curve



def swapped_goals(goals: Sequence[kl.Goal]) -> list[kl.Goal]:
    """For each goal, the first goal after it (cyclically) whose task's first step shares none of its verb, colour
    and object type (BabyAI: ``goto:red:ball`` is swapped for neither ``goto:blue:box`` nor ``pickup:blue:ball``;
    Meta-World: another task), else the first with another task: the instruction a swapped-instruction control
    gives it. Neighbours in the goal list mostly differ in colour alone, and a policy that read only the verb or
    only the type would pass such a swap."""
    def parts(task: str) -> tuple[str, ...]:
        first = task.split(">")[0].split(":")
        return tuple(first) if len(first) == 3 else (task,)

    out = []
    for i, goal in enumerate(goals):
        own = parts(goal.task)
        order = [goals[(i + k) % len(goals)] for k in range(1, len(goals))]
        other = [g for g in order if g.task != goal.task]
        if not other:
            raise ValueError(f"swapped_goals: no goal with another task than {goal.task!r}")
        apart = [g for g in other if len(parts(g.task)) == len(own)
                 and all(a != b for a, b in zip(parts(g.task), own, strict=True))]
        out.append((apart or other)[0])
    return out


def gate_goals(benchmark: str) -> list[kl.Goal]:
    """Gate 0's goals: the first training phrasing of each training task (goals the model was grounded on)."""
    return kl.one_per_task(kl.goals(benchmark, "train"))


def closed_loop(rows: dict[str, BatchAct], goals: Sequence[kl.Goal], settings: kl.EnvSettings, episodes: int,
                first_seed: int, what: str = "kalm.ground.gate_seed") -> dict[str, list[EpisodeOutcome]]:
    """Each row's episodes in the real simulator on ``goals`` from *validation* starts: at least ``episodes``, every
    goal equally (``run_level``; the same goals and starts for every row). ``ValueError`` naming ``what`` when the
    seeds would leave the validation range."""
    if episodes <= 0:
        raise ValueError(f"closed_loop: episodes must be > 0, got {episodes}")
    per = kl.per_goal(len(goals), episodes)
    kl.check_seed_range("validation", first_seed, len(goals) * per, what)
    with kl.GoalEnvPool(settings) as pool:
        return {name: run_level(act, goals, pool, per, first_seed) for name, act in rows.items()}


def success_summary(flags: Sequence[bool], confidence: float = 0.95) -> dict:
    """Success rate, its Wilson interval and the episode count of pooled 0/1 outcomes."""
    flags = [bool(f) for f in flags]
    if not flags:
        raise ValueError("success_summary: no episodes")
    low, high = wilson_interval(sum(flags), len(flags), confidence)
    return {"success": round(float(np.mean(flags)), 4), "ci_low": round(low, 4), "ci_high": round(high, 4),
            "episodes": len(flags)}


def gate0(grounded: Sequence[Sequence[bool]], random: Sequence[bool], confidence: float = 0.95) -> dict:
    """Gate 0's verdict: does the grounded policy act clearly above random actions on real states?

    ``grounded``: one list of episode successes per grounding seed; ``random``: random actions' successes from the
    same goals and starts. Passes when the Wilson interval of the grounded episodes (pooled over seeds) lies wholly
    above random's: the rule of gate 1 (``rollout_quality``'s ``imagines``) and of the page's claims
    (``compare_intervals``), so both gates read alike. A paired test (McNemar, the starts are shared) would pass
    smaller gaps; "clearly above" asks for separated intervals. Each seed's verdict by the same rule is recorded:
    imagination from a seed that fails alone says nothing about KALM either."""
    if not grounded or any(len(s) == 0 for s in grounded):
        raise ValueError("gate0: grounded needs at least one seed with episodes")
    if not random:
        raise ValueError("gate0: random needs episodes")
    rand = success_summary(random, confidence)
    pooled = success_summary([f for s in grounded for f in s], confidence)
    per_seed = [success_summary(s, confidence) for s in grounded]
    return {"passed": compare_intervals(pooled, rand) == "higher", "grounded": pooled, "random": rand,
            "per_seed": [{**s, "passed": compare_intervals(s, rand) == "higher"} for s in per_seed],
            "rule": "grounded Wilson lower bound > random Wilson upper bound", "confidence": confidence}


GATE_ROWS = ("grounded", "random", "bc")  # every gate has them
# where actions are discrete, and where kalm.ground.gate_swap_benchmarks asks for the swapped-instruction control
GATE_OPTIONAL = ("bc_sampled", "grounded_swapped", "bc_sampled_swapped")


def pool_gate0(seeds: dict[int, dict[str, Sequence[bool]]], confidence: float = 0.95) -> dict:
    """Gate 0 over grounding seeds trained apart (one kalm_ground item each): ``seeds`` maps each grounding seed
    to its episode successes per row (``grounded``, ``random``, ``bc``; every seed plays the same goals and
    starts). The verdict is ``gate0`` on the seeds' grounded episodes against every seed's random episodes, each
    seed's own verdict labelled with its seed; BC's episodes (greedy, and sampled where every seed has them) are
    pooled alike, as the reference of what the same real data teaches, and so are the swapped-instruction rows
    (``swapped_goals``), with ``reads_goal``: each row's success under its own instruction minus under another
    task's, per seed and start, bootstrapped with starts and seeds as crossed factors ("higher" only where the
    goal's text is read)."""
    if not seeds:
        raise ValueError("pool_gate0: no grounding seed")
    for seed, rows in seeds.items():
        missing = [row for row in GATE_ROWS if not rows.get(row)]
        if missing:
            raise ValueError(f"pool_gate0: grounding seed {seed} has no episodes of {missing}")
    verdict = gate0([rows["grounded"] for rows in seeds.values()],
                    [f for rows in seeds.values() for f in rows["random"]], confidence)
    verdict["per_seed"] = [{"seed": seed, **v} for seed, v in zip(seeds, verdict["per_seed"])]
    optional = [row for row in ("bc", *GATE_OPTIONAL) if all(rows.get(row) for rows in seeds.values())]
    pooled = {row: success_summary([f for rows in seeds.values() for f in rows[row]], confidence) for row in optional}
    # own instruction minus another task's, per seed and start: both share the seed's model (and a sampled row its
    # per-episode random stream), so the difference is taken within each (seed, start) and then bootstrapped with
    # starts and seeds as crossed factors (llmrl.eval.paired)
    reads_goal = {}
    for row in ("grounded", "bc_sampled"):
        if f"{row}_swapped" in optional:
            own = np.asarray([rows[row] for rows in seeds.values()], float)
            difference = own - np.asarray([rows[f"{row}_swapped"] for rows in seeds.values()], float)
            boot = mean_bootstrap(difference, confidence=confidence)
            per_start = difference.mean(0)
            reads_goal[row] = {"difference": boot["mean"], "ci_low": boot["ci_low"], "ci_high": boot["ci_high"],
                               "starts": boot["items"], "seeds": boot["runs"],
                               "starts_higher": int((per_start > 0).sum()), "starts_lower": int((per_start < 0).sum()),
                               "verdict": "higher" if boot["ci_low"] > 0 else "lower" if boot["ci_high"] < 0
                               else "no difference"}
    return {**verdict, **pooled, **({"reads_goal": reads_goal} if reads_goal else {}), "seeds": list(seeds)}


def evaluate_benchmark(benchmark: str, *, offline_runs: Sequence[tuple[str, Path]], table, levels: Sequence[str],
                       settings: kl.EnvSettings, episodes: int, first_seed: int, random_seeds: int,
                       confidence: float = 0.95, grounded=None, grounded_episodes: int = 0,
                       threads: int = 1) -> dict:
    """Every row of one benchmark on every level; returns ``{"rows": [...], "episodes": [...], "headline": {...}}``.

    ``episodes`` (and ``grounded_episodes``): at least this many per level and seed, every goal equally often
    (``kalm_levels.per_goal``). ``offline_runs``: (row name, model path) per trained seed — runs sharing a row name are its seeds. Rows are
    aggregated with ``aggregate_seeds`` (training seed = unit); a DiscreteBC run ``<policy>-<data>`` is also evaluated
    with actions drawn from its distribution, as row ``<policy>-sampled-<data>`` (the same draws for every run: one
    stream per episode); the random row has ``random_seeds`` seeds; the
    grounded LLM row (``grounded.models[benchmark]``, a level's episodes in one batch) one. Each row's entry of
    a level carries its success per goal. The headline gives each row's success per level and their mean.
    """
    import torch
    from d3rlpy.algos import DiscreteBC

    from llmrl.agents.offline_policy import OfflinePolicy
    from llmrl.eval.seeds import aggregate_seeds

    torch.set_num_threads(threads)
    start = time.perf_counter()
    goals = {lv: kl.goals(benchmark, lv) for lv in levels}
    per_goal = {lv: kl.per_goal(len(goals[lv]), episodes) for lv in levels}
    for lv in levels:
        kl.check_seed_range("test", first_seed, len(goals[lv]) * per_goal[lv], "kalm.eval.seed")
    pool = kl.GoalEnvPool(settings)
    embeds = {lv: table.lookup([g.instruction for g in goals[lv]]) for lv in levels}
    scores: dict[str, dict[str, list[list[float]]]] = {}
    per_goal_hits: dict[tuple[str, str], dict[str, list[float]]] = {}
    episodes_out: list[dict] = []

    def record(row: str, level: str, seed, outcomes) -> None:
        scores.setdefault(row, {}).setdefault(level, []).append([float(o.success) for o in outcomes])
        hits = per_goal_hits.setdefault((row, level), {})
        for o in outcomes:
            hits.setdefault(goals[level][o.goal].instruction, []).append(float(o.success))
        episodes_out.extend({"benchmark": benchmark, "row": row, "level": level, "train_seed": seed,
                             "task": goals[level][o.goal].task, "goal": goals[level][o.goal].instruction,
                             "episode_seed": o.seed, "success": o.success, "length": o.length} for o in outcomes)

    for row, path in offline_runs:
        policy = OfflinePolicy.load(path, np.zeros(table.dim), name=row)
        for lv in levels:
            record(row, lv, str(path.parent.name), run_level(offline_act(policy, embeds[lv]), goals[lv], pool,
                                                             per_goal[lv], first_seed))
        if isinstance(policy.learnable, DiscreteBC):  # an imitation policy is a distribution: its draws apart
            policy_name, _, data = row.rpartition("-")
            for lv in levels:
                record(f"{policy_name}-sampled-{data}", lv, str(path.parent.name),
                       run_level(offline_act(policy, embeds[lv], sample_seed=first_seed), goals[lv], pool,
                                 per_goal[lv], first_seed))
        log.info("%s %s (%s) evaluated (%.0fs)", benchmark, row, path.parent.name, time.perf_counter() - start)
    for seed in range(random_seeds):
        for lv in levels:
            record("random", lv, seed, run_level(random_act(benchmark, seed), goals[lv], pool, per_goal[lv],
                                                 first_seed))
    if grounded is not None and grounded_episodes:
        if benchmark not in grounded.models:
            log.warning("no grounded LLM for %s (have %s): row left out", benchmark, sorted(grounded.models))
        else:
            for lv in levels:
                record("grounded-llm", lv, 0, run_level(grounded_act(grounded.models[benchmark], goals[lv]),
                                                        goals[lv], pool,
                                                        kl.per_goal(len(goals[lv]), min(grounded_episodes, episodes)),
                                                        first_seed))
        log.info("%s grounded-llm evaluated (%.0fs)", benchmark, time.perf_counter() - start)
    pool.close()
    rows, headline = [], {}
    for row, by_level in scores.items():
        levels_out = {}
        for lv, per_seed in by_level.items():
            agg = aggregate_seeds(per_seed, confidence=confidence, rng_seed=0, rate=True).summary()  # 0/1 successes
            by_goal = {g: round(float(np.mean(v)), 4) for g, v in per_goal_hits[(row, lv)].items()}
            rows.append({"benchmark": benchmark, "row": row, "level": lv, **agg, "goals": len(goals[lv]),
                         "episodes_per_goal_and_seed": len(per_seed[0]) // len(goals[lv]), "success_by_goal": by_goal})
            levels_out[lv] = agg["value"]
            log.info("%s %-22s %-8s success %.3f [%.3f, %.3f] seeds %s", benchmark, row, lv, agg["value"],
                     agg["ci_low"], agg["ci_high"], agg["per_seed"])
        headline[row] = {**levels_out, "mean": round(float(np.mean(list(levels_out.values()))), 4)}
    return {"rows": rows, "episodes": episodes_out, "headline": headline,
            "seconds": round(time.perf_counter() - start, 1)}
