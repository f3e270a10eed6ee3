"""The OpenAI-compatible backend against real HTTP servers on 127.0.0.1 (the real `openai` client, no mock)."""

import json
import socket
import threading
import time
from dataclasses import replace

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from llmrl.llm.generate import generate, SamplingConfig
from llmrl.llm.backends import (CachedBackend, CacheMissError, LocalBackend, openai_backend, OpenAIChatBackend,
                                ReplyCache)
from llmrl.llm.load import load_model, save_model
from llmrl.llm.serve import build_app


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, app):
        self.port = _free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.05)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def served_model(tmp_path_factory, tiny_llm):
    """The tiny model saved as a local folder and loaded back through the local-folder path."""
    folder = tmp_path_factory.mktemp("model") / "tiny"
    save_model(tiny_llm.model, tiny_llm.tokenizer, folder)
    return load_model(str(folder))


def test_remote_backend_and_offline_cache(served_model, tmp_path):
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.0, seed=3)
    prompts = ["Agent sees <key>, holds <nothing>. Plan?", [{"role": "user", "content": "hello"}]]
    cache = ReplyCache(tmp_path / "replies")
    with _Server(build_app(served_model, "tiny-served")) as url:
        backend = OpenAIChatBackend("tiny-served", url)
        direct = backend.generate(prompts, sampling)
        cached = CachedBackend(OpenAIChatBackend("tiny-served", url), cache)
        first = cached.generate(prompts, sampling)
    # The server replies what the model generates for the same rendered prompt and seed.
    for i, p in enumerate(prompts):
        local = generate(served_model, [p], SamplingConfig(max_new_tokens=10, temperature=1.0, seed=3 + i))[0]
        assert direct[i].text == local.text
    assert [g.text for g in first] == [g.text for g in direct]
    assert cached.stats.misses == 2 and cached.stats.hits == 0
    files = sorted((tmp_path / "replies").rglob("*.json"))
    assert len(files) == 2
    record = json.loads(files[0].read_text())
    assert {"model", "messages", "sampling", "generation"} <= set(record)
    before = {f: f.read_bytes() for f in files}

    # Server gone: an offline cached backend answers from disk, byte-identical, and files are untouched.
    offline = CachedBackend(OpenAIChatBackend("tiny-served", "http://127.0.0.1:9/v1", max_retries=0),
                            ReplyCache(tmp_path / "replies"), offline=True)
    again = offline.generate(prompts, sampling)
    assert [g.__dict__ for g in again] == [g.__dict__ for g in first]
    assert offline.stats.hits == 2 and offline.stats.misses == 0
    assert {f: f.read_bytes() for f in files} == before
    with pytest.raises(CacheMissError, match="no reply for key"):
        offline.generate(["a prompt never asked"], sampling)
    # Any change of sampling settings is a different key.
    with pytest.raises(CacheMissError):
        offline.generate(prompts, SamplingConfig(max_new_tokens=10, temperature=1.0, seed=4))


def test_retries_on_429_and_5xx(monkeypatch):
    """The client retries with backoff on 429 / 503 and then succeeds; the key comes from the environment."""
    calls = {"n": 0, "auth": []}
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def flaky(request: dict = None):  # noqa: B006
        calls["n"] += 1
        if calls["n"] == 1:
            return JSONResponse({"error": {"message": "slow down"}}, status_code=429, headers={"retry-after-ms": "10"})
        if calls["n"] == 2:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503, headers={"retry-after-ms": "10"})
        return {
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "go to key"}, "finish_reason": "stop"}],
        }

    @app.middleware("http")
    async def record_auth(request, call_next):
        calls["auth"].append(request.headers.get("authorization"))
        return await call_next(request)

    monkeypatch.setenv("LLMRL_TEST_KEY", "sk-test-123")
    with _Server(app) as url:
        backend = OpenAIChatBackend("m", url, api_key_env="LLMRL_TEST_KEY", max_retries=3)
        out = backend.generate(["plan?"], SamplingConfig(max_new_tokens=5))
    assert out[0].text == "go to key"
    assert calls["n"] == 3
    assert calls["auth"][-1] == "Bearer sk-test-123"
    assert "sk-test-123" not in repr(backend.__dict__.get("model_id"))


class _SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers (a hung endpoint)."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def __exit__(self, *exc):
        self.sock.close()


