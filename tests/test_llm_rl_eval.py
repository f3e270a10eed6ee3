"""LLM_RL's evaluation over training seeds: each variant's accuracy with an interval over its seeds and the problems
(crossed: every seed answers the same problems) beside each seed's value, the base model with an interval over
problems, and a claim against the base model only where the paired difference on the same problems excludes 0
(``llmrl.eval.llm_rl``); the stage scores every (variant, seed) model on the same problems (stages/llm_rl_eval.py)."""

from __future__ import annotations

import json

import pytest

from llmrl.eval.llm_rl import accuracy_by_arithmetic, accuracy_entry, against_base
from llmrl.files import read_json

from .faults_support import repo_params, run_stage, stage_repo


def _records(accuracy: float, n: int = 60, *, ids: str = "p", offset: int = 0) -> list[dict]:
    """``solve``'s records for ``n`` problems, ``accuracy`` of them answered correctly: problems ``offset``,
    ``offset`` + 1, ... (cyclically)."""
    right = {(offset + i) % n for i in range(round(accuracy * n))}
    return [{"id": f"{ids}{i}", "correct": i in right, "parsed_answer": None if i == n - 1 else "1",
             "finish_reason": "length" if i == n - 1 else "answer", "n_tokens": 10 + i % 2} for i in range(n)]


def test_accuracy_over_seeds_is_the_mean_of_each_seeds_accuracy_with_an_interval_over_seeds_and_problems():
    entry = accuracy_entry([_records(0.5), _records(0.6), _records(0.7)])
    assert entry["per_seed"] == [0.5, 0.6, 0.7] and entry["success"] == 0.6
    assert (entry["seeds"], entry["episodes"]) == (3, 180)
    assert entry["interval"] == "seeds x problems, crossed bootstrap"
    assert entry["success_lo"] < 0.6 < entry["success_hi"]
    assert entry["parse_failure"] == entry["truncated"] == round(3 / 180, 4) and entry["tokens"] == 10.5
    # the same pooled answers from seeds that disagree: a wider interval (the seed is a unit, not the answer)
    spread = accuracy_entry([_records(0.3), _records(0.6), _records(0.9)])
    assert spread["success"] == 0.6
    assert spread["success_hi"] - spread["success_lo"] > 2 * (entry["success_hi"] - entry["success_lo"])
    # the base model: one model, an interval over the problems alone, and it says so
    base = accuracy_entry([_records(0.3)])
    assert base["seeds"] == 1 and base["per_seed"] == [0.3] and base["success_lo"] < 0.3 < base["success_hi"]
    assert base["interval"] == "one run, interval over problems"
    # none right: the interval still allows a rate above 0 (the pooled answers' Wilson bound)
    assert accuracy_entry([_records(0.0)])["success_hi"] > 0.03


def test_problems_shared_by_seeds_widen_the_interval_over_pooling_the_answers():
    """Three seeds that answer the same 60 problems alike: 180 answers, but only 60 problems' worth of evidence. The
    interval must be as wide as one seed's over its problems, not sqrt(3) narrower."""
    three = accuracy_entry([_records(0.5)] * 3)
    one = accuracy_entry([_records(0.5)])
    assert three["success_hi"] - three["success_lo"] >= 0.95 * (one["success_hi"] - one["success_lo"])


def test_accuracy_entry_needs_every_seed_on_the_same_problems():
    with pytest.raises(ValueError, match="seed 1 answered other problems than seed 0"):
        accuracy_entry([_records(0.5), _records(0.5, ids="q")])
    with pytest.raises(ValueError, match="seed 1 has no records"):
        accuracy_entry([_records(0.5), []])
    with pytest.raises(ValueError, match="no seeds"):
        accuracy_entry([])


def test_a_variant_beats_the_base_model_only_where_the_paired_difference_excludes_zero():
    base = [_records(0.3)]
    # seeds that agree at twice the base model's accuracy, right on what the base model got right and more
    up = against_base([_records(0.6)] * 3, base)
    assert up["verdict"] == "higher" and up["difference"] == pytest.approx(0.3) and up["runs"] == [3, 1]
    assert up["items_lower"] == 0 and up["items"] == 60
    # the same mean gain from seeds that disagree: three draws, not 180 answers
    assert against_base([_records(0.9), _records(0.1), _records(0.8)], base)["verdict"] == "no difference"
    assert against_base([_records(0.05)] * 3, base)["verdict"] == "lower"
    # the same accuracy on other problems is no gain, whatever it does per problem
    shifted = against_base([_records(0.3, offset=30)] * 3, base)
    assert shifted["difference"] == 0 and shifted["verdict"] == "no difference"
    with pytest.raises(ValueError, match="answered other problems"):
        against_base([_records(0.5, ids="q")], base)


def test_accuracy_by_arithmetic_splits_unseen_partly_seen_and_seen_problems():
    seeds = [_records(0.5, n=4), _records(0.25, n=4)]  # seed 0 right on problems 0, 1; seed 1 on problem 0
    out = accuracy_by_arithmetic(seeds, [0.0, 0.0, 0.5, 1.0])
    assert out == {"unseen": {"problems": 2, "accuracy": 0.75}, "partly_seen": {"problems": 1, "accuracy": 0.0},
                   "seen": {"problems": 1, "accuracy": 0.0}}
    assert set(accuracy_by_arithmetic(seeds, [0.0] * 4)) == {"unseen"}  # only the groups that hold a problem
    with pytest.raises(ValueError, match="3 seen shares for 4 problems"):
        accuracy_by_arithmetic(seeds, [0.0] * 3)


