"""KALM's grounding fine-tune: four supervised patterns over real trajectories, one weighted loss.

Patterns (KALM, arXiv 2404.09248, Sec. 4.1), each a token sequence with vector slots (``llmrl.llm.grounded``):
1. instruction -> trajectory: ``Instruction: <text>\\nTrajectory: # s0 @ a0 # s1 @ a1 ... # sK``
   (L_act on every a_t, predicted at s_t; L_obs on every s_{t+1}, predicted at a_t);
2. (s, a) -> s': ``Predict the next state: # s @ a ^ s'`` (L_obs on s');
3. (s0, instruction) -> final state: ``Instruction: <text>\\nInitial state: # s0 Final state: ^ s_T`` (L_obs on s_T);
4. trajectory -> instruction: ``Trajectory: # s0 @ a0 ... # sT\\nInstruction: <text><eos>`` (L_token on the text).
Loss = obs_weight * L_obs + act_weight * L_act + token_weight * L_token (KALM: 0.5, 0.5, 1.0), each term a mean
over its own targets in the batch. Under accelerate with N processes every rank builds the same batches and trains
on its share of each; the terms stay means over the whole batch's targets (``train_grounding``). Written by hand (not trl's SFTTrainer) because the inputs are mixed token/vector
embeddings with two regression heads, which trl's collators and losses do not model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from llmrl.config.kalm import KalmGroundParams
from llmrl.data.trajectories import Episode
from llmrl.envs import kalm_levels as kl
from llmrl.llm.grounded import (GroundedLM, GroundingSpec, TokenSequence, collate, observation_scale, reverse_prompt,
                                trajectory_prompt)
from llmrl.llm.load import dtype_name, resolve_dtype

__all__ = ["FIELD_COPY_LOGIT", "grounding_spec", "build_samples", "validation_params", "training_phrasing_episodes",
           "heldout_samples",
           "update_steps", "length_batches", "autocast_dtype", "evaluate_losses", "selection_loss", "select_checkpoint",
           "state_error", "action_agreement", "goal_swap", "majority_agreement",
           "goal_sensitivity", "offline_goal_sensitivity", "train_grounding"]

PATTERNS = ("trajectory", "dynamics", "goal", "reverse")
TERMS = ("obs_loss", "act_loss", "token_loss")


def episode_arrays(ep: Episode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(obs [T, d], actions [T(, A)], next_obs [T, d]) of one real or imagined episode."""
    return ep.observations["obs"], ep.actions, ep.observations["next_obs"]


# The categorical fields' prior for their current class (GroundingSpec.field_copy_logit): at 4 a field with up to
# ten classes starts at about 0.86 probability of keeping its value, the share a step leaves unchanged or more.
FIELD_COPY_LOGIT = 4.0


def grounding_spec(benchmark: str, episodes: Sequence[Episode], p: KalmGroundParams, *,
                   egocentric: bool) -> GroundingSpec:
    """The grounded model's spec for ``benchmark``: observation and action sizes, BabyAI's categorical fields, the
    continuous dims' mean and floored scale (``observation_scale``) over the training episodes' states, and for
    continuous observations changes predicted instead of absolute values, with the dims a step copies exactly
    (``kalm_levels.obs_copies``) taken from the last state. ``egocentric``: the input also carries BabyAI's
    egocentric features (``KalmEnvParams.egocentric_input``)."""
    if egocentric and benchmark != "babyai":
        raise ValueError(f"grounding_spec: egocentric features are BabyAI's (kalm.env.babyai_egocentric_input), "
                         f"not {benchmark}'s")
    obs = np.concatenate([np.concatenate([e.observations["obs"], e.observations["next_obs"]]) for e in episodes])
    kl.check_obs(benchmark, obs, "training observations")
    mean, scale = observation_scale(obs, p.obs_std_floor)
    act = kl.action_spec(benchmark)
    return GroundingSpec(obs_dim=kl.obs_dim(benchmark), action_dim=act.n, discrete=act.discrete,
                         action_low=float(act.low), action_high=float(act.high), base_model=p.model,
                         finetune="lora" if p.lora is not None else "full", obs_mean=mean, obs_std=scale,
                         obs_fields=[list(f) for f in kl.obs_fields(benchmark)],
                         obs_delta=not kl.obs_fields(benchmark),
                         field_copy_logit=FIELD_COPY_LOGIT if kl.obs_fields(benchmark) else 0.0,
                         obs_copy=[list(c) for c in kl.obs_copies(benchmark)], obs_egocentric=egocentric)


