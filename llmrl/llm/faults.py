"""One fault policy for every stage that asks an LLM (``llmrl.config.llm_faults.LLMFaultParams``).

``FaultGuard`` holds a stage's policy and its counts. The remote backends send each request through
``FaultGuard.request`` (each attempt's timeout capped by what is left of the deadline; transient failures retried
with backoff); ``GuardedBackend`` wraps any backend, counts the prompts it is asked and those whose call failed,
and turns the stage's fault share or deadline, once passed, into ``LLMOutageError``. A fault within the share is
re-raised as it came, for the caller's recorded fallback (``llm_fault_types``); ``LLMOutageError`` is not one of
those types, so it ends the stage before anything is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from llmrl.config.llm_faults import LLMFaultParams
from llmrl.llm.generate import Generation, Prompt, SamplingConfig

__all__ = ["LLMOutageError", "MalformedReplyError", "llm_fault_types", "FaultGuard", "GuardedBackend"]

T = TypeVar("T")
BACKOFF_S = 0.5  # first retry's wait; doubled per retry, capped at MAX_BACKOFF_S (the openai client's schedule)
MAX_BACKOFF_S = 8.0
RETRIED_STATUS = (408, 409, 429)  # and every 5xx: what the openai client itself retries


class LLMOutageError(RuntimeError):
    """The LLM failed too often (past the stage's ``max_fault_share``) or too slowly (past its ``deadline_s``)
    for its answers to stand for the stage's result; the stage writes nothing."""


class MalformedReplyError(ConnectionError):
    """The endpoint answered, but not with a completion (an HTML page, an empty choice list): an LLM fault."""


def llm_fault_types() -> tuple[type[BaseException], ...]:
    """The exceptions that are faults of the LLM service, not of this program; callers take their fallback.

    ``openai.APIError`` covers status errors (4xx/5xx, refusals by policy), connection errors and timeouts after
    the retries; ``httpx.HTTPError`` any other transport failure; ``TimeoutError`` / ``ConnectionError`` (with
    ``MalformedReplyError``) the rest. ``LLMOutageError`` is not one: it ends the stage. Neither is an offline
    reply cache's ``CacheMissError``: a run missing a reply is a broken pipeline.
    """
    import httpx
    import openai

    return (TimeoutError, ConnectionError, openai.APIError, httpx.HTTPError)


def _transient(err: BaseException) -> bool:
    """A failure worth another attempt: no connection, no answer in time, or HTTP 408/409/429/5xx."""
    import openai

    if isinstance(err, openai.APIConnectionError):  # APITimeoutError included
        return True
    return isinstance(err, openai.APIStatusError) and (err.status_code in RETRIED_STATUS or err.status_code >= 500)


def _server_delay(err: BaseException) -> float | None:
    """The wait a 429/503 asks for (``retry-after-ms`` / ``retry-after`` seconds), when it names one."""
    headers = getattr(getattr(err, "response", None), "headers", None) or {}
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, TypeError, ValueError):
            continue
    return None


class FaultGuard:
    """One stage's fault policy and counts, shared by every backend the stage asks.

    ``where`` is the policy's key path in params (``props.llm.faults``); every ``LLMOutageError`` names the key
    that ended the stage. The deadline runs from the first request. ``expect(n)`` adds the ``n`` requests a
    caller plans (a fault-free run makes at least that many); the fault share is counted against the planned
    requests, or the requests made when they are more.
    """

    def __init__(self, policy: LLMFaultParams, where: str, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.policy = policy
        self.where = where
        self.clock = clock
        self.sleep = sleep
        self.started: float | None = None
        self.planned = 0
        self.requests = 0
        self.faults = 0
        self.retries = 0
        self.first_fault = ""

    def expect(self, n: int) -> None:
        """Plan ``n`` more requests (the denominator of the fault share)."""
        if n < 0:
            raise ValueError(f"FaultGuard.expect: n must be >= 0, got {n}")
        self.planned += n

    def remaining(self) -> float | None:
        """Seconds left before the deadline (the clock starts at the first request); None without a deadline."""
        if self.started is None:
            self.started = self.clock()
        if self.policy.deadline_s is None:
            return None
        return self.policy.deadline_s - (self.clock() - self.started)

    def check_deadline(self) -> None:
        left = self.remaining()
        if left is not None and left <= 0:
            raise LLMOutageError(
                f"{self.where}.deadline_s: the LLM work passed its {self.policy.deadline_s:g} s after {self.requests} "
                f"requests ({self.faults} failed{self._first()}); the stage writes nothing")

    def request(self, send: Callable[[float], T]) -> T:
        """``send(timeout_s)`` once, and again after each transient failure, up to ``max_retries`` times.

        Each attempt gets ``timeout_s``, or what is left of the deadline when that is less; a retry's backoff
        that would end past the deadline ends the stage instead.
        """
        for attempt in range(self.policy.max_retries + 1):
            self.check_deadline()
            left = self.remaining()
            timeout = self.policy.timeout_s if left is None else min(self.policy.timeout_s, left)
            try:
                return send(timeout)
            except Exception as err:
                if not _transient(err) or attempt == self.policy.max_retries:
                    raise
                delay = _server_delay(err)
                delay = min(BACKOFF_S * 2 ** attempt, MAX_BACKOFF_S) if delay is None or delay > 60 else delay
                left = self.remaining()
                if left is not None and delay >= left:
                    raise LLMOutageError(
                        f"{self.where}.deadline_s: no time left for retry {attempt + 1} of a request that failed "
                        f"({type(err).__name__}: {err}); the stage writes nothing") from err
                self.retries += 1
                self.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def record(self, n: int, fault: BaseException | None = None) -> None:
        """Count ``n`` requests, failed together by ``fault`` when given; past the fault share, ``LLMOutageError``."""
        self.requests += n
        if fault is None:
            return
        self.faults += n
        self.first_fault = self.first_fault or f"{type(fault).__name__}: {fault}"
        allowed = self.policy.max_fault_share * max(self.planned, self.requests)
        if self.faults > allowed:
            raise LLMOutageError(
                f"{self.where}.max_fault_share: {self.faults} of {max(self.planned, self.requests)} planned LLM "
                f"requests failed (more than {self.policy.max_fault_share:.0%}{self._first()}); the stage writes "
                "nothing") from fault

    def _first(self) -> str:
        return f"; first fault: {self.first_fault[:300]}" if self.first_fault else ""


class GuardedBackend:
    """Any backend under a ``FaultGuard``: each ``generate`` call checks the deadline before and after, and counts
    its prompts as requests, all of them failed when the call raises an LLM fault (re-raised for the caller's
    fallback while the share holds, else ``LLMOutageError``)."""

    def __init__(self, backend, guard: FaultGuard):
        self.backend = backend
        self.guard = guard
        self.model_id = backend.model_id
        self._faults = llm_fault_types()

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingConfig) -> list[Generation]:
        self.guard.check_deadline()
        try:
            out = self.backend.generate(prompts, sampling)
        except self._faults as err:
            self.guard.record(len(prompts), err)
            raise
        self.guard.record(len(prompts))
        self.guard.check_deadline()
        return out
