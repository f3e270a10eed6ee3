"""GLAM: policy = softmax of true log-probs, PPO updates what it should, learning beats random, exact resume."""

import numpy as np
import pytest
import torch

from llmrl.agents.baselines import RandomPolicy
from llmrl.agents.llm_policy import LLMBatchPolicy, LLMPolicy, build_agent, build_prompt, candidates_for, render
from llmrl.algos.bc_llm import train_bc
from llmrl.algos.ppo_llm import advantage_batch, collect, ppo_update, train
from llmrl.config.glam import GlamPPO
from llmrl.envs.make import make_env
from llmrl.envs.babyai_text.languages import ACTIONS_EN, VARIANTS
from llmrl.eval.harness import evaluate
from llmrl.eval.batched import evaluate_batched
from llmrl.llm.score import score_naive

ENV = "BabyAI-Text-GoToObjS4-v0"
HISTORY = 3  # observations per prompt (GLAM's)
LABELS = VARIANTS["none"].labels


def test_prompt_layout():
    p = build_prompt(LABELS, ACTIONS_EN, "go to the red ball", ["o0", "o1", "o2"], ["turn left", "go forward"])
    assert p.splitlines() == [
        "Possible actions of the agent: turn left, turn right, go forward, pick up, drop, toggle",
        "Goal of the agent: go to the red ball",
        "Observation 0: o0", "Action 0: turn left", "Observation 1: o1", "Action 1: go forward",
        "Observation 2: o2", "Action 2:"]


def test_policy_is_softmax_of_naive_logprobs():
    agent = build_agent("tiny", "lora", temperature=1.0)
    env = make_env(ENV)
    obs, _ = env.reset(seed=3)
    rendered = render(agent.llm, build_prompt(LABELS, ACTIONS_EN, obs["mission"], [obs["text"]], []))
    assert rendered.startswith("<|system|>")  # the chat template was applied
    cands = candidates_for(rendered, ACTIONS_EN)
    with torch.no_grad():
        probs = torch.softmax(agent([rendered], [cands]).logits[0], -1).numpy()
    ref = score_naive(agent.llm, [rendered], cands)[0].logprob
    np.testing.assert_allclose(probs, np.exp(ref - ref.max()) / np.exp(ref - ref.max()).sum(), atol=1e-5)
    policy = LLMPolicy(agent, "glam", history=3)
    policy.reset(env, seed=0)
    assert policy.act(obs, greedy=True) == int(np.argmax(ref))


def _batch(agent, cfg):
    slots_env = lambda: make_env(ENV)  # noqa: E731
    from llmrl.algos.ppo_llm import EnvSlot

    slots = [EnvSlot(slots_env(), seed=i, history=HISTORY) for i in range(cfg.n_envs)]
    return advantage_batch(collect(agent, slots, cfg, torch.Generator().manual_seed(0)), cfg)


