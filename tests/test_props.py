"""ProPS: the strict parser and the re-ask path, prompts rendered from the policy, the linear policy's maths,
token trimming, reply-cache replay, LLM faults taking the fallback (real HTTP server + real openai client),
and the black-box baselines improving on CartPole."""

import re

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from llmrl.agents.linear_policy import LinearPolicy, QTablePolicy, evaluate_params, policy_for
from llmrl.algos.blackbox import cem, random_search
from llmrl.algos.props_prompts import (
    PromptSettings,
    chat_token_counter,
    format_example,
    history_line,
    parse_reply,
    render_correction,
    render_search_prompt,
    trim_history,
)
from llmrl.algos.props_search import OptimizerLLM, build_optimizer_llm, props_search
from llmrl.config.props import CEMParams, PropsLLMParams, PropsSearchParams, PropsSpaceParams
from llmrl.envs.control import TASKS, get_task
from llmrl.llm import CacheMissError, OpenAIChatBackend
from tests.test_remote import _Server

SPACE = PropsSpaceParams()

# ------------------------------------------------------------------------------------------------ parser


@pytest.mark.parametrize("text", [
    "params[0]: 1.5; params[1]: -2; params[2]: 0.25",
    "Here is my proposal:\nparams[0]: 1.5, params[1]: -2, params[2]: 0.25\nI moved along the gradient.",
    "<think>f rose when\nparams[0] grew</think>\n<policy>params[0]: 1.5; params[1]: -2; params[2]: 0.25</policy>",
    "params[0]: 1.5; params[1]: -2; params[2]: 0.25; f(params): 40",
    "params[2] = 0.25; params[0] = 1.5; params[1] = -2.",
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
    assert "only an example" in prompt.splitlines()[-2]
    assert example == format_example(n)
    if n <= 24:
        filled = parse_reply(example, n, -6, 6)
        assert filled.ok and len(filled.params) == n
    assert history_line(*hist[0]) in prompt
    assert "iteration 2 of 9" in prompt and "about 1" in prompt or task.step_size != 1.0
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
    base = dict(tasks=["mountaincar_continuous"], iterations=2, episodes_per_eval=2,
                max_episode_steps={"mountaincar_continuous": 50}, prompt_token_budget=900)
    base.update(kw)
    return PropsSearchParams(**base)


def _run(optimizer, llm_params, **kw):
    states = []
    rows = list(props_search("mountaincar_continuous", ["props", "props_plus"], [0, 1], optimizer, _params(**kw),
                             SPACE, llm_params, states_out=states))
    return rows, states


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def test_reply_cache_replays_offline(tiny_llm, tmp_path):
    lp = PropsLLMParams(spec="tiny", max_new_tokens=12, answer_prefix="params[0]:", max_retries=0)
    rows, states = _run(build_optimizer_llm(lp, cache_dir=tmp_path / "replies", llm=tiny_llm), lp, max_reasks=1)
    assert len(rows) == 2 * 4 and rows[-1]["llm_calls"] >= 2
    assert all(r["episodes"] == 2 * r["step"] for r in rows)
    files = sorted((tmp_path / "replies").rglob("*.json"))
    assert files
    before = {f: f.read_bytes() for f in files}
    offline = PropsLLMParams(spec="tiny", max_new_tokens=12, answer_prefix="params[0]:", offline=True)
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
    return OptimizerLLM(backend, chat_token_counter(tokenizer), backend.model_id)


def test_endpoint_500_takes_the_fallback_and_is_counted(tiny_llm):
    app = FastAPI()
    hits = {"n": 0}

    @app.post("/v1/chat/completions")
    async def broken(request: dict = None):  # noqa: B006
        hits["n"] += 1
        return JSONResponse({"error": {"message": "internal"}}, status_code=500)

    lp = PropsLLMParams(backend="openai", model="m", base_url="http://x", spec="tiny", max_retries=0)
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

    lp = PropsLLMParams(backend="openai", model="m", base_url="http://x", spec="tiny", max_retries=0)
    states = []
    with _Server(app) as url:
        rows = list(props_search("mountaincar_continuous", ["props"], [0], _openai_optimizer(url, tiny_llm.tokenizer),
                                 _params(iterations=1), SPACE, lp, states_out=states))
    assert rows[0]["llm_calls"] == 3 and rows[0]["reasks"] == 2 and rows[0]["parse_failures"] == 2
    assert rows[0]["fallbacks"] == 0
    np.testing.assert_array_equal(states[0].history[0][0], [0.5, 1, -0.5])
    assert len(seen[1]) == 3 and seen[1][1]["content"] == replies[0]
    assert "not of the form" in seen[1][2]["content"] or "no line" in seen[1][2]["content"]
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
        _run(OptimizerLLM(Broken(), chat_token_counter(tiny_llm.tokenizer), "broken"), lp)


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
                     "parse_failures": 2 * (i + 1), "duplicates": i, "faults": 0, "fallbacks": i} if llm else {})}
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

    from llmrl.algos.props_ppo import evaluate_ppo, ppo_baseline
    from llmrl.config.props import PPOBaselineParams

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where SB3 would put its SB3-<date> folders
    models: list = []
    p = PPOBaselineParams(n_steps=64, batch_size=32, n_epochs=1, net_arch=[8])
    rows = list(ppo_baseline("cartpole", 0, 12, p, max_episode_steps=50, model_out=models))
    assert rows[-1]["episodes"] >= 12 and rows[-1]["episodes"] - 12 < 2  # stopped at the budget
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(r["method"] == "ppo" and r["seed"] == 0 for r in rows)
    returns = evaluate_ppo(models[0], "cartpole", [1, 2], max_episode_steps=50)
    assert returns.shape == (2,) and (returns > 0).all()
    assert not list(tmp_path.glob("SB3-*"))
