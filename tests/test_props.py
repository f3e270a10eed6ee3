"""ProPS: the strict parser and the re-ask path, prompts rendered from the policy, the linear policy's maths,
token trimming and the reply cap, reply-cache replay, LLM faults taking the fallback (real HTTP server + real openai
client), the counters of where proposals came from, and the black-box baselines improving on CartPole."""

import re

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from llmrl.agents.linear_policy import LinearPolicy, QTablePolicy, evaluate_params, policy_for
from llmrl.algos.blackbox import cem, random_search
from llmrl.algos.props_prompts import (
    PLACEHOLDER,
    PromptSettings,
    chat_token_counter,
    format_example,
    history_line,
    parse_reply,
    render_correction,
    render_search_prompt,
    reply_token_cap,
    search_messages,
    trim_history,
)
from llmrl.algos.props_search import OptimizerLLM, build_optimizer_llm, props_search
from llmrl.config.props import CEMParams, PropsLLMParams, PropsSearchParams, PropsSpaceParams
from llmrl.envs.control import TASKS, get_task
from llmrl.llm.backends import CacheMissError, OpenAIChatBackend
from tests.test_remote import _Server

SPACE = PropsSpaceParams()

# ------------------------------------------------------------------------------------------------ parser


@pytest.mark.parametrize("text", [
    "params[0]: 1.5; params[1]: -2; params[2]: 0.25",
    "Here is my proposal:\nparams[0]: 1.5, params[1]: -2, params[2]: 0.25\nI moved along the gradient.",
    "<think>f rose when\nparams[0] grew</think>\n<policy>params[0]: 1.5; params[1]: -2; params[2]: 0.25</policy>",
    "params[0]: 1.5; params[1]: -2; params[2]: 0.25; f(params): 40",
    "params[2] = 0.25; params[0] = 1.5; params[1] = -2.",
    # cut by the token cap inside the trailing echo: the parameters before it are complete
    "params[0]: 1.5; params[1]: -2; params[2]: 0.25; f(par",
    "params[0]: 1.5; params[1]: -2; params[2]: 0.25; f(params): -12.",
    "params[0]: 1.5; params[1]: -2; params[2]: 0.25; f",
])
def test_parser_accepts_good_replies(text):
    r = parse_reply(text, 3, -6, 6, current=[0, 0, 0])
    assert r.ok, r.detail
    np.testing.assert_array_equal(r.params, [1.5, -2.0, 0.25])


@pytest.mark.parametrize("text,error,word", [
    ("params[0]: 1; params[1]: 2; params[2]: 3; params[3]: 4", "too_many", "exactly 3"),
    ("params[0]: 1; params[1]: 2", "too_few", "missing params[2]"),
    ("params[0]: 1; params[1]: nan; params[2]: 3", "non_finite", "params[1]"),
    ("params[0]: 1; params[1]: inf; params[2]: 3", "non_finite", "params[1]"),
    ("params[0]: 1; params[1]: 6.5; params[2]: 3", "out_of_range", "params[1] = 6.5 is outside [-6, 6]"),
    ("params[0]: 1; params[1]: 2; params[1]: 3", "repeated_index", "params[1]"),
    ("params[0]: 0.5; params[1]: -1; params[2]: 2", "same_as_current", "current point"),
    ("params[0]: <value>; params[1]: <value>; params[2]: <value>", "example_copy", "placeholder"),
    ("params[0]: 1.5; params[1]: <value>; params[2]: 3", "example_copy", "placeholder"),
    ("params[0]: 1; params[1]: 2; f(par", "too_few", "missing params[2]"),  # the echo cut, a parameter missing
    ("I think the answer is 42.", "no_answer", "params[0]"),
    ("params[0]: one; params[1]: 2; params[2]: 3", "junk", "params[0]: one"),
    ("", "no_answer", ""),
])
def test_parser_rejects_bad_replies(text, error, word):
    r = parse_reply(text, 3, -6, 6, current=[0.5, -1, 2])
    assert not r.ok and r.params is None
    assert r.error == error
    assert word in r.detail
    assert word in render_correction(r.detail, n_params=3, low=-6, high=6, current=[0.5, -1, 2]) or not word


