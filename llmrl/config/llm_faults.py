"""The fault policy of a stage that asks an LLM: the ``faults`` section of its LLM params
(``llm4teach.teacher.faults``, ``props.llm.faults``), enforced by ``llmrl.llm.faults.FaultGuard``.

A request gets ``timeout_s`` per attempt and ``max_retries`` further attempts after a transient failure; the
stage's LLM work ends by ``deadline_s``; requests that still fail (after their retries) take the caller's recorded
fallback while they stay within ``max_fault_share`` of the requests the stage plans. Past the share or the
deadline the stage fails with ``LLMOutageError`` and writes nothing, so an outage is never published (nor cached
by DVC) as a result.
"""

from __future__ import annotations

from pydantic import Field

from llmrl.config import Section

__all__ = ["LLMFaultParams"]


class LLMFaultParams(Section):
    timeout_s: float = Field(30.0, gt=0, description="seconds one attempt of a request may take (an endpoint "
                             "that accepts and never answers costs this much per attempt); never more than what is "
                             "left of deadline_s")
    max_retries: int = Field(2, ge=0, description="further attempts of a request after a transient failure "
                             "(connection error, timeout, HTTP 408/409/429/5xx), with exponential backoff")
    deadline_s: float | None = Field(1800.0, gt=0, description="seconds the stage's LLM work may take from its "
                                     "first request, any backend; past it the stage fails with LLMOutageError "
                                     "and writes nothing; null: no deadline")
    max_fault_share: float = Field(0.1, ge=0, le=1, description="share of the stage's planned LLM requests that "
                                   "may fail (after retries; HTTP errors, timeouts, non-completion bodies) and take "
                                   "the recorded fallback; one more and the stage fails with LLMOutageError, "
                                   "writing nothing")
