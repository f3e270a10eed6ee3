"""The LLM4Teach planner and a ProPS search against llama.cpp's OpenAI-compatible server (llama-cpp-python) on the
embedded GGUF: a server the project did not write, reached through the OpenAI-compatible backend exactly as a
larger served model would be (docs/methods/props.md, "ProPS on a served model").

llama-cpp-python is part of the test extras (a source build: `make setup` compiles it once with
CMAKE_ARGS=-DGGML_NATIVE=OFF, pip caches the wheel). ``LLAMA_CPP_PYTHON`` may name another interpreter that has
it; by default the server runs under this one. The server answers on 127.0.0.1 only, one thread; the module's
tests take about 20 s.
"""

import os
import socket
import subprocess
import sys
import time

import pytest

from llmrl.agents.teacher import LLMPlanner, observation_texts
from llmrl.llm.backends import openai_backend
from llmrl.llm.generate import SamplingConfig
from llmrl.llm.load import embedded_gguf, load_tokenizer

PYTHON = os.environ.get("LLAMA_CPP_PYTHON") or sys.executable


@pytest.fixture(scope="module", autouse=True)
def _has_llama_cpp():
    found = subprocess.run([PYTHON, "-c", "import llama_cpp.server"], capture_output=True, text=True)
    if found.returncode:  # a missing server fails, never skips: `make setup` installs it with the test extras
        pytest.fail(f"{PYTHON} cannot import llama_cpp.server (llama-cpp-python[server], a test extra: make setup): "
                    f"{found.stderr.strip().splitlines()[-1:]}")


@pytest.fixture(scope="module")
def llama_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gguf = embedded_gguf("smollm2-135m-instruct")
    proc = subprocess.Popen([PYTHON, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
                             "--port", str(port), "--n_threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"llama_cpp.server did not start ({PYTHON})")
            time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def _invalid_rate(backend) -> float:
    planner = LLMPlanner("doorkey", backend, n_ask=5, answer_prefix="Action: {",
                         sampling=SamplingConfig(max_new_tokens=24, temperature=0.9, stop=("\n",), seed=0))
    for text in observation_texts("doorkey"):
        planner.plan(text)
    return planner.stats()["invalid_rate"]


def test_completions_api_continues_the_answer_prefix_on_llama_cpp(llama_server):
    """Through /v1/completions the server gets the local backend's text (prefix continued) and the replies
    parse; through /v1/chat/completions llama-cpp-python starts a new turn instead, and the replies do not."""
    tokenizer = load_tokenizer("embedded:smollm2-135m-instruct")
    completions = openai_backend("completions", "smollm2", llama_server, tokenizer=tokenizer)
    chat = openai_backend("chat", "smollm2", llama_server)
    by_completions, by_chat = _invalid_rate(completions), _invalid_rate(chat)
    assert by_completions < 0.8 < by_chat  # measured: 0.53 against 1.00 (10 replies per text)


def test_props_search_through_llama_cpp_reaches_the_model(llama_server):
    """ProPS's endpoint profile end to end: props_search with backend openai (completions API, the answer prefix
    continued, the embedded model's tokenizer counting prompt tokens) on the quadratic task. Every request is
    answered (no fault), and the model's own proposals, not fallbacks, are among the points evaluated."""
    from llmrl.algos.props_search import build_optimizer_llm, props_search
    from llmrl.config.props import PropsLLMParams, PropsSearchParams, PropsSpaceParams
    from llmrl.envs.control import QuadraticTask

    lp = PropsLLMParams(backend="openai", api="completions", model="smollm2", base_url=llama_server,
                        spec="embedded:smollm2-135m-instruct", answer_prefix="params[0]:", temperature=0.7)
    search = PropsSearchParams(tasks=["quadratic"], methods=["props"], seeds=[0, 1], iterations=3,
                               episodes_per_eval=1, max_reasks=1, prompt_token_budget=768)
    states = []
    rows = list(props_search(QuadraticTask(n_params=2), ["props"], [0, 1], build_optimizer_llm(lp, cache_dir=None),
                             search, PropsSpaceParams(), lp, states_out=states))
    assert len(rows) == 6 and all(st.faults == 0 for st in states)
    assert sum(st.llm_calls for st in states) >= 6
    assert sum(st.llm_proposals for st in states) >= 1, [rec["exchanges"] for st in states for rec in st.records]
