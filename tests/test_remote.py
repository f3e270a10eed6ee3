"""The OpenAI-compatible backend against real HTTP servers on 127.0.0.1 (the real `openai` client, no mock)."""

import json
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from llmrl.llm import (
    CachedBackend,
    CacheMissError,
    OpenAIChatBackend,
    ReplyCache,
    SamplingConfig,
    generate,
    load_model,
    save_model,
)
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