def test_parser_never_raises_on_odd_text():
    rng = np.random.default_rng(0)
    alphabet = list("params[]:;,.-+0123456789eEnaif() \n<>/thk")
    for _ in range(300):
        text = "".join(rng.choice(alphabet, size=rng.integers(0, 80)))
        r = parse_reply(text, 3, -6, 6)
        assert r.ok == (r.error is None)


# -------------------------------------------------------------------------------------- prompts and policy


@pytest.mark.parametrize("key", sorted(TASKS))
@pytest.mark.parametrize("template", ["numeric", "semantic"])
def test_rendered_count_and_layout_equal_the_policys(key, template):
    task, policy = get_task(key), policy_for(key)
    n = policy.n_params
    settings = PromptSettings(-6, 6, 1, task.step_size, task.optimum, 20)
    hist = [(np.arange(n) * 0.1, 12.5)]
    prompt = render_search_prompt(template, task=task, policy=policy, history=hist, iteration=2,
                                  total_iterations=9, settings=settings)
    counts = {int(x) for x in re.findall(r"exactly (\d+) values", prompt)}
    counts |= {int(x) for x in re.findall(r"vector of (\d+) real numbers", prompt)}
    counts |= {int(x) for x in re.findall(r"The policy has (\d+) parameters", prompt)}
    assert counts == {n}
    example = prompt.splitlines()[-1]
    assert f"a number in place of each {PLACEHOLDER}" in prompt.splitlines()[-2]
    assert example == format_example(n)
    # the format example is no point: copied, it is rejected and counted as a copy
    assert parse_reply(example, n, -6, 6).error == "example_copy"
    assert not re.search(r"params\[\d+\]: -?\d", example)
    assert history_line(*hist[0]) in prompt
    assert "iteration 2 of 9" in prompt and "about 1" in prompt or task.step_size != 1.0
    system, user = search_messages(template, task=task, policy=policy, history=hist, iteration=2, total_iterations=9,
                                   settings=settings)
    assert system["role"] == "system" and format_example(n) in system["content"] and user["content"] == prompt
    if template == "semantic":
        assert task.description in prompt
        if isinstance(policy, LinearPolicy):
            listed = re.findall(r"^params\[(\d+)\]: (?:weight|bias)", prompt, flags=re.M)
            assert sorted(int(i) for i in listed) == list(range(n))
    no_hint = render_search_prompt(template, task=task, policy=policy, history=hist, iteration=2, total_iterations=9,
                                   settings=PromptSettings(-6, 6, 1, task.step_size, None, 20))
    assert "global maximum of f is about" in prompt and "global maximum of f is about" not in no_hint


def test_cartpole_announces_ten_parameters():
    """The original's description said 18 for a 4x2 + 2 policy."""
    policy = policy_for("cartpole")
    assert policy.n_params == 10
    assert policy.layout_text().startswith("The policy has 10 parameters")


def test_linear_policy_maths():
    pol = LinearPolicy(obs_dim=2, act_dim=2, discrete=True)
    params = np.array([1.0, -1.0, 2.0, 0.5, 0.1, 0.2])  # W = [[1,-1],[2,0.5]], b = [0.1, 0.2]
    w, b = pol.split(params)
    np.testing.assert_array_equal(w, [[1, -1], [2, 0.5]])
    obs = np.array([[1.0, 1.0], [-1.0, 0.0]])
    np.testing.assert_allclose(pol.outputs(obs, params), [[3.1, -0.3], [-0.9, 1.2]])
    np.testing.assert_array_equal(pol.act(obs, params), [0, 1])
    # Batched parameters: row k of the output uses parameter vector k.
    batch = np.stack([params, -params])
    np.testing.assert_allclose(pol.outputs(obs, batch), [[3.1, -0.3], [0.9, -1.2]])
    cont = LinearPolicy(obs_dim=2, act_dim=1, discrete=False, action_low=(-1.0,), action_high=(1.0,))
    np.testing.assert_allclose(cont.act(np.array([[0.2, 0.1], [3.0, 0.0]]), np.array([1.0, 2.0, 0.0])),
                               [[0.4], [1.0]], rtol=1e-6)
    with pytest.raises(ValueError, match="expected 3 values, got 4"):
        cont.act(np.zeros((1, 2)), np.zeros(4))
    q = QTablePolicy(n_states=3, n_actions=2)
    table = np.array([0, 1, 5, 2, -1, -3], dtype=float)
    np.testing.assert_array_equal(q.act(np.array([0, 1, 2]), table), [1, 0, 0])


