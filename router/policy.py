"""The policy interface shared by every router (llm, compact, baselines).

A policy drives the orchestration loop one *step* at a time. At each step it sees the
request context and the loop state (what was called, what came back, what was spent) and
returns one of:

- ``Answer``: the router's own text is the final answer (a direct answer or a synthesis);
- ``Call``: call one or more pool models in parallel (``final=True`` on a single call means
  "that model's answer is the response", which lets the gateway stream it straight through);
- ``Select``: the answer of an earlier call, by tool_call_id, is the response.

Every choice a policy makes is recorded in ``LoopState.decision`` with its propensity (the
probability the policy gave it), because off-policy learning from logged traffic needs it.
"""

from __future__ import annotations

import abc
import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from pricing import TokenUsage
from router.pool import ModelPool
from router.providers.errors import ProviderError, retry_after_s


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A request to call one pool model (``call_<model>`` in the tool schema)."""

    id: str
    model: str
    system_prompt: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    synthesized: bool = False
    # Why the answer ended ("length": the writer's token cap cut it) and a refusal in place
    # of (or beside) text, as an OpenAI assistant message carries one.
    finish_reason: str = "stop"
    refusal: str | None = None


@dataclass(frozen=True, slots=True)
class Call:
    calls: tuple[ToolCall, ...]
    final: bool = False


@dataclass(frozen=True, slots=True)
class Select:
    tool_call_id: str


Step = Answer | Call | Select


@dataclass(frozen=True, slots=True)
class RouteContext:
    """What a policy knows about the request. Immutable for the request's lifetime."""

    request_id: str
    messages: list[dict[str, Any]]
    pool: ModelPool
    cost_weight: float
    max_cost_micros: int | None = None
    max_turns: int = 4
    tools: list[dict[str, Any]] | None = None
    request_params: dict[str, Any] = field(default_factory=dict)


# The error kind of a call the request stopped waiting for because its client left: the
# call neither failed nor answered, so it says nothing about the model.
CANCELLED = "cancelled"
# A call the request's own deadline cut (``server.request_timeout_s``): the model did not
# answer in the time the request had left, which is what a per-model timeout books too.
TIMEOUT = "timeout"


@dataclass(slots=True)
class CallOutcome:
    """The result of one downstream (or router) call inside the loop."""

    call: ToolCall
    turn: int
    ok: bool
    role: str = "downstream"  # or "router"
    model: str = ""  # the pool model that actually answered (differs after a fallback)
    message: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost_micros: int = 0
    latency_ms: float = 0.0
    ttft_ms: float | None = None  # streamed calls: time to the first chunk
    error: str | None = None
    error_kind: str | None = None
    attempts: int = 1
    fallback_from: str | None = None
    # Why the call left the model asked for (``fallback_from``; ``call.model`` for a call
    # that went on to a fallback and ended on the model asked for, its fallbacks skipped):
    # that model's first error, ``circuit_open`` when it was never called
    # (``DownstreamClient``'s ``fallback_reason``). None: the call never went on to a
    # fallback.
    fallback_reason: str | None = None
    deployment: str | None = None  # the model's deployment that answered, if it has several
    # A failed call's: whether asking again later may succeed (``ProviderError.transient``)
    # and how long its upstream asked to be left alone (``retry-after``), which the
    # gateway passes on to a client it answers with the failure.
    transient: bool = False
    retry_after_s: float | None = None

    @classmethod
    def failed(
        cls,
        call: ToolCall,
        turn: int,
        started: float,
        error: str,
        error_kind: str,
        attempts: int = 1,
        role: str = "downstream",
    ) -> CallOutcome:
        """A call that ended without an answer, with how long it ran since ``started``
        (``time.perf_counter()``): its time is the call's, not the request's overhead."""
        return cls(
            call=call,
            turn=turn,
            ok=False,
            role=role,
            model=call.model,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            error=error,
            error_kind=error_kind,
            attempts=attempts,
        )

    @classmethod
    def provider_failed(
        cls, call: ToolCall, turn: int, started: float, err: ProviderError
    ) -> CallOutcome:
        """A call the provider layer gave up on (``err``, from ``DownstreamClient``), as
        :meth:`failed` books one, with what the error says of retrying it."""
        out = cls.failed(call, turn, started, err.message, err.kind, err.attempts)
        if err.model and err.model != call.model:
            # The chain went on to a fallback and the error is that fallback's: the row names
            # the model that failed with it, and the model asked for as ``fallback_from``, as
            # for a fallback that answered or was given up on (it named the model asked for
            # with another's error, which a count of errors by model misread).
            out.model = err.model
            out.fallback_from = call.model
        out.deployment = err.deployment  # of the model that failed last: ``out.model``
        out.transient = err.transient
        out.retry_after_s = retry_after_s(err)
        # The error may be a fallback's: the reason says whether the model asked for was
        # called at all.
        out.fallback_reason = err.fallback_reason
        return out

    @property
    def text(self) -> str:
        if not self.message:
            return ""
        content = self.message.get("content")
        return content if isinstance(content, str) else ""


