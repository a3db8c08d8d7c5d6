"""In-process limit store: the embedded default (one worker, no Redis).

Same semantics as the Redis store, statement for statement (see ``gateway.limits.lua`` for the
algorithm notes): sliding-window logs for rpm/tpm summed per tick, as on Redis
(``gateway.limits.memory_rate``), holds with deadlines swept on every budget operation (at most
256 a call, earliest first, as on Redis), spend counters keyed by period id.

No lock: the store is used from one event loop, and no method awaits between reading and
writing its state, so each method runs atomically with respect to every other coroutine. It is
*not* shared between processes; with several workers, use the Redis backend (each worker here
would enforce the full limit on its own).
"""

from __future__ import annotations

import bisect
import heapq
import time
from dataclasses import dataclass, field
from operator import itemgetter

from gateway.limits.base import (
    ALLOW_ALL,
    HOLD_SWEEP_LIMIT,
    SLOT_FREE,
    BudgetState,
    KeyLimits,
    LimitStore,
    RateCounts,
    RateLimitName,
    RateResult,
    ReserveResult,
    SlotResult,
    validate_amount,
)
from gateway.limits.memory_rate import TickLog, gone_in
from gateway.limits.windows import (
    RATE_WINDOW_S,
    PeriodCache,
    PeriodWindow,
    token_correction_times,
)

DEFAULT_HOLD_TTL_S = 900.0


# Dead heap entries tolerated beyond twice the live ones before a heap is rebuilt.
_COMPACT_SLACK = 64
_DEADLINE = itemgetter(0)


@dataclass(slots=True)
class _RateLog:
    requests: TickLog = field(default_factory=TickLog)  # weight 1 a request
    tokens: TickLog = field(default_factory=TickLog)

    def sweep(self, now: float) -> None:
        cutoff = now - RATE_WINDOW_S  # an entry at t counts while now < t + window
        self.requests.sweep(cutoff)
        self.tokens.sweep(cutoff)


