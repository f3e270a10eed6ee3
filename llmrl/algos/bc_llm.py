"""Behavioural cloning of the LLM policy on bot demonstrations: cross-entropy of the candidate softmax.

The target is the bot's action among the same six candidate strings the policy scores, so BC trains exactly
the distribution PPO later uses (the original fine-tuned the causal LM on the action text; over a fixed
candidate set that is the same objective up to the normalisation over candidates).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from tqdm.auto import tqdm

from llmrl.agents.llm_policy import History, LLMActorCritic, candidates_for, render
from llmrl.data.trajectories import Episode

__all__ = ["bc_samples", "train_bc"]


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


def train_bc(agent: LLMActorCritic, samples: list[tuple[str, list[str], int]], *, epochs: int, batch_size: int,
             lr: float, seed: int, progress: bool = True) -> Iterator[dict]:
    """Adam on the mean cross-entropy over minibatches of shuffled samples; yields one row per optimiser step
    (``step`` from 1, ``epoch`` from 1, ``loss``)."""
    if not samples:
        raise ValueError("train_bc: no samples (the demonstrations hold no steps)")
    params = [p for p in agent.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    step = 0
    agent.train()
    for epoch in tqdm(range(1, epochs + 1), desc="bc", disable=not progress):
        perm = torch.randperm(len(samples), generator=gen).tolist()
        for start in range(0, len(perm), batch_size):
            batch = [samples[i] for i in perm[start:start + batch_size]]
            out = agent([b[0] for b in batch], [b[1] for b in batch])
            target = torch.tensor([b[2] for b in batch], device=out.logits.device)
            loss = torch.nn.functional.cross_entropy(out.logits.float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            yield {"step": step, "epoch": epoch, "loss": float(loss.detach())}