# ---- the stage, on the tiny model --------------------------------------------------------------------------------
def _math_data(root) -> None:
    folder = root / "data" / "llm_rl"
    folder.mkdir(parents=True)
    for split, first in (("train", 0), ("test", 50)):
        rows = [{"id": f"{split}{i}", "problem": f"Tom has {i} apples and gets 2 more. How many apples?",
                 "solution": f"{i} + 2 = {i + 2}\nThe answer is: {i + 2}", "answer": str(i + 2),
                 "source": "generated", "key": f"add|{i}|2"}
                for i in range(first, first + 6)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _trained_models(root, seeds) -> None:
    """Stand-ins for llm_rl_train's outputs: a LoRA adapter of the tiny model per variant and seed, each its own."""
    import torch

    from llmrl.agents.math_solver import write_policy
    from llmrl.config.lora import LoraSettings
    from llmrl.llm.load import load_model

    from stages import paths

    for variant in ("reinforce_kl", "grpo"):
        for seed in seeds:
            torch.manual_seed(seed)
            llm = load_model("tiny", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
            with torch.no_grad():
                for name, param in llm.model.named_parameters():
                    if "lora_B" in name:
                        param.normal_(0, 0.5)
            folder = root / paths.llm_rl_train(variant, seed).model.relative_to(paths.ROOT)
            write_policy(llm, folder, base_model="tiny")


@pytest.fixture
def eval_repo(tmp_path):
    p = repo_params()
    p["llm_rl"]["train"]["seeds"] = [0, 1]
    p["llm_rl"]["train"]["common"].update(model="tiny", few_shot=1, answer_tokens=6, line_tokens=6)
    p["llm_rl"]["eval"].update(n_problems=4, batch_size=4)
    root = stage_repo(tmp_path, p)
    _math_data(root)
    return root


def test_eval_stage_scores_every_seed_of_every_variant_against_the_base_model(eval_repo):
    _trained_models(eval_repo, [0, 1])
    run = run_stage(eval_repo, "llm_rl_eval.py")
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = eval_repo / "metrics" / "llm_rl"
    # the metrics files hold the headline; the whole entry (per-seed values, the verdict) is the plain out beside
    # the responses
    base = read_json(metrics / "responses" / "base.json")
    for mode in ("greedy", "sampled"):
        assert (base[mode]["seeds"], base[mode]["episodes"], len(base[mode]["per_seed"])) == (1, 4, 1)
        assert "vs_base" not in base[mode]
        assert read_json(metrics / "eval" / "base.json")[mode]["success"] == base[mode]["success"]
        for variant in ("reinforce_kl", "grpo"):
            entry = read_json(metrics / "responses" / f"{variant}.json")[mode]
            assert (entry["seeds"], entry["episodes"], len(entry["per_seed"])) == (2, 8, 2)
            assert entry["by_arithmetic"] == {"unseen": {"problems": 4, "accuracy": entry["success"]}}
            gain = entry["gain_over_base"]
            assert gain["runs"] == [2, 1] and gain["items"] == 4 and entry["vs_base"].startswith(gain["verdict"])
            assert gain["difference"] == pytest.approx(entry["success"] - base[mode]["success"], abs=1e-4)
            headline = read_json(metrics / "eval" / f"{variant}.json")[mode]
            assert (headline["gain"], headline["gain_lo"], headline["gain_hi"]) == (
                gain["difference"], gain["ci_low"], gain["ci_high"])
            for seed in (0, 1):  # every seed's answers, on the same problems as the base model's
                answers = [json.loads(line) for line in
                           (metrics / "responses" / f"{variant}_seed-{seed}_{mode}.jsonl").read_text().splitlines()]
                assert [a["id"] for a in answers] == [f"test{i}" for i in range(50, 54)]
    # the two seeds' models are different models: their sampled answers differ somewhere
    sampled = [(metrics / "responses" / f"reinforce_kl_seed-{s}_sampled.jsonl").read_text() for s in (0, 1)]
    assert sampled[0] != sampled[1]


def test_eval_stage_names_a_missing_seed_model_before_writing(eval_repo):
    _trained_models(eval_repo, [0])
    run = run_stage(eval_repo, "llm_rl_eval.py")
    assert run.returncode != 0
    assert "llm_rl.eval.models: 'reinforce_kl' seed 1 has no trained policy at" in run.stderr
    assert not (eval_repo / "metrics" / "llm_rl" / "eval").exists()


def test_a_training_summary_counts_samples_steps_and_rewards_of_either_variant():
    from llmrl.eval.llm_rl import training_summary

    reinforce = [{"iteration": 0, "average_reward": 0.25, "optimizer_steps": 2},
                 {"iteration": 1, "average_reward": 0.5, "optimizer_steps": 2}]
    grpo = [{"step": 0, "average_reward": 0.1, "optimizer_steps": 1}, {"step": 1, "optimizer_steps": 1},
            {"step": 2, "average_reward": 0.3, "optimizer_steps": 1}]
    samples = [{"tokens": 10}, {"tokens": 12}, {"tokens": None}]
    s = training_summary(reinforce, samples, answer_tokens=96, dtype="float32", seconds=12.34)
    assert s == {"samples": 3, "optimizer_steps": 4, "answer_tokens": 96, "tokens": 11.0, "reward_first": 0.25,
                 "reward_last": 0.5, "dtype": "float32", "seconds": 12.3}
    s = training_summary(grpo, [], answer_tokens=96, dtype="bfloat16", seconds=1.0)
    assert (s["optimizer_steps"], s["reward_first"], s["reward_last"], s["tokens"]) == (3, 0.1, 0.3, None)
    with pytest.raises(ValueError, match="average_reward"):
        training_summary([{"step": 0, "optimizer_steps": 1}], [], answer_tokens=96, dtype="float32", seconds=1.0)