def test_token_trimming_keeps_newest_entries_under_budget(tiny_llm):
    task, policy = get_task("mountaincar_continuous"), policy_for("mountaincar_continuous")
    settings = PromptSettings(-6, 6, 1, 0.5, 100.0, 20)
    hist = [(np.array([i * 0.1, -i * 0.1, 1.0]), float(i)) for i in range(40)]
    count = chat_token_counter(tiny_llm.tokenizer)

    def render(h):
        return render_search_prompt("numeric", task=task, policy=policy, history=h, iteration=41,
                                    total_iterations=50, settings=settings)

    full = count(render(hist))
    budget = full - 100
    prompt, dropped, tokens = trim_history(render, hist, count, budget)
    assert 0 < dropped < len(hist)
    assert tokens == count(prompt) <= budget
    assert history_line(*hist[-1]) in prompt and history_line(*hist[dropped]) in prompt
    assert history_line(*hist[dropped - 1]) not in prompt
    assert count(render(hist[dropped - 1:])) > budget  # one more entry would not fit: only what must go goes
    with pytest.raises(ValueError, match="prompt_token_budget"):
        trim_history(render, hist, count, 20)


# ------------------------------------------------------------------------------------------- search loop


def _params(**kw):
    base = dict(tasks=["pendulum"], iterations=2, episodes_per_eval=2, max_episode_steps={"pendulum": 50},
                prompt_token_budget=900, max_reasks=3)
    base.update(kw)
    return PropsSearchParams(**base)


def _run(optimizer, llm_params, **kw):
    states = []
    rows = list(props_search("pendulum", ["props", "props_plus"], [0, 1], optimizer, _params(**kw),
                             SPACE, llm_params, states_out=states))
    return rows, states


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def test_reply_cache_replays_offline(tiny_llm, tmp_path):
    lp = PropsLLMParams(spec="tiny", answer_prefix="params[0]:")
    rows, states = _run(build_optimizer_llm(lp, cache_dir=tmp_path / "replies", llm=tiny_llm), lp, max_reasks=1)
    assert len(rows) == 2 * 4 and rows[-1]["llm_calls"] >= 2
    assert all(r["episodes"] == 2 * r["step"] for r in rows)
    files = sorted((tmp_path / "replies").rglob("*.json"))
    assert files
    before = {f: f.read_bytes() for f in files}
    offline = PropsLLMParams(spec="tiny", answer_prefix="params[0]:", offline=True)
    rows2, states2 = _run(build_optimizer_llm(offline, cache_dir=tmp_path / "replies", llm=tiny_llm), offline,
                          max_reasks=1)
    assert _strip(rows2) == _strip(rows)
    assert [s.records[0]["exchanges"][0]["reply"] for s in states2] == [s.records[0]["exchanges"][0]["reply"]
                                                                        for s in states]
    assert {f: f.read_bytes() for f in files} == before
    # A miss offline is not an LLM fault: it fails loudly instead of taking the fallback.
    with pytest.raises(CacheMissError):
        _run(build_optimizer_llm(offline, cache_dir=tmp_path / "replies", llm=tiny_llm), offline, max_reasks=1,
             iterations=3)


def _openai_optimizer(url, tokenizer):
    backend = OpenAIChatBackend("m", url, max_retries=0, timeout_s=10)
    return OptimizerLLM(backend, chat_token_counter(tokenizer), backend.model_id, tokenizer)


def test_endpoint_500_takes_the_fallback_and_is_counted(tiny_llm):
    app = FastAPI()
    hits = {"n": 0}

    @app.post("/v1/chat/completions")
    async def broken(request: dict = None):  # noqa: B006
        hits["n"] += 1
        return JSONResponse({"error": {"message": "internal"}}, status_code=500)

    lp = PropsLLMParams(backend="openai", model="m", base_url="http://x", spec="tiny", faults={"max_retries": 0})
    with _Server(app) as url:
        rows, states = _run(_openai_optimizer(url, tiny_llm.tokenizer), lp)
    assert hits["n"] == 2  # one batched round per iteration, each failing once (no retries)
    last = [r for r in rows if r["step"] == 2]
    assert all(r["faults"] == 2 and r["fallbacks"] == 2 and r["llm_calls"] == 0 for r in last)
    for st in states:
        assert all("InternalServerError" in rec["exchanges"][0]["fault"] for rec in st.records)
        assert all(SPACE.low <= x <= SPACE.high for rec in st.records for x in rec["fallback"])
    # Different searches draw different fallback points.
    assert states[0].records[0]["fallback"] != states[1].records[0]["fallback"]


