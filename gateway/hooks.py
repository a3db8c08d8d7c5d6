"""What happens around the loop for every request: admission (rate limits, budget guard)
before, and accounting (ledger row, metrics, tpm correction) after."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.errors import STORE_RETRY_AFTER_S, APIError, retry_after_headers
from gateway.limits.base import LimitStoreUnavailable
from router.estimate import estimate_prompt_tokens, requested_max_tokens
from router.policy import LoopState, RouteContext, ToolCall
from router.route_result import RouteResult

if TYPE_CHECKING:
    from gateway.budget_gauges import BudgetGauges
    from gateway.cache import CacheTicket
    from gateway.key_budget_metrics import KeyBudgetSeries
    from gateway.ledger.writer import LedgerWriter
    from gateway.limits.base import KeyLimits, LimitStore, ReserveResult
    from gateway.metrics import GatewayMetrics
    from gateway.principal import Principal
    from pricing.catalog import ModelPrice

log = logging.getLogger(__name__)

KEY_BUDGET = "key budget exhausted"
# Refused while calls in flight hold the rest of the key's budget (their worst cases): the
# budget itself has room, and the holds go as those calls settle.
KEY_BUDGET_HELD = "key budget held by calls in flight"
LIMITS_UNAVAILABLE = "the rate-limit store is unavailable"


def limits_unavailable() -> APIError:
    return APIError(
        503,
        LIMITS_UNAVAILABLE,
        type="server_error",
        code="limits_unavailable",
        headers=retry_after_headers(STORE_RETRY_AFTER_S),
    )


@dataclass(slots=True)
class RequestLog:
    """Everything known about one request, filled in as it goes; becomes the ledger row."""

    request_id: str
    created_at: float
    principal: Principal
    t0: float
    requested_model: str = ""
    policy: str = ""
    status: int = 0
    error_type: str | None = None
    stream: bool = False
    api: str = "chat"  # or "responses", "messages"
    messages: list[Any] | None = None
    response_text: str | None = None
    result: RouteResult | None = None
    result_state: LoopState | None = None
    tokens_estimate: int = 0
    admitted_at: float = 0.0  # when tokens_estimate entered the tpm window
    extra_headers: dict[str, str] = field(default_factory=dict)
    cache: CacheTicket | None = None  # the answer cache's view of this request, if it is on
    cached_from: str | None = None  # answered from the cache: the request that paid for it
    # The request's ``user`` or ``safety_identifier`` (OpenAI) / ``metadata.user_id``.
    end_user: str | None = None
    tags: list[str] | None = None  # ``xrouter.tags``
    slot_held: bool = False  # one of its key's max_parallel slots, freed when it finishes
    finished: bool = False

    def overhead_ms(self, result: RouteResult | None) -> float:
        total = (time.perf_counter() - self.t0) * 1000
        if result is None:
            return total
        # Overhead = wall time not spent waiting on calls. Calls of one turn run in
        # parallel, so count the slowest of each turn.
        per_turn: dict[tuple[str, int], float] = {}
        for o in (*result.state.router_calls, *result.state.outcomes):
            key = (o.role, o.turn)
            per_turn[key] = max(per_turn.get(key, 0.0), o.latency_ms)
        return max(total - sum(per_turn.values()), 0.0)


class Bookkeeping:
    """Runs what must happen once a call or request is over (settling a hold, the ledger
    row, the tpm correction) to completion even when the request's task is cancelled.

    A client that hangs up mid-stream cancels the response task, and the ASGI server's
    cancel scope re-cancels every await in its ``finally`` blocks: a settle waiting on a
    first-use Redis script load, or the ledger submission behind it, would be dropped. Each
    such step runs in a task of its own, shielded from the caller's cancellation and
    tracked here so that shutdown waits for it."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, step: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(step)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        await asyncio.shield(task)

    def spawn(self, step: Coroutine[Any, Any, None]) -> None:
        """Start ``step`` without waiting for it (a metric read back from the store, which
        must not add a round trip to the request); shutdown still waits for it."""
        task = asyncio.get_running_loop().create_task(step)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        # The caller may be gone (cancelled): a failure must still be seen somewhere.
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("bookkeeping step failed", exc_info=exc)

    async def wait_current(self) -> None:
        """Wait for the steps running now (not for ones started meanwhile: under steady
        traffic there always are some)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def drain(self) -> None:
        """Wait for every step still running (shutdown, before the ledger closes)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class KeyBudgetGuard:
    """Reserves each call's worst case against the key's budget, settles with the real cost."""

    def __init__(
        self,
        store: LimitStore,
        limits: KeyLimits,
        request_id: str,
        *,
        alias: str | None = None,
        metrics: GatewayMetrics | None = None,
        bookkeeping: Bookkeeping,
        gauges: BudgetGauges | None = None,
    ) -> None:
        self.store = store
        self.limits = limits
        self.request_id = request_id
        self.alias = alias
        self.metrics = metrics
        self.bookkeeping = bookkeeping
        self.gauges = gauges
        self.rejection: ReserveResult | None = None
        # The store failed (``on_store_error: closed``): every later call is refused without
        # asking it again, and the request ends in a 503, with its ledger row.
        self.unavailable: str | None = None

    async def reserve(self, call: ToolCall, worst_case_micros: int) -> str | None:
        if self.unavailable is not None:
            return self.unavailable
        taking = asyncio.get_running_loop().create_task(
            self.store.reserve(self.limits, None, worst_case_micros, f"{self.request_id}:{call.id}")
        )
        try:
            res = await asyncio.shield(taking)
        except asyncio.CancelledError:
            # The request ended (its client left, its deadline passed) while the store took
            # the hold: the loop never learns it was taken, so nothing would settle it and it
            # would hold the key's budget until it expired (request_timeout_s + 60 s).
            self.bookkeeping.spawn(self._release_when_taken(taking, call, worst_case_micros))
            raise
        except LimitStoreUnavailable:
            # Refused like a call over budget, so the loop settles what it holds, ends the
            # request and keeps the turns already paid for; not raised, which would skip all
            # of that. A reply that timed out may still have taken the hold (the script ran,
            # its answer came late), which would hold the key's budget for a call never made
            # until it expired: release it, as the store allows for a hold never taken, and
            # the failure policy retries the release while the store is down.
            self.bookkeeping.spawn(
                self.store.release(self.limits, f"{self.request_id}:{call.id}", worst_case_micros)
            )
            self.unavailable = f"{LIMITS_UNAVAILABLE}: the call to {call.model} was not made"
            return self.unavailable
        if res.ok:
            # Not the budget gauge: what is left after this hold counts every call in flight
            # as if it spent its worst case. The gauge is read after the settles instead.
            return None
        self.rejection = res
        if res.held_only:
            # Not the budget running out (no refusal counted for its gauge): other calls'
            # worst cases hold what this one needs, and they cost a fraction of it.
            return (
                f"{KEY_BUDGET_HELD}: a call to {call.model} may cost up to "
                f"{worst_case_micros} µUSD and only {res.remaining_micros} µUSD are not held "
                "by the key's other calls in flight (their worst cases); retry when they finish"
            )
        if (export := self._budget_export()) is not None:
            # A key can be refused with a little left (less than this call's worst case),
            # so the gauge alone would not say it is out: count the refusal too.
            export[0].refused(export[1])
            self._refresh_gauge(*export)
        return f"{KEY_BUDGET}: a call to {call.model} may cost up to {worst_case_micros} µUSD, {res.remaining_micros} µUSD remain"

    async def _release_when_taken(
        self, taking: asyncio.Task[ReserveResult], call: ToolCall, worst_case_micros: int
    ) -> None:
        try:
            res = await taking
        except LimitStoreUnavailable:
            return  # nothing was held
        if res.ok:
            await self._settle(call, worst_case_micros, 0)

    async def settle(self, call: ToolCall, reserved_micros: int, actual_micros: int) -> None:
        # Called from the loop's `finally` blocks, often while the request is being cancelled.
        await self.bookkeeping.run(self._settle(call, reserved_micros, actual_micros))

    async def _settle(self, call: ToolCall, reserved_micros: int, actual_micros: int) -> None:
        await self.store.settle(
            self.limits, f"{self.request_id}:{call.id}", reserved_micros, actual_micros
        )
        if (export := self._budget_export()) is not None:
            self._refresh_gauge(*export)

    def _refresh_gauge(self, series: KeyBudgetSeries, alias: str) -> None:
        """Read the key's budget back into its gauge, at most once a second (a refused
        flood or a busy key costs the store one read a second, not one per request)."""
        delay = series.refresh_delay(alias, time.monotonic())
        if delay is not None:
            # Spawned (from the shielded settle step, too), so a cancelled request still
            # refreshes it; not awaited, so the request does not wait on the read. The store
            # runs it after the settle (a write-behind settle is queued ahead of it).
            self.bookkeeping.spawn(self._scheduled_read(series, alias, delay))

    def _budget_export(self) -> tuple[KeyBudgetSeries, str] | None:
        """The budget series and the key alias this key's budget is exported under, if it is."""
        metrics, alias = self.metrics, self.alias
        if metrics is None or not alias or self.limits.budget_micros is None:
            return None
        series = metrics.key_budgets
        return (series, alias) if series.exports(alias) else None

    async def _scheduled_read(self, series: KeyBudgetSeries, alias: str, delay: float) -> None:
        try:
            if delay > 0:
                await asyncio.sleep(delay)
        finally:
            # Before the read: a settle landing while it runs schedules the next one.
            series.refresh_done(alias)
        await self._observe_remaining()

    async def _observe_remaining(self) -> None:
        """Export the key's budget minus its spend in the current period (at least 0, as
        every remaining budget the gateway reports). Holds of calls in flight are not
        deducted: they come back, or become spend, when those calls settle."""
        budget = self.limits.budget_micros
        if self.metrics is None or not self.alias or budget is None:
            return
        try:
            state = await self.store.spent(self.limits)
        except LimitStoreUnavailable:
            return  # the gauge keeps its last reading until the store answers again
        exported = self.metrics.key_budgets.remaining(self.alias, max(budget - state.spent, 0))
        if exported and self.gauges is not None:
            # Kept current from now on between the key's calls here.
            self.gauges.track(self.alias, self.limits.key_id)