@dataclass(slots=True)
class Decision:
    """What the policy did and with which probabilities (for off-policy learning)."""

    policy: str
    cost_weight: float
    feature_version: str | None = None
    # The content version of the checkpoint that decided (checkpoint-served policies), so
    # logged traffic says which deployed router made each decision.
    checkpoint: str | None = None
    actions: list[str] = field(default_factory=list)
    # None: the policy cannot say (an LLM router sampling at temperature > 0).
    propensities: list[float | None] = field(default_factory=list)
    distribution: dict[str, float] | None = None
    explored: bool = False

    def record(
        self,
        action: str,
        propensity: float | None,
        distribution: dict[str, float] | None = None,
    ) -> None:
        self.actions.append(action)
        self.propensities.append(None if propensity is None else float(propensity))
        if distribution is not None and self.distribution is None:
            self.distribution = distribution

    @property
    def propensity(self) -> float | None:
        """The joint probability of the whole action sequence (None if one is unknown)."""
        p = 1.0
        for q in self.propensities:
            if q is None:
                return None
            p *= q
        return p

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "cost_weight": self.cost_weight,
            "feature_version": self.feature_version,
            "checkpoint": self.checkpoint,
            "actions": list(self.actions),
            "propensities": list(self.propensities),
            "propensity": self.propensity,
            "distribution": self.distribution,
            "explored": self.explored,
        }


@dataclass(slots=True)
class LoopState:
    """Everything that happened so far in one request."""

    decision: Decision
    turn: int = 0
    outcomes: list[CallOutcome] = field(default_factory=list)
    router_calls: list[CallOutcome] = field(default_factory=list)
    # The router model's own transcript (the llm policy appends its turns and tool results).
    transcript: list[dict[str, Any]] = field(default_factory=list)
    spent_micros: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    # The request's deadline while the routing runs under one (``Orchestrator.run``).
    deadline: asyncio.Timeout | None = None

    def abandoned(self) -> tuple[str, str]:
        """Why a call in flight was given up on (error text, kind) when the request is
        cancelled: its deadline passed, or its client left."""
        if self.deadline is not None and self.deadline.expired():
            return "the request's deadline passed before the call answered", TIMEOUT
        return "the client left before the call answered", CANCELLED

    def outcome(self, tool_call_id: str) -> CallOutcome | None:
        for o in self.outcomes:
            if o.call.id == tool_call_id:
                return o
        return None

    def successful(self) -> list[CallOutcome]:
        return [o for o in self.outcomes if o.ok]


class Policy(abc.ABC):
    """A routing policy. Implementations must be safe to share across concurrent requests:
    per-request state lives in ``LoopState``, never on the policy."""

    name: str = "policy"
    feature_version: str | None = None

    @abc.abstractmethod
    async def step(self, ctx: RouteContext, state: LoopState) -> Step:
        """Return the next step. Called once per turn until it returns Answer or Select, or a
        Call with ``final=True`` has completed."""

    def router_call(self, ctx: RouteContext, state: LoopState) -> tuple[ToolCall, int] | None:
        """The router-model call the next ``step`` will make, with its worst-case cost in
        micro-USD, so the loop can hold it against the caller's budget first (and settle it
        with the call's real cost after). None (the default): the step calls no paid model
        itself. The call's id must be the one its ``CallOutcome`` in ``router_calls`` gets."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources (HTTP sessions, thread pools)."""