def test_reask_path_with_scripted_endpoint(tiny_llm):
    """Junk, then out of range, then a good reply: two re-asks, each carrying the parser's detail."""
    replies = ["I would like to try something new.", "params[0]: 9; params[1]: 1; params[2]: 0",
               "params[0]: 0.5; params[1]: 1; params[2]: -0.5"]
    seen = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def scripted(request: dict):
        seen.append(request["messages"])
        text = replies[min(len(seen) - 1, 2)]
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    lp = PropsLLMParams(backend="openai", model="m", base_url="http://x", spec="tiny", faults={"max_retries": 0},
                        answer_prefix="")  # the model writes the whole reply: the re-asks carry it verbatim
    states = []
    with _Server(app) as url:
        rows = list(props_search("mountaincar_continuous", ["props"], [0], _openai_optimizer(url, tiny_llm.tokenizer),
                                 _params(iterations=1), SPACE, lp, states_out=states))
    assert rows[0]["llm_calls"] == 3 and rows[0]["reasks"] == 2 and rows[0]["parse_failures"] == 2
    assert rows[0]["fallbacks"] == 0
    np.testing.assert_array_equal(states[0].history[0][0], [0.5, 1, -0.5])
    assert len(seen[1]) == 4 and seen[1][0]["role"] == "system" and seen[1][2]["content"] == replies[0]
    assert "not of the form" in seen[1][3]["content"] or "no line" in seen[1][3]["content"]
    assert "outside [-6, 6]" in seen[2][-1]["content"]
    errors = [e["parse"]["error"] for e in states[0].records[0]["exchanges"]]
    assert errors == ["no_answer", "out_of_range", None]


def test_programming_error_is_not_a_fault(tiny_llm):
    class Broken:
        model_id = "broken"

        def generate(self, prompts, sampling):
            raise TypeError("a bug, not an LLM fault")

    lp = PropsLLMParams(spec="tiny")
    with pytest.raises(TypeError, match="a bug"):
        _run(OptimizerLLM(Broken(), chat_token_counter(tiny_llm.tokenizer), "broken", tiny_llm.tokenizer), lp)


def _scripted(replies):
    """An OpenAI-compatible chat endpoint answering ``replies`` in turn (the last one ever after)."""
    seen = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def scripted(request: dict):
        seen.append(request["messages"])
        text = replies[min(len(seen) - 1, len(replies) - 1)]
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    return app, seen


def test_rows_count_where_proposals_came_from(tiny_llm):
    """A copied placeholder is an example copy; a search without a usable reply falls back, and its row and
    record say so; the counters add up."""
    copy = "params[0]: <value>; params[1]: <value>; params[2]: <value>"
    app, seen = _scripted([copy, "params[0]: 0.5; params[1]: 1; params[2]: -0.5", copy, copy])
    lp = PropsLLMParams(backend="openai", model="m", base_url="http://x", spec="tiny")
    states = []
    with _Server(app) as url:
        rows = list(props_search("mountaincar_continuous", ["props"], [0], _openai_optimizer(url, tiny_llm.tokenizer),
                                 _params(iterations=2, max_reasks=1), SPACE, lp, states_out=states))
    assert seen[0][0]["role"] == "system" and "<value>" in seen[0][0]["content"]  # the one ProPS system message
    assert [r["proposal"] for r in rows] == ["llm", "fallback"]
    last = rows[-1]
    assert (last["llm_proposals"], last["fallbacks"], last["llm_calls"], last["reasks"]) == (1, 1, 4, 2)
    assert last["example_copies"] == 3 == last["parse_errors"]["example_copy"] == last["parse_failures"]
    assert states[0].records[1]["proposal"] == "fallback" and "fallback" in states[0].records[1]
    from llmrl.eval.props import headline, mean_curve

    run = {"rows": rows, "best_return": states[0].best_return, "final_eval": [0.0, 1.0]}
    h = headline([run, {**run, "final_eval": [1.0, 2.0]}], reps=50)["llm"]
    assert h["llm_proposed"] == 0.5 and h["example_copy_rate"] == 0.75 and h["parse_errors"] == {"example_copy": 6}
    assert [p["fallbacks"] for p in mean_curve([rows, rows])] == [0, 2]


