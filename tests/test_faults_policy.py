"""The one fault policy of LLM-calling stages: ``llmrl.llm.faults`` against real HTTP
endpoints on 127.0.0.1 through the real ``openai`` client, and its params."""

from __future__ import annotations

import time

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from llmrl.agents.teacher import LLMOutageError as TeacherOutageError
from llmrl.agents.teacher import LLMPlanner, observation_texts, plan_texts
from llmrl.config import ParamsError, load_section
from llmrl.config.llm4teach import LLM4TeachTeacherParams
from llmrl.config.llm_faults import LLMFaultParams
from llmrl.llm.backends import OpenAIChatBackend
from llmrl.llm.faults import FaultGuard, GuardedBackend, LLMOutageError, llm_fault_types
from llmrl.llm.generate import Generation, SamplingConfig

from .faults_support import HungEndpoint
from .test_remote import _Server


class _Scripted:
    """A backend answering a valid plan, or failing with ConnectionError on the calls listed in ``fail``, and
    advancing a fake clock by ``seconds`` per call."""

    model_id = "scripted"

    def __init__(self, fail=(), seconds=0.0, now=None):
        self.calls, self.fail, self.seconds, self.now = 0, set(fail), seconds, now

    def generate(self, prompts, sampling):
        self.calls += 1
        if self.now is not None:
            self.now[0] += self.seconds
        if self.calls in self.fail:
            raise ConnectionError("connection reset by peer")
        return [Generation(prompt="p", text="go to <key>}", finish_reason="stop", n_tokens=3)] * len(prompts)


def test_outage_error_lives_in_the_llm_layer_and_is_no_fault():
    assert TeacherOutageError is LLMOutageError  # re-exported where it was
    assert not issubclass(LLMOutageError, llm_fault_types())  # no caller takes a fallback for it


def test_faults_within_the_share_take_the_fallback_and_the_pass_completes():
    guard = FaultGuard(LLMFaultParams(max_fault_share=0.2), "llm4teach.teacher.faults")
    backend = _Scripted(fail={2})
    planner = LLMPlanner("doorkey", GuardedBackend(backend, guard), n_ask=2, answer_prefix="Action: {")
    texts = observation_texts("doorkey")
    dists = plan_texts(planner, texts, guard)
    assert len(dists) == len(texts) == 6
    assert guard.planned == 12 and guard.requests == 12 and guard.faults == 2  # 2 of 12 <= 20 %
    failed = dists[texts[1]]
    assert failed.fallback and failed.n_error == 2 and failed.plans == ("explore",)
    assert planner.stats()["error_replies"] == 2


def test_one_fault_past_the_share_ends_the_pass():
    guard = FaultGuard(LLMFaultParams(max_fault_share=0.2), "llm4teach.teacher.faults")
    planner = LLMPlanner("doorkey", GuardedBackend(_Scripted(fail={2, 4}), guard), n_ask=2, answer_prefix="Action: {")
    with pytest.raises(LLMOutageError, match=r"llm4teach.teacher.faults.max_fault_share: 4 of 12 .*"
                                             r"ConnectionError: connection reset by peer"):
        plan_texts(planner, observation_texts("doorkey"), guard)
    assert len(planner.memo) == 3  # texts 1-3 planned; the 4th call's fault ended the pass


def test_the_deadline_counts_from_the_first_request_and_is_a_named_error():
    now = [1000.0]
    guard = FaultGuard(LLMFaultParams(deadline_s=150), "llm4teach.teacher.faults", clock=lambda: now[0])
    now[0] += 500  # time before the first request (loading a model) does not count
    planner = LLMPlanner("doorkey", GuardedBackend(_Scripted(seconds=100, now=now), guard), n_ask=2,
                         answer_prefix="Action: {")
    with pytest.raises(LLMOutageError, match="llm4teach.teacher.faults.deadline_s: .* 150 s"):
        plan_texts(planner, observation_texts("doorkey"), guard)
    assert len(planner.memo) == 1  # 100 s, then 200 s > 150 s ends the second call


def _counting_app(status: int, hits: list):
    app = FastAPI()

    @app.post("/v1/chat/completions")
    def failing():
        hits.append(time.perf_counter())
        return JSONResponse({"error": {"message": f"status {status}"}}, status_code=status)

    return app


@pytest.mark.parametrize(("status", "attempts"), [(500, 3), (429, 3), (400, 1), (401, 1)])
def test_transient_failures_are_retried_others_are_not(status, attempts):
    hits: list[float] = []
    guard = FaultGuard(LLMFaultParams(max_retries=2, timeout_s=5), "x.faults")
    with _Server(_counting_app(status, hits)) as url:
        with pytest.raises(llm_fault_types()):
            OpenAIChatBackend("m", url, guard=guard).generate(["hi"], SamplingConfig(max_new_tokens=2))
    assert len(hits) == attempts and guard.retries == attempts - 1
    if attempts == 3:  # exponential backoff: 0.5 s, then 1 s
        assert hits[1] - hits[0] >= 0.45 and hits[2] - hits[1] >= 0.95


def test_an_attempt_never_outlasts_the_deadline():
    guard = FaultGuard(LLMFaultParams(timeout_s=30, max_retries=5, deadline_s=1.0), "props.llm.faults")
    t0 = time.perf_counter()
    with HungEndpoint() as url, pytest.raises(LLMOutageError, match="props.llm.faults.deadline_s"):
        OpenAIChatBackend("m", url, guard=guard).generate(["hi"], SamplingConfig(max_new_tokens=2))
    assert time.perf_counter() - t0 < 5  # not 6 attempts x 30 s


def test_policy_params_are_typed_and_named():
    teacher = load_section({"t": {"faults": {"timeout_s": 2, "deadline_s": None}}}, "t", LLM4TeachTeacherParams)
    assert teacher.faults == LLMFaultParams(timeout_s=2.0, deadline_s=None)
    with pytest.raises(ParamsError, match=r"t.faults.max_fault_share: must be <= 1, got 2"):
        load_section({"t": {"faults": {"max_fault_share": 2}}}, "t", LLM4TeachTeacherParams)
    with pytest.raises(ParamsError, match=r"t.faults.timeout: unknown key"):
        load_section({"t": {"faults": {"timeout": 2}}}, "t", LLM4TeachTeacherParams)
    for name, field in LLMFaultParams.model_fields.items():
        assert field.description, name


def test_a_guard_or_direct_settings_not_both():
    with pytest.raises(ValueError, match="guard"):
        OpenAIChatBackend("m", "http://127.0.0.1:9/v1", guard=FaultGuard(LLMFaultParams(), "x"), timeout_s=1)
