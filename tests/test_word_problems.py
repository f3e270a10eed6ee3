"""Math data, answer checking, the safe calculator and the stepwise environment (LLM_RL)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from llmrl.config import ParamsError, load_section
from llmrl.config.llm_rl import MathDataParams, ReinforceTrainParams
from llmrl.envs.word_problems.datasets import (
    MathDataError,
    check_disjoint,
    gsm_symbolic_splits,
    normalize,
    normalize_gsm8k,
    normalize_math,
    problem_splits,
    read_jsonl,
    read_records,
    write_jsonl,
)
from llmrl.envs.word_problems.answers import answers_match, extract_answer, is_correct
from llmrl.envs.word_problems.calculator import CalculatorError, apply_calculator, safe_eval
from llmrl.envs.word_problems.env import MathEnv
from llmrl.envs.word_problems.generator import generate_problems, generated_splits, operations, seen_arithmetic

# (predicted text, gold answer, should match)
ANSWER_TABLE = [
    ("72", "72", True),
    ("1,000", "1000", True),
    ("$1,234.50", "1234.5", True),
    ("18 dollars.", "18", True),
    ("3 bolts", "3", True),
    ("5.", "5", True),
    ("5.0", "5", True),
    ("05", "5", True),
    ("-7", "-7", True),
    ("−7", "-7", True),
    ("3/4", "0.75", True),
    ("\\frac{3}{4}", "3/4", True),
    ("\\dfrac{1}{2}", "0.5", True),
    ("\\frac12", "1/2", True),
    ("1 1/2", "1.5", True),
    ("50%", "50", True),
    ("\\boxed{42}", "42", True),
    ("$\\boxed{\\frac{7}{2}}$", "3.5", True),
    ("x = 5", "5", True),
    ("10^\\circ", "10", True),
    ("5\\text{ cm}", "5", True),
    ("\\boxed{(1, 2)}", "(1,2)", True),
    ("\\left( 3, 4 \\right)", "(3,4)", True),
    ("#### 72", "72", True),
    ("0.3333333", "1/3", True),
    ("7", "8", False),
    ("-5", "5", False),
    ("2x", "2", False),
    ("5 + 3", "8", False),
    ("(1,2)", "(2,1)", False),
    ("1/0", "0", False),
    ("", "0", False),
    (None, "3", False),
    ("12", "1,2", False),
]


@pytest.mark.parametrize("predicted,gold,expected", ANSWER_TABLE)
def test_answer_table(predicted, gold, expected):
    assert answers_match(predicted, gold) is expected


def test_answer_table_is_large():
    assert len(ANSWER_TABLE) >= 30


@pytest.mark.parametrize("solution,answer", [
    ("Step one.\nThe answer is: 18 dollars.\n", "18 dollars."),
    ("the final answer is 4", "4"),
    ("The answer is: 3\nsome more\nThe answer is: 5", "5"),  # the last statement counts
    ("Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
    ("so $x = \\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("The answer is: \\boxed{7}", "7"),
    ("no answer here", None),
])
def test_extract_answer(solution, answer):
    assert extract_answer(solution) == answer


def test_is_correct_whole_solutions():
    assert is_correct("3 + 4 = <<3+4=7>>7\nThe answer is: 7", "7")
    assert not is_correct("3 + 4 = <<3+4=7>>7", "7")  # an answer must be stated


# ------------------------------------------------------------------------------------------------ calculator


@pytest.mark.parametrize("expr,value", [("48/2", 24), ("2+3*4", 14), ("(2+3)*4", 20), ("-3**2", -9),
                                        ("7//2", 3), ("7%3", 1), ("1,000*2", 2000), ("3 x 4", 12),
                                        ("6÷4", 1.5), ("0.1+0.2", 0.3), ("2**-2", 0.25)])
def test_calculator_arithmetic(expr, value):
    assert float(safe_eval(expr)) == pytest.approx(value)


@pytest.mark.parametrize("expr", ["__import__('os').system('true')", "open('x')", "a+1", "(1).real", "[1][0]",
                                  "1 if 1 else 2", "1<2", "'a'*3", "lambda: 1", "9**9**9",
                                  "((10**64)**64)**64", "1/0", "x" * 300, "2 and 3", "{1: 2}", ""])
def test_calculator_refuses_everything_else(expr):
    with pytest.raises(CalculatorError):
        safe_eval(expr)


def test_calculator_rewrites_annotations():
    line, calls = apply_calculator("She sold <<48/2=25>>25 clips and <<3*4>> more, <<os.system(1)=0>>")
    assert line == "She sold <<48/2=24>>24 clips and <<3*4=12>> more, <<os.system(1)=0>>"
    assert calls == 2
    assert apply_calculator("<<1+1=3>> <<1+1=3>> <<1+1=3>>", max_calls=2)[0] == "<<1+1=2>> <<1+1=2>> <<1+1=3>>"


def test_no_eval_or_exec_in_math_code():
    import ast
    import inspect

    import llmrl.agents.math_solver as ms
    import llmrl.algos.llm_rl_grpo as gm
    import llmrl.algos.reinforce_kl as rk
    import llmrl.envs.word_problems.answers as ma
    import llmrl.envs.word_problems.calculator as mc
    import llmrl.envs.word_problems.datasets as dm
    import llmrl.envs.word_problems.env as em
    import llmrl.envs.word_problems.generator as mg

    for module in (em, ma, mc, rk, gm, ms, dm, mg):
        calls = [n.func.id for n in ast.walk(ast.parse(inspect.getsource(module)))
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
        assert not {"eval", "exec", "compile"} & set(calls), module.__name__


# ---------------------------------------------------------------------------------------------- environment

PROBLEMS = [{"id": "p0", "problem": "Tom has 2 apples and gets 3 more. How many?", "answer": "5"},
            {"id": "p1", "problem": "What is 6 times 7?", "answer": "42"}]


def test_env_answer_line_ends_episode_with_reward():
    env = MathEnv(PROBLEMS, max_steps=5)
    obs, info = env.reset(options={"index": 0})
    assert obs == {"problem": PROBLEMS[0]["problem"], "solution": ""} and info["answer"] == "5"
    obs, r, term, trunc, info = env.step("2 + 3 = 5\nignored second line")
    assert (r, term, trunc) == (0.0, False, False) and obs["solution"] == "2 + 3 = 5\n"
    obs, r, term, trunc, info = env.step("The answer is: 5 apples.")
    assert (r, term, trunc) == (1.0, True, False) and info["success"] and info["end"] == "answer"
    env.reset(options={"index": 0})
    _, r, term, _, info = env.step("the answer is: 6")
    assert (r, term, info["success"]) == (0.0, True, False)


def test_env_truncates_after_max_steps_and_ends_on_empty_line():
    env = MathEnv(PROBLEMS, max_steps=2)
    env.reset(options={"index": 1})
    assert env.step("step one")[2:4] == (False, False)
    _, r, term, trunc, info = env.step("step two")
    assert (r, term, trunc, info["end"]) == (0.0, False, True, "max_steps")
    env.reset(options={"index": 1})
    _, r, term, trunc, info = env.step("\nlater text")
    assert (r, term, trunc, info["end"]) == (0.0, True, False, "end_of_turn")


def test_env_calculator_and_seeded_reset():
    env = MathEnv(PROBLEMS, calculator=True)
    env.reset(options={"index": 1})
    obs, *_ = env.step("6 * 7 = <<6*7=41>>41")
    assert obs["solution"] == "6 * 7 = <<6*7=42>>42\n"
    picks = [MathEnv(PROBLEMS * 5).reset(seed=s)[1]["id"] for s in range(10)]
    assert picks == [MathEnv(PROBLEMS * 5).reset(seed=s)[1]["id"] for s in range(10)]
    with pytest.raises(ValueError, match="problems\\[0\\] needs 'problem' and 'answer'"):
        MathEnv([{"question": "?"}])


def test_discounted_returns():
    from llmrl.algos.reinforce_kl import discounted_returns

    np.testing.assert_allclose(discounted_returns(3, 1.0, 0.99), [0.99**2, 0.99, 1.0])
    np.testing.assert_allclose(discounted_returns(2, 20.0, 1.0), [10.0, 10.0])  # clamped as the original


# ---------------------------------------------------------------------------------------------------- data


def test_generated_splits_are_disjoint_and_seeded():
    train, test = generated_splits(300, 50, seed=3)
    assert len(train) == 300 and len(test) == 50
    assert not {r["key"] for r in train} & {r["key"] for r in test}
    assert seen_arithmetic(train, test) == [0.0] * 50  # not one calculation of a test problem is made in training
    assert sum(r["key"].count("|") == 3 for r in test) == round(50 * 0.3)  # two-step share
    check_disjoint(train, test)
    assert (train, test) == generated_splits(300, 50, seed=3)
    assert generated_splits(300, 50, seed=4)[1] != test
    for r in train[:50] + test:
        assert is_correct(r["solution"], r["answer"])  # every generated solution checks out
        assert all(apply_calculator(line)[0] == line for line in r["solution"].split("\n"))


def test_operations_are_the_solutions_calculations_up_to_operand_order():
    assert operations("mul|3|4") == operations("price|4|3") == {("*", 3, 4)}  # one calculation, two templates
    assert operations("add|5|2") == {("+", 2, 5)} and operations("sub|5|2") == {("-", 5, 2)}
    assert operations("div|3|4") == {("/", 12, 3)}  # 12 shared among 3
    assert operations("mul_add|3|4|5") == {("*", 3, 4), ("+", 5, 12)}
    assert operations(("add_sub", 2, 3, 4)) == {("+", 2, 3), ("-", 5, 4)}
    with pytest.raises(ValueError, match="unknown problem family 'pow'"):
        operations("pow|2|3")
    # a split of one shuffled pool by unique key (what keys alone ensure) shares calculations: the check sees it
    pool = generate_problems(700, seed=0, two_step_fraction=0.2)
    records = [{"key": "|".join(map(str, q.key))} for q in pool]
    shared = seen_arithmetic(records[100:], records[:100])
    assert sum(x == 1.0 for x in shared) > 10


def test_gsm_symbolic_splits_hold_out_whole_templates():
    train, test = gsm_symbolic_splits(200, 40, seed=1)
    assert len(train) == 200 and len(test) == 40
    assert not {r["key"] for r in train} & {r["key"] for r in test}  # no test problem is a re-numbered train one
    check_disjoint(train, test)
    assert (train, test) == gsm_symbolic_splits(200, 40, seed=1)
    assert gsm_symbolic_splits(200, 40, seed=2)[1] != test
    for r in train[:40] + test:
        assert r["source"] == "gsm_symbolic" and "Do not include units" not in r["problem"]
        assert is_correct(r["solution"], r["answer"])  # GSM8K-style solutions ending in our answer line
    with pytest.raises(MathDataError, match="gsm_symbolic: too few distinct problems"):
        gsm_symbolic_splits(10, 5, seed=1, test_templates=0.01)  # one held-out template: ~3 of the 300 draws
    with pytest.raises(ParamsError, match="train_path/test_path need source gsm8k or math"):
        load_section({"llm_rl": {"data": {"source": "gsm_symbolic", "train_path": "x.jsonl"}}}, "llm_rl.data",
                     MathDataParams)


def test_generated_problems_start_easy():
    probs = generate_problems(200, seed=0, two_step_fraction=0.0, max_number=12)
    assert all(len(p.solution_lines) == 2 for p in probs)  # one calculation and the answer line
    assert max(p.answer for p in probs) <= 144


def test_check_disjoint_raises_on_overlap():
    a = [{"id": "1", "problem": "What is 2+2?"}]
    b = [{"id": "9", "problem": "what  is 2+2?"}]
    with pytest.raises(MathDataError, match="overlap"):
        check_disjoint(a, b)


GSM = [{"question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in all?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether 48+24 = <<48+24=72>>72.\n#### 72"},
       {"question": "A big number?", "answer": "It is 1,000 + 200.\n#### 1,200"}]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".json"])
def test_local_gsm8k_files_normalise(tmp_path, suffix):
    path = tmp_path / f"gsm{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in GSM))
    elif suffix == ".json":
        path.write_text(json.dumps(GSM))
    else:
        pd.DataFrame(GSM).to_parquet(path)
    recs = normalize(read_records(path), "gsm8k", "gsm8k-train")
    assert [r["answer"] for r in recs] == ["72", "1200"]
    assert recs[0]["id"] == "gsm8k-train-0"
    assert recs[0]["solution"].endswith("The answer is: 72") and "####" not in recs[0]["solution"]
    assert "<<48/2=24>>24" in recs[0]["solution"]
    assert all(is_correct(r["solution"], r["answer"]) for r in recs)
    write_jsonl(tmp_path / "out.jsonl", recs)
    assert read_jsonl(tmp_path / "out.jsonl") == recs


def test_math_records_and_bad_records(tmp_path):
    rec = normalize_math({"problem": "Compute $1/2+1/4$.", "solution": "It is $\\boxed{\\frac{3}{4}}$.",
                          "level": "Level 1"}, "m0")
    assert rec["answer"] == "\\frac{3}{4}" and rec["level"] == "Level 1" and is_correct(rec["solution"], "0.75")
    with pytest.raises(MathDataError, match="no \\\\boxed"):
        normalize_math({"problem": "?", "solution": "no box"}, "m1")
    with pytest.raises(MathDataError, match="missing field 'question'"):
        normalize_gsm8k({"answer": "#### 1"}, "g1")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "problem": "?"}\n')
    with pytest.raises(MathDataError, match="lacks field"):
        read_jsonl(bad)
    with pytest.raises(MathDataError, match="unknown data file type"):
        read_records(tmp_path / "x.csv") if (tmp_path / "x.csv").write_text("a") else None


def test_params_errors_name_the_key():
    with pytest.raises(ParamsError, match="llm_rl.data.n_test: must be > 0"):
        load_section({"llm_rl": {"data": {"n_test": 0}}}, "llm_rl.data", MathDataParams)
    with pytest.raises(ParamsError, match="train_path/test_path need source"):
        load_section({"llm_rl": {"data": {"train_path": "x.jsonl"}}}, "llm_rl.data", MathDataParams)
    good = {"common": {}, "reinforce_kl": {}, "grpo": {}}
    assert load_section({"r": good}, "r", ReinforceTrainParams).common.lr > 0
    with pytest.raises(ParamsError, match="llm_rl.train.common.lr: must be > 0"):
        load_section({"llm_rl": {"train": {**good, "common": {"lr": -1}}}}, "llm_rl.train", ReinforceTrainParams)
    with pytest.raises(ParamsError, match="micro_batch"):
        load_section({"r": {**good, "common": {"micro_batch": 3}}}, "r", ReinforceTrainParams)


def test_the_first_stated_answer_counts_everywhere():
    """Training (MathEnv, the GRPO reward) and evaluation score the answer a solution states first: what a policy
    writes after it (a new problem from the few-shot pattern, another answer) is not its answer."""
    from llmrl.algos.llm_rl_grpo import correctness_reward
    from llmrl.envs.word_problems.answers import extract_answer, through_first_answer

    text = "2 + 3 = 5\nThe answer is: 5\nProblem: Ann has 1 pen.\nThe answer is: 1\n"
    assert through_first_answer(text) == "2 + 3 = 5\nThe answer is: 5\n"
    assert through_first_answer("no answer here") is None
    assert through_first_answer("The answer is: 7") == "The answer is: 7"
    assert extract_answer(text) == "1"  # the last one: not what is scored
    assert correctness_reward(None, [text, text], ["5", "1"]) == [1.0, 0.0]


def test_solve_scores_the_first_answer_and_counts_only_real_cuts():
    from llmrl.agents.math_solver import solve
    from llmrl.llm.generate import SamplingConfig
    from llmrl.llm.load import load_model

    llm = load_model("tiny")
    problems = [{"id": "a", "problem": "1 + 1?", "answer": "2"}]
    rec = solve(llm, problems, [], SamplingConfig(max_new_tokens=3, temperature=0), progress=False)[0]
    # the tiny model writes no answer line in 3 tokens: a cut by the cap, scored on nothing
    assert rec["finish_reason"] == "length" and rec["parsed_answer"] is None


def test_problem_splits_from_local_gsm8k_files_shuffle_train_and_cut_both(tmp_path):
    def rows(first, n):
        return [{"question": f"Tom has {a} apples and buys {a + 1} more. How many?",
                 "answer": f"{a} + {a + 1} = <<{a}+{a + 1}={2 * a + 1}>>{2 * a + 1}\n#### {2 * a + 1}"}
                for a in range(first, first + n)]

    (tmp_path / "gsm").mkdir()
    (tmp_path / "gsm" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(1, 6)))
    (tmp_path / "gsm" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(50, 3)))
    p = MathDataParams(source="gsm8k", train_path="gsm/train.jsonl", test_path="gsm/test.jsonl", n_train=4, n_test=2,
                       seed=1)
    train, test = problem_splits(p, tmp_path)
    assert len(train) == 4 and [r["id"] for r in test] == ["gsm8k-test-0", "gsm8k-test-1"]
    assert {r["answer"] for r in train} <= {str(2 * a + 1) for a in range(1, 7)}
    assert [r["id"] for r in train] != [f"gsm8k-train-{i}" for i in range(4)]  # shuffled by the seed
    assert problem_splits(p, tmp_path) == (train, test)
    generated = problem_splits(MathDataParams(n_train=5, n_test=2), tmp_path)
    assert generated == generated_splits(5, 2, 0, 0.2, 20)
    (tmp_path / "gsm" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(1, 3)))
    with pytest.raises(MathDataError, match="overlap"):
        problem_splits(p.model_copy(update={"n_train": 6}), tmp_path)
