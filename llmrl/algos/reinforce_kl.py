"""Stepwise REINFORCE with a KL penalty to a periodically refreshed reference policy (navidmdn/LLM_RL).

Settings: ``llmrl.config.llm_rl.ReinforceTrainParams`` (its ``common`` block, shared with GRPO, and its
``reinforce_kl`` block), taken as they are.

One iteration:
1. Collect ``problems_per_iteration × group_size`` episodes in ``MathEnv``: every active episode samples its
   next line at once (temperature 1.0, top-p 0.9, cut at the first newline) until it states an answer, ends
   its turn, or hits ``max_steps``. Reward 1 for a correct final answer.
2. Returns per line: a line k steps before the end gets γ^k·R (γ = 0.99, clamped to [0, 10]). A baseline b is
   subtracted the same way, A = γ^k·(R − b): the batch mean of R, or the leave-one-out mean over the other
   episodes of the same problem (the default), or none (the original).
3. Loss per (state, line) sample with T line tokens, policy log-probs ℓ_t and reference log-probs ℓ^ref_t:
       L = −Σ_t (ℓ_t/T)·[A − β(ℓ_t − ℓ^ref_t)/T]
   averaged over samples. As in the original, the KL-shaped return is not detached, so the penalty also has a
   gradient of its own.
   One optimiser step per micro-batch of episodes.
4. Every ``ref_update_iterations`` iterations the reference is reset to the current policy (re-anchored, not
   annealed). AdamW, a constant lr or transformers' linear decay to 0 over the optimiser steps (the schedule
   TRL gives GRPO, so both variants share it), gradient clipping.

Budget: each line is capped at ``common.line_tokens`` and the episode's lines together at
``common.answer_tokens``, the budget GRPO's completions get: an episode whose budget runs out ends truncated.

Fixes over the original: the optimiser is built from the parameters that require grad *after* LoRA is
attached (the original's held only frozen weights); training never sees the test split; the calculator never
runs model output as code; the state and its line are tokenised jointly and each token is assigned to the
line holding its last character (by offsets), so a line's first token is never lost; a baseline is offered.

The reference is a snapshot of the trainable weights (the LoRA adapter, or every weight in a full fine-tune),
swapped in for a no-grad forward pass. This keeps the refresh semantics exactly (an adapter-disabled base
would freeze the reference at the base model) and costs one adapter's memory instead of a second model.

Departure: updates are on-policy, on the iteration's own samples (``epochs`` passes). The original replayed a
100k FIFO buffer, so most of its REINFORCE updates used samples from older policies without correction.
Each episode is one sequence (its lines are consecutive continuations of the same chat prompt), so one forward
pass scores all its lines; the prompt prefix shared by a batch (system prompt and few-shot examples) is computed
once, in sampling and in scoring (``llmrl.llm.prefix``). With the calculator on, the line trained on is the
corrected line the state holds.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tqdm.auto import tqdm

from llmrl.agents.math_solver import build_messages, render_state
from llmrl.checkpoint import RunIdentity, load_resumable, run_identity, save_checkpoint
from llmrl.config.llm_rl import ReinforceTrainParams
from llmrl.envs.word_problems import MathEnv
from llmrl.llm.generate import SamplingConfig
from llmrl.llm.load import LLM
from llmrl.llm.prefix import PrefixBatch, generate_shared_prefix, split_prefix, suffix_token_logprobs

__all__ = ["optimizer_steps", "MathEpisode", "collect_episodes", "discounted_returns", "advantages", "EpisodeBatch",
           "tokenize_episodes", "token_logprobs", "reinforce_kl_loss", "ReinforceKL", "train"]

if TYPE_CHECKING:
    from accelerate import Accelerator


def optimizer_steps(p: ReinforceTrainParams) -> int:
    """Planned optimiser steps of the run (the linear schedule reaches 0 after them)."""
    c = p.common
    per_iteration = -(-c.problems_per_iteration * c.group_size // c.micro_batch)
    return c.iterations * p.reinforce_kl.epochs * per_iteration


@dataclass
class MathEpisode:
    """One collected episode: the chat prompt, the lines written (each with its newline) and the outcome."""

    problem_id: str
    group: int
    head: str  # rendered prompt before the first line
    lines: list[str] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    end: str = ""
    parsed_answer: str | None = None
    tokens: int = 0  # generated tokens of all lines, against the answer budget

    def as_record(self) -> dict:
        return {"problem_id": self.problem_id, "lines": self.lines, "reward": self.reward,
                "success": self.success, "end": self.end, "parsed_answer": self.parsed_answer,
                "tokens": self.tokens}


def collect_episodes(llm: LLM, problems: Sequence[dict], shots: Sequence[dict], p: ReinforceTrainParams,
                     seed: int) -> list[MathEpisode]:
    """``group_size`` episodes per problem, all active episodes stepping together (batched generation)."""
    c, r = p.common, p.reinforce_kl
    envs, episodes, messages = [], [], []
    for gi, prob in enumerate(problems):
        msgs = build_messages(prob["problem"], shots)
        for _ in range(c.group_size):
            env = MathEnv([prob], max_steps=r.max_steps, calculator=r.calculator)
            env.reset(seed=seed)
            envs.append(env)
            messages.append(msgs)
            episodes.append(MathEpisode(problem_id=str(prob["id"]), group=gi, head=render_state(llm, msgs, "")))
    active = list(range(len(envs)))
    spent = [0] * len(envs)  # tokens of each episode's lines so far, against c.answer_tokens
    step = 0
    while active:
        # Episodes left with less than a line's budget generate apart, each group under its own cap.
        caps: dict[int, list[int]] = {}
        for i in active:
            caps.setdefault(min(c.line_tokens, c.answer_tokens - spent[i]), []).append(i)
        gens = {}
        for cap, rows in sorted(caps.items(), reverse=True):
            states = [render_state(llm, messages[i], "".join(episodes[i].lines)) for i in rows]
            sampling = SamplingConfig(max_new_tokens=cap, temperature=c.temperature, top_p=c.top_p,
                                      stop=("\n",), seed=seed * 1000 + step * 97 + cap)
            gens.update(zip(rows, generate_shared_prefix(llm, states, sampling, batch_size=c.gen_batch_size)))
        still = []
        for i in active:
            g = gens[i]
            spent[i] += g.n_tokens
            episodes[i].tokens = spent[i]
            _, reward, terminated, truncated, info = envs[i].step(g.text)
            ep = episodes[i]
            if info["line"].strip():
                ep.lines.append(info["line"] + "\n")
            if not (terminated or truncated) and spent[i] >= c.answer_tokens:
                truncated, info = True, {**info, "end": "answer_tokens"}
            if terminated or truncated:
                ep.reward, ep.success, ep.end = float(reward), bool(info["success"]), info["end"]
                ep.parsed_answer = info["parsed_answer"]
            else:
                still.append(i)
        active, step = still, step + 1
    for ep, msgs in zip(episodes, messages):
        # The single-sequence scoring below relies on the chat template continuing a partial reply verbatim.
        if ep.lines and render_state(llm, msgs, "".join(ep.lines)) != ep.head + "".join(ep.lines):
            raise ValueError(f"chat template of {llm.spec!r} does not continue a partial reply verbatim")
    return episodes


def discounted_returns(n_steps: int, final_reward: float, gamma: float, clamp: tuple[float, float] = (0.0, 10.0)
                       ) -> np.ndarray:
    """Per-step returns of an episode rewarded only at its end: a line k steps before the end gets γ^k·R.

    Clamped to ``clamp`` as in LLM_RL.
    """
    k = np.arange(n_steps - 1, -1, -1, dtype=np.float64)
    return np.clip(final_reward * gamma ** k, *clamp)


def advantages(episodes: Sequence[MathEpisode], gamma: float, baseline: str) -> list[np.ndarray]:
    """Per-line advantages γ^k·(R − b) of each episode (see module doc)."""
    rewards = np.array([ep.reward for ep in episodes], dtype=np.float64)
    if baseline == "none":
        b = np.zeros_like(rewards)
    elif baseline == "batch":
        b = np.full_like(rewards, rewards.mean())
    else:
        groups = np.array([ep.group for ep in episodes])
        b = np.empty_like(rewards)
        for g in np.unique(groups):
            idx = np.flatnonzero(groups == g)
            b[idx] = (rewards[idx].sum() - rewards[idx]) / max(len(idx) - 1, 1)
    out = []
    for ep, bi in zip(episodes, b):
        n = len(ep.lines)
        out.append(discounted_returns(n, ep.reward, gamma) - bi * gamma ** np.arange(n - 1, -1, -1.0))
    return out


@dataclass
class EpisodeBatch:
    """Episodes tokenised for scoring: the batch's shared prompt prefix once, then right-padded suffixes."""

    tokens: PrefixBatch
    line_of: torch.Tensor  # [B, S] line index of each suffix token; -1 for prompt tokens and padding

    def row(self, i: int) -> tuple[list[int], list[int]]:
        """Full token ids of episode i and each token's line index (-1: prompt)."""
        n = int(self.tokens.suffix_mask[i].sum())
        ids = self.tokens.prefix[0].tolist() + self.tokens.suffix[i, :n].tolist()
        return ids, [-1] * self.tokens.P + self.line_of[i, :n].tolist()