def _failing_app(kind: str):
    from fastapi.responses import HTMLResponse

    app = FastAPI()

    @app.post("/v1/completions")
    @app.post("/v1/chat/completions")
    def chat():
        if kind == "500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        return HTMLResponse("<html><body>maintenance</body></html>")  # a 200 that is not a completion

    return app


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("fault", ["hang", "500", "html"])
def test_outage_fails_the_planning_pass_within_its_bounds(fault, api, tmp_path, tiny_llm):
    """A hung, failing or garbage-answering endpoint ends `plan_texts` with LLMOutageError, in bounded time,
    with nothing written to the reply cache (the outage is never cached as the teacher), through either API."""
    from llmrl.agents.teacher import LLMOutageError, LLMPlanner, observation_texts, plan_texts
    from llmrl.config.llm_faults import LLMFaultParams
    from llmrl.llm.faults import FaultGuard, GuardedBackend

    server = _SilentServer() if fault == "hang" else _Server(_failing_app(fault))
    guard = FaultGuard(LLMFaultParams(timeout_s=0.5, max_retries=1, max_fault_share=0.1), "llm4teach.teacher.faults")
    with server as url:
        remote = openai_backend(api, "tiny", url, tokenizer=tiny_llm.tokenizer, guard=guard)
        backend = CachedBackend(GuardedBackend(remote, guard), ReplyCache(tmp_path))
        planner = LLMPlanner("doorkey", backend, n_ask=2, sampling=SamplingConfig(max_new_tokens=4, seed=0))
        texts = observation_texts("doorkey")
        t0 = time.perf_counter()
        with pytest.raises(LLMOutageError, match="llm4teach.teacher.faults.max_fault_share"):
            plan_texts(planner, texts, guard)
        elapsed = time.perf_counter() - t0
    assert guard.requests == 2 and guard.faults == 2  # failed fast: 2 of 12 planned replies exceed 10%
    assert elapsed < 10  # one text: 2 attempts x 0.5 s timeout, plus 0.5 s backoff
    assert not any(tmp_path.rglob("*.json"))


def test_reply_cache_key_ignores_the_endpoint_spelling(served_model, tmp_path):
    """Two spellings of one server (localhost / 127.0.0.1, trailing slash) share the reply cache."""
    prompts = [[{"role": "user", "content": "Say hi."}]]
    sampling = SamplingConfig(max_new_tokens=4, temperature=0.0, seed=0)
    with _Server(build_app(served_model, "tiny")) as url:
        first = CachedBackend(OpenAIChatBackend("tiny", url), ReplyCache(tmp_path))
        a = first.generate(prompts, sampling)
        other = url.replace("127.0.0.1", "localhost") + "/"
        second = CachedBackend(OpenAIChatBackend("tiny", other), ReplyCache(tmp_path), offline=True)
        assert second.generate(prompts, sampling) == a and second.stats.hits == 1


def test_one_prompt_on_every_backend(served_model):
    """An answer prefix (a partial assistant turn) reaches the model as the same text locally, through
    /v1/completions (rendered here) and through /v1/chat/completions (continue_final_message): same seed,
    same replies, so the same parse rates."""
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, seed=5)
    prompts = [[{"role": "user", "content": f"Agent sees <{obj}>. Plan?"},
                {"role": "assistant", "content": "Action: {"}] for obj in ("key", "door", "goal")]
    # One prompt per call with the seed the endpoints use for position i (a local batch shares one RNG stream).
    local = [LocalBackend(served_model).generate([p], replace(sampling, seed=sampling.seed + i))[0]
             for i, p in enumerate(prompts)]
    with _Server(build_app(served_model, "tiny-served")) as url:
        completions = openai_backend("completions", "tiny-served", url, tokenizer=served_model.tokenizer)
        by_completions = completions.generate(prompts, sampling)
        by_chat = openai_backend("chat", "tiny-served", url).generate(prompts, sampling)
    assert [g.prompt for g in by_completions] == [g.prompt for g in local]  # the rendered text itself
    assert all(g.prompt.endswith("Action: {") for g in local)  # the prefix continued, not closed
    assert [g.text for g in by_completions] == [g.text for g in local]
    assert [g.text for g in by_chat] == [g.text for g in local]
    assert not any(g.prefix_repeated for g in by_chat)
    assert completions.model_id == "openai-completions:tiny-served"


def test_completions_api_needs_the_served_models_tokenizer():
    with pytest.raises(ValueError, match="tokenizer"):
        openai_backend("completions", "m", "http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="'completions' or 'chat'"):
        openai_backend("responses", "m", "http://127.0.0.1:9/v1")


def test_a_repeated_prefix_is_cut_and_recorded():
    app = FastAPI()

    @app.post("/v1/chat/completions")
    def chat(body: dict):
        assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": " Action: {go to key}"},
                             "finish_reason": "stop"}]}

    prompt = [{"role": "user", "content": "Plan?"}, {"role": "assistant", "content": "Action: {"}]
    with _Server(app) as url:
        gen = OpenAIChatBackend("m", url, max_retries=0).generate([prompt], SamplingConfig(max_new_tokens=8))[0]
    assert gen.text == "go to key}"
    assert gen.prefix_repeated