@dataclass(slots=True)
class _BudgetScope:
    """One key's holds and spend (or the shared scope of requests without a key)."""

    held: dict[str, int] = field(default_factory=dict)  # reservation id -> micro-USD held
    deadline: dict[str, float] = field(default_factory=dict)  # reservation id -> hold deadline
    # (deadline, id) of every hold, sorted, one entry a hold: the expired are a prefix
    deadlines: list[tuple[float, str]] = field(default_factory=list)
    reserved: int = 0
    spent: dict[str, tuple[int, float | None]] = field(
        default_factory=dict
    )  # period -> (µ$, expiry)
    req_spent: dict[str, tuple[int, float]] = field(default_factory=dict)  # id -> (µ$, expiry)
    req_expiries: list[tuple[float, str]] = field(default_factory=list)  # heap, lazily pruned

    def sweep(self, now: float) -> None:
        """Free the expired holds, at most ``HOLD_SWEEP_LIMIT`` a call, earliest deadline first
        (ties by reservation id): what the Redis scripts' ``ZRANGEBYSCORE ... LIMIT 0 256``
        frees, so both stores give the same answers. Unbounded, the first call after a mass
        failure (50,000 holds expiring together) popped them all in Python on the event loop,
        57-150 ms during which the worker served nothing; until swept, an expired hold still
        counts against the budget, which is only conservative for a few more calls.

        The holds are a sorted list, not a heap with dead entries left by settled holds: those
        had to be popped too before the live ones behind them (70 ms for 100,000 of them in
        front of 50,000 expired holds), and bounding them as well would have freed fewer holds
        than Redis does. Reserving a hold with the latest deadline appends it; a settle or a
        sweep is one bisection and one move of the list's tail, in C."""
        limit = min(HOLD_SWEEP_LIMIT, len(self.deadlines))
        expired = bisect.bisect_right(self.deadlines, now, hi=limit, key=_DEADLINE)
        for _, rid in self.deadlines[:expired]:
            del self.deadline[rid]
            self.reserved -= self.held.pop(rid)
        del self.deadlines[:expired]
        # Spend tracked for a request's cap: reads check the expiry themselves (a Redis key
        # that expired reads as nothing), so this sweep only reclaims memory and may stop at
        # any point without changing an answer.
        heap = self.req_expiries
        for _ in range(HOLD_SWEEP_LIMIT):
            if not heap or heap[0][0] > now:
                break
            when, rid = heapq.heappop(heap)
            entry = self.req_spent.get(rid)
            if entry is not None and entry[1] == when:
                del self.req_spent[rid]

    def set_deadline(self, rid: str, deadline: float | None) -> None:
        """Give a hold its (new) deadline, or None once it is settled in full."""
        old = self.deadline.pop(rid, None)
        if old is not None:
            at = bisect.bisect_left(self.deadlines, (old, rid))
            del self.deadlines[at]  # there: one entry a hold, and the floats are the same
        if deadline is not None:
            self.deadline[rid] = deadline
            bisect.insort(self.deadlines, (deadline, rid))

    def request_spent(self, rid: str, now: float) -> tuple[int, float] | None:
        """A capped request's (spend, expiry), or None once it expired, swept yet or not."""
        entry = self.req_spent.get(rid)
        return None if entry is None or entry[1] <= now else entry

    def compact(self) -> None:
        """Rebuild the request-spend heap once its entries are mostly dead. A capped request's
        spend leaves one behind per settle until its expiry (request_timeout_s + 60 s), so a
        busy key's heap would hold every call of the last 11 minutes (176 bytes each: 115 MB
        at 1,000 calls a second); rebuilt once the dead outnumber the live twice over, it
        stays proportional to what is in flight, at amortized O(1) a call."""
        if len(self.req_expiries) > 2 * len(self.req_spent) + _COMPACT_SLACK:
            self.req_expiries = [(exp, rid) for rid, (_, exp) in self.req_spent.items()]
            heapq.heapify(self.req_expiries)

    def spent_in(self, period_id: str) -> int:
        entry = self.spent.get(period_id)
        return 0 if entry is None else entry[0]

    def add_spent(self, period_id: str, amount: int, expires_at: float | None, now: float) -> None:
        self.spent[period_id] = (self.spent_in(period_id) + amount, expires_at)
        if len(self.spent) > 1:  # a period rolled over: drop counters past their grace time
            for pid, (_, exp) in list(self.spent.items()):
                if exp is not None and exp <= now:
                    del self.spent[pid]


