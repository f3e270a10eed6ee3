"""Behavioural cloning of the LLM policy on bot demonstrations: cross-entropy of the candidate softmax.

The target is the bot's action among the same six candidate strings the policy scores, so BC trains exactly
the distribution PPO later uses (the original fine-tuned the causal LM on the action text; over a fixed
candidate set that is the same objective up to the normalisation over candidates).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from llmrl.agents.llm_policy import History, LLMActorCritic, candidates_for, infer, render
from llmrl.data.trajectories import Episode

__all__ = ["bc_samples", "capture_trunks", "group_samples", "train_bc"]


def bc_samples(agent: LLMActorCritic, episodes: Sequence[Episode], labels: dict[str, str],
               actions: Sequence[str], history: int) -> list[tuple[str, list[str], int]]:
    """(rendered prompt, candidates, bot action) for every step, with the prompt history rebuilt step by step."""
    samples = []
    for ep in episodes:
        texts = [str(t.decode() if isinstance(t, bytes) else t) for t in ep.observations["text"]]
        h = History(history)
        for t, (text, a) in enumerate(zip(texts, ep.actions)):
            if t == 0:
                h.reset(text)
            else:
                h.push(actions[int(ep.actions[t - 1])], text)
            rendered = render(agent.llm, h.prompt(labels, tuple(actions), ep.mission))
            samples.append((rendered, candidates_for(rendered, actions), int(a)))
    return samples


Group = tuple[str, list[str], torch.Tensor]  # (rendered prompt, candidates, how often the bot took each candidate)


def group_samples(samples: Sequence[tuple[str, list[str], int]]) -> list[Group]:
    """Identical (prompt, candidates) samples as one row with the count of each action the bot took there: the mean
    cross-entropy over samples is the count-weighted one over rows, and a small level repeats its prompts a lot
    (GoToObjS4's 406 steps of 160 episodes hold 107 distinct prompts at history 1)."""
    rows: dict[tuple[str, tuple[str, ...]], torch.Tensor] = {}
    for rendered, cands, action in samples:
        counts = rows.setdefault((rendered, tuple(cands)), torch.zeros(len(cands)))
        counts[action] += 1
    return [(r, list(c), counts) for (r, c), counts in rows.items()]


def capture_trunks(agent: LLMActorCritic, rows: Sequence[Group], chunk: int = 32) -> list | None:
    """The frozen layers' states of every row, computed once (``None`` without a frozen trunk): with LoRA on the top
    layers only, every epoch then runs those layers alone, as GLAM's PPO epochs do. They depend on the frozen base
    weights alone, so BC runs of several seeds can share them."""
    if agent.trunk_start is None:
        return None
    trunks: list = []
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        trunks += infer(agent, [r[0] for r in part], [r[1] for r in part], {}, capture=True)[2]
    return trunks


def _rows_loss(agent: LLMActorCritic, rows: Sequence[Group], trunks: list | None) -> tuple[torch.Tensor, float]:
    """Summed cross-entropy of the bot's actions under the candidate softmax, and how many of them the greedy action
    hits."""
    out = agent([r[0] for r in rows], [r[1] for r in rows], trunks=trunks)
    counts = torch.stack([r[2] for r in rows]).to(out.logits.device)
    logp = torch.log_softmax(out.logits.float(), -1)
    hits = counts.gather(1, logp.argmax(-1, keepdim=True)).sum()
    return -(counts * logp).sum(), float(hits)


@torch.no_grad()
def _validate(agent: LLMActorCritic, rows: Sequence[Group], trunks: list | None, batch_size: int) -> dict:
    agent.eval()
    loss, hits = 0.0, 0.0
    for start in range(0, len(rows), batch_size):
        idx = range(start, min(start + batch_size, len(rows)))
        l, h = _rows_loss(agent, [rows[i] for i in idx], [trunks[i] for i in idx] if trunks else None)
        loss, hits = loss + float(l), hits + h
    agent.train()
    n = float(sum(r[2].sum() for r in rows))
    return {"validation_loss": loss / n, "validation_accuracy": hits / n}


def train_bc(agent: LLMActorCritic, samples: list[tuple[str, list[str], int]], *, epochs: int, batch_size: int,
             lr: float, seed: int, validation: list[tuple[str, list[str], int]] | None = None,
             patience: int | None = None, trunks: tuple[list, list | None] | None = None,
             progress: bool = True) -> Iterator[dict]:
    """Adam on the mean cross-entropy of the bot's actions, over minibatches of ``batch_size`` shuffled distinct
    prompts (``group_samples``).

    Yields one row per optimiser step (``step`` from 1, ``epoch`` from 1, ``loss``: the minibatch's estimate of the
    mean over all samples: its rows' count-weighted sum over rows drawn times samples per row). With ``validation``
    samples it also yields, before training and after each epoch, ``{"epoch",
    "validation_loss", "validation_accuracy", "best"}``; training stops after ``patience`` epochs without a lower
    validation loss, and the agent ends with the weights of the epoch of lowest validation loss (epoch 0: the
    weights it started with). ``trunks``: ``capture_trunks`` of the grouped training and validation rows, when a
    caller shares them between runs.
    """
    if not samples:
        raise ValueError("train_bc: no samples (the demonstrations hold no steps)")
    if validation is not None and not validation:
        raise ValueError("train_bc: validation is empty (give validation samples, or None)")
    rows, val_rows = group_samples(samples), group_samples(validation) if validation else None
    if trunks is None:
        trunks = (capture_trunks(agent, rows), capture_trunks(agent, val_rows) if val_rows else None)
    train_trunks, val_trunks = trunks
    params = [p for p in agent.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    samples_per_row = len(samples) / len(rows)
    best: tuple[float, int, dict] | None = None
    if val_rows:
        row = {"epoch": 0, **_validate(agent, val_rows, val_trunks, batch_size)}
        best = (row["validation_loss"], 0, agent.trainable_state())
        yield {**row, "best": True}
    step = 0
    agent.train()
    for epoch in tqdm(range(1, epochs + 1), desc="bc", disable=not progress):
        perm = torch.randperm(len(rows), generator=gen).tolist()
        for start in range(0, len(perm), batch_size):
            idx = perm[start:start + batch_size]
            batch = [rows[i] for i in idx]
            total, _ = _rows_loss(agent, batch, [train_trunks[i] for i in idx] if train_trunks else None)
            # an unbiased estimate of the mean over all samples: rows drawn uniformly, each weighted by its count
            loss = total / (len(batch) * samples_per_row)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            yield {"step": step, "epoch": epoch, "loss": float(loss.detach())}
        if val_rows:
            row = {"epoch": epoch, **_validate(agent, val_rows, val_trunks, batch_size)}
            improved = row["validation_loss"] < best[0]
            if improved:
                best = (row["validation_loss"], epoch, agent.trainable_state())
            yield {**row, "best": improved}
            if patience is not None and epoch - best[1] >= patience:
                break
    if best is not None:
        agent.load_trainable_state(best[2])
