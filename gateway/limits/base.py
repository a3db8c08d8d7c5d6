"""The limit-store interface: per-key rate limits (rpm/tpm), parallel requests and spend
budgets.

Two backends implement it with the same semantics and pass the same test suite:
``MemoryLimitStore`` (one process, the embedded default) and ``RedisLimitStore`` (shared by
every worker and replica; each check is one atomic Lua script). ``FailPolicyStore`` wraps
either to decide what happens when the backend is unreachable.

Money is integer micro-USD throughout (see ``pricing.money``); time is Unix seconds. Every
method takes an optional ``now`` so tests and replays can drive the clock; production
callers leave it ``None`` (the store reads ``time.time()``).

Budget model. A request first *reserves* its worst-case cost; the reservation succeeds only
if ``spent + reserved + amount <= budget`` for the key's current period, so concurrent
requests can never jointly commit more than the budget. After the call the request
*settles*: the hold is released and the real cost is added to spend (the real cost is
always recorded, even above the hold; a hold that underestimated is the only way spend can
pass the budget, by at most that request's excess). ``reservation_id`` names the *request*:
the gateway may reserve several times under one id (one hold per downstream call) and settle
or release each part with the amount it reserved; the optional per-request cap is checked
against everything that id has held and spent so far.

Holds expire. A worker that dies mid-request never settles, so every hold carries a deadline
(``hold_ttl_s`` after its last reservation) and the stores sweep expired holds on every
budget operation; the budget they blocked comes back by itself. Settling a hold that has
already expired releases nothing (it was released by the sweep) but still records the cost.
Choose ``hold_ttl_s`` above the longest a request may run (the server's request timeout).

Parallel requests. ``acquire_slot`` admits a request only while fewer than the key's
``max_parallel`` hold a slot; ``release_slot`` frees it when the request has ended. Slots
expire ``hold_ttl_s`` after they are taken, as holds do, so a worker that dies mid-request
does not keep its key's slots taken for good.

Bookkeeping that fails is sent again. A settle, release or slot release that the backend did
not confirm (unreachable, restarting, reply lost) is reported with a ``PendingWrite`` that
sends exactly the same write once more; ``FailPolicyStore`` keeps those in a bounded queue
and retries them, oldest first, with backoff until the store answers. A resent write must be
idempotent (the first attempt may have run and only its reply been lost): the Redis store
marks each settle applied, so a settle never counts twice.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from gateway.errors import retry_after_headers
from gateway.limits.windows import BudgetPeriod, PeriodWindow

logger = logging.getLogger(__name__)

RateLimitName = Literal["rpm", "tpm"]
BudgetLimitName = Literal["budget", "request_budget"]
FailMode = Literal["closed", "open"]

STORE_UNAVAILABLE = "store_unavailable"
# Expired budget holds one call frees at most, earliest deadline first, in either store: a
# mass failure (every worker gone at once) then costs each later call a bounded time, and
# until the rest are freed the budget is merely conservative.
HOLD_SWEEP_LIMIT = 256


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A bookkeeping write the backend did not confirm, and how to send it again.

    ``resend`` sends the very same write (awaiting its reply) and must be idempotent: the
    first attempt may have run with only its reply lost. ``deadline`` (``time.monotonic()``)
    is when resending stops being safe or useful (the store forgets that it applied the write,
    or what it releases has expired by itself). ``spend``: giving up on it leaves recorded
    spend out of the counters (``LimitStore.spend_writes_lost``)."""

    op: str
    resend: Callable[[], Awaitable[object]]
    deadline: float
    spend: bool