def update_steps(p: KalmGroundParams, samples: int) -> int:
    """Optimizer updates for ``p.epochs`` passes over ``samples`` sequences at ``p.batch_size`` (at least one)."""
    return max(1, math.ceil(p.epochs * samples / p.batch_size))


def build_samples(model: GroundedLM, episodes: Sequence[Episode], p: KalmGroundParams,
                  rng: np.random.Generator) -> dict[str, list[TokenSequence]]:
    """The four patterns' samples drawn from ``episodes`` (counts from params; episodes drawn uniformly). With
    ``p.all_transitions`` the trajectory pattern instead tiles every episode into consecutive windows."""
    if not episodes:
        raise ValueError("build_samples: no episodes")
    b = model.builder
    out: dict[str, list[TokenSequence]] = {k: [] for k in PATTERNS}
    counts = {"trajectory": p.trajectory_samples, "dynamics": p.dynamics_samples, "goal": p.goal_samples,
              "reverse": p.reverse_samples}
    if p.all_transitions:
        for ep in episodes:
            for start in range(0, len(ep), p.window):
                _trajectory_window(b, ep, start, p.window)
                out["trajectory"].append(b.build())
        counts.pop("trajectory")
    for pattern, n in counts.items():
        for _ in range(n):
            ep = episodes[int(rng.integers(len(episodes)))]
            obs, act, nxt = episode_arrays(ep)
            T = len(obs)
            if pattern == "trajectory":
                _trajectory_window(b, ep, 0 if rng.random() < p.start_prob else int(rng.integers(T)), p.window)
            elif pattern == "dynamics":
                t = int(rng.integers(T))
                b.text("Predict the next state:").state(obs[t]).action(act[t]).state(nxt[t], target=True,
                                                                                      marker="target")
            elif pattern == "goal":
                b.text(f"Instruction: {ep.mission}\nInitial state:").state(obs[0]).text(" Final state:")
                b.state(nxt[-1], target=True, marker="target")
            else:
                reverse_prompt(b, obs, act, nxt[-1], p.reverse_states)
                b.text(" " + ep.mission, target=True).eos(target=True)
            out[pattern].append(b.build())
    return out


def _trajectory_window(b, ep: Episode, start: int, window: int) -> None:
    """The instruction -> trajectory sample of ``ep``'s steps start .. start + window - 1 into builder ``b``."""
    obs, act, nxt = episode_arrays(ep)
    stop = min(len(obs), start + window)
    b.text(trajectory_prompt(ep.mission))
    for t in range(start, stop):
        b.state(obs[t], target=t > start).action(act[t], target=True)
    b.state(nxt[stop - 1], target=True)


def validation_params(p: KalmGroundParams) -> KalmGroundParams:
    """The held-out set's sample counts: an eighth of each pattern's training count (at least one), drawn from
    the validation episodes."""
    return p.model_copy(update={k: max(1, v // 8) for k, v in {
        "trajectory_samples": p.trajectory_samples, "dynamics_samples": p.dynamics_samples,
        "goal_samples": p.goal_samples, "reverse_samples": p.reverse_samples}.items()})


def _training_phrasings(benchmark: str) -> dict[str, list[str]]:
    """Each training task's training phrasings, in the split's order."""
    phrasings: dict[str, list[str]] = {}
    for g in kl.goals(benchmark, "train"):
        phrasings.setdefault(g.task, []).append(g.instruction)
    return phrasings


