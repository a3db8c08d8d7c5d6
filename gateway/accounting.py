"""Turning a finished request into a ledger row and metric observations."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gateway.ledger.records import CallRecord, RequestRecord
from router.policy import CallOutcome, LoopState
from router.route_result import RouteResult

if TYPE_CHECKING:
    from gateway.hooks import RequestLog
    from gateway.metrics import GatewayMetrics


def _status(o: CallOutcome) -> str:
    if o.ok:
        return "ok"
    return "refused" if _refused(o) else "error"


def _refused(o: CallOutcome) -> bool:
    """A call a budget refused: it was never made, so it is no upstream call."""
    return o.error_kind == "budget"


def _answered(o: CallOutcome) -> bool:
    """The model answered the call: it succeeded, or its stream was cut short after it
    started (the only failed outcome that carries a response). A call that failed outright
    carries how long its attempts took, but that is no answer's duration: its failed
    attempts are counted by the client as upstream errors."""
    return o.ok or o.response is not None


def call_records(request_id: str, state: LoopState | None) -> list[CallRecord]:
    if state is None:
        return []
    return [
        CallRecord(
            request_id=request_id,
            turn=o.turn,
            role=o.role,
            model=o.model or o.call.model,
            status=_status(o),
            error_type=o.error_kind,
            prompt_tokens=o.usage.prompt_tokens,
            completion_tokens=o.usage.completion_tokens,
            cached_tokens=o.usage.cached_tokens,
            reasoning_tokens=o.usage.reasoning_tokens,
            cost_micros=o.cost_micros,
            latency_ms=round(o.latency_ms, 3),
            attempts=o.attempts,
            fallback_from=o.fallback_from,
            fallback_reason=o.fallback_reason,
            deployment=o.deployment,
        )
        for o in (*state.router_calls, *state.outcomes)
    ]


def build_record(
    rlog: RequestLog, result: RouteResult | None, state: LoopState | None
) -> RequestRecord:
    calls = call_records(rlog.request_id, state)
    router = sum(c.cost_micros for c in calls if c.role == "router")
    downstream = sum(c.cost_micros for c in calls if c.role != "router")
    latency = (time.perf_counter() - rlog.t0) * 1000
    decision = state.decision if state is not None and rlog.cached_from is None else None
    return RequestRecord(
        request_id=rlog.request_id,
        created_at=rlog.created_at,
        key_id=rlog.principal.key_id,
        policy=rlog.policy or "unresolved",
        requested_model=rlog.requested_model,
        final_model=result.final_model if result is not None and rlog.status == 200 else None,
        status=rlog.status,
        error_type=rlog.error_type,
        total_cost_micros=router + downstream,
        router_cost_micros=router,
        downstream_cost_micros=downstream,
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        completion_tokens=sum(c.completion_tokens for c in calls),
        latency_ms=round(latency, 3),
        overhead_ms=round(rlog.overhead_ms(result), 3),
        # A cached answer made no routing decision: nothing for off-policy learning.
        cost_weight=decision.cost_weight if decision is not None else None,
        decision=decision.to_dict() if decision is not None else None,
        messages=rlog.messages,
        response_text=rlog.response_text,
        stream=rlog.stream,
        api=rlog.api,
        cached_from=rlog.cached_from,
        end_user=rlog.end_user,
        tags=rlog.tags,
        calls=calls,
    )


def observe(
    metrics: GatewayMetrics,
    rlog: RequestLog,
    result: RouteResult | None,
    state: LoopState | None,
    reference_price: Any,
) -> None:
    """Metric observations for one finished request (labels are bounded inside metrics)."""
    duration = time.perf_counter() - rlog.t0
    final_model = (result.final_model if result is not None else None) or (
        "router" if rlog.status == 200 else "none"
    )
    cost = 0
    reference = 0
    if state is not None:
        for o in (*state.router_calls, *state.outcomes):
            cost += o.cost_micros
            if _refused(o):
                continue  # never made: no tokens, no cost, no duration
            if o.role == "downstream" and o.ok and reference_price is not None:
                reference += reference_price.cost_micros(o.usage)
            metrics.observe_call(
                # The router model's turns under "router" (its configured name is no pool
                # model's, and would be reported as "other").
                model="router" if o.role == "router" else (o.model or o.call.model),
                prompt_tokens=o.usage.prompt_tokens,
                completion_tokens=o.usage.completion_tokens,
                cached_tokens=o.usage.cached_tokens,
                reasoning_tokens=o.usage.reasoning_tokens,
                cost_micros=o.cost_micros,
                duration_s=o.latency_ms / 1000 if _answered(o) else None,
                ttft_s=o.ttft_ms / 1000 if o.ttft_ms is not None else None,
                policy=rlog.policy or "unresolved",
            )
        for action in state.decision.actions:
            metrics.decision(rlog.policy, action)
        copies = state.notes.get("query_copies", 0)
        if copies:
            metrics.query_copied(copies)
        calls = (*state.router_calls, *state.outcomes)  # a router turn may be refused too
        if any(o.error_kind == "budget" for o in calls) and rlog.status == 429:
            metrics.budget_rejected(
                "key" if rlog.error_type == "key_budget_exceeded" else "request"
            )
    metrics.observe_request(
        policy=rlog.policy or "unresolved",
        model=final_model,
        status=rlog.status,
        duration_s=duration,
        overhead_s=rlog.overhead_ms(result) / 1000,
        cost_micros=cost,
        reference_cost_micros=reference if reference_price is not None else None,
        # Calls made: a refused one never reached a model (a request refused outright made 0).
        downstream_calls=(
            sum(1 for o in state.outcomes if not _refused(o)) if state is not None else None
        ),
        api=rlog.api,
    )