def test_reply_cap_holds_a_complete_answer_and_a_smaller_cap_is_refused():
    """With the embedded model's own tokenizer: the widest answer the format allows fits the cap for every task's
    parameter count; a configured cap below it is an error before any request."""
    from llmrl.llm.load import load_tokenizer

    tok = load_tokenizer("embedded:smollm2-135m-instruct")
    for key in ("cartpole", "mountaincar_continuous", "inverted_pendulum", "swimmer"):
        n = policy_for(key).n_params
        cap = reply_token_cap(tok, n, -6, 6, 1)
        widest = "; ".join(f"params[{i}]: -5.55" for i in range(n)) + "; f(params): -123.45"
        ids = tok(widest, add_special_tokens=False)["input_ids"]
        cut = tok.decode(ids[:cap])  # what a reply cut at the cap keeps
        assert parse_reply(cut, n, -6, 6).ok, (key, cap, cut)
    lp = PropsLLMParams(spec="embedded:smollm2-135m-instruct", max_new_tokens=20)
    opt = OptimizerLLM(None, chat_token_counter(tok), "unused", tok)
    with pytest.raises(ValueError, match="max_new_tokens: 20 cannot hold a complete answer of 10 values"):
        list(props_search("cartpole", ["props"], [0], opt, _params(), SPACE, lp))


# -------------------------------------------------------------------------------------------- baselines


def test_random_search_and_cem_improve_on_cartpole():
    search = PropsSearchParams(tasks=["cartpole"], iterations=15, episodes_per_eval=4)
    rs_states, cem_states = [], []
    rs = list(random_search("cartpole", [0, 1], search, SPACE, states_out=rs_states))
    cm = list(cem("cartpole", [0, 1], search, SPACE, CEMParams(population=10, episodes_per_candidate=1),
                  states_out=cem_states))
    budget = search.iterations * search.episodes_per_eval
    assert max(r["episodes"] for r in rs) == budget and max(r["episodes"] for r in cm) <= budget
    held_out = list(range(10_000_000, 10_000_010))
    random_level = evaluate_params("cartpole", np.random.default_rng(5).uniform(-6, 6, (20, 10)), held_out).mean()
    for states, rows in ((rs_states, rs), (cem_states, cm)):
        for st in states:
            mine = [r for r in rows if r["seed"] == st.seed]
            assert mine[-1]["best_return"] > mine[0]["return_mean"]
            final = evaluate_params("cartpole", st.final_params, held_out).mean()
            assert final > 2 * random_level, (st.method, final, random_level)


def test_headline_and_curve_from_runs():
    from llmrl.eval.props import headline, mean_curve

    def run(seed, final, llm):
        rows = [{"episodes": 10 * (i + 1), "best_return": float(seed + i), "seconds": 2.0,
                 **({"llm_calls": 4 * (i + 1), "tokens": 100 * (i + 1), "reasks": 2 * (i + 1),
                     "parse_failures": 2 * (i + 1), "duplicates": i, "faults": 0, "fallbacks": i,
                     "llm_proposals": 1} if llm else {})}
                for i in range(3)]
        return {"seed": seed, "rows": rows, "best_return": float(seed + 2), "final_eval": final}

    runs = [run(0, [1.0, 3.0], True), run(1, [5.0, 7.0], True)]
    h = headline(runs, reps=200)
    assert h["final"]["value"] == 4.0 and h["final"]["per_seed"] == [2.0, 6.0] and h["final"]["n_seeds"] == 2
    assert h["final"]["ci_low"] <= 4.0 <= h["final"]["ci_high"]
    assert h["episodes"] == 30 and h["best_search_return"] == 2.5
    assert h["llm"]["calls"] == 24 and h["llm"]["parse_failure_rate"] == 0.5
    assert h["llm"]["duplicate_rate"] == round(4 / 6, 4) and h["llm"]["fallback_rate"] == round(4 / 6, 4)
    assert h["seconds_per_iteration"] == 2.0
    assert "llm" not in headline([run(0, [1.0], False)], reps=50)
    assert mean_curve([r["rows"] for r in runs]) == [{"episodes": 10, "best_return": 0.5},
                                                     {"episodes": 20, "best_return": 1.5},
                                                     {"episodes": 30, "best_return": 2.5}]