def tokenize_episodes(tokenizer, episodes: Sequence[MathEpisode], device) -> EpisodeBatch:
    """Head + lines of each episode tokenised jointly, each token tagged with its line (by offsets).

    A token belongs to the line that holds its last character, so a token straddling the prompt/line border
    counts for the line: the first line token is never dropped.
    """
    rows, tags = [], []
    for ep in episodes:
        enc = tokenizer(ep.head + "".join(ep.lines), add_special_tokens=False, return_offsets_mapping=True)
        bounds = np.cumsum([len(ep.head)] + [len(x) for x in ep.lines])
        ends = np.array([end for _, end in enc["offset_mapping"]])
        seg = np.searchsorted(bounds, np.maximum(ends - 1, 0), side="right") - 1  # -1 = prompt
        seg[seg >= len(bounds) - 1] = len(bounds) - 2  # characters past the last border: the last line
        rows.append(enc["input_ids"])
        tags.append(seg)
    # The shared prefix stops before the first line token of any row: episodes of one problem may share lines.
    first_line = min(int(np.argmax(seg >= 0)) if (seg >= 0).any() else len(seg) for seg in tags)
    tokens = split_prefix(rows, tokenizer.pad_token_id, device, max_prefix=first_line)
    line_of = torch.full(tokens.suffix.shape, -1, dtype=torch.long)
    for i, seg in enumerate(tags):
        line_of[i, : len(seg) - tokens.P] = torch.from_numpy(seg[tokens.P:])
    return EpisodeBatch(tokens=tokens, line_of=line_of.to(device))