@pytest.mark.parametrize("variant", ["lora", "full", "npae"])
def test_one_update_changes_trainable_only_and_lowers_loss(variant):
    torch.manual_seed(0)
    agent = build_agent("tiny", variant)
    # one optimiser step (epochs=1, one minibatch of two accumulated micro-batches): first order, the loss falls
    cfg = GlamPPO(n_envs=2, frames_per_env=4, epochs=1, minibatch_size=8, micro_batch=4, lr=1e-4)
    batch = _batch(agent, cfg)
    before = {n: p.detach().clone() for n, p in agent.named_parameters()}
    frozen = torch.optim.Adam([p for p in agent.parameters() if p.requires_grad], lr=0.0)
    loss0 = ppo_update(agent, frozen, batch, cfg, torch.Generator().manual_seed(1))["loss"]
    opt = torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=1e-3)  # plain first-order step
    for _ in range(2):  # two steps: LoRA's A matrices get gradient only once B (zero-initialised) moved
        ppo_update(agent, opt, batch, cfg, torch.Generator().manual_seed(1))
    loss1 = ppo_update(agent, frozen, batch, cfg, torch.Generator().manual_seed(1))["loss"]
    assert loss1 < loss0
    # Adam moves every parameter with a non-zero gradient by ~lr (SGD steps can vanish in float32 rounding)
    adam = torch.optim.Adam([p for p in agent.parameters() if p.requires_grad], lr=1e-3)
    ppo_update(agent, adam, batch, cfg, torch.Generator().manual_seed(1))
    trainable = {n for n, p in agent.named_parameters() if p.requires_grad}
    assert any("value_head" in n for n in trainable)
    if variant != "full":
        assert any("lora_" in n for n in trainable) and all("lora_" in n or "_head" in n for n in trainable)
    for n, p in agent.named_parameters():
        changed = not torch.equal(before[n], p.detach())
        assert changed == (n in trainable), n


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_trained_tiny_agent_beats_random(dtype):
    # The same run learns in fp32 and under bf16 (the learning curves stay equivalent). The random tiny model's summed log-probs put almost all mass on one-token actions (about -10.8 per
    # token), so the scoring head never explores; length-normalised scores start near uniform. Full
    # fine-tuning lets PPO move the LM head directly; a LoRA / NPAE agent did not learn within this budget.
    # The tiny model cannot tell states apart yet, so its greedy policy is one fixed action: the learned
    # stochastic policy is what beats random (it drops the useless pick up / drop / toggle).
    agent = build_agent("tiny", "full", length_norm=True, seed=0, dtype=dtype)
    assert agent.llm.dtype_name == dtype
    cfg = GlamPPO(n_envs=16, frames_per_env=8, updates=6, epochs=4, minibatch_size=32, micro_batch=32,
                  lr=1e-3, reward_scale=1.0, max_steps=8)
    history = list(train(agent, lambda: make_env(ENV), cfg, history=1, seed=0, progress=False))
    assert history[-1]["entropy"] < history[0]["entropy"]
    seeds = range(900, 1100)
    trained = evaluate_batched(LLMBatchPolicy(agent, "glam", history=1), lambda: make_env(ENV), seeds,
                               mode="sampled", max_steps=8, progress=False).summary()
    rand = evaluate(RandomPolicy(), make_env(ENV), seeds, mode="sampled", max_steps=8, progress=False).summary()
    assert trained["success_rate"] > rand["success_ci95"][1], (trained["success_rate"], rand["success_rate"])


def test_lockstep_evaluation_matches_the_harness():
    agent = build_agent("tiny", "lora", length_norm=True, seed=0)
    seeds = range(40, 52)
    for mode in ("greedy", "sampled"):
        one = evaluate(LLMPolicy(agent, "glam", history=2), make_env(ENV), seeds, mode=mode, max_steps=4,
                       progress=False)
        many = evaluate_batched(LLMBatchPolicy(agent, "glam", history=2), lambda: make_env(ENV), seeds, mode=mode,
                                max_steps=4, n_envs=5, progress=False)
        assert many.table() == one.table()


def test_resume_gives_identical_results(tmp_path):
    cfg = GlamPPO(n_envs=2, frames_per_env=3, updates=3, epochs=1, minibatch_size=6, micro_batch=3, lr=1e-3)
    skip = ("fps", "collect_s", "resumed")

    def strip(h):
        return [{k: v for k, v in r.items() if k not in skip} for r in h]

    straight = build_agent("tiny", "lora", seed=0)
    h_straight = list(train(straight, lambda: make_env(ENV), cfg, history=HISTORY, seed=0, progress=False))
    ckpt = tmp_path / "ckpt.pt"

    class Kill(Exception):
        pass

    first = build_agent("tiny", "lora", seed=0)
    for row in train(first, lambda: make_env(ENV), cfg, history=HISTORY, seed=0, checkpoint=ckpt, progress=False):
        break  # stopped after update 1, its checkpoint on disk
    resumed = build_agent("tiny", "lora", seed=0)
    h_resumed = list(train(resumed, lambda: make_env(ENV), cfg, history=HISTORY, seed=0, checkpoint=ckpt,
                           progress=False))
    assert [r.get("resumed", False) for r in h_resumed] == [True, False, False]
    assert strip(h_resumed) == strip(h_straight)
    for (n, a), (_, b) in zip(straight.named_parameters(), resumed.named_parameters()):
        assert torch.equal(a, b), n


def test_bc_lowers_loss():
    agent = build_agent("tiny", "lora", seed=0)
    rendered = render(agent.llm, build_prompt(LABELS, ACTIONS_EN, "go to the red ball", ["You see a wall"], []))
    samples = [(rendered, candidates_for(rendered, ACTIONS_EN), 2)] * 4
    losses = [r["loss"] for r in train_bc(agent, samples, epochs=5, batch_size=4, lr=1e-2, seed=0, progress=False)]
    assert len(losses) == 5 and losses[-1] < losses[0]
    with pytest.raises(ValueError, match="no samples"):
        next(train_bc(agent, [], epochs=1, batch_size=4, lr=1e-2, seed=0))