def test_ppo_baseline_counts_every_training_episode_and_writes_no_log_folders(tmp_path, monkeypatch):
    import tempfile

    from llmrl.algos.props_ppo import ppo_baseline
    from llmrl.eval.props import evaluate_ppo
    from llmrl.config.props import PPOBaselineParams

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where SB3 would put its SB3-<date> folders
    models: list = []
    p = PPOBaselineParams(n_steps=64, batch_size=32, n_epochs=1, net_arch=[8])
    rows = list(ppo_baseline(get_task("cartpole", 50), 0, 12, p, model_out=models))
    assert rows[-1]["episodes"] >= 12 and rows[-1]["episodes"] - 12 < 2  # stopped at the budget
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(r["method"] == "ppo" and r["seed"] == 0 for r in rows)
    returns = evaluate_ppo(models[0], get_task("cartpole", 50), [1, 2])
    assert returns.shape == (2,) and (returns > 0).all()
    assert not list(tmp_path.glob("SB3-*"))


# ------------------------------------------------------------------------------- equal budgets, the quadratic


def test_a_table_with_unequal_budgets_is_refused():
    from llmrl.eval.props import UnequalBudgetError, check_equal_budgets

    assert check_equal_budgets({"props": {"episodes": 40}, "cem": {"episodes": 40}}, name="t") == 40
    with pytest.raises(UnequalBudgetError, match=r"t: methods spent different episode budgets .*'props_tuned': 20"):
        check_equal_budgets({"props": {"episodes": 40}, "props_tuned": {"episodes": 20}}, name="t")
    with pytest.raises(ValueError, match="must divide the budget 6"):  # CEM cannot stop short of the others
        list(cem("pendulum", [0], _params(iterations=3), SPACE, CEMParams(population=4, episodes_per_candidate=1)))


def test_paired_difference_says_better_worse_or_no_difference():
    from llmrl.eval.props import paired_difference

    def runs(values):
        return [{"seed": s, "final_eval": [v]} for s, v in enumerate(values)]

    better = paired_difference(runs([10, 12, 11, 13]), runs([1, 2, 1, 2]), reps=500)
    assert better["verdict"] == "better" and better["seeds_won"] == 4 and better["difference"] == 10.0
    assert paired_difference(runs([1, 2, 1, 2]), runs([10, 12, 11, 13]), reps=500)["verdict"] == "worse"
    assert paired_difference(runs([5, -5, 5, -5]), runs([0, 0, 0, 0]), reps=500)["verdict"] == "no difference"
    with pytest.raises(ValueError, match="needs >= 2 seeds"):
        paired_difference(runs([1]), runs([1]))


def test_paired_difference_by_adapter_resamples_adapters_then_their_searches():
    from llmrl.eval.props import paired_difference

    def runs(values, adapters):
        return [{"seed": s, "final_eval": [v], "adapter": a} for s, (v, a) in enumerate(zip(values, adapters))]

    base = runs([0] * 6, [None] * 6)
    # two adapters, each in three searches: one adapter helps a lot, the other not at all
    tuned = runs([10, 11, 12, 0, -1, 1], ["a", "a", "a", "b", "b", "b"])
    by_seed = paired_difference(tuned, base, reps=2000)
    by_adapter = paired_difference(tuned, base, reps=2000, group_by="adapter")
    assert by_adapter["difference"] == by_seed["difference"] == 5.5 and by_adapter["groups"] == 2
    # six searches counted as independent draws say "better"; two adapters cannot
    assert by_seed["verdict"] == "better" and by_adapter["verdict"] == "no difference"
    assert by_adapter["ci_high"] - by_adapter["ci_low"] > by_seed["ci_high"] - by_seed["ci_low"]
    # one adapter for every search (the default tier): the seeds are the units, the interval as without grouping
    one = runs([10, 11, 12, 0, -1, 1], ["a"] * 6)
    assert paired_difference(one, base, reps=500, group_by="adapter") == paired_difference(one, base, reps=500)