def training_phrasing_episodes(episodes: Sequence[Episode], benchmark: str) -> list[Episode]:
    """The held-out episodes with their instruction replaced by a training phrasing of the same task (the k-th
    episode of a task takes its k-th training phrasing, cycling). The expert's states and actions do not depend on
    the phrasing, so these are the training goals played from validation starts: what selection must score."""
    phrasings = _training_phrasings(benchmark)
    seen: dict[str, int] = {}
    out = []
    for ep in episodes:
        task = ep.info.get("task")
        if task not in phrasings:
            raise ValueError(f"training_phrasing_episodes: episode seed {ep.seed} has task {task!r}, not a "
                             f"{benchmark} training task")
        k = seen[task] = seen.get(task, -1) + 1
        out.append(dataclasses.replace(ep, mission=phrasings[task][k % len(phrasings[task])]))
    return out


def heldout_samples(model: GroundedLM, episodes: Sequence[Episode], benchmark: str, p: KalmGroundParams,
                    rng: np.random.Generator) -> tuple[dict[str, list[TokenSequence]], dict[str, list[TokenSequence]]]:
    """(selection samples, unseen-phrasing samples) from held-out ``episodes`` (validation phrasings, validation
    starts): the patterns carrying action and observation targets on the episodes relabelled with training
    phrasings (``training_phrasing_episodes``), and the trajectory -> instruction pattern on their own, unseen
    phrasings (its token loss, reported apart). Counts: ``validation_params``."""
    v = validation_params(p)
    behaviour = v.model_copy(update={"reverse_samples": 0})
    phrasing = v.model_copy(update={"trajectory_samples": 0, "dynamics_samples": 0, "goal_samples": 0,
                                    "all_transitions": False})
    selection = build_samples(model, training_phrasing_episodes(episodes, benchmark), behaviour, rng)
    return selection, build_samples(model, episodes, phrasing, rng)


def weighted_loss(losses: dict[str, torch.Tensor], p: KalmGroundParams) -> torch.Tensor:
    return p.obs_weight * losses["obs_loss"] + p.act_weight * losses["act_loss"] + p.token_weight * losses["token_loss"]


def autocast_dtype(p: KalmGroundParams, device: torch.device) -> torch.dtype:
    """The compute dtype of p.dtype on ``device`` (llmrl.llm.load.resolve_dtype); weights stay fp32."""
    return resolve_dtype(p.dtype, device)


def _autocast(dtype: torch.dtype, device: torch.device):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


@torch.no_grad()
def evaluate_losses(model: GroundedLM, samples: dict[str, list[TokenSequence]], p: KalmGroundParams,
                    batch_size: int = 32) -> dict[str, float]:
    """Losses per pattern (``<pattern>/<term>``), each term's mean over the patterns carrying it, and the
    weighted total of those means."""
    model.eval()
    dtype = autocast_dtype(p, model.llm.device)
    pad = model.llm.tokenizer.pad_token_id
    result: dict[str, float] = {}
    per_term: dict[str, list[float]] = {"obs_loss": [], "act_loss": [], "token_loss": []}
    for pattern, seqs in samples.items():
        if not seqs:
            continue
        acc: dict[str, float] = {}
        for i in range(0, len(seqs), batch_size):
            chunk = seqs[i:i + batch_size]
            with _autocast(dtype, model.llm.device):
                losses = model.losses(collate(chunk, pad))
            for k, v in losses.items():
                acc[k] = acc.get(k, 0.0) + float(v) * len(chunk)
        for k, v in acc.items():
            if v and k in per_term:
                result[f"{pattern}/{k}"] = round(v / len(seqs), 5)
                per_term[k].append(v / len(seqs))
            elif k == "obs_accuracy":
                result[f"{pattern}/{k}"] = round(v / len(seqs), 4)
    # a term's figure is the mean over the patterns that carry it (patterns weigh equally, whatever their counts)
    totals = {k: float(np.mean(v)) if v else 0.0 for k, v in per_term.items()}
    result.update({k: round(v, 5) for k, v in totals.items()})
    accuracies = [v for k, v in result.items() if k.endswith("/obs_accuracy")]
    if accuracies:
        result["obs_accuracy"] = round(float(np.mean(accuracies)), 4)
    result["loss"] = round(p.obs_weight * totals["obs_loss"] + p.act_weight * totals["act_loss"]
                           + p.token_weight * totals["token_loss"], 5)
    result["selection_loss"] = round(selection_loss(totals, p), 5)
    return result