def _bc_task(agent, goals=("red ball", "blue key", "green box", "grey door")):
    """One prompt per goal, the bot's action a function of the goal: learnable, and different per sample."""
    rows = []
    for i, goal in enumerate(goals):
        rendered = render(agent.llm, build_prompt(LABELS, ACTIONS_EN, f"go to the {goal}", ["You see a wall"], []))
        rows.append((rendered, candidates_for(rendered, ACTIONS_EN), i))
    return rows


@pytest.mark.parametrize("lora_layers", [None, 1])
def test_bc_keeps_the_epoch_of_lowest_validation_loss(lora_layers):
    agent = build_agent("tiny", "lora", seed=0, lora_layers=lora_layers)
    assert (agent.trunk_start is not None) == (lora_layers is not None)  # 1: epochs run on captured trunk states
    train = _bc_task(agent) * 2  # each prompt twice: one row of count 2 (group_samples)
    before = agent.trainable_state()
    rows = list(train_bc(agent, train, validation=_bc_task(agent), epochs=6, batch_size=4, lr=1e-2, seed=0,
                         progress=False))
    epochs = [r for r in rows if "validation_loss" in r]
    assert [e["epoch"] for e in epochs] == list(range(7))  # before training, then each epoch
    assert epochs[-1]["validation_loss"] < epochs[0]["validation_loss"]
    best = min(epochs, key=lambda e: e["validation_loss"])
    assert best["best"] and sum(e["best"] for e in epochs if e["epoch"] > best["epoch"]) == 0
    changed = [n for n, t in agent.trainable_state().items() if not torch.equal(t, before[n])]
    assert any("lora" in n for n in changed)
    # the agent holds the kept epoch's weights: a new run's first row (before any step) gives the best loss
    again = next(train_bc(agent, train, validation=_bc_task(agent), epochs=1, batch_size=4, lr=1e-2, seed=0,
                          progress=False))
    assert again["epoch"] == 0 and again["validation_loss"] == pytest.approx(best["validation_loss"], rel=1e-4)


def test_bc_stops_after_patience_epochs_without_improvement_and_restores_the_best():
    agent = build_agent("tiny", "lora", seed=0)
    start = agent.trainable_state()
    # an lr this large overshoots: validation stops improving, training stops and the best weights come back
    rows = list(train_bc(agent, _bc_task(agent), validation=_bc_task(agent, ("purple box",) * 4), epochs=20,
                         patience=1, batch_size=4, lr=5.0, seed=0, progress=False))
    epochs = [r for r in rows if "validation_loss" in r]
    best = max(e["epoch"] for e in epochs if e["best"])
    assert epochs[-1]["epoch"] == best + 1 < 20
    if best == 0:
        assert all(torch.equal(t, start[n]) for n, t in agent.trainable_state().items())
    with pytest.raises(ValueError, match="validation is empty"):
        next(train_bc(agent, _bc_task(agent), validation=[], epochs=1, batch_size=4, lr=1e-2, seed=0))


def test_sampling_streams_change_the_actions_not_the_starts():
    from llmrl.eval.streams import SamplingStream, episode_stream_seed
    env = make_env(ENV)
    seeds = range(40)
    runs = [evaluate(SamplingStream(RandomPolicy(n_actions=6), s), env, seeds, mode="sampled", progress=False)
            for s in (0, 0, 1)]
    plain = evaluate(RandomPolicy(n_actions=6), env, seeds, mode="sampled", progress=False)
    assert runs[0].table() == runs[1].table()  # a stream is deterministic
    assert [e.length for e in runs[0].episodes] == [e.length for e in plain.episodes]  # stream 0: no streams
    assert [e.length for e in runs[0].episodes] != [e.length for e in runs[2].episodes]
    assert runs[2].episodes[0].seed == 0 and runs[2].table() != runs[0].table()
    assert episode_stream_seed(7, 0) == 7 and episode_stream_seed(7, 1) != episode_stream_seed(7, 2)
    with pytest.raises(ValueError, match="stream"):
        episode_stream_seed(7, -1)