def token_logprobs(model, batch: EpisodeBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of every suffix token given everything before it, and its line index: ([B, S], [B, S]).

    The prompt prefix shared by the batch (system prompt, few-shot examples) is computed once.
    """
    return suffix_token_logprobs(model, batch.tokens), batch.line_of


def reinforce_kl_loss(logp: torch.Tensor, ref_logp: torch.Tensor, line_of: torch.Tensor,
                      adv: Sequence[np.ndarray], beta: float) -> tuple[torch.Tensor, dict]:
    """Sum over (episode, line) samples of −Σ_t (ℓ_t/T)·[A − β(ℓ_t − ℓ^ref_t)/T], and its statistics.

    ``logp``/``ref_logp``/``line_of``: [B, K] token log-probs and line indices; ``adv[b][s]``: advantage of
    line s of episode b. Returns the summed loss (callers divide by the sample count) and the pieces.
    """
    total = logp.new_zeros(())
    pg_sum, kl_sum, n_samples, n_tokens = 0.0, 0.0, 0, 0
    for b, a in enumerate(adv):
        for s, a_s in enumerate(a):
            sel = line_of[b] == s
            T = int(sel.sum())
            if T == 0:
                continue
            lp, lp_ref = logp[b][sel], ref_logp[b][sel]
            shaped = float(a_s) - beta * (lp - lp_ref) / T  # not detached: the KL term has a gradient too
            loss_s = -((lp / T) * shaped).sum()
            total = total + loss_s
            pg_sum += float(-(lp.detach() / T).sum() * float(a_s))
            kl_sum += float((lp.detach() - lp_ref).sum())
            n_samples, n_tokens = n_samples + 1, n_tokens + T
    return total, {"pg_loss_sum": pg_sum, "kl_sum": kl_sum, "samples": n_samples, "tokens": n_tokens}


class ReinforceKL:
    """The trainer: holds the policy, its optimiser and schedule, and the reference snapshot."""

    def __init__(self, llm: LLM, cfg: ReinforceTrainParams, train_problems: Sequence[dict], shots: Sequence[dict],
                 accelerator: Accelerator | None = None):
        self.llm, self.cfg = llm, cfg
        c = cfg.common
        # Several processes (``accelerate launch --num_processes N``): every rank collects the same episodes (the
        # same seeds and, DDP keeping the weights equal, the same policy) -- N times the collection work, but it keeps
        # N processes testably equal to one -- and trains on its rank's share of every micro-batch.
        self.accelerator = accelerator if accelerator is not None and accelerator.num_processes > 1 else None
        if self.accelerator is not None and c.micro_batch % self.accelerator.num_processes:
            raise ValueError(f"reinforce_kl: common.micro_batch={c.micro_batch} is not divisible by the "
                             f"{self.accelerator.num_processes} processes")
        self.problems, self.shots = list(train_problems), list(shots)
        if len(self.problems) < c.problems_per_iteration:
            raise ValueError(f"reinforce_kl: {len(self.problems)} train problems, fewer than "
                             f"common.problems_per_iteration={c.problems_per_iteration}")
        # Built after any LoRA adapter is attached: these are exactly the weights that train.
        self.params = [p for p in llm.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("reinforce_kl: the model has no trainable parameters (load it with lora= or trainable=)")
        self.opt = torch.optim.AdamW(self.params, lr=c.lr)
        # The DDP-wrapped model for the training forward passes (gradients averaged over the ranks); llm.model stays
        # the plain model, for sampling and the reference pass, and self.params are the same tensors. The optimiser
        # and the schedule are not prepared: accelerate would step a prepared schedule once per process.
        self.train_model = llm.model if self.accelerator is None else self.accelerator.prepare(llm.model)
        total = optimizer_steps(cfg)
        # transformers' get_linear_schedule_with_warmup without warmup: the schedule TRL applies to GRPO
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, (lambda step: max(0.0, (total - step) / total)) if c.lr_schedule == "linear" else
            (lambda step: 1.0))
        self.ref = self._snapshot()
        self.rng = np.random.default_rng(c.seed)
        self.iteration = 0

    def _snapshot(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.params]

    @contextlib.contextmanager
    def reference_weights(self) -> Iterator[None]:
        """Temporarily put the reference weights into the policy (no grad)."""
        current = self._snapshot()
        with torch.no_grad():
            for p, r in zip(self.params, self.ref):
                p.copy_(r)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, c in zip(self.params, current):
                    p.copy_(c)

    def sample_problems(self) -> list[dict]:
        idx = self.rng.choice(len(self.problems), size=self.cfg.common.problems_per_iteration, replace=False)
        return [self.problems[i] for i in idx]

    def update(self, episodes: Sequence[MathEpisode]) -> dict:
        """Policy-gradient steps on one iteration's episodes: one optimiser step per micro-batch of episodes.

        Under accelerate with N processes each rank scores its share ``mb[rank::N]`` of every micro-batch, and the
        gradient DDP averages is the mean over the whole micro-batch's samples, so the step equals one process's
        (up to float rounding: the shares are batched, padded and prefix-split apart). Every rank returns the same
        stats, those of one process. With one process the same code runs with N = 1 and sums that stay local."""
        acc = self.accelerator
        c, r, model, tok = self.cfg.common, self.cfg.reinforce_kl, self.llm.model, self.llm.tokenizer
        rank, world = (acc.process_index, acc.num_processes) if acc is not None else (0, 1)
        dev = acc.device if acc is not None else self.llm.device
        total = (lambda t: acc.reduce(t, "sum")) if acc is not None else (lambda t: t)
        clip = acc.clip_grad_norm_ if acc is not None else torch.nn.utils.clip_grad_norm_
        adv = advantages(episodes, r.gamma, r.baseline)
        usable = [i for i, ep in enumerate(episodes) if ep.lines]
        micro = [usable[j:j + c.micro_batch] for j in range(0, len(usable), c.micro_batch)]
        # A rank whose share is empty (a short last micro-batch) scores the micro-batch's first episode with weight
        # 0: every rank must run the forward and backward passes DDP's gradient all-reduce pairs up.
        shares = [(mb[rank::world] or mb[:1], bool(mb[rank::world])) for mb in micro]
        batches = [tokenize_episodes(tok, [episodes[i] for i in share], dev) for share, _ in shares]
        model.eval()  # no dropout in the reference pass
        with torch.no_grad(), self.reference_weights():
            ref = [token_logprobs(model, b)[0] for b in batches]
        local = torch.zeros(4, dtype=torch.float64)  # this rank's sums: loss, policy loss, KL, tokens
        samples, grad_norms, steps = 0, 0.0, 0
        model.train()
        for _ in range(r.epochs):
            for (share, real), batch, ref_lp in zip(shares, batches, ref):
                self.opt.zero_grad(set_to_none=True)
                logp, line_of = token_logprobs(self.train_model, batch)
                loss, s = reinforce_kl_loss(logp, ref_lp, line_of, [adv[i] for i in share], r.beta)
                if not real:
                    loss, s = loss * 0.0, {k: 0 for k in s}
                n_global = int(total(torch.tensor(s["samples"], device=dev)))
                # DDP averages the ranks' gradients; the factor N makes that average sum_r loss_r / n_global, the
                # mean over the global micro-batch's samples that one process takes.
                (loss * world / max(n_global, 1)).backward()
                grad_norm = clip(self.params, c.grad_clip)
                self.opt.step()
                self.sched.step()
                local += torch.tensor([float(loss.detach()), s["pg_loss_sum"], s["kl_sum"], s["tokens"]],
                                      dtype=torch.float64)
                samples += n_global
                grad_norms += float(grad_norm)  # of the averaged gradient: the same on every rank
                steps += 1
        model.eval()
        loss_sum, pg_sum, kl_sum, tokens = total(local.to(dev)).tolist()
        tokens = int(round(tokens))
        n_samples = max(samples, 1)
        return {"loss": loss_sum / n_samples, "policy_loss": pg_sum / n_samples,
                "divergence": kl_sum / max(tokens, 1), "grad_norm": grad_norms / max(steps, 1),
                "samples": samples // r.epochs, "tokens": tokens // r.epochs, "optimizer_steps": steps}

    def step(self) -> tuple[dict, list[MathEpisode]]:
        """One iteration: refresh the reference if due, collect, update. Returns its stats and episodes."""
        cfg = self.cfg
        if self.iteration > 0 and self.iteration % cfg.reinforce_kl.ref_update_iterations == 0:
            self.ref = self._snapshot()
        t0 = time.perf_counter()
        episodes = collect_episodes(self.llm, self.sample_problems(), self.shots, cfg,
                                    seed=cfg.common.seed * 10_000 + self.iteration)
        t1 = time.perf_counter()
        lr_used = self.opt.param_groups[0]["lr"]  # the lr of this iteration's first step
        stats = self.update(episodes)
        t2 = time.perf_counter()
        stats.update(
            iteration=self.iteration,
            lr=lr_used,
            average_reward=float(np.mean([ep.reward for ep in episodes])),
            answer_rate=float(np.mean([ep.end == "answer" for ep in episodes])),
            mean_lines=float(np.mean([len(ep.lines) for ep in episodes])),
            episodes=len(episodes),
            collect_s=t1 - t0,
            update_s=t2 - t1,
        )
        self.iteration += 1
        return stats, episodes

    def state_dict(self) -> dict:
        """Everything the next iteration depends on: weights, reference, optimiser, schedule, every RNG, counter."""
        return {"iteration": self.iteration, "trainable": self._snapshot(), "ref": [r.clone() for r in self.ref],
                "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                "problem_rng": self.rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
                "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            for p, w in zip(self.params, state["trainable"], strict=True):
                p.copy_(w)
        self.ref = [r.clone() for r in state["ref"]]
        self.opt.load_state_dict(state["opt"])
        self.sched.load_state_dict(state["sched"])
        self.rng.bit_generator.state = state["problem_rng"]
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        self.iteration = state["iteration"]

    def train(self, progress: bool = True, *, checkpoint: str | Path | None = None,
              identity: RunIdentity | None = None) -> Iterator[tuple[dict, list[MathEpisode]]]:
        """Yield (stats, episodes) per iteration. With ``checkpoint``, every iteration ends with an atomic checkpoint
        (trainer state plus the iterations so far) stored with the run ``identity`` (``llmrl.checkpoint``; default:
        the config alone); a checkpoint of the same run is resumed, its finished iterations yielded again first, so a
        killed run yields exactly what an uninterrupted one does. Any other checkpoint is discarded with a log line."""
        done: list[tuple[dict, list[MathEpisode]]] = []
        if checkpoint is not None:
            identity = identity or run_identity({"cfg": self.cfg.model_dump(mode="json")})
            state = load_resumable(checkpoint, identity)
            if state is not None:
                self.load_state_dict(state["trainer"])
                done = state["done"]
        yield from done
        for _ in tqdm(range(self.iteration, self.cfg.common.iterations), desc="reinforce_kl", disable=not progress,
                      initial=self.iteration, total=self.cfg.common.iterations):
            out = self.step()
            done.append(out)
            if checkpoint is not None:
                save_checkpoint(checkpoint, {"trainer": self.state_dict(), "done": done}, identity)
            yield out


def train(llm: LLM, problems: Sequence[dict], cfg: ReinforceTrainParams, *, shots: Sequence[dict],
          record: list[dict] | None = None, accelerator: Accelerator | None = None,
          checkpoint: str | Path | None = None, identity: RunIdentity | None = None,
          progress: bool = True) -> Iterator[dict]:
    """REINFORCE-KL on ``problems`` (``shots``: the few-shot pairs of every prompt), the shape LLM_RL's variants
    share (``llmrl.algos.llm_rl_grpo.train``): one stats row per iteration, ``llm.model`` updated in place. With
    ``record`` every sampled episode is appended to it, with its iteration (LLM outputs are data). ``checkpoint``,
    ``identity`` and ``accelerator``: ``ReinforceKL``."""
    trainer = ReinforceKL(llm, cfg, problems, shots, accelerator=accelerator)
    for stats, episodes in trainer.train(progress, checkpoint=checkpoint, identity=identity):
        if record is not None:
            record += [{"iteration": stats["iteration"], **ep.as_record()} for ep in episodes]
        yield stats
