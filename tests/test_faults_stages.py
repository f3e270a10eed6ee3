"""Every stage that asks an LLM, run as the pipeline runs it (its script, its params) with its backend set to
openai against a broken endpoint on 127.0.0.1, through the real ``openai`` client.

Three endpoints: one that accepts and never answers, one that answers HTTP 500, one that answers an HTML page
with status 200. Each time the stage must end with ``LLMOutageError`` naming the fault policy's key, within its
bounds (timeout 0.5 s, one retry), and write nothing: the previous outputs stay byte for byte.
"""

from __future__ import annotations

import time

import pytest

from .faults_support import endpoint, repo_params, run_stage, snapshot, stage_repo, write_params

FAULTS = ["hang", "500", "html"]
POLICY = {"timeout_s": 0.5, "max_retries": 1, "deadline_s": 60.0, "max_fault_share": 0.1}


def _previous_outputs(root, files: list[str]) -> dict[str, str]:
    """Outputs of an earlier run at the stage's paths, which a failed run must leave as they are."""
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"previous run's {rel}\n")
    return snapshot(root)


def _teacher_params(url: str, policy: dict) -> dict:
    params = repo_params()
    teacher = params["llm4teach"]["teacher"]
    teacher.update(backend="openai", openai_model="tiny", openai_base_url=url, openai_api="completions", spec="tiny",
                   n_ask=2, max_new_tokens=4, faults=policy)
    params["llm4teach"]["train"]["teachers"] = ["llm", "oracle"]
    params["llm4teach"]["mpe"]["teachers"] = ["llm"]
    return params


def _props_params(url: str, policy: dict) -> dict:
    params = repo_params()
    props = params["props"]
    props["llm"].update(backend="openai", model="tiny", base_url=url, api="completions", spec="tiny",
                        answer_prefix="", faults=policy)
    props["search"].update(tasks=["cartpole"], methods=["props"], seeds=[0, 1], iterations=3, episodes_per_eval=1,
                           eval_episodes=1, video=False)
    props["transfer"].update(tasks=["cartpole"])
    props["quadratic"].update(seeds=[0, 1], iterations=3)
    return params


STAGES = {
    # stage script, its argv, params builder, earlier outputs at its paths (stages/paths.py)
    "llm4teach_plans": ("llm4teach_plans.py", [], _teacher_params,
                        ["data/llm4teach/plans/simpledoorkey.json", "metrics/llm4teach/plans/simpledoorkey.json",
                         "data/llm4teach/replies/ab/abcd.json"]),
    "props_search": ("props_search.py", ["cartpole"], _props_params,
                     ["data/props/search/cartpole/runs.json", "plots/props/search/cartpole/props/x.tsv",
                      "data/props/replies/search-cartpole/ab/abcd.json"]),
    "props_quadratic": ("props_quadratic.py", [], _props_params,
                        ["data/props/quadratic/runs.json", "data/props/replies/quadratic/ab/abcd.json"]),
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_an_outage_fails_the_stage_loudly_and_writes_nothing(stage, fault, tmp_path):
    script, argv, make_params, previous = STAGES[stage]
    root = stage_repo(tmp_path)
    before = _previous_outputs(root, previous)
    with endpoint(fault) as url:
        write_params(root, make_params(url, POLICY))
        t0 = time.perf_counter()
        run = run_stage(root, script, *argv, timeout=240)
        elapsed_after_start = time.perf_counter() - t0
    assert run.returncode != 0, run.stderr[-2000:]
    tail = run.stderr[-3000:]
    assert "LLMOutageError" in tail and "faults.max_fault_share" in tail, tail
    assert "the stage writes nothing" in tail
    # the first request's failure is past the share: one request of 0.5 s x 2 attempts (+ 0.5 s backoff) after
    # the stage's imports
    assert elapsed_after_start < 90
    assert snapshot(root) == before  # nothing written, nothing replaced


def test_the_deadline_bounds_a_hung_stage(tmp_path):
    """A deadline shorter than one attempt's timeout: the attempt is cut at the deadline, and the stage ends
    with the deadline's error well before timeout x attempts."""
    root = stage_repo(tmp_path)
    before = _previous_outputs(root, STAGES["props_search"][3])
    policy = {"timeout_s": 30.0, "max_retries": 3, "deadline_s": 2.0, "max_fault_share": 1.0}
    with endpoint("hang") as url:
        write_params(root, _props_params(url, policy))
        t0 = time.perf_counter()
        run = run_stage(root, "props_search.py", "cartpole", timeout=240)
        elapsed = time.perf_counter() - t0
    assert run.returncode != 0
    assert "LLMOutageError" in run.stderr and "props.llm.faults.deadline_s" in run.stderr, run.stderr[-2000:]
    assert elapsed < 60  # 4 attempts x 30 s without the deadline
    assert snapshot(root) == before