def test_bad_params_name_the_key():
    from llmrl.config import ParamsError, load_section
    from llmrl.config.glam import GlamTrain

    with pytest.raises(ParamsError, match=r"glam.train.lr: must be > 0, got -1"):
        load_section({"glam": {"train": {"env_id": ENV, "n_envs": 1, "frames_per_env": 1, "updates": 1,
                                         "minibatch_size": 1, "micro_batch": 1, "lr": -1, "seeds": [0],
                                         "variants": ["lora"]}}}, "glam.train", GlamTrain)
    with pytest.raises(ParamsError, match=r"glam.train: .*minibatch_size 10 is not a multiple of micro_batch 4"):
        load_section({"glam": {"train": {"env_id": ENV, "minibatch_size": 10, "micro_batch": 4, "seeds": [0],
                                         "variants": ["lora"]}}}, "glam.train", GlamTrain)


def test_generalisation_runs_at_least_100_episodes_per_test():
    from llmrl.config import ParamsError, load_section
    from llmrl.config.glam import GlamGeneralisation

    section = {"env_id": ENV, "episodes": 99, "seed": 300000, "tests": ["none"]}
    with pytest.raises(ParamsError, match=r"glam.generalisation.episodes: must be >= 100, got 99"):
        load_section({"glam": {"generalisation": section}}, "glam.generalisation", GlamGeneralisation)


def test_time_limit_truncation_is_bootstrapped_with_the_cut_state_value():
    """A step cut by ``max_steps`` (not terminal) gets reward + gamma * V(s_cut); a terminal step does not."""
    from llmrl.algos.ppo_llm import EnvSlot

    torch.manual_seed(0)
    agent = build_agent("tiny", "lora")
    cfg = GlamPPO(n_envs=2, frames_per_env=3, max_steps=2, gamma=0.9, reward_scale=20.0)
    slots = [EnvSlot(make_env(ENV), seed=i, history=HISTORY) for i in range(cfg.n_envs)]
    buf = collect(agent, slots, cfg, torch.Generator().manual_seed(0))
    cut = buf["dones"][1]  # every episode is cut after 2 steps unless it ended before
    assert cut.sum() > 0
    for i in range(cfg.n_envs):
        if buf["dones"][0, i] == 0 and cut[i] == 1:
            # The bot-free tiny agent fails these levels: the env reward is 0, so the reward is the bootstrap.
            assert buf["rewards"][1, i] != 0.0
            assert buf["rewards"][2, i] == 0.0 or buf["dones"][2, i] == 1