def test_the_quadratic_task_has_its_maximum_at_a_centre_per_seed(tiny_llm):
    from llmrl.envs.control import QuadraticTask

    q = QuadraticTask(n_params=3)
    c0, c1 = q.centre(0), q.centre(1)
    assert not np.array_equal(c0, c1) and np.all(np.abs(c0) <= 4.5) and np.array_equal(c0, np.round(c0, 1))
    assert q.values(c0, 0) == 100.0 and q.values(c0 + [1, 0, 0], 0) == pytest.approx(90.0)
    # random search finds better points as it draws more; every method sees f only through its proposals
    search = PropsSearchParams(tasks=["quadratic"], iterations=30, episodes_per_eval=1, seeds=[0, 1])
    rows = list(random_search(q, [0, 1], search, SPACE))
    assert all(r["episodes"] == r["step"] for r in rows) and rows[-1]["best_return"] > rows[1]["best_return"]
    # ProPS on the quadratic: the numeric prompt (no environment to describe), the scripted point's exact value
    app, _ = _scripted(["params[0]: 0.5; params[1]: 1; params[2]: -0.5"])
    lp = PropsLLMParams(backend="openai", model="m", base_url="http://x", spec="tiny")
    states = []
    with _Server(app) as url:
        opt = _openai_optimizer(url, tiny_llm.tokenizer)
        got = list(props_search(q, ["props"], [3], opt, search.model_copy(update={"iterations": 1}), SPACE, lp,
                                states_out=states))
        with pytest.raises(ValueError, match="props_plus describes an environment"):
            list(props_search(q, ["props_plus"], [3], opt, search, SPACE, lp))
    assert got[0]["return_mean"] == pytest.approx(q.values([0.5, 1, -0.5], 3)) and got[0]["proposal"] == "llm"


def test_held_out_evaluation_is_every_final_policy_on_the_same_held_out_seeds():
    from llmrl.agents.linear_policy import evaluate_params
    from llmrl.algos.props_search import HeldOutEvaluation, held_out_seeds, search_task

    search = PropsSearchParams(tasks=["cartpole"], eval_episodes=3, eval_seed=10_000_000,
                               max_episode_steps={"cartpole": 20})
    task = search_task(search, "cartpole")
    assert task.horizon == 20 and search_task(search, task) is task  # a task object is taken as it is
    params = np.zeros(policy_for(task).n_params)
    with HeldOutEvaluation(task, search) as held_out:
        returns = held_out(params)
        assert held_out.seeds.tolist() == held_out_seeds(search).tolist() == [10_000_000, 10_000_001, 10_000_002]
    assert returns == [float(x) for x in evaluate_params(task, params, held_out_seeds(search))[0]]
    assert len(returns) == 3


def test_a_control_task_is_taken_as_it_is_or_by_its_name():
    from llmrl.envs.control import as_task

    task = get_task("cartpole", 50)
    assert as_task(task) is task and as_task("cartpole") == get_task("cartpole")


def test_metrics_of_a_method_are_its_headline_numbers_only():
    from llmrl.eval.props import metrics_of

    h = {"final": {"value": 4.0, "ci_low": 1.0, "ci_high": 7.0, "n_seeds": 2, "episodes": 40, "per_seed": [2.0, 6.0]},
         "episodes": 30, "best_search_return": 2.5,
         "llm": {"llm_proposed": 0.75, "parse_failure_rate": 0.5, "example_copy_rate": 0.1, "reasks": 3}}
    assert metrics_of(h) == {"greedy": {"return": 4.0, "return_lo": 1.0, "return_hi": 7.0, "seeds": 2,
                                        "episodes": 40},
                             "train_episodes": 30, "llm_proposed": 0.75, "parse_failure": 0.5}
    baseline = {**h}
    del baseline["llm"]
    assert set(metrics_of(baseline)) == {"greedy", "train_episodes"}