def selection_loss(terms: dict[str, float], p: KalmGroundParams) -> float:
    """The checkpoint selector: obs_weight * obs_loss + act_weight * act_loss. The token loss is left out: on
    held-out phrasings it measures language, not whether the model acts and predicts states (it made up most of
    the old held-out loss and stopped training at a fifth of an epoch while the action loss still fell)."""
    return float(p.obs_weight * terms["obs_loss"] + p.act_weight * terms["act_loss"])


def select_checkpoint(evaluations: Sequence[tuple[int, dict[str, float]]], p: KalmGroundParams) -> int:
    """The update whose held-out evaluation (``evaluate_losses`` terms) has the lowest ``selection_loss``; the
    earliest on a tie."""
    if not evaluations:
        raise ValueError("select_checkpoint: no evaluations")
    return min(evaluations, key=lambda e: (selection_loss(e[1], p), e[0]))[0]


def state_error(model: GroundedLM, episodes: Sequence[Episode]) -> dict:
    """The model's one-step state error on every real transition of ``episodes`` (``GroundedLM.predict_next``,
    teacher-forced), beside copying the last state (s' := s), the baseline a model of small changes must beat.
    Continuous observations: mean absolute error over dims; categorical ones: the share of fields wrong."""
    if not episodes:
        raise ValueError("state_error: no episodes")
    obs = np.concatenate([e.observations["obs"] for e in episodes]).astype(np.float32)
    nxt = np.concatenate([e.observations["next_obs"] for e in episodes]).astype(np.float32)
    pred = model.predict_next(obs, np.concatenate([np.asarray(e.actions) for e in episodes]))
    if model.codec.categorical:
        metric, err, copy = "field_error", float(np.mean(pred != nxt)), float(np.mean(obs != nxt))
    else:
        metric, err, copy = "mae", float(np.mean(np.abs(pred - nxt))), float(np.mean(np.abs(obs - nxt)))
    return {"metric": metric, "model": round(err, 6), "copy_last_state": round(copy, 6),
            "beats_copy": err < copy, "transitions": len(obs)}


def action_agreement(model: GroundedLM, episodes: Sequence[Episode], instructions: Sequence[str]) -> dict:
    """The model's teacher-forced actions on ``episodes`` (the real states and the expert's actions fed in; episode
    i under ``instructions[i]``), against the expert's: the share of steps whose greedy action is the expert's
    (discrete), or the mean absolute action error (continuous). The episodes step together as rows of one batch."""
    if not episodes:
        raise ValueError("action_agreement: no episodes")
    if len(instructions) != len(episodes):
        raise ValueError(f"action_agreement: {len(instructions)} instructions for {len(episodes)} episodes")
    arrays = [episode_arrays(ep) for ep in episodes]
    live = list(range(len(episodes)))
    state, h = model.start_episodes(list(instructions), np.stack([a[0][0] for a in arrays]).astype(np.float32))
    scores: list[float] = []
    t = 0
    while True:
        pred = model.actions_from_hidden(h, greedy=True)
        for row, i in enumerate(live):
            expert = np.asarray(arrays[i][1][t])
            scores.append(float(pred[row] == expert) if model.spec.discrete
                          else float(np.mean(np.abs(pred[row] - expert))))
        keep = [row for row, i in enumerate(live) if t + 1 < len(arrays[i][0])]
        if not keep:
            break
        if len(keep) < len(live):
            state = model.select_rows(state, keep)
            live = [live[row] for row in keep]
        taken = np.stack([np.asarray(arrays[i][1][t]) for i in live])
        state, h = model.feed(state, taken.astype(np.int64) if model.spec.discrete else taken.astype(np.float32),
                              np.stack([arrays[i][2][t] for i in live]).astype(np.float32))
        t += 1
    return {"metric": "agreement" if model.spec.discrete else "mae", "value": round(float(np.mean(scores)), 6),
            "steps": len(scores)}