def test_update_computes_each_distinct_row_of_a_minibatch_once():
    # Small levels repeat (prompt, candidates) rows: a minibatch's repeats share one forward row, micro-batches
    # hold distinct rows, and the update is the one of computing every sample apart (their gradients sum).
    torch.manual_seed(0)
    agent = build_agent("tiny", "lora", lora_layers=1)
    cfg = GlamPPO(n_envs=4, frames_per_env=4, epochs=1, minibatch_size=16, micro_batch=2, lr=1e-2)
    batch = _batch(agent, cfg)
    distinct = len({(p, tuple(c)) for p, c in zip(batch["prompts"], batch["cands"])})
    assert distinct < len(batch["prompts"])  # the test needs repeats
    rows, forward = [], agent._forward
    agent._forward = lambda rendered, *a, **k: rows.append(len(rendered)) or forward(rendered, *a, **k)
    stats = ppo_update(agent, torch.optim.SGD([p for p in agent.parameters() if p.requires_grad], lr=0.0), batch,
                       cfg, torch.Generator().manual_seed(1))
    assert sum(rows) == distinct and max(rows) <= cfg.micro_batch and len(rows) == -(-distinct // cfg.micro_batch)
    assert abs(stats["approx_kl"]) < 1e-6  # lr 0: the policy that collected the batch


def test_frozen_trunk_gives_the_full_forward_and_trains_the_top_layers_only():
    # LoRA on the top layer of the tiny model's two: the bottom layer's outputs, captured while acting, stand in
    # for it in every PPO epoch, and must give what the full forward gives, before and after the top moves.
    torch.manual_seed(0)
    agent = build_agent("tiny", "lora", lora_layers=1)
    assert agent.trunk_start == 1
    cfg = GlamPPO(n_envs=2, frames_per_env=4, epochs=2, minibatch_size=8, micro_batch=4, lr=1e-3)
    batch = _batch(agent, cfg)
    assert len(batch["trunks"]) == len(batch["prompts"]) and batch["trunks"][0].start == 1
    prompts, cands = batch["prompts"], batch["cands"]

    def both():
        with torch.no_grad():
            full, cached = agent(prompts, cands), agent(prompts, cands, trunks=batch["trunks"])
        return full, cached

    before = {n: p.detach().clone() for n, p in agent.named_parameters() if p.requires_grad}
    full, cached = both()
    torch.testing.assert_close(cached.logits, full.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(cached.values, full.values, rtol=0, atol=1e-5)
    opt = torch.optim.Adam([p for p in agent.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # LoRA's A gets gradient once B (zero-initialised) moved
        ppo_update(agent, opt, batch, cfg, torch.Generator().manual_seed(1))
    full_after, cached_after = both()
    assert (full_after.logits - full.logits).abs().max() > 1e-3  # the update moved the policy
    torch.testing.assert_close(cached_after.logits, full_after.logits, rtol=0, atol=1e-5)
    trainable = [n for n, p in agent.named_parameters() if p.requires_grad]
    assert all(".layers.1." in n for n in trainable if "lora_" in n) and any("lora_" in n for n in trainable)
    for n, p in agent.named_parameters():
        if p.requires_grad:
            assert not torch.equal(before[n], p.detach()), n


def test_trunk_states_of_other_rows_are_refused():
    agent = build_agent("tiny", "lora", lora_layers=1)
    batch = _batch(agent, GlamPPO(n_envs=2, frames_per_env=2))
    with pytest.raises(ValueError, match="one trunk per prompt"):
        agent(batch["prompts"][:2], batch["cands"][:2], trunks=batch["trunks"][:1])
    with pytest.raises(ValueError, match="lora.layers: 3 asked, the model has 2"):
        build_agent("tiny", "lora", lora_layers=3)


@pytest.mark.parametrize("lora_layers", [None, 1])
def test_bf16_ppo_ratios_start_at_one(lora_layers):
    # Collection and update compute the log-probs the same way (the same bf16 path, with or without the frozen
    # trunk), so before any step the ratio is 1 up to bf16's batch-shape noise (measured approx_kl 5e-8).
    torch.manual_seed(0)
    agent = build_agent("tiny", "lora", lora_layers=lora_layers, dtype="bfloat16")
    cfg = GlamPPO(n_envs=2, frames_per_env=4, epochs=1, minibatch_size=8, micro_batch=4)
    batch = _batch(agent, cfg)
    frozen = torch.optim.Adam([p for p in agent.parameters() if p.requires_grad], lr=0.0)
    stats = ppo_update(agent, frozen, batch, cfg, torch.Generator().manual_seed(1))
    assert abs(stats["approx_kl"]) < 1e-6 and stats["clipfrac"] == 0.0


def test_glam_is_compared_with_each_reference_paired_by_start():
    from llmrl.eval.glam import paired_against, success_matrix
    from llmrl.eval.harness import EpisodeRecord, EvalResult

    def run(successes, seeds=None):
        seeds = seeds or list(range(len(successes)))
        return EvalResult("x", "env", "sampled", [EpisodeRecord(seed=s, episode_return=float(w), length=1, success=bool(w))
                                           for s, w in zip(seeds, successes)])

    glam = success_matrix([run([1] * 30), run([1] * 29 + [0]), run([1] * 30)])
    random = success_matrix([run([1, 0, 0] * 10)])
    same = success_matrix([run([1] * 30)] * 2)
    vs = paired_against({"greedy": glam, "sampled": glam}, {"random": {"sampled": random}, "bot": {"greedy": same}})
    assert set(vs) == {"random", "bot"} and set(vs["random"]) == {"sampled"}  # only modes both ran
    r = vs["random"]["sampled"]
    assert r["difference"] == pytest.approx(1 - 1 / 90 - 1 / 3, abs=1e-4) and r["ci_low"] > 0
    assert (r["runs"], r["reference_runs"], r["items"]) == (3, 1, 30)
    assert vs["bot"]["greedy"]["ci_low"] <= 0 <= vs["bot"]["greedy"]["ci_high"]
    with pytest.raises(ValueError, match="same episode seeds"):
        success_matrix([run([1, 0]), run([1, 0], seeds=[5, 6])])
    from llmrl.eval.glam import require_same_starts
    require_same_starts({"glam": [0, 1], "bc": [0, 1]})
    with pytest.raises(ValueError, match=r"\['bc'\] played other episode seeds than 'glam'"):
        require_same_starts({"glam": [0, 1], "bc": [1, 0]})