class RequestHooks:
    def __init__(
        self,
        *,
        limits: LimitStore | None = None,
        ledger: LedgerWriter | None = None,
        metrics: GatewayMetrics | None = None,
        reference_price: ModelPrice | None = None,
        budget_gauges: BudgetGauges | None = None,
    ) -> None:
        self.limits = limits
        self.ledger = ledger
        self.metrics = metrics
        self.reference_price = reference_price
        self.budget_gauges = budget_gauges
        self.bookkeeping = Bookkeeping()

    async def admit(self, rlog: RequestLog, ctx: RouteContext) -> KeyBudgetGuard | None:
        limits: KeyLimits | None = rlog.principal.limits
        if self.limits is None or limits is None:
            return None
        # As OpenAI and Anthropic count a request against a token rate limit: its prompt
        # and the output it may generate (max_tokens), corrected to what it used when it
        # ends; a request that sets no limit counts its prompt until then.
        params = ctx.request_params
        output = (requested_max_tokens(params) or 0) * int(params.get("n") or 1)
        rlog.tokens_estimate = estimate_prompt_tokens(ctx.messages, None, ctx.tools) + output
        rlog.admitted_at = time.time()
        if limits.max_parallel is not None:
            # Before the rate windows: a request refused here must not use up its key's rpm.
            await self._take_slot(rlog, limits)
        try:
            rate = await self.limits.check_rate(limits, rlog.tokens_estimate, rlog.admitted_at)
        except LimitStoreUnavailable:
            await self._free_slot(rlog, limits)
            raise limits_unavailable() from None
        rlog.extra_headers.update(rate.headers())
        if not rate.allowed:
            await self._free_slot(rlog, limits)
            if self.metrics is not None:
                self.metrics.rate_limited(rate.limit or "rpm")
            raise APIError(
                429,
                f"rate limit exceeded ({rate.limit}) for this key",
                type="rate_limit_exceeded",
                code=f"{rate.limit}_limit_exceeded",
                headers=rate.headers(),
            )
        if limits.budget_micros is None:
            return None
        return KeyBudgetGuard(
            self.limits,
            limits,
            rlog.request_id,
            alias=rlog.principal.alias,
            metrics=self.metrics,
            bookkeeping=self.bookkeeping,
            gauges=self.budget_gauges,
        )

    async def _take_slot(self, rlog: RequestLog, limits: KeyLimits) -> None:
        """One of the key's ``max_parallel`` slots for the request, or a 429."""
        assert self.limits is not None
        try:
            slot = await self.limits.acquire_slot(limits, rlog.request_id, rlog.admitted_at)
        except LimitStoreUnavailable:
            # A reply that timed out may still have taken the slot, which would keep the key
            # at its bound until the slot's TTL: free it (freeing one never taken does
            # nothing, and the failure policy retries while the store is down).
            self.bookkeeping.spawn(self.limits.release_slot(limits, rlog.request_id))
            raise limits_unavailable() from None
        if slot.ok:
            rlog.slot_held = True
            return
        if self.metrics is not None:
            self.metrics.rate_limited("parallel")
        raise APIError(
            429,
            f"too many requests in flight for this key ({slot.in_flight} of its "
            f"{limits.max_parallel}); retry when one has finished",
            type="rate_limit_exceeded",
            code="parallel_limit_exceeded",
            headers={"retry-after": "1"},
        )

    async def _free_slot(self, rlog: RequestLog, limits: KeyLimits) -> None:
        if rlog.slot_held and self.limits is not None:
            rlog.slot_held = False
            await self.limits.release_slot(limits, rlog.request_id)

    def budget_error(
        self, rlog: RequestLog, message: str, guard: KeyBudgetGuard | None
    ) -> APIError:
        """429 for a refused call: the key's budget (with when it resets) or the request's
        own ``max_cost_usd``; 503 when the limit store could not be asked."""
        if guard is not None and guard.unavailable is not None:
            return limits_unavailable()
        rejection = guard.rejection if guard is not None else None
        if rejection is not None and message.startswith((KEY_BUDGET, KEY_BUDGET_HELD)):
            headers: dict[str, str] = {}
            if rejection.remaining_micros is not None:
                remaining = max(rejection.remaining_micros, 0) / 1e6
                headers["x-ratelimit-remaining-budget-usd"] = f"{remaining:.6f}"
            if rejection.held_only:
                # Transient, as a max_parallel refusal is: retried, the call fits once the
                # key's calls in flight settle at what they actually cost.
                headers["retry-after"] = "1"
                return APIError(
                    429,
                    message,
                    type="rate_limit_exceeded",
                    code="key_budget_held",
                    headers=headers,
                )
            # A budget does not come back by retrying at once, and the OpenAI SDKs retry a
            # 429 (ignoring a retry-after over 60 s) unless told not to.
            headers["x-should-retry"] = "false"
            if rejection.resets_at is not None:
                headers["retry-after"] = str(max(int(rejection.resets_at - time.time()) + 1, 1))
            return APIError(
                429, message, type="budget_exceeded", code="key_budget_exceeded", headers=headers
            )
        return APIError(
            429,
            message,
            type="budget_exceeded",
            code="request_budget_exceeded",
            headers={"x-should-retry": "false"},
        )

    async def finish(self, rlog: RequestLog, result: RouteResult | None) -> None:
        """Account for a finished request, exactly once. Never raises: accounting problems
        are logged and counted, they don't turn a served answer into an error."""
        if rlog.finished:
            return
        rlog.finished = True
        if rlog.cache is not None:
            # Identical requests waiting for this one's answer stop waiting now: it was
            # handed to them already (``AnswerCache.store``), or there is none to share —
            # or, if its client hung up (499), one of them buys it for the others.
            rlog.cache.end(client_left=rlog.status == 499)
        await self.bookkeeping.run(self._finish_logged(rlog, result))

    async def _finish_logged(self, rlog: RequestLog, result: RouteResult | None) -> None:
        try:
            await self._finish(rlog, result)
        except Exception:
            log.exception("accounting failed for request %s", rlog.request_id)

    async def _finish(self, rlog: RequestLog, result: RouteResult | None) -> None:
        from gateway.accounting import build_record, observe

        state = result.state if result is not None else rlog.result_state
        # Each step before the ledger row is on its own: a limit store's or a metric's
        # failure is logged, and never costs the request its row (the call was paid for).
        limits = rlog.principal.limits
        if limits is not None:
            # First: the next request of the key may be waiting for the slot.
            await _logged_step("release its slot", rlog, self._free_slot(rlog, limits))
        if self.limits is not None and limits is not None and state is not None:
            used = sum(o.usage.total_tokens for o in (*state.router_calls, *state.outcomes))
            if used != rlog.tokens_estimate:
                # Booked when the estimate was, so the correction leaves the tpm window with
                # it: a refund that outlived its charge would make room for tokens never had.
                correction = self.limits.add_tokens(
                    limits, used - rlog.tokens_estimate, at=rlog.admitted_at or None
                )
                await _logged_step("correct its token count", rlog, correction)
        if self.metrics is not None:
            try:
                observe(self.metrics, rlog, result, state, self.reference_price)
            except Exception:
                log.exception("metrics failed for request %s", rlog.request_id)
        if self.ledger is not None:
            record = build_record(rlog, result, state)
            await self.ledger.submit_durable(record)


async def _logged_step(what: str, rlog: RequestLog, step: Awaitable[None]) -> None:
    try:
        await step
    except Exception:
        log.exception("accounting: could not %s for request %s", what, rlog.request_id)