def goal_swap(episodes: Sequence[Episode], benchmark: str) -> tuple[list[Episode], list[str]]:
    """Held-out ``episodes`` relabelled with a training phrasing of their own task (``training_phrasing_episodes``),
    and for each the same-index training phrasing of another task (the next training task in sorted order): the two
    goals ``goal_sensitivity`` compares."""
    own = training_phrasing_episodes(episodes, benchmark)
    phrasings = _training_phrasings(benchmark)
    tasks = sorted(phrasings)
    other = []
    for ep in own:
        k = phrasings[ep.info["task"]].index(ep.mission)
        swap = tasks[(tasks.index(ep.info["task"]) + 1) % len(tasks)]
        other.append(phrasings[swap][k % len(phrasings[swap])])
    return own, other


def majority_agreement(episodes: Sequence[Episode]) -> float:
    """The agreement with the expert of always taking its most common action (discrete actions)."""
    acts = np.concatenate([np.asarray(e.actions).reshape(-1) for e in episodes]).astype(np.int64)
    return round(float(np.bincount(acts).max() / len(acts)), 6)


def goal_sensitivity(model: GroundedLM, episodes: Sequence[Episode], benchmark: str) -> dict:
    """Does the model's action depend on its instruction? ``action_agreement`` on held-out ``episodes`` under a
    training phrasing of each episode's own task (``own_goal``) and of another task (``other_goal``, ``goal_swap``).
    Equal figures mean a policy that ignores its goal, which no goal-conditioned rollout can come from;
    ``majority_action`` is the agreement of always taking the expert's most common action (discrete)."""
    own, other = goal_swap(episodes, benchmark)
    out = {"own_goal": action_agreement(model, own, [e.mission for e in own]),
           "other_goal": action_agreement(model, own, other)}
    if model.spec.discrete:
        out["majority_action"] = majority_agreement(episodes)
    return out


def offline_goal_sensitivity(policy, episodes: Sequence[Episode], benchmark: str, table) -> dict:
    """``goal_sensitivity`` for an offline policy (``OfflinePolicy``, gate 0's BC): its greedy actions on the real
    states of held-out ``episodes`` against the expert's, under its own goal's instruction embedding and another
    task's (``goal_swap``; ``table``: an ``EmbeddingTable``)."""
    own, other = goal_swap(episodes, benchmark)
    obs = np.concatenate([e.observations["obs"] for e in own]).astype(np.float32)
    expert = np.concatenate([np.asarray(e.actions) for e in own])
    discrete = kl.action_spec(benchmark).discrete
    out: dict = {}
    for key, instructions in (("own_goal", [e.mission for e in own]), ("other_goal", other)):
        per_step = [i for e, i in zip(own, instructions, strict=True) for _ in range(len(e))]
        pred = np.asarray(policy.act_batch(obs, table.lookup(per_step)))
        value = (np.mean(pred.reshape(-1) == expert.reshape(-1)) if discrete else np.mean(np.abs(pred - expert)))
        out[key] = {"metric": "agreement" if discrete else "mae", "value": round(float(value), 6),
                    "steps": len(obs)}
    if discrete:
        out["majority_action"] = majority_agreement(episodes)
    return out


