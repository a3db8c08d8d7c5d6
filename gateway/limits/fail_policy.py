"""The limits' failure policy (``limits.on_store_error``) around any store, and the retry
queue that sends bookkeeping the store did not confirm again (see ``base`` for the
semantics of both)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from gateway.limits.base import (
    ALLOW_ALL,
    SLOT_FREE,
    STORE_UNAVAILABLE,
    BudgetState,
    FailMode,
    KeyLimits,
    LimitStore,
    LimitStoreUnavailable,
    PendingWrite,
    RateResult,
    ReserveResult,
    SlotResult,
)
from gateway.limits.windows import PeriodWindow

logger = logging.getLogger(__name__)


class _RetryQueue:
    """Bookkeeping writes the store did not confirm, sent again in order until it answers.

    Bounded (``max_writes``): past it, or past a write's deadline, a write is given up and
    handed to ``on_give_up`` rather than kept forever in memory. One task drains the queue,
    waiting ``first_delay_s`` and doubling up to ``max_delay_s`` while the store refuses, so
    an outage costs a connection attempt every few seconds, not one per queued write."""

    def __init__(
        self,
        on_give_up: Callable[[PendingWrite, str], None],
        *,
        max_writes: int = 10_000,
        first_delay_s: float = 0.2,
        max_delay_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._on_give_up = on_give_up
        self._max_writes = max_writes
        self._first_delay_s = first_delay_s
        self._max_delay_s = max_delay_s
        self._clock = clock
        self._writes: deque[PendingWrite] = deque()
        self._task: asyncio.Task[None] | None = None
        # One drain at a time: two would send the head write twice (the retry task's and
        # a restore's, ``FailPolicyStore.send_pending``).
        self._draining = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._writes)

    def add(self, write: PendingWrite) -> None:
        if len(self._writes) >= self._max_writes:
            self._on_give_up(self._writes.popleft(), "the retry queue is full")
        self._writes.append(write)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="xrouter-limit-store-retry"
            )

    async def _run(self) -> None:
        delay = self._first_delay_s
        while self._writes:
            await asyncio.sleep(delay)
            if await self.drain():
                delay = self._first_delay_s
            else:
                delay = min(delay * 2, self._max_delay_s)

    async def drain(self) -> bool:
        """Send the queued writes, oldest first; False at the first one the store refuses
        (it stays at the head, so later writes of the same request never overtake it)."""
        async with self._draining:
            return await self._drain()

    async def _drain(self) -> bool:
        sent = 0
        while self._writes:
            write = self._writes[0]
            if self._clock() > write.deadline:
                self._writes.popleft()
                self._on_give_up(write, "the limit store stayed unavailable past its deadline")
                continue
            try:
                await write.resend()
            except LimitStoreUnavailable as exc:
                logger.debug("limit store retry of %s failed: %s", write.op, exc)
                return False
            except Exception as exc:  # a bug must not spin the queue forever
                logger.exception("limit store retry of %s failed unexpectedly", write.op)
                self._discard(write)
                self._on_give_up(write, f"{type(exc).__name__}: {exc}")
                continue
            # A full queue may have given the head up while it was being sent.
            self._discard(write)
            sent += 1
        if sent:
            logger.info("limit store answers again: applied %d delayed bookkeeping write(s)", sent)
        return True

    def _discard(self, write: PendingWrite) -> None:
        if self._writes and self._writes[0] is write:
            self._writes.popleft()

    async def aclose(self, timeout_s: float) -> None:
        """Stop retrying after one last attempt of at most ``timeout_s``; what is left is
        given up."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._writes:
            try:
                await asyncio.wait_for(self.drain(), timeout_s)
            except TimeoutError:
                pass
        while self._writes:
            self._on_give_up(self._writes.popleft(), "the gateway is shutting down")


