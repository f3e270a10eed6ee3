"""A small OpenAI-compatible server for a local model (``/v1/models``, ``/v1/completions``,
``/v1/chat/completions``).

Lets teachers and optimisers run against a model on another machine or process through the same
``OpenAICompletionsBackend`` / ``OpenAIChatBackend`` they use for other servers and hosted APIs.
Run: ``python -m llmrl.llm.serve --model models/base_llm``. Binds 127.0.0.1 by default. Single-threaded
generation: requests are served one at a time.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

from fastapi import FastAPI
from pydantic import BaseModel, Field

from llmrl.llm.generate import SamplingConfig, generate
from llmrl.llm.load import LLM, load_model

__all__ = ["build_app"]


class ChatMessage(BaseModel):
    role: str
    content: str


class CompletionRequest(BaseModel):
    model: str
    prompt: str
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None


class ChatRequest(BaseModel):
    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    # vLLM's names and defaults: a conversation ending with an assistant turn gets a new turn unless the
    # client asks for that turn to be continued (OpenAIChatBackend does, for an answer prefix).
    add_generation_prompt: bool = True
    continue_final_message: bool = False


def build_app(llm: LLM, served_name: str | None = None) -> FastAPI:
    name = served_name or llm.spec
    app = FastAPI(title="llmrl OpenAI-compatible server")
    lock = threading.Lock()

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "llmrl"}]}

    def run(req: CompletionRequest | ChatRequest, rendered: str):
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        sampling = SamplingConfig(max_new_tokens=req.max_tokens or 256, temperature=req.temperature,
                                  top_p=req.top_p, stop=tuple(stop), seed=req.seed or 0)
        with lock:
            gen = generate(llm, [rendered], sampling, raw=True)[0]
        prompt_tokens = len(llm.tokenizer(gen.prompt, add_special_tokens=False)["input_ids"])
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": gen.n_tokens,
                 "total_tokens": prompt_tokens + gen.n_tokens}
        return gen, usage

    @app.post("/v1/completions")
    def completions(req: CompletionRequest) -> dict:
        gen, usage = run(req, req.prompt)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": name, "choices": [{"index": 0, "text": gen.text, "finish_reason": gen.finish_reason}],
                "usage": usage}

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest) -> dict:
        messages = [m.model_dump() for m in req.messages]
        if req.continue_final_message and messages[-1]["role"] == "assistant":
            rendered = llm.render(messages)  # continues the partial assistant turn
        else:
            rendered = llm.tokenizer.apply_chat_template(messages, tokenize=False,
                                                         add_generation_prompt=req.add_generation_prompt)
        gen, usage = run(req, rendered)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": name, "usage": usage,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text},
                             "finish_reason": gen.finish_reason}]}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="model spec (see llmrl.llm.load_model)")
    parser.add_argument("--name", default=None, help="model id to serve under (default: the spec)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    uvicorn.run(build_app(load_model(args.model), args.name), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
