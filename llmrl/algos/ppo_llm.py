"""PPO for LLM policies (GLAM), CleanRL style: collect, GAE, clipped policy and value losses, entropy bonus.

Defaults follow the original (clip 0.2, entropy 0.01, value 0.5, gamma = lambda = 0.99, 4 epochs, 40 frames per
env per update, reward 20 x BabyAI reward, Adam eps 1e-5, grad clip 0.5). Differences on purpose: statistics are
averaged over every epoch and minibatch (the original logged the last one); minibatches are split into
micro-batches whose gradients are accumulated, so memory does not grow with the minibatch size.

Every update ends with an atomic checkpoint of everything the next update depends on: trainable weights (LoRA
adapter or full model, heads), optimizer, RNG states, the environments themselves (pickled, mid-episode), their
prompt histories and the counters, stored with the run identity (`llmrl.checkpoint`). ``train`` resumes from it only
when the identity matches, so a killed run ends exactly like an unkilled one and a changed run starts afresh.
"""

from __future__ import annotations

import copy
import pickle
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tqdm.auto import tqdm

from llmrl.agents.llm_policy import History, LLMActorCritic, candidates_for, infer, render
from llmrl.algos.distilled_ppo import clipped_ppo_losses, gae
from llmrl.checkpoint import RunIdentity, load_resumable, run_identity, save_checkpoint
from llmrl.config.glam import GlamPPO
from llmrl.envs.make import episode_success

__all__ = ["EnvSlot", "collect", "ppo_update", "advantage_batch", "train"]


class EnvSlot:
    """One environment, its current observation, prompt history and running episode statistics."""

    def __init__(self, env: gym.Env, seed: int, history: int):
        self.env = env
        self.history = History(history)
        self.obs, _ = env.reset(seed=seed)
        self.history.reset(self.obs["text"])
        self.ep_return = 0.0
        self.ep_len = 0

    def prompt(self) -> tuple[str, tuple[str, ...]]:
        actions = tuple(self.env.get_wrapper_attr("action_texts"))
        labels = self.env.get_wrapper_attr("labels")
        return self.history.prompt(labels, actions, self.obs["mission"]), actions


def _rng_state(gen: torch.Generator) -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "sampler": gen.get_state()}