def test_a_function_search_takes_any_function_index_and_an_env_search_keeps_its_seed_ranges(tiny_llm):
    """A function search's seed names the function (it draws no episodes): the held-out test's 12 functions per
    dimension (seeds 0..11) run where an environment search's seeds would overlap ``eval_seed``."""
    from llmrl.envs.functions import FunctionTask

    lp = PropsLLMParams(spec="tiny", answer_prefix="params[0]:")
    opt = build_optimizer_llm(lp, cache_dir=None, llm=tiny_llm)
    search = _params(eval_seed=3_000_000, max_reasks=0)
    rows = list(props_search(FunctionTask("test", 2), ["props"], [0, 11], opt, search, SPACE, lp, iterations=2))
    assert {r["seed"] for r in rows} == {0, 11}
    with pytest.raises(ValueError, match="eval_seed 3000000 overlaps the search episode seeds"):
        list(props_search("pendulum", ["props"], [0, 11], opt, search, SPACE, lp))


def test_repeat_control_evaluates_a_random_point_in_place_of_a_repeat(tiny_llm):
    """Replies A, B, A: kept, the search evaluates A twice; with ``repeats="random"`` the third is replaced by a point
    of the space (recorded with the repeat), counted as a duplicate, not an LLM proposal; the iterations before it
    are the same either way. (The parser itself refuses only a repeat of the current point.)"""
    a, b = "params[0]: 0.5; params[1]: 1; params[2]: -0.5", "params[0]: 1; params[1]: 0; params[2]: 2"
    lp = PropsLLMParams(backend="openai", model="m", base_url="http://x", spec="tiny")
    runs = {}
    for repeats in ("keep", "random"):
        app, _ = _scripted([a, b, a])
        states = []
        with _Server(app) as url:
            rows = list(props_search("mountaincar_continuous", ["props"], [0], _openai_optimizer(
                url, tiny_llm.tokenizer), _params(iterations=3), SPACE, lp, states_out=states, repeats=repeats))
        runs[repeats] = (rows, states[0])
    kept, _ = runs["keep"]
    replaced, st = runs["random"]
    assert [r["proposal"] for r in kept] == ["llm"] * 3 and kept[-1]["duplicates"] == 1
    assert [r["proposal"] for r in replaced] == ["llm", "llm", "replaced"]
    assert (replaced[-1]["llm_proposals"], replaced[-1]["duplicates"], replaced[-1]["fallbacks"]) == (2, 1, 0)
    assert [r["return_mean"] for r in replaced[:2]] == [r["return_mean"] for r in kept[:2]]
    assert st.records[2]["repeated"] == [0.5, 1, -0.5] and "repeated" not in st.records[1]
    third = st.history[2][0]
    assert not any(np.array_equal(third, h) for h, _ in st.history[:2])
    assert all(SPACE.low <= x <= SPACE.high for x in third)
    from llmrl.eval.props import headline, mean_curve

    run = {"rows": replaced, "best_return": st.best_return, "final_eval": [0.0, 1.0]}
    assert headline([run, {**run, "final_eval": [1.0, 2.0]}], reps=50)["llm"]["llm_proposed"] == 0.6667
    assert [p["fallbacks"] for p in mean_curve([replaced, kept])] == [0, 0, 1]  # the replaced point is not the LLM's
    with pytest.raises(ValueError, match="repeats"):
        list(props_search("mountaincar_continuous", ["props"], [0], None, _params(iterations=1), SPACE, lp,
                          repeats="drop"))


def test_the_transfer_stages_refuse_a_task_or_seed_outside_props_transfer():
    from stages import props_repeat_control, props_transfer

    with pytest.raises(SystemExit, match=r"props_transfer: seed '7' is not among props\.transfer\.seeds \[0, 1, 2\]"):
        props_transfer.main(["mountaincar_continuous", "7"])
    with pytest.raises(SystemExit, match=r"props_repeat_control: task 'pendulum' is not among props\.transfer\.tasks"):
        props_repeat_control.main(["pendulum", "0"])


def test_transfer_seeds_must_be_distinct():
    from llmrl.config.props import PropsTransferParams

    with pytest.raises(ValueError, match=r"props\.transfer\.seeds must be distinct"):
        PropsTransferParams(seeds=[0, 1, 1])