class _Losses(torch.nn.Module):
    """``GroundedLM.losses`` as a module's forward: DDP reduces gradients only of what ran through its forward."""

    def __init__(self, model: GroundedLM):
        super().__init__()
        self.model = model

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.model.losses(batch)


def _target_counts(batch: dict[str, torch.Tensor]) -> list[float]:
    """How many targets each of TERMS averages over in ``GroundedLM.losses`` (the same shifted masks)."""
    return [float(batch["obs_target"][:, 1:].sum()), float(batch["act_target"][:, 1:].sum()),
            float((batch["labels"][:, 1:] != -100).sum())]


def length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, window: int = 32
                   ) -> list[np.ndarray]:
    """One epoch of batches (sample indices): a seeded permutation cut into windows of ``window`` batches, each
    window sorted by sequence length and cut into batches, then the batches shuffled. Sequences of similar length
    share a batch, so little compute goes to padding (the patterns' lengths differ up to tenfold), and every sample
    appears once per epoch. A short remainder joins the batch before it, so every batch holds at least
    ``batch_size`` samples (the pool allowing) and N processes (N <= batch_size) each get a share of each batch:
    one process and N run the same batches."""
    order = rng.permutation(len(lengths))
    batches = []
    for lo in range(0, len(order), window * batch_size):
        chunk = order[lo:lo + window * batch_size]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        pieces = [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
        if len(pieces[-1]) < batch_size and len(batches) + len(pieces) > 1:
            batches += pieces[:-1]
            batches[-1] = np.concatenate([batches[-1], pieces[-1]])
        else:
            batches += pieces
    return [batches[i] for i in rng.permutation(len(batches))]


def train_grounding(model: GroundedLM, samples: dict[str, list[TokenSequence]], p: KalmGroundParams,
                    rng: np.random.Generator, *, accelerator=None,
                    validation: dict[str, list[TokenSequence]] | None = None,
                    unseen: dict[str, list[TokenSequence]] | None = None) -> Iterator[dict]:
    """SFT on the mixed patterns; yields one metrics row per update.

    Row: step, loss, obs_loss, act_loss, token_loss (obs_accuracy for categorical observations), lr, autocast
    (dtype name). ``update_steps(p, samples)`` updates over the patterns' samples pooled, in seeded epochs of
    length-bucketed batches (``length_batches``).

    With ``validation`` samples (``heldout_samples``: training phrasings from validation starts) and
    ``p.eval_every`` > 0, the held-out terms are measured every ``eval_every`` updates and after the last (row keys
    ``heldout_obs_loss``, ``heldout_act_loss``, ``heldout_selection_loss``; ``unseen_token_loss`` on the
    ``unseen`` phrasings' samples, reported only), and the model ends with the trainable weights of the update
    ``select_checkpoint`` picks (row key ``selected`` on the last row): a small model overfits a few thousand
    samples within epochs, and held-out behaviour picks the stopping point.

    ``accelerator`` (``accelerate.Accelerator`` of N processes, the model on its device): every rank draws the
    same batches and runs its share ``batch[rank::N]`` through DDP. A rank's term is its share's mean weighted by
    N x its share of the batch's targets of that term, so DDP's gradient average is the one-process batch mean;
    the reported losses are the batch's, on every rank (up to float rounding: the shares are padded apart).
    """
    acc = accelerator if accelerator is not None and accelerator.num_processes > 1 else None
    rank, world = (acc.process_index, acc.num_processes) if acc is not None else (0, 1)
    if p.batch_size < world:
        raise ValueError(f"kalm.ground.batch_size: {p.batch_size} sequences cannot be shared by {world} processes")
    pool = [s for k in PATTERNS for s in samples.get(k, [])]
    if not pool:
        raise ValueError("train_grounding: no samples")
    params = [q for q in model.parameters() if q.requires_grad]
    # find_unused_parameters: a rank's share may hold no state or action target, leaving that head without a
    # gradient in its backward pass (accelerate's prepare_model reads this only from the caller's Accelerator).
    ddp = (torch.nn.parallel.DistributedDataParallel(_Losses(model), find_unused_parameters=True)
           if acc is not None else None)
    opt = torch.optim.AdamW(params, lr=p.lr, weight_decay=p.weight_decay)

    steps = update_steps(p, len(pool))

    def schedule(step: int) -> float:
        if step < p.warmup:
            return (step + 1) / (p.warmup + 1)
        return max(0.0, 1 - (step - p.warmup) / max(1, steps - p.warmup))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    dtype = autocast_dtype(p, model.llm.device)
    pad = model.llm.tokenizer.pad_token_id
    lengths = np.asarray([len(s) for s in pool])
    epoch: list[np.ndarray] = []
    select = bool(validation) and p.eval_every > 0
    evaluations: list[tuple[int, dict[str, float]]] = []
    weights: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(steps):
        while not epoch:
            epoch = length_batches(lengths, p.batch_size, rng)
            if any(len(b) < world for b in epoch):
                raise ValueError(f"kalm.ground: {len(pool)} samples cannot be shared by {world} processes")
        batch = [pool[i] for i in epoch.pop(0)]
        model.train()
        if ddp is None:
            with _autocast(dtype, model.llm.device):
                losses = model.losses(collate(batch, pad))
            loss = objective = weighted_loss(losses, p)
        else:
            losses, objective = _share_losses(ddp, collate(batch[rank::world], pad), p, acc, dtype)
            loss = weighted_loss(losses, p)
        if not math.isfinite(float(loss.detach())):
            raise FloatingPointError(f"grounding loss is {float(loss)} at step {step}")
        opt.zero_grad(set_to_none=True)
        objective.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        lr = opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        row = {"step": step + 1, "loss": float(loss.detach()), **{k: float(v.detach()) for k, v in losses.items()},
               "lr": lr, "autocast": dtype_name(dtype)}
        if select and ((step + 1) % p.eval_every == 0 or step + 1 == steps):
            terms = evaluate_losses(model, validation, p)
            row |= {"heldout_obs_loss": terms["obs_loss"], "heldout_act_loss": terms["act_loss"],
                    "heldout_selection_loss": terms["selection_loss"]}
            if unseen:
                row["unseen_token_loss"] = evaluate_losses(model, unseen, p)["token_loss"]
            evaluations.append((step + 1, terms))
            best = select_checkpoint(evaluations, p)
            # keep only the best weights so far: the next evaluation competes with them alone
            weights = {step + 1: {n: q.detach().clone() for n, q in model.named_parameters() if q.requires_grad}} \
                if best == step + 1 else weights
        if select and step + 1 == steps:
            best = select_checkpoint(evaluations, p)
            with torch.no_grad():
                for n, q in model.named_parameters():
                    if q.requires_grad:
                        q.copy_(weights[best][n])
            row["selected"] = best
        yield row


def _share_losses(ddp, share: dict[str, torch.Tensor], p: KalmGroundParams, acc, dtype: torch.dtype):
    """(the whole batch's terms, this rank's loss to backpropagate) for one rank's ``share`` of the batch."""
    world = acc.num_processes
    model = ddp.module.model
    counts = _target_counts(share)
    with _autocast(dtype, model.llm.device):
        local = ddp(share)
    # one all-reduce: every term's target count and target sum over the ranks
    sums = acc.reduce(torch.tensor([*counts, *(float(local[k]) * c for k, c in zip(TERMS, counts))],
                                   dtype=torch.float64, device=acc.device), "sum").tolist()
    totals, term_sums = sums[:len(TERMS)], sums[len(TERMS):]
    whole = {k: torch.tensor(s / t if t else 0.0) for k, s, t in zip(TERMS, term_sums, totals)}
    scaled = {k: local[k] * (world * c / t if t else 0.0) for k, c, t in zip(TERMS, counts, totals)}
    return whole, weighted_loss(scaled, p)