def _set_rng_state(state: dict, gen: torch.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    gen.set_state(state["sampler"])


def _save_checkpoint(path: Path, agent, optimizer, gen, slots, update, frames, rows,
                     identity: RunIdentity) -> None:
    save_checkpoint(path, {"update": update, "frames": frames, "metrics": rows,
                           "trainable": agent.trainable_state(), "optimizer": optimizer.state_dict(),
                           "rng": _rng_state(gen), "slots": pickle.dumps(slots)}, identity)


def _rendered(agent: LLMActorCritic, slots: list[EnvSlot]) -> tuple[list[str], list[list[str]]]:
    """Every env's current prompt as the model reads it, and its candidate actions."""
    prompts, cands = [], []
    for s in slots:
        p, acts = s.prompt()
        r = render(agent.llm, p)
        prompts.append(r)
        cands.append(candidates_for(r, acts))
    return prompts, cands


def collect(agent: LLMActorCritic, slots: list[EnvSlot], cfg: GlamPPO, gen: torch.Generator) -> dict:
    """``frames_per_env`` steps of every env, all envs scored as one batch per step."""
    T, N = cfg.frames_per_env, len(slots)
    capture = agent.trunk_start is not None  # keep the frozen layers' states for the update's epochs
    buf = {"prompts": [], "cands": [], "trunks": [], "actions": torch.zeros(T, N, dtype=torch.long),
           "logp": torch.zeros(T, N), "values": torch.zeros(T, N), "rewards": torch.zeros(T, N),
           "dones": torch.zeros(T, N)}
    finished = []
    memo: dict = {}  # the weights are fixed during a rollout: each distinct prompt is scored once
    for t in range(T):
        prompts, cands = _rendered(agent, slots)
        logits, values, *trunks = infer(agent, prompts, cands, memo, capture=capture)
        dist = torch.distributions.Categorical(logits=logits)
        actions = torch.multinomial(dist.probs, 1, generator=gen).squeeze(-1)
        buf["prompts"].append(prompts)
        buf["cands"].append(cands)
        if capture:
            buf["trunks"].append(trunks[0])
        buf["actions"][t] = actions
        buf["logp"][t] = dist.log_prob(actions)
        buf["values"][t] = values
        cut_prompts, cut_cands, cut_slots = [], [], []  # episodes truncated at this step, not terminated
        for i, s in enumerate(slots):
            a = int(actions[i])
            obs, reward, terminated, truncated, info = s.env.step(a)
            s.ep_return += float(reward)
            s.ep_len += 1
            if cfg.max_steps is not None and s.ep_len >= cfg.max_steps:
                truncated = True
            buf["rewards"][t, i] = cfg.reward_scale * float(reward)
            if truncated and not terminated:
                # A time limit is not a terminal state: bootstrap with gamma * V(s_{t+1}) of the state the episode
                # was cut in (GAE then treats the step as done, so the value enters through the reward).
                final = copy.deepcopy(s.history)
                final.push(cands[i][a].strip(), obs["text"])
                r = render(agent.llm, final.prompt(s.env.get_wrapper_attr("labels"),
                                                   tuple(s.env.get_wrapper_attr("action_texts")), obs["mission"]))
                cut_prompts.append(r)
                cut_cands.append(candidates_for(r, tuple(s.env.get_wrapper_attr("action_texts"))))
                cut_slots.append(i)
            if terminated or truncated:
                buf["dones"][t, i] = 1.0
                finished.append({"return": s.ep_return, "length": s.ep_len,
                                 "success": episode_success(info, float(reward), terminated)})
                s.obs, _ = s.env.reset()  # the env's own RNG stream continues: fixed by the first seed
                s.history.reset(s.obs["text"])
                s.ep_return, s.ep_len = 0.0, 0
            else:
                s.history.push(cands[i][a].strip(), obs["text"])
                s.obs = obs
        if cut_slots:
            cut_values = infer(agent, cut_prompts, cut_cands, memo)[1]
            for i, v in zip(cut_slots, cut_values):
                buf["rewards"][t, i] += cfg.gamma * float(v)
    buf["last_value"] = infer(agent, *_rendered(agent, slots), memo)[1]
    buf["episodes"] = finished
    return buf


def ppo_update(agent: LLMActorCritic, optimizer: torch.optim.Optimizer, batch: dict, cfg: GlamPPO,
               gen: torch.Generator, *, accelerator=None, model: torch.nn.Module | None = None) -> dict:
    """``epochs`` passes of clipped PPO over the flattened batch; returns statistics averaged over all of them.

    A minibatch's samples are grouped by their (prompt, candidates) row, and a micro-batch holds up to
    ``micro_batch`` distinct rows with every sample of them. With an ``accelerator`` of N processes every rank
    holds the same batch and runs ``model`` (``agent`` wrapped in DDP) on its share ``rows[rank::N]`` of each
    minibatch. Its losses are scaled by N, so DDP's gradient average is the minibatch mean one process takes,
    and the statistics are summed over the ranks: every rank steps and reports like one process (up to float
    rounding: the shares are batched and padded apart).
    """
    acc = accelerator
    rank, world = (acc.process_index, acc.num_processes) if acc is not None else (0, 1)
    model = model if model is not None else agent
    clip = acc.clip_grad_norm_ if acc is not None else torch.nn.utils.clip_grad_norm_
    prompts, cands, trunks = batch["prompts"], batch["cands"], batch["trunks"]
    actions, old_logp = batch["actions"], batch["logp"]
    old_values, adv, returns = batch["values"], batch["advantages"], batch["returns"]
    n = len(prompts)
    params = [p for p in agent.parameters() if p.requires_grad]
    keys = ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "loss")
    stats: dict[str, list[float]] = {k: [] for k in (*keys, "grad_norm")}
    agent.train()
    row_of = [(p, tuple(c)) for p, c in zip(prompts, cands)]  # small levels repeat (prompt, candidates) rows a lot
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=gen)
        for start in range(0, n, cfg.minibatch_size):
            mb = perm[start:start + cfg.minibatch_size]
            # Micro-batches hold up to micro_batch distinct rows with all their samples: the model computes each
            # distinct row of the minibatch once (the forward indexes repeats back; their gradients sum).
            samples: dict[tuple, list[int]] = {}
            for i in mb.tolist():
                samples.setdefault(row_of[i], []).append(i)
            groups = list(samples.values())[rank::world]
            # Every rank runs as many micro-batches as the largest share (DDP pairs up their backward passes); a
            # rank out of rows runs the minibatch's first sample with weight 0.
            n_micro = -(-(-(-len(samples) // world)) // cfg.micro_batch)
            optimizer.zero_grad(set_to_none=True)
            sums = {k: 0.0 for k in keys}
            for j in range(n_micro):
                idx = torch.tensor([i for g in groups[j * cfg.micro_batch:(j + 1) * cfg.micro_batch] for i in g],
                                   dtype=torch.long)
                weight = len(idx) / len(mb)  # micro-batch share of the minibatch mean
                if not len(idx):
                    idx = mb[:1]
                out = model([prompts[i] for i in idx], [cands[i] for i in idx],
                            trunks=[trunks[i] for i in idx] if trunks else None)
                dist = torch.distributions.Categorical(logits=out.logits.float())
                logp = dist.log_prob(actions[idx].to(out.logits.device)).cpu()
                values = out.values.float().cpu()
                ratio, policy_loss, value_loss = clipped_ppo_losses(logp, old_logp[idx], adv[idx], values,
                                                                    old_values[idx], returns[idx], cfg.clip)
                entropy = dist.entropy().mean().cpu()
                loss = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
                (loss * (weight * world)).backward()
                with torch.no_grad():
                    log_ratio = logp - old_logp[idx]
                    for k, v in (("policy_loss", policy_loss), ("value_loss", value_loss), ("entropy", entropy),
                                 ("approx_kl", ((ratio - 1) - log_ratio).mean()),
                                 ("clipfrac", ((ratio - 1).abs() > cfg.clip).float().mean()), ("loss", loss)):
                        sums[k] += float(v) * weight
            if acc is not None:
                summed = acc.reduce(torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=acc.device),
                                    "sum").tolist()
                sums = dict(zip(keys, summed))
            grad_norm = clip(params, cfg.max_grad_norm)
            optimizer.step()
            for k, v in sums.items():
                stats[k].append(v)
            stats["grad_norm"].append(float(grad_norm))
    return {k: float(np.mean(v)) for k, v in stats.items()}


def advantage_batch(buf: dict, cfg: GlamPPO) -> dict:
    """GAE over the [T, N] rollout, then one flat list of samples."""
    adv, returns = gae(buf["rewards"], buf["values"], buf["dones"], buf["last_value"], cfg.gamma, cfg.lam)
    return {"prompts": [p for row in buf["prompts"] for p in row],
            "cands": [c for row in buf["cands"] for c in row],
            "trunks": [t for row in buf["trunks"] for t in row],
            "actions": buf["actions"].reshape(-1), "logp": buf["logp"].reshape(-1),
            "values": buf["values"].reshape(-1), "advantages": adv.reshape(-1), "returns": returns.reshape(-1)}


def train(
    agent: LLMActorCritic,
    make_env: Callable[[], gym.Env],
    cfg: GlamPPO,
    *,
    history: int,
    seed: int,
    checkpoint: str | Path | None = None,
    run_extra: dict | None = None,
    identity: RunIdentity | None = None,
    progress: bool = True,
    accelerator=None,
) -> Iterator[dict]:
    """Train ``agent`` with PPO for ``cfg.updates`` updates; resume from ``checkpoint`` if it holds this run.

    ``history`` is the prompt window (observations per prompt), ``seed`` seeds Python, NumPy, torch, the action
    sampler and env i (``seed * 10000 + i``).
    Yields one metrics row per update (``iteration`` from 1, frames, episodes, success_rate, return_mean,
    length_mean, the losses, fps, collect_s), each once its checkpoint is on disk; a resumed run first yields
    the rows of the updates it restored, marked ``resumed: True``, so a consumer always sees the whole run.
    ``identity`` (``llmrl.checkpoint.run_identity``: params + input contents + code) decides whether the
    checkpoint belongs to this run; without one, the config and ``run_extra`` alone identify it.
    ``accelerator`` (``accelerate.Accelerator`` of N processes, the agent on its device): every process collects
    the same rollouts from the same seeds and trains on its share of each minibatch (``ppo_update``); such a run
    keeps no restart point.
    """
    if accelerator is not None and accelerator.num_processes == 1:
        accelerator = None
    if accelerator is not None and checkpoint is not None:
        raise ValueError("ppo_llm: a run over several processes keeps no restart point: pass checkpoint=None")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in agent.parameters() if p.requires_grad]
    if not params:
        raise ValueError("ppo_llm: the agent has no trainable parameters")
    optimizer = torch.optim.Adam(params, lr=cfg.lr, eps=cfg.adam_eps)
    model = accelerator.prepare_model(agent) if accelerator is not None else agent  # DDP over the processes
    identity = identity or run_identity({"cfg": cfg.model_dump(), "history": history, "seed": seed,
                                         "extra": run_extra or {}})
    slots = [EnvSlot(make_env(), seed=seed * 10_000 + i, history=history) for i in range(cfg.n_envs)]
    update, frames, rows = 0, 0, []
    ckpt = Path(checkpoint) if checkpoint else None
    state = load_resumable(ckpt, identity) if ckpt is not None else None
    if state is not None:
        agent.load_trainable_state(state["trainable"])
        optimizer.load_state_dict(state["optimizer"])
        _set_rng_state(state["rng"], gen)
        slots = pickle.loads(state["slots"])
        update, frames, rows = state["update"], state["frames"], state["metrics"]
        for row in rows:
            yield {**row, "resumed": True}
    bar = tqdm(total=cfg.updates, initial=update, desc="ppo_llm", disable=not progress)
    while update < cfg.updates:
        t0 = time.perf_counter()
        buf = collect(agent, slots, cfg, gen)
        t_collect = time.perf_counter() - t0
        stats = ppo_update(agent, optimizer, advantage_batch(buf, cfg), cfg, gen, accelerator=accelerator,
                           model=model)
        n_frames = cfg.frames_per_env * cfg.n_envs
        update += 1
        frames += n_frames
        eps = buf["episodes"]
        row = {"iteration": update, "frames": frames, "episodes": len(eps),
               "success_rate": float(np.mean([e["success"] for e in eps])) if eps else 0.0,
               "return_mean": float(np.mean([e["return"] for e in eps])) if eps else 0.0,
               "length_mean": float(np.mean([e["length"] for e in eps])) if eps else 0.0,
               **stats, "fps": n_frames / (time.perf_counter() - t0), "collect_s": t_collect}
        rows.append(row)
        if ckpt is not None:
            _save_checkpoint(ckpt, agent, optimizer, gen, slots, update, frames, rows, identity)
        bar.update(1)
        yield row
    bar.close()