class FailPolicyStore(LimitStore):
    """Applies ``limits.on_store_error`` to another store.

    The mode governs *admission* (``check_rate``, ``acquire_slot``, ``reserve``): ``"closed"`` re-raises
    ``LimitStoreUnavailable`` (the gateway answers 503), so no request goes through
    unmetered; ``"open"`` lets the request through as if no limit applied.

    Bookkeeping after the call (``add_tokens``, ``settle``, ``release``, ``release_slot``)
    never raises in either mode: the upstream has already answered and been paid for, so
    refusing the response would only lose it. The failure is logged and counted, and a failed
    settle, release or slot release is queued and sent again (``_RetryQueue``) until the store
    answers, so a blip neither loses spend nor keeps a slot or hold taken until its TTL. A write
    given up (queue full, store down past the write's deadline, shutdown) is logged; a lost
    settle counts in ``spend_writes_lost`` so ``BudgetSync`` recounts from the ledger. Token
    corrections are not retried: the rate windows forget them within a minute anyway.

    ``on_event("store_unavailable")`` is called on every backend failure in either mode, so
    the caller's metric counts them (label it with the mode; don't count them again).
    ``spent`` is a report, not a gate, and always re-raises."""

    def __init__(
        self,
        inner: LimitStore,
        on_error: FailMode,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        if on_error not in ("closed", "open"):
            raise ValueError(f"on_error must be 'closed' or 'open', got {on_error!r}")
        self.inner = inner
        self.on_error: FailMode = on_error
        self._on_event = on_event
        self._retries = _RetryQueue(self._give_up)
        self._spend_writes_lost = 0
        inner.set_error_listener(
            lambda exc: self._bookkeeping_failed(exc, "write-behind bookkeeping")
        )

    def _bookkeeping_failed(self, exc: LimitStoreUnavailable, op: str) -> None:
        """Report the failure and queue the write to be sent again, if it can be."""
        self._report(exc, op)
        if exc.pending is not None:
            self._retries.add(exc.pending)

    def _give_up(self, write: PendingWrite, reason: str) -> None:
        if write.spend:
            self._spend_writes_lost += 1
        logger.warning(
            "limit store: gave up %s (%s)%s",
            write.op,
            reason,
            "; the key's spend counter is recounted from the ledger" if write.spend else "",
        )

    def spend_writes_lost(self) -> int:
        return self._spend_writes_lost

    @property
    def pending_writes(self) -> int:
        """Bookkeeping writes waiting for the store to answer again."""
        return len(self._retries)

    async def send_pending(self) -> bool:
        return await self._retries.drain()

    def _report(self, exc: LimitStoreUnavailable, op: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(STORE_UNAVAILABLE)
            except Exception:  # a broken metrics hook must not turn into a 500
                logger.exception("limit store on_event hook failed")
        logger.warning("limit store unavailable during %s (%s): %s", op, self.on_error, exc)

    def _admission_failed(self, exc: LimitStoreUnavailable, op: str) -> None:
        """Report the failure; re-raise unless failing open."""
        self._report(exc, op)
        if self.on_error == "closed":
            raise exc

    async def check_rate(
        self, limits: KeyLimits, tokens_estimate: int, now: float | None = None
    ) -> RateResult:
        try:
            return await self.inner.check_rate(limits, tokens_estimate, now)
        except LimitStoreUnavailable as exc:
            self._admission_failed(exc, "check_rate")
            return ALLOW_ALL

    async def add_tokens(
        self,
        limits: KeyLimits,
        tokens: int,
        now: float | None = None,
        *,
        at: float | None = None,
    ) -> None:
        try:
            await self.inner.add_tokens(limits, tokens, now, at=at)
        except LimitStoreUnavailable as exc:
            self._report(exc, "add_tokens")

    async def acquire_slot(
        self, limits: KeyLimits, request_id: str, now: float | None = None
    ) -> SlotResult:
        try:
            return await self.inner.acquire_slot(limits, request_id, now)
        except LimitStoreUnavailable as exc:
            self._admission_failed(exc, "acquire_slot")
            return SLOT_FREE

    async def release_slot(self, limits: KeyLimits, request_id: str) -> None:
        try:
            await self.inner.release_slot(limits, request_id)
        except LimitStoreUnavailable as exc:
            self._bookkeeping_failed(exc, "release_slot")

    async def reserve(
        self,
        limits: KeyLimits | None,
        request_budget_micros: int | None,
        amount_micros: int,
        reservation_id: str,
        now: float | None = None,
    ) -> ReserveResult:
        try:
            return await self.inner.reserve(
                limits, request_budget_micros, amount_micros, reservation_id, now
            )
        except LimitStoreUnavailable as exc:
            self._admission_failed(exc, "reserve")
            return ReserveResult(ok=True)

    async def settle(
        self,
        limits: KeyLimits | None,
        reservation_id: str,
        reserved_micros: int,
        actual_micros: int,
        now: float | None = None,
    ) -> None:
        try:
            await self.inner.settle(limits, reservation_id, reserved_micros, actual_micros, now)
        except LimitStoreUnavailable as exc:
            self._bookkeeping_failed(exc, "settle")

    async def release(
        self,
        limits: KeyLimits | None,
        reservation_id: str,
        reserved_micros: int,
        now: float | None = None,
    ) -> None:
        try:
            await self.inner.release(limits, reservation_id, reserved_micros, now)
        except LimitStoreUnavailable as exc:
            self._bookkeeping_failed(exc, "release")

    async def spent(self, limits: KeyLimits, now: float | None = None) -> BudgetState:
        return await self.inner.spent(limits, now)

    async def restore_spent(
        self, limits: KeyLimits, period: PeriodWindow, micros: int, now: float | None = None
    ) -> int:
        return await self.inner.restore_spent(limits, period, micros, now)

    async def spend_restored(self) -> bool:
        return await self.inner.spend_restored()

    async def mark_spend_restored(self) -> None:
        await self.inner.mark_spend_restored()

    async def ping(self) -> bool:
        return await self.inner.ping()

    async def aclose(self) -> None:
        # One last attempt (bounded) at what is still queued, while the connection is open.
        await self._retries.aclose(timeout_s=2.0)
        await self.inner.aclose()