class MemoryLimitStore(LimitStore):
    def __init__(self, *, hold_ttl_s: float = DEFAULT_HOLD_TTL_S) -> None:
        if hold_ttl_s <= 0:
            raise ValueError("hold_ttl_s must be > 0")
        self.hold_ttl_s = hold_ttl_s
        self._periods = PeriodCache()
        self._rates: dict[str, _RateLog] = {}
        self._scopes: dict[str, _BudgetScope] = {}
        self._anonymous = _BudgetScope()  # requests without a key: only the per-request cap
        # Parallel requests: key id -> {request id: when its slot expires}.
        self._slots: dict[str, dict[str, float]] = {}
        # Counters live and die with this process: a new store knows nothing the ledger does.
        self._restored = False

    def _scope(self, limits: KeyLimits | None) -> _BudgetScope:
        if limits is None:
            return self._anonymous
        scope = self._scopes.get(limits.key_id)
        if scope is None:
            scope = self._scopes[limits.key_id] = _BudgetScope()
        return scope

    # -- rate limits -------------------------------------------------------------------------

    async def check_rate(
        self, limits: KeyLimits, tokens_estimate: int, now: float | None = None
    ) -> RateResult:
        validate_amount("tokens_estimate", tokens_estimate)
        rpm, tpm = limits.rpm, limits.tpm
        if rpm is None and tpm is None:
            return ALLOW_ALL
        now = time.time() if now is None else now
        log = self._rates.get(limits.key_id)
        if log is None:
            log = self._rates[limits.key_id] = _RateLog()
        log.sweep(now)
        requests = log.requests.total if rpm is not None else 0
        used = max(0, log.tokens.total) if tpm is not None else 0

        reason: RateLimitName | None = None
        retry: float | None = 0.0  # None: never fits
        if rpm is not None and requests + 1 > rpm:
            reason = "rpm"
            # the request fits once the (requests - rpm + 1) oldest have left; rpm 0: never
            oldest_needed = log.requests.left_by(requests - rpm + 1) if rpm > 0 else None
            retry = None if oldest_needed is None else gone_in(oldest_needed, now)
        if tpm is not None and used + tokens_estimate > tpm:
            reason = reason or "tpm"
            # A refund is booked at its request's admission time, beside the estimate it
            # corrects, and the two leave the window together: only whole timestamps free
            # room (an estimate counted without its refund promised room that was not there).
            freed_at = None
            if tokens_estimate <= tpm and retry is not None:
                freed_at = log.tokens.left_by(used + tokens_estimate - tpm)
            retry = (
                None if retry is None or freed_at is None else max(retry, gone_in(freed_at, now))
            )

        if reason is None:
            if rpm is not None:
                log.requests.add(now, 1)
                requests += 1
            if tpm is not None and tokens_estimate:
                log.tokens.add(now, tokens_estimate)
                used += tokens_estimate
        return RateCounts(
            allowed=reason is None,
            limit=reason,
            requests=requests,
            reset_requests_s=log.requests.reset_s(now),
            tokens=used,
            reset_tokens_s=log.tokens.reset_s(now),
            retry_after_s=retry,
        ).to_result(limits)

    async def add_tokens(
        self,
        limits: KeyLimits,
        tokens: int,
        now: float | None = None,
        *,
        at: float | None = None,
    ) -> None:
        times = None if limits.tpm is None or tokens == 0 else token_correction_times(now, at)
        if times is None:
            return
        now, at = times
        log = self._rates.get(limits.key_id)
        if log is None:
            log = self._rates[limits.key_id] = _RateLog()
        log.sweep(now)
        log.tokens.add(at, tokens)

    # -- parallel requests -------------------------------------------------------------------

    async def acquire_slot(
        self, limits: KeyLimits, request_id: str, now: float | None = None
    ) -> SlotResult:
        if limits.max_parallel is None:
            return SLOT_FREE
        now = time.time() if now is None else now
        slots = self._slots.setdefault(limits.key_id, {})
        for rid in [r for r, expiry in slots.items() if expiry <= now]:
            del slots[rid]  # a dead worker's, or a request that never said it ended
        if request_id not in slots and len(slots) >= limits.max_parallel:
            return SlotResult(ok=False, in_flight=len(slots))
        slots[request_id] = now + self.hold_ttl_s
        return SlotResult(ok=True, in_flight=len(slots))

    async def release_slot(self, limits: KeyLimits, request_id: str) -> None:
        slots = self._slots.get(limits.key_id)
        if slots is not None:
            slots.pop(request_id, None)
            if not slots:
                del self._slots[limits.key_id]

    # -- budgets -----------------------------------------------------------------------------

    async def reserve(
        self,
        limits: KeyLimits | None,
        request_budget_micros: int | None,
        amount_micros: int,
        reservation_id: str,
        now: float | None = None,
    ) -> ReserveResult:
        validate_amount("amount_micros", amount_micros)
        if limits is None and request_budget_micros is None:
            return ReserveResult(ok=True)
        now = time.time() if now is None else now
        budget = None if limits is None else limits.budget_micros
        period = self._periods.window(None if limits is None else limits.budget_period, now)
        resets_at = period.end if budget is not None else None
        scope = self._scope(limits)
        scope.sweep(now)

        key_left = None
        if budget is not None:
            key_left = budget - scope.spent_in(period.id) - scope.reserved
        req_left = None
        if request_budget_micros is not None:
            tracked = scope.request_spent(reservation_id, now)
            req_spent = 0 if tracked is None else tracked[0]
            req_left = request_budget_micros - req_spent - scope.held.get(reservation_id, 0)

        if key_left is not None and amount_micros > key_left:
            held_only = scope.reserved > 0 and amount_micros <= key_left + scope.reserved
            return ReserveResult(
                False, "budget", max(0, key_left), _floor0(req_left), resets_at, held_only
            )
        if req_left is not None and amount_micros > req_left:
            return ReserveResult(
                False, "request_budget", _floor0(key_left), max(0, req_left), resets_at
            )

        scope.held[reservation_id] = scope.held.get(reservation_id, 0) + amount_micros
        scope.reserved += amount_micros
        deadline = now + self.hold_ttl_s
        scope.set_deadline(reservation_id, deadline)
        if request_budget_micros is not None:
            # Track this request's spend for its cap. Only capped requests are tracked, so
            # the common case costs no per-request state beyond the hold itself.
            tracked = scope.request_spent(reservation_id, now)
            spent = 0 if tracked is None else tracked[0]
            scope.req_spent[reservation_id] = (spent, deadline)
            heapq.heappush(scope.req_expiries, (deadline, reservation_id))
        return ReserveResult(
            ok=True,
            remaining_micros=_floor0(None if key_left is None else key_left - amount_micros),
            request_remaining_micros=_floor0(
                None if req_left is None else req_left - amount_micros
            ),
            resets_at=resets_at,
        )

    async def settle(
        self,
        limits: KeyLimits | None,
        reservation_id: str,
        reserved_micros: int,
        actual_micros: int,
        now: float | None = None,
    ) -> None:
        validate_amount("reserved_micros", reserved_micros)
        validate_amount("actual_micros", actual_micros)
        now = time.time() if now is None else now
        scope = self._scope(limits)
        scope.sweep(now)
        held = scope.held.get(reservation_id)
        if held is not None:  # None: never held, or already swept when its TTL ran out
            release = min(reserved_micros, held)
            if held - release <= 0:
                del scope.held[reservation_id]
                scope.set_deadline(reservation_id, None)
            else:
                scope.held[reservation_id] = held - release
            scope.reserved -= release
        if actual_micros:
            if limits is not None:
                period = self._periods.window(limits.budget_period, now)
                expires = period.counter_ttl_s(now)
                scope.add_spent(
                    period.id, actual_micros, None if expires is None else now + expires, now
                )
            tracked = scope.request_spent(reservation_id, now)
            if tracked is not None:
                expiry = now + self.hold_ttl_s
                scope.req_spent[reservation_id] = (tracked[0] + actual_micros, expiry)
                heapq.heappush(scope.req_expiries, (expiry, reservation_id))
        scope.compact()

    async def release(
        self,
        limits: KeyLimits | None,
        reservation_id: str,
        reserved_micros: int,
        now: float | None = None,
    ) -> None:
        await self.settle(limits, reservation_id, reserved_micros, 0, now)

    async def spent(self, limits: KeyLimits, now: float | None = None) -> BudgetState:
        now = time.time() if now is None else now
        period = self._periods.window(limits.budget_period, now)
        scope = self._scope(limits)
        scope.sweep(now)
        spent = scope.spent_in(period.id)
        remaining = None
        if limits.budget_micros is not None:
            remaining = max(0, limits.budget_micros - spent - scope.reserved)
        return BudgetState(
            spent=spent,
            reserved=scope.reserved,
            remaining=remaining,
            period_start=period.start,
            resets_at=period.end,
        )

    async def restore_spent(
        self, limits: KeyLimits, period: PeriodWindow, micros: int, now: float | None = None
    ) -> int:
        validate_amount("micros", micros)
        now = time.time() if now is None else now
        scope = self._scope(limits)
        current = scope.spent_in(period.id)
        if micros > current:
            ttl = period.counter_ttl_s(now)
            scope.spent[period.id] = (micros, None if ttl is None else now + ttl)
            return micros
        return current

    async def spend_restored(self) -> bool:
        return self._restored

    async def mark_spend_restored(self) -> None:
        self._restored = True

    async def ping(self) -> bool:
        return True

    async def aclose(self) -> None:
        self._rates.clear()
        self._scopes.clear()


def _floor0(value: int | None) -> int | None:
    return None if value is None else max(0, value)
