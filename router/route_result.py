"""What a run of the routing loop (:mod:`router.loop`) ends with: a :class:`RouteResult` —
the answer, or a final call whose answer streams straight through — or :class:`NoAnswer`
when every call failed and the policy had no answer of its own. The gateway renders, bills
and logs these; training scores them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pricing import TokenUsage
from router.policy import CallOutcome, Decision, LoopState


class NoAnswer(Exception):
    """Every call failed and the policy produced no answer of its own."""

    def __init__(self, message: str, state: LoopState) -> None:
        super().__init__(message)
        self.state = state
        self.last_failure = last = _last_failure(state)
        self.error_kind = last.error_kind if last else None
        # What the client is told of retrying: a refusal ends the run, but another call's
        # failure that passes (a 503 before it) leaves asking again worth it; and the wait
        # the failure reported asked for, if its upstream named one.
        self.transient = any(o.transient for o in state.outcomes if not o.ok)
        self.retry_after_s = last.retry_after_s if last else None


def _last_failure(state: LoopState) -> CallOutcome | None:
    """What ended a run without an answer: a router call refused by the budget (which stops
    the loop), else the last failed downstream call."""
    last_router = state.router_calls[-1] if state.router_calls else None
    if last_router is not None and last_router.error_kind == "budget":
        return last_router
    return next((o for o in reversed(state.outcomes) if not o.ok), None)


class RequestTimeout(NoAnswer):
    """The request's deadline passed before the loop finished (calls in flight are cancelled
    and their holds settled; the state keeps every call that completed)."""

    def __init__(self, timeout_s: float, state: LoopState) -> None:
        super().__init__(f"the request did not finish within {timeout_s:g} s", state)
        self.error_kind = "timeout"


class StreamingCall(Protocol):
    """A final call whose answer streams straight through to the client."""

    @property
    def chunks(self) -> AsyncIterator[dict[str, Any]]: ...

    @property
    def model(self) -> str:
        """The pool model answering: the one asked, or the fallback that took over when it
        failed before its first chunk."""
        ...

    def finish(self) -> CallOutcome:
        """The call's outcome, once ``chunks`` is exhausted (or abandoned)."""
        ...

    async def aclose(self) -> None:
        """Give back what the call holds (its concurrency slot, the upstream response),
        read to the end or not; idempotent."""
        ...


@dataclass(slots=True)
class RouteResult:
    state: LoopState
    message: dict[str, Any] | None = None  # the final assistant message (None while streaming)
    response: dict[str, Any] | None = None  # the downstream response the answer came from
    final_model: str | None = None  # pool model that produced the answer; None = the router
    finish_reason: str = "stop"
    stream: StreamingCall | None = None
    fallback_used: bool = False  # max turns reached: best successful answer returned
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def decision(self) -> Decision:
        return self.state.decision

    @property
    def outcomes(self) -> list[CallOutcome]:
        return self.state.outcomes

    @property
    def downstream_cost_micros(self) -> int:
        return sum(o.cost_micros for o in self.state.outcomes)

    @property
    def router_cost_micros(self) -> int:
        return sum(o.cost_micros for o in self.state.router_calls)

    @property
    def cost_micros(self) -> int:
        return self.downstream_cost_micros + self.router_cost_micros

    def usage(self) -> TokenUsage:
        total = TokenUsage()
        for o in (*self.state.router_calls, *self.state.outcomes):
            total = total + o.usage
        return total
