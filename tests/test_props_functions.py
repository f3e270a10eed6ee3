"""ProPS's optimizer training on objective functions: the function families and their disjoint splits, the episodes
and their prompts (the search's own), the four rewards on hand-made replies, the selection on validation, GRPO on
the tiny model (every LoRA weight and the reply distribution on a fixed prompt change; a run cut into parts equals
the uncut run; prefix-shared sampling equals unshared), hill climbing, and the held-out table's statistics."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrl.agents.linear_policy import PlainVector, objective_for
from llmrl.algos.blackbox import hill_climb, random_search
from llmrl.algos.grpo import (BestAdapter, build_grpo_trainer, checkpoint_path, part_end, recording, train,
                              validate_every, validation_replies)
from llmrl.algos.props_grpo_functions import (PRODUCERS, duplicate_penalty, format_reward, function_records,
                                              grpo_data, history_for, improvement_reward, make_function_rewards,
                                              mix_examples, outcome_rates, parse_penalty, reply_outcomes, score_reply,
                                              search_loop_examples)
from llmrl.algos.props_prompts import PromptSettings, search_messages
from llmrl.config import ParamsError, load_section
from llmrl.config.grpo import GRPOTrainParams
from llmrl.config.lora import LoraSettings
from llmrl.config.props import (PropsFunctionDataParams, PropsGRPOParams, PropsHeldoutParams, PropsLLMParams,
                                PropsSearchParams, PropsSpaceParams)
from llmrl.envs.functions import SPLITS, FunctionTask, TestFunction, draw_function, gap_closed, normalised_score
from llmrl.eval.props_heldout import grpo_summary, heldout_table, reply_shares, tuning_gate
from llmrl.eval.props_heldout_runs import BASELINES, baseline_runs, tune_hill_step
from llmrl.eval.paired import mean_bootstrap, paired_bootstrap
from llmrl.llm.load import load_model

SPACE = PropsSpaceParams()
DATA = PropsFunctionDataParams(train_examples=8, validation_examples=4, dims=[2, 3])
PREFIX = "params[0]:"


def _key(fn):
    return (fn.family, fn.dim, fn.centre, fn.matrix)


# ------------------------------------------------------------------------------------------------ functions


def test_splits_are_disjoint_and_a_test_function_never_reaches_training():
    drawn = {s: {_key(draw_function(s, i, d)) for i in range(300) for d in (2, 3, 4)} for s in SPLITS}
    assert all(len(v) == 900 for v in drawn.values())  # no repeats within a split either
    assert not drawn["train"] & drawn["test"] and not drawn["train"] & drawn["validation"]
    assert not drawn["validation"] & drawn["test"]
    with pytest.raises(ValueError, match="'train' or 'validation' functions only"):
        function_records("test", 2, DATA, SPACE, optimum_hint=True, total_iterations=30, answer_prefix=PREFIX)
    with pytest.raises(ValueError, match="split: must be one of"):
        draw_function("holdout", 0, 2)
    recs = function_records("train", 8, DATA, SPACE, optimum_hint=True, total_iterations=30, answer_prefix=PREFIX)
    assert {json.loads(r["function"])["split"] for r in recs} == {"train"}


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5))
def test_each_function_peaks_at_its_centre_inside_the_range_and_scores_normalise(index, dim):
    fn = draw_function("train", index, dim)
    c = np.asarray(fn.centre)
    assert np.all(np.abs(c) <= 4.5) and fn.values(c) == pytest.approx(fn.optimum)
    a = np.asarray(fn.matrix)
    assert np.allclose(a, a.T) and np.linalg.eigvalsh(a).min() > 0  # a concave bowl: one maximum
    rng = np.random.default_rng(index)
    x = c + rng.normal(size=dim)
    assert fn.values(x) < fn.optimum
    # the closed-form mean over the range is the Monte-Carlo mean, and it normalises to 0, the optimum to 1
    vals = fn.values(rng.uniform(-6, 6, size=(100_000, dim)))
    stderr = vals.std() / np.sqrt(vals.size)  # 5 standard errors: one draw in ~3.5 million falls outside
    assert fn.reference_value(-6, 6) == pytest.approx(vals.mean(), abs=5 * stderr)
    assert normalised_score(fn.optimum, fn, -6, 6) == pytest.approx(1.0)
    assert normalised_score(fn.reference_value(-6, 6), fn, -6, 6) == pytest.approx(0.0, abs=1e-9)
    assert gap_closed(fn.optimum, fn, -6, 6) == pytest.approx(6.0) and gap_closed(fn.reference_value(-6, 6), fn, -6, 6) == 0


def test_function_task_runs_in_the_search_objective_and_a_function_round_trips():
    task = FunctionTask("test", 3)
    ev = objective_for(task)
    x = np.asarray([task.function(5).centre, task.function(6).centre])
    out = ev.returns(x, np.zeros((2, 1), dtype=int), search_seeds=[5, 6])
    assert out[:, 0] == pytest.approx([100.0, 100.0]) and task.key == "functions-test-3d"
    fn = task.function(5)
    assert type(fn).from_json(fn.to_json()) == fn
    with pytest.raises(ValueError, match="expected 3 values"):
        fn.values(np.zeros(2))


# ------------------------------------------------------------------------------------------------ episodes


def test_episodes_hold_k_points_from_either_producer_in_the_searchs_own_prompt():
    fn = draw_function("train", 3, 2)
    rng = np.random.default_rng(0)
    for producer in PRODUCERS:
        hist = history_for(fn, 7, producer, rng, SPACE, (0.3, 2.0))
        assert len(hist) == 7 and all(v == pytest.approx(fn.values(np.asarray(p))) for p, v in hist)
        assert all(-6 <= x <= 6 and round(x, 1) == x for p, _ in hist for x in p)
    climb = history_for(fn, 12, "hill_climb", np.random.default_rng(1), SPACE, (0.3, 0.3))
    assert max(v for _, v in climb[6:]) >= max(v for _, v in climb[:6])  # it converges, never loses its best
    recs = function_records("train", 8, DATA, SPACE, optimum_hint=True, total_iterations=30, answer_prefix=PREFIX)
    assert {r["producer"] for r in recs} == set(PRODUCERS) and all(DATA.history_min <= r["k"] <= DATA.history_max for r in recs)
    r = recs[0]
    hist = json.loads(r["history"])
    settings_ = PromptSettings(low=-6, high=6, decimals=1, step_size=1.0, optimum=100.0, episodes=1)
    expected = search_messages("numeric", task=FunctionTask("train", r["dim"]), policy=PlainVector(r["dim"]),
                               history=hist, iteration=r["k"] + 1, total_iterations=30, settings=settings_)
    assert r["prompt"] == expected + [{"role": "assistant", "content": PREFIX}]
    again = function_records("train", 8, DATA, SPACE, optimum_hint=True, total_iterations=30, answer_prefix=PREFIX)
    assert again == recs  # seeded


# ------------------------------------------------------------------------------------------------ rewards


def test_an_empty_history_is_the_searchs_first_turn_and_pays_for_the_format_alone():
    data = DATA.model_copy(update={"history_min": 0, "history_max": 1})
    recs = function_records("train", 16, data, SPACE, optimum_hint=True, total_iterations=30, answer_prefix=PREFIX)
    first = [r for r in recs if r["k"] == 0]
    assert first and all(json.loads(r["history"]) == [] for r in first)
    assert "No point has been evaluated yet" in first[0]["prompt"][1]["content"]
    assert "iteration 1 of 30" in first[0]["prompt"][1]["content"]
    fn = draw_function("train", 0, 2)
    ok = score_reply(_line(fn.centre), fn, [], -6, 6)
    assert ok.parsed and not ok.duplicate and ok.improvement == 0.0 and ok.value == pytest.approx(fn.optimum)
    bad = score_reply(_line([9.0, 0.0]), fn, [], -6, 6)
    assert not bad.parsed and bad.error == "out_of_range"
    rewards = {f.__name__: f for f in make_function_rewards(SPACE)}
    cols = {"function": [fn.to_json()] * 2, "history": ["[]"] * 2, "answer_prefix": [None] * 2}
    completions = [_line(fn.centre), _line([9.0, 0.0])]
    assert rewards["parse_penalty"](completions, **cols) == [0.0, -1.0]
    assert rewards["improvement"](completions, **cols) == [0.0, 0.0]
    assert rewards["format"](completions, **cols) == [1.0, 1.0]


def _example(dim=2):
    fn = draw_function("train", 0, dim)
    c = np.asarray(fn.centre)
    hist = [([float(x) for x in np.round(c + 2.0, 1)], float(fn.values(np.round(c + 2.0, 1)))),
            ([float(x) for x in np.round(c - 1.0, 1)], float(fn.values(np.round(c - 1.0, 1))))]
    return fn, hist


def _line(point) -> str:
    return "; ".join(f"params[{i}]: {v:g}" for i, v in enumerate(point))


def test_improvement_pays_the_share_of_the_gap_closed_and_nothing_for_worse_repeated_or_unparsable():
    fn, hist = _example()
    best = max(v for _, v in hist)
    at_centre = score_reply(_line(fn.centre), fn, hist, -6, 6)
    assert at_centre.parsed and not at_centre.duplicate and at_centre.improvement == pytest.approx(1.0)
    half = np.asarray(fn.centre) - 0.5
    got = score_reply(_line(half), fn, hist, -6, 6)
    assert got.improvement == pytest.approx((fn.values(half) - best) / (fn.optimum - best))
    assert score_reply(_line(np.asarray(fn.centre) + 5), fn, hist, -6, 6).improvement == 0.0  # worse or out of range
    repeat = score_reply(_line(hist[1][0]), fn, hist, -6, 6)
    assert repeat.duplicate and repeat.improvement == 0.0
    junk = score_reply("I think params are good", fn, hist, -6, 6)
    assert not junk.parsed and junk.improvement == 0.0 and not junk.well_formed


def test_each_reward_under_the_answer_prefix_and_their_rates():
    fn, hist = _example()
    cols = dict(function=[fn.to_json()] * 4, history=[json.dumps(hist)] * 4, answer_prefix=[PREFIX] * 4)
    body = _line(fn.centre)[len(PREFIX):]
    completions = [body, _line(hist[1][0])[len(PREFIX):], " 9; params[1]: 0", " lots; of words"]
    kw = dict(low=-6.0, high=6.0)
    assert improvement_reward(completions, **cols, **kw) == [1.0, 0.0, 0.0, 0.0]
    assert duplicate_penalty(completions, **cols, **kw) == [0.0, -1.0, 0.0, 0.0]
    assert parse_penalty(completions, **cols, **kw) == [0.0, 0.0, -1.0, -1.0]  # out of range, junk
    assert format_reward(completions, **cols, **kw) == [1.0, 1.0, 1.0, 0.0]
    funcs = make_function_rewards(SPACE)
    assert [f.__name__ for f in funcs] == ["improvement", "parse_penalty", "duplicate_penalty", "format"]
    assert funcs[0](completions=completions, **cols) == [1.0, 0.0, 0.0, 0.0]
    rates = outcome_rates([score_reply(PREFIX + c, fn, hist, -6, 6) for c in completions])
    assert rates == {"replies": 4, "reward_mean": 0.25, "improvement_mean": 0.25, "improve_rate": 0.25,
                     "duplicate_rate": 0.25, "parse_failure_rate": 0.5}


def test_config_errors_name_the_field():
    with pytest.raises(ParamsError, match="history_min"):
        load_section({"f": {"history_min": 9, "history_max": 3}}, "f", PropsFunctionDataParams)
    with pytest.raises(ParamsError, match="cem"):
        load_section({"h": {"iterations": 7}}, "h", PropsHeldoutParams)


# ------------------------------------------------------------------------------------------------ GRPO


def _length(completions, **_):
    """Varies within a group even for the random tiny model, so advantages are non-zero."""
    return [len(c) / 10 for c in completions]


def _records():
    return function_records("train", 8, DATA, SPACE, optimum_hint=True, total_iterations=30, answer_prefix=PREFIX)


def _cfg(**kw):
    return GRPOTrainParams(learning_rate=5e-2, max_steps=4, max_completion_length=8,
                           lora=LoraSettings(r=4, alpha=8, dropout=0.1), **kw)


def _run(cfg, parts, tmp_path, record, validated=None):
    checkpoint = None
    for i, stop in enumerate(parts):
        llm = load_model("tiny")
        run = build_grpo_trainer(llm, Dataset.from_list(_records()),
                                 recording([*make_function_rewards(SPACE), _length], record, keys=("id",)), cfg,
                                 tmp_path / f"part{i}")
        if validated is not None:  # as props_grpo_part validates: generation inside the trainer, mid-run
            policy = dataclasses.replace(llm, model=run.trainer.model)
            validate_every(run, 2, cfg.max_steps, lambda step: validated.append(
                (step, [r["completion"] for r in validation_replies(
                    policy, _records()[:2], make_function_rewards(SPACE), samples=1, max_new_tokens=6,
                    temperature=0.7, top_p=1.0, stop_at_newline=True, seed=5)])))
        rows = list(train(run, resume_from=checkpoint, stop_after=stop))
        if stop is not None:
            checkpoint = checkpoint_path(run)
    return run, rows


def test_grpo_changes_every_lora_weight_and_the_reply_distribution_on_a_fixed_prompt(tmp_path):
    llm = load_model("tiny")
    prompt = _records()[0]["prompt"]
    ids = llm.tokenizer(llm.render(prompt), return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        before_dist = torch.softmax(llm.model(ids).logits[0, -1].float(), -1)
    run = build_grpo_trainer(llm, Dataset.from_list(_records()), [*make_function_rewards(SPACE), _length],
                             _cfg(stop_at_newline=True), tmp_path / "trl")
    model = run.trainer.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = list(train(run))
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert {"reward_improvement", "reward_parse_penalty", "reward_duplicate_penalty", "reward_format"} <= rows[0].keys()
    for n, p in model.named_parameters():
        assert (not torch.equal(before[n], p.detach())) == p.requires_grad, n
    model.eval()
    with torch.no_grad():
        after_dist = torch.softmax(model(ids).logits[0, -1].float(), -1)
    assert (after_dist - before_dist).abs().sum() > 1e-3  # the next-token distribution after the prefix moved


def test_a_run_cut_into_parts_equals_the_uncut_run(tmp_path):
    whole: list[dict] = []
    parts: list[dict] = []
    val_whole: list = []
    val_parts: list = []
    cfg = _cfg(stop_at_newline=True)
    run_a, _ = _run(cfg, [None], tmp_path / "a", whole, val_whole)
    run_b, rows = _run(cfg, [1, 3, None], tmp_path / "b", parts, val_parts)
    assert [r["step"] for r in rows] == [4]
    assert [c["completion"] for c in whole] == [c["completion"] for c in parts]
    assert [s for s, _ in val_whole] == [0, 2, 4] and val_whole == val_parts  # validated at the same weights
    a = dict(run_a.trainer.model.named_parameters())
    for n, p in run_b.trainer.model.named_parameters():
        assert torch.equal(p, a[n]), n
    assert [part_end(k, 4, 10) for k in (1, 2, 3, 4)] == [3, 5, 8, 10]
    with pytest.raises(ValueError, match="part_end"):
        part_end(5, 4, 10)
    run = build_grpo_trainer(load_model("tiny"), Dataset.from_list(_records()), make_function_rewards(SPACE),
                             _cfg(num_iterations=2), tmp_path / "c")
    with pytest.raises(ValueError, match="one generation round per optimiser step"):
        list(train(run, stop_after=1))


def test_prefix_shared_sampling_draws_the_same_completions(tmp_path):
    shared: list[dict] = []
    plain: list[dict] = []
    cfg = _cfg().model_copy(update={"max_steps": 1})
    _run(cfg, [None], tmp_path / "s", shared)
    _run(cfg.model_copy(update={"share_prompt_prefix": False}), [None], tmp_path / "p", plain)
    assert [c["completion"] for c in shared] == [c["completion"] for c in plain]


def test_selection_keeps_the_best_validated_adapter_and_survives_a_part(tmp_path):
    run = build_grpo_trainer(load_model("tiny"), Dataset.from_list(_records()), make_function_rewards(SPACE),
                             _cfg(), tmp_path / "trl")
    model = run.trainer.model
    sel = BestAdapter()
    assert sel.consider(0, 0.1, model) and not sel.consider(5, 0.1, model)  # a tie keeps the earliest
    kept = {k: v.clone() for k, v in sel.state.items()}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(1.0)
    assert not sel.consider(10, -0.5, model)
    sel.save(tmp_path)
    back = BestAdapter.load(tmp_path)
    assert back.best_step == 0 and [h["step"] for h in back.history] == [0, 5, 10]
    back.restore(model)
    from peft import get_peft_model_state_dict

    now = get_peft_model_state_dict(model)
    assert all(torch.equal(now[k], kept[k]) for k in kept)
    with pytest.raises(ValueError, match="not finite"):
        sel.consider(11, float("nan"), model)


def test_validation_replies_are_scored_like_training_and_repeat_for_the_same_weights():
    llm = load_model("tiny")
    recs = _records()[:3]
    kw = dict(samples=2, max_new_tokens=6, temperature=0.7, top_p=1.0, stop_at_newline=True, seed=3)
    a = validation_replies(llm, recs, make_function_rewards(SPACE), **kw)
    assert len(a) == 6 and a == validation_replies(llm, recs, make_function_rewards(SPACE), **kw)
    r = a[0]
    assert r["reward"] == pytest.approx(sum(r[f"reward_{k}"] for k in ("improvement", "parse_penalty",
                                                                          "duplicate_penalty", "format")))


# ------------------------------------------------------------------------------------------------ baselines, stats


def test_hill_climbing_steps_from_its_best_point_and_random_search_does_not():
    task = FunctionTask("validation", 2)
    search = PropsSearchParams(tasks=["quadratic"], seeds=list(range(8)), iterations=30, episodes_per_eval=1)
    out = []
    rows = list(hill_climb(task, search.seeds, search, SPACE, 0.3, states_out=out))
    assert len(rows) == 30 * 8 and rows[-1]["episodes"] == 30
    for s in out:  # 29 steps of sigma 0.3 from the first point: the search stays near where it climbed
        mine = [r for r in rows if r["seed"] == s.seed]
        assert all(b["best_return"] >= a["best_return"] for a, b in zip(mine, mine[1:]))
    got = {}
    for name, gen in (("small", lambda o: hill_climb(task, search.seeds, search, SPACE, 0.1, states_out=o)),
                      ("random", lambda o: random_search(task, search.seeds, search, SPACE, states_out=o))):
        found = []
        list(gen(found))
        got[name] = np.mean([gap_closed(s.best_return, task.function(s.seed), -6, 6) for s in found])
    assert got["random"] > got["small"]  # a tiny step cannot leave its random start: why the step is tuned
    again = []
    list(hill_climb(task, [0], search, SPACE, 0.3, states_out=again, rep=1))
    assert not np.array_equal(again[0].best_params, out[0].best_params)  # another repetition, another stream
    with pytest.raises(ValueError, match="step: must be > 0"):
        list(hill_climb(task, [0], search, SPACE, 0.0))


def test_heldout_baselines_search_every_test_function_at_the_hill_step_validation_picked():
    g = PropsGRPOParams()
    h = PropsHeldoutParams(dims=[2, 3], functions_per_dim=3, validation_functions_per_dim=2, iterations=10, reps=2,
                           hill_steps=[0.01, 1.0], cem={"population": 5, "episodes_per_candidate": 1})
    search = PropsSearchParams(tasks=["quadratic"])
    step, tuning = tune_hill_step(g, h, search, SPACE)
    assert set(tuning) == {"0.01", "1.0"} and step == 1.0 and tuning["1.0"] > tuning["0.01"]  # a step that can move
    runs = baseline_runs(step, g, h, search, SPACE)
    keys = {(r["method"], r["dim"], r["function"], r["rep"]) for r in runs}
    assert keys == {(m, d, f, rep) for m in BASELINES for d in (2, 3) for f in range(3) for rep in range(2)}
    assert all(r["rows"][-1]["episodes"] == 10 and np.isfinite(r["score"]) for r in runs)
    test_centres = {FunctionTask("test", 2).function(f).centre for f in range(3)}
    assert not test_centres & {FunctionTask("validation", 2).function(f).centre for f in range(2)}


def test_the_searchs_own_examples_are_its_exchanges_scored_as_it_parses():
    from llmrl.algos.props_search import build_optimizer_llm

    g = PropsGRPOParams(functions={"dims": [2]})
    h = PropsHeldoutParams(dims=[2], iterations=3, prompt_token_budget=640)
    search = PropsSearchParams(tasks=["quadratic"], max_reasks=1)
    lp = PropsLLMParams(spec="tiny", answer_prefix=PREFIX, faults={"max_retries": 0})
    optimizer = build_optimizer_llm(lp, cache_dir=None, llm=load_model("tiny"))
    got = search_loop_examples(optimizer, "train", [0, 1], g, search, h, SPACE, lp)
    # the tiny model's replies are junk: every turn is asked twice, then falls back
    assert len(got) == 2 * 3 * 2 and {ex["attempt"] for ex in got} == {0, 1}
    assert {(ex["k"], ex["attempt"]) for ex in got} == {(k, a) for k in range(3) for a in (0, 1)}
    for ex in got:
        assert ex["split"] == "train" and ex["producer"] == "search"
        assert ex["prompt"][-1] == {"role": "assistant", "content": PREFIX}
        assert ("No point has been evaluated yet" in ex["prompt"][1]["content"]) == (ex["k"] == 0)
        reask = [m["role"] for m in ex["prompt"][:-1]]
        assert reask == (["system", "user"] if ex["attempt"] == 0 else ["system", "user", "assistant", "user"])
        history, current = json.loads(ex["history"]), json.loads(ex["current"])
        assert len(history) == ex["k"] and current == (history[-1][0] if history else None)
    late = next(ex for ex in got if ex["k"] == 2)
    fn = TestFunction.from_json(late["function"])
    history, current = json.loads(late["history"]), json.loads(late["current"])
    copy = score_reply(_line(current), fn, history, -6, 6, current)
    assert not copy.parsed and copy.error == "same_as_current"  # as the search rejects it, not as a repeat
    assert score_reply(_line(current), fn, history, -6, 6).duplicate  # the made-up examples' rule
    assert reply_outcomes([{"id": late["id"], "completion": _line(current)[len(PREFIX):]}],
                          [late], -6, 6)[0].error == "same_as_current"
    with pytest.raises(ValueError, match="split"):
        search_loop_examples(optimizer, "test", [0], g, search, h, SPACE, lp)

    made = function_records("train", 6, DATA, SPACE, optimum_hint=True, total_iterations=3, answer_prefix=PREFIX)
    mixed = mix_examples(made, got, 0.5, 6, np.random.default_rng(0))
    assert [ex["id"] for ex in mixed] == list(range(6)) and [ex["producer"] for ex in mixed[3:]] == ["search"] * 3
    assert mixed[:3] == [dict(ex, id=i) for i, ex in enumerate(made[:3])]
    assert len({json.dumps(ex, sort_keys=True) for ex in mix_examples(made, got[:2], 0.5, 6, np.random.default_rng(0))
                if ex["producer"] == "search"}) == 2  # at most every searched example, never one twice
    Dataset.from_list(mixed)  # one table: made-up and searched examples share their columns

    # every training seed validates on the same examples, however many train exchanges its searches produced
    gp = PropsGRPOParams(functions={"dims": [2], "train_examples": 6, "validation_examples": 4, "history_max": 2})
    one, other = (grpo_data(gp, SPACE, None, {"train": train, "validation": got}) for train in (got, got[:3]))
    assert one.validation == other.validation and one.train != other.train
    assert one.describe["validation_digest"] == other.describe["validation_digest"]


def test_with_searches_part_one_searches_and_the_training_parts_read_its_examples(tmp_path):
    from .faults_support import repo_params, run_stage, stage_repo

    params = repo_params()
    g = params["props"]["grpo"]
    g.update(model="tiny", total_iterations=3)
    g["functions"].update(dims=[2], train_examples=8, validation_examples=4, history_max=2, loop_functions=1,
                          loop_validation_functions=1, loop_share=0.5)
    g["trainer"].update(num_generations=2, per_device_train_batch_size=2, max_steps=4, max_completion_length=6)
    params["props"]["heldout"].update(dims=[2], iterations=3)
    root = stage_repo(tmp_path, params)
    for part in (1, 2):
        run = run_stage(root, "props_grpo_part.py", str(part), "3", "0")
        assert run.returncode == 0, run.stderr[-3000:]
    first, second = (root / "models/props/grpo_parts" / str(n) / "0" for n in (1, 2))
    assert sorted(x.name for x in first.iterdir()) == ["part.json", "search_examples.json"]  # searched, trained nothing
    assert json.loads((first / "part.json").read_text())["last_step"] == 0
    searched = json.loads((first / "search_examples.json").read_text())
    assert {ex["split"] for ex in searched["train"]} == {"train"} and searched["validation"]
    assert {ex["split"] for ex in searched["validation"]} == {"validation"}
    part = json.loads((second / "part.json").read_text())
    assert part["last_step"] == 2 and part["search_examples"]["train"]["used"] == 4  # parts 2-3 share the 4 steps
    assert (second / "search_examples.json").read_text() == (first / "search_examples.json").read_text()
    assert json.loads((second / "selection.json").read_text())["history"][0]["step"] == 0  # the base validated


def test_paired_bootstrap_finds_a_shift_and_no_shift():
    rng = np.random.default_rng(0)
    items = rng.normal(size=(1, 24)) * 3  # item difficulty, shared by both methods
    up = paired_bootstrap(items + 0.3 + rng.normal(0, 0.1, size=(3, 24)), items)
    assert up["verdict"] == "higher" and up["ci_low"] > 0 and up["runs"] == [3, 1] and up["items"] == 24
    same = paired_bootstrap(items + rng.normal(0, 0.1, size=(3, 24)), items)
    assert same["verdict"] == "no difference" and same["ci_low"] < 0 < same["ci_high"]
    # pairing matters: unpaired, the item spread would swamp a 0.3 shift; paired it does not
    assert up["ci_high"] - up["ci_low"] < 0.3
    with pytest.raises(ValueError, match="same >= 2 items"):
        paired_bootstrap(np.zeros((2, 3)), np.zeros((2, 4)))


def test_a_seed_is_one_draw_for_every_item():
    """Three seeds whose effects are -0.7, +0.3 and +1.3 on every item: their mean gain of 0.3 rests on three
    draws, not on 3 x 24 answers. Drawing seeds apart per item would average their spread away and call it an
    effect."""
    rng = np.random.default_rng(1)
    items = rng.normal(size=(1, 24)) * 3
    seeds = items + np.array([[-0.7], [0.3], [1.3]]) + rng.normal(0, 0.05, size=(3, 24))
    gain = paired_bootstrap(seeds, items)
    assert gain["difference"] == pytest.approx(0.3, abs=0.05) and gain["verdict"] == "no difference"
    assert gain["ci_low"] < -0.3 and gain["ci_high"] > 0.9  # the extremes: every draw the worst or the best seed
    one = mean_bootstrap(seeds)
    assert one["ci_low"] < items.mean() - 0.3 and one["ci_high"] > items.mean() + 0.9 and one["runs"] == 3
    # one run: an interval over items alone, narrower than the three seeds' (their spread is gone)
    single = mean_bootstrap(seeds[1:2])
    assert single["runs"] == 1 and single["ci_high"] - single["ci_low"] < one["ci_high"] - one["ci_low"]
    with pytest.raises(ValueError, match="must be finite"):
        mean_bootstrap(np.array([[0.0, np.nan]]))


def _summary(seed, base, last, selected, step, **train):
    out = {"seed": seed, "validation_score_base": base, "validation_score_last": last,
           "validation_score_selected": selected, "selected_step": step}
    if train:
        out["train_replies_first"] = {k: v[0] for k, v in train.items()}
        out["train_replies_last"] = {k: v[1] for k, v in train.items()}
    return out


def test_the_tuning_gate_needs_every_seed_above_its_base_without_the_selections_bias():
    rates = {"improve_rate": (0.1, 0.2), "duplicate_rate": (0.3, 0.05), "parse_failure_rate": (0.2, 0.1)}
    good = tuning_gate([_summary(0, 0.1, 0.3, 0.35, 150, **rates), _summary(1, 0.1, 0.2, 0.2, 200, **rates)])
    assert good["passed"] and good["last_above_base"] == 2 and good["validation_gain_last_mean"] == pytest.approx(0.15)
    assert good["per_seed"][0]["train_duplicate_rate_first_last"] == [0.3, 0.05]
    # the best of several validations beat the base, the last did not: the selection's maximum alone is no evidence
    lucky = tuning_gate([_summary(0, 0.1, 0.3, 0.35, 150), _summary(1, 0.1, 0.05, 0.12, 50)])
    assert not lucky["passed"] and lucky["selected_after_step_0"] == 2 and lucky["last_above_base"] == 1
    assert not tuning_gate([_summary(0, 0.1, 0.3, 0.1, 0)])["passed"]  # selection kept the base weights
    with pytest.raises(ValueError, match="seed 3 has no validation at step 0"):
        tuning_gate([_summary(3, None, 0.3, 0.3, 50)])
    with pytest.raises(ValueError, match="no training seeds"):
        tuning_gate([])
    apart = [dict(_summary(0, 0.1, 0.3, 0.35, 150), validation_digest="a"),
             dict(_summary(1, 0.1, 0.2, 0.2, 200), validation_digest="b")]
    with pytest.raises(ValueError, match="validated on different examples"):
        tuning_gate(apart)


def _replies(step, scores):
    return [{"id": i, "sample": 0, "step": step, "reward_improvement": v} for i, v in enumerate(scores)]


def test_grpo_summary_pairs_the_last_validation_with_the_base_by_episode():
    rates = {"improve_rate": 0.1, "duplicate_rate": 0.2, "parse_failure_rate": 0.1}
    history = [{"step": 0, "score": 0.1, **rates}, {"step": 50, "score": 0.4, **rates}]
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 0.2, 32)
    better = grpo_summary([], [], history, functions=True, replies=_replies(0, base) + _replies(50, base + 0.3))
    assert better["validation_gain_last"]["verdict"] == "higher"
    assert better["validation_gain_last"]["difference"] == pytest.approx(0.3, abs=1e-3)
    assert better["validation_items"]["ids"] == list(range(32)) and better["validation_items"]["last_step"] == 50
    shuffled = grpo_summary([], [], history, functions=True, replies=_replies(0, base) + _replies(50, base[::-1]))
    assert shuffled["validation_gain_last"]["verdict"] == "no difference"
    assert "validation_gain_last" not in grpo_summary([], [], history, functions=True)  # no replies recorded
    with pytest.raises(ValueError, match="different episodes"):
        grpo_summary([], [], history, functions=True, replies=_replies(0, base) + _replies(50, base[:30]))


def test_the_tuning_gate_pools_the_seeds_gains_by_episode():
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 0.2, 32)

    def seed(k, last):
        items = {"ids": list(range(32)), "base": list(base), "last": list(last)}
        return {**_summary(k, float(base.mean()), float(np.mean(last)), float(np.mean(last)), 50),
                "validation_items": items}

    # every seed's last step above its base on average, by a reply's worth: the old rule passes, the pooled
    # interval over the episodes holds 0
    swing = np.tile([0.2, -0.19], 16)
    weak = tuning_gate([seed(k, base + np.roll(swing, k)) for k in range(3)])
    assert weak["last_above_base"] == 3 and weak["selected_after_step_0"] == 3
    assert weak["validation_gain_last"]["verdict"] == "no difference" and not weak["passed"]
    strong = tuning_gate([seed(k, base + 0.2 + rng.normal(0, 0.02, 32)) for k in range(3)])
    assert strong["passed"] and strong["validation_gain_last"]["verdict"] == "higher"
    other = seed(1, base + 0.2)
    other["validation_items"] = {**other["validation_items"], "ids": list(range(1, 33))}
    with pytest.raises(ValueError, match="validation episodes differ"):
        tuning_gate([seed(0, base + 0.2), other])


def _run_row(method, rep, function, score, llm=False):
    rows = [{"proposal": "llm", "return_mean": float(i), "duplicates": 1, "parse_failures": 2, "llm_calls": 4,
             "fallbacks": 0, "episodes": i + 1} for i in range(3)] if llm else [{"return_mean": 0.0, "episodes": 3}]
    return {"method": method, "rep": rep, "dim": 2, "function": function, "score": score, "rows": rows}


def test_heldout_table_compares_paired_by_function_and_rates_replies():
    runs = [_run_row("props_tuned", r, f, 0.5 + 0.1 * f + 0.2, llm=True) for r in range(3) for f in range(6)]
    runs += [_run_row("props_base", 0, f, 0.5 + 0.1 * f, llm=True) for f in range(6)]
    runs += [_run_row("random_search", r, f, 0.4 + 0.1 * f) for r in range(2) for f in range(6)]
    t = heldout_table(runs, [("props_tuned", "props_base"), ("props_tuned", "random_search")], reps=500)
    c = t["comparisons"]["props_tuned_over_props_base"]
    assert c["paired_difference"]["difference"] == pytest.approx(0.2) and c["paired_difference"]["verdict"] == "higher"
    assert c["probability_of_improvement"]["value"] > 0.5 and t["items"] == 6 and t["evaluations"] == 3
    base = t["methods"]["props_base"]["iqm"]  # one run per function: the interval comes from drawing functions
    assert base["runs"] == 1 and base["ci_high"] - base["ci_low"] > 0.1
    assert t["methods"]["props_tuned"]["replies"] == {"improve_share": 1.0, "repeat_share": 0.3333,
                                                      "parse_failure_share": 0.5, "fallback_share": 0.0,
                                                      "opening_fallback_share": 0.0}
    assert reply_shares(runs[0]["rows"])["proposals"] == 3
    opened_by_a_draw = [dict(r, proposal="fallback" if i == 0 else "llm", fallbacks=1)
                        for i, r in enumerate(runs[0]["rows"])]
    got = reply_shares(opened_by_a_draw)
    assert got["opening_fallback_share"] == 0.5 and got["fallback_share"] == 0.3333 and got["proposals"] == 2
    with pytest.raises(ValueError, match="lacks runs"):
        heldout_table(runs[:-1], [])


def test_reply_outcomes_read_the_examples_answer_prefix():
    from llmrl.algos.props_grpo_functions import reply_outcomes

    recs = _records()[:1]
    fn = type(draw_function("train", 0, 2)).from_json(recs[0]["function"])
    body = _line(fn.centre)[len(PREFIX):]
    got = reply_outcomes([{"id": recs[0]["id"], "completion": body}], recs, -6, 6)
    assert got[0].parsed and got[0].improvement == pytest.approx(1.0)