class LimitStoreUnavailable(RuntimeError):
    """The backend could not be reached or did not answer in time. ``pending`` is set when
    the failed operation was a bookkeeping write that can be sent again."""

    def __init__(self, message: str, pending: PendingWrite | None = None) -> None:
        super().__init__(message)
        self.pending = pending


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """What one API key is allowed. ``None`` means "no limit" for that dimension.

    A budget without a period is a lifetime ("total") budget."""

    key_id: str
    budget_micros: int | None = None
    budget_period: BudgetPeriod | None = None
    rpm: int | None = None
    tpm: int | None = None
    # Requests of the key being answered at once (LiteLLM's max_parallel_requests).
    max_parallel: int | None = None

    def __post_init__(self) -> None:
        if not self.key_id:
            raise ValueError("key_id must be non-empty")
        for name in ("budget_micros", "rpm", "tpm", "max_parallel"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")


def _duration(seconds: float) -> str:
    """OpenAI-style duration for ``x-ratelimit-reset-*`` ("120ms", "7.5s", "1m0s")."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, secs = divmod(seconds, 60)
    secs_text = f"{secs:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{secs_text}s" if minutes else f"{secs_text}s"


@dataclass(frozen=True, slots=True)
class RateResult:
    """Outcome of ``check_rate``. Remaining counts are *after* this request when allowed.

    ``reset_*_s`` is the time until that window is empty again; ``retry_after_s`` (only on
    rejection) is the time until this request would fit, or ``None`` when it never can (its
    token estimate alone exceeds the tpm limit)."""

    allowed: bool
    limit: RateLimitName | None = None
    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float | None = None
    retry_after_s: float | None = None

    def headers(self) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers OpenAI clients understand, plus ``retry-after`` and
        ``retry-after-ms`` (honoured by the openai SDKs' backoff) on rejection."""
        h: dict[str, str] = {}
        if self.limit_requests is not None:
            h["x-ratelimit-limit-requests"] = str(self.limit_requests)
            h["x-ratelimit-remaining-requests"] = str(self.remaining_requests or 0)
            h["x-ratelimit-reset-requests"] = _duration(self.reset_requests_s or 0.0)
        if self.limit_tokens is not None:
            h["x-ratelimit-limit-tokens"] = str(self.limit_tokens)
            h["x-ratelimit-remaining-tokens"] = str(self.remaining_tokens or 0)
            h["x-ratelimit-reset-tokens"] = _duration(self.reset_tokens_s or 0.0)
        if not self.allowed and self.retry_after_s is not None:
            h.update(retry_after_headers(self.retry_after_s))
        elif not self.allowed:
            # Never fits (more tokens than the key's tpm): waiting cannot help, so the
            # OpenAI SDKs are told not to retry it, as for a budget.
            h["x-should-retry"] = "false"
        return h


ALLOW_ALL = RateResult(allowed=True)


@dataclass(frozen=True, slots=True)
class RateCounts:
    """What a backend measured for one rate check; both backends produce exactly this and
    share ``to_result`` so their answers can't drift apart."""

    allowed: bool
    limit: RateLimitName | None
    requests: int  # requests in the window (after this one, if allowed)
    reset_requests_s: float
    tokens: int  # tokens in the window (after this one, if allowed)
    reset_tokens_s: float
    retry_after_s: float | None  # only meaningful when rejected; None = never fits

    def to_result(self, limits: KeyLimits) -> RateResult:
        rpm, tpm = limits.rpm, limits.tpm
        return RateResult(
            allowed=self.allowed,
            limit=self.limit,
            limit_requests=rpm,
            remaining_requests=None if rpm is None else max(0, rpm - self.requests),
            reset_requests_s=None if rpm is None else self.reset_requests_s,
            limit_tokens=tpm,
            remaining_tokens=None if tpm is None else max(0, tpm - self.tokens),
            reset_tokens_s=None if tpm is None else self.reset_tokens_s,
            retry_after_s=None if self.allowed else self.retry_after_s,
        )


@dataclass(frozen=True, slots=True)
class ReserveResult:
    """Outcome of ``reserve``.

    ``remaining_micros`` is the key's budget left in the period (after this hold when ``ok``,
    what was available when rejected; ``None`` if the key has no budget).
    ``request_remaining_micros`` is the same for the per-request cap. ``limit`` names the
    limit that rejected. ``resets_at`` is when the key's budget period ends (None: never).
    ``held_only``: the key's budget refused only because calls in flight hold part of it
    (their worst cases): the amount fits what the period has not spent, so the call may
    go through once they settle — not the budget running out."""

    ok: bool
    limit: BudgetLimitName | None = None
    remaining_micros: int | None = None
    request_remaining_micros: int | None = None
    resets_at: float | None = None
    held_only: bool = False


@dataclass(frozen=True, slots=True)
class SlotResult:
    """Outcome of ``acquire_slot``: whether the request got a slot, and how many of the
    key's requests hold one (this one included when it got one)."""

    ok: bool
    in_flight: int = 0


SLOT_FREE = SlotResult(ok=True)


@dataclass(frozen=True, slots=True)
class BudgetState:
    """A key's budget in its current period, all in micro-USD. ``remaining`` is None when
    the key has no budget; ``period_start``/``resets_at`` are None for lifetime budgets."""

    spent: int
    reserved: int
    remaining: int | None
    period_start: float | None
    resets_at: float | None


class LimitStore(ABC):
    """Rate limits and budgets for API keys. All methods are coroutines and never block the
    event loop. Backend failures raise ``LimitStoreUnavailable``."""

    @abstractmethod
    async def check_rate(
        self, limits: KeyLimits, tokens_estimate: int, now: float | None = None
    ) -> RateResult:
        """Count one request in the rpm window and ``tokens_estimate`` in the tpm window if
        both fit (atomically: either both are counted or neither)."""

    @abstractmethod
    async def add_tokens(
        self,
        limits: KeyLimits,
        tokens: int,
        now: float | None = None,
        *,
        at: float | None = None,
    ) -> None:
        """Correct the tpm window once real usage is known: pass ``actual - estimate``.
        Positive charges the window, negative refunds an overestimate. ``at`` is when the
        estimate was counted (default: now): the correction is booked then, so it leaves the
        window with the estimate, and is dropped if that has already left."""

    @abstractmethod
    async def acquire_slot(
        self, limits: KeyLimits, request_id: str, now: float | None = None
    ) -> SlotResult:
        """Take one of the key's ``max_parallel`` slots for ``request_id``, or refuse
        without taking anything when all are held."""

    @abstractmethod
    async def release_slot(self, limits: KeyLimits, request_id: str) -> None:
        """Free ``request_id``'s slot (nothing if it holds none, or it expired)."""

    @abstractmethod
    async def reserve(
        self,
        limits: KeyLimits | None,
        request_budget_micros: int | None,
        amount_micros: int,
        reservation_id: str,
        now: float | None = None,
    ) -> ReserveResult:
        """Hold ``amount_micros`` against the key's budget and the per-request cap, or
        reject without holding anything. ``limits=None`` (no key) checks only the cap."""

    @abstractmethod
    async def settle(
        self,
        limits: KeyLimits | None,
        reservation_id: str,
        reserved_micros: int,
        actual_micros: int,
        now: float | None = None,
    ) -> None:
        """Release ``reserved_micros`` of the hold and record ``actual_micros`` of spend."""

    @abstractmethod
    async def release(
        self,
        limits: KeyLimits | None,
        reservation_id: str,
        reserved_micros: int,
        now: float | None = None,
    ) -> None:
        """Release a hold whose call never happened (nothing is spent)."""

    @abstractmethod
    async def spent(self, limits: KeyLimits, now: float | None = None) -> BudgetState:
        """The key's spend, holds and remaining budget in the current period."""

    @abstractmethod
    async def restore_spent(
        self, limits: KeyLimits, period: PeriodWindow, micros: int, now: float | None = None
    ) -> int:
        """Raise the key's spend counter for ``period`` to at least ``micros`` and return the
        counter's value. Never lowers it: the ledger, which supplies ``micros``, lags the
        counter (rows are written after their calls settle), so the larger figure is the
        truer one. How budgets survive a restart of the in-process store or a Redis that
        lost its data (``gateway.budget_sync``)."""

    @abstractmethod
    async def spend_restored(self) -> bool:
        """Whether the spend counters are known to include the ledger's spend: False for a
        new in-process store, and for a Redis that lost the marker (flushed, restarted
        without persistence, or never synced)."""

    @abstractmethod
    async def mark_spend_restored(self) -> None:
        """Record that every key's counters now include the ledger's spend."""

    @abstractmethod
    async def ping(self) -> bool:
        """True if the backend answers; never raises."""

    async def send_pending(self) -> bool:
        """Send the bookkeeping writes waiting for the store to answer again (see
        ``FailPolicyStore``) now; True once none is left. A restore of the spend counters
        comes after them: one that came first would count a queued settle twice (in the
        ledger's figure it raised the counter to, then again when the settle lands)."""
        return True

    def spend_writes_lost(self) -> int:
        """How many settles this process gave up sending (the store stayed unreachable too
        long, or too many were waiting): their spend is in the ledger but not in the
        counters until ``gateway.budget_sync`` raises them again. Only ever grows."""
        return 0

    def set_error_listener(self, listener: Callable[[LimitStoreUnavailable], None]) -> None:
        """Stores that apply bookkeeping (settle, add_tokens) write-behind report a failure
        found after the call returned to ``listener``. Stores that finish it inline ignore
        this."""
        return None

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections. The store is unusable afterwards."""


def validate_amount(name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
