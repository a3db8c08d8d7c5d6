"""Redis limit store: one set of limits shared by every worker and replica.

Every operation is a single Lua script (``gateway.limits.lua``), so checks are exact under any
concurrency, across processes and hosts. Key layout, all under ``<prefix>:{<key id>}`` so one
API key's state lives in one Redis Cluster slot and a script never spans slots:

    <prefix>:{<key>}:rl:req          zset   rpm sliding-window log
    <prefix>:{<key>}:rl:tlog         zset   tpm sliding-window log ("<id>:<tokens>")
    <prefix>:{<key>}:rl:tsum         int    sum of the tpm log
    <prefix>:{<key>}:rl:tticks       hash   the tpm log summed per 1/4 s, and how far it
                                            has been swept (see ``lua_rate.RATE_LUA``)
    <prefix>:{<key>}:b:holds         zset   reservation id -> hold deadline
    <prefix>:{<key>}:b:held          hash   reservation id -> micro-USD held
    <prefix>:{<key>}:b:reserved      int    sum of held
    <prefix>:{<key>}:b:spent:<period> int   micro-USD spent in a period (d2025-01-31, ...)
    <prefix>:{<key>}:b:req:<id>      int    spend of one capped request
    <prefix>:{<key>}:b:done:<id>     string a settle applied (kept one hold TTL: a resent
                                            settle that finds it does nothing)
    <prefix>:budgets-restored        string set once the counters include the ledger's spend

Requests without a key that carry a per-request cap use ``<prefix>:{%anon:<id>}`` (the ``%``
can't come out of key-id escaping, so it never collides with a real key). Everything except
lifetime spend counters carries a TTL, so idle keys leave nothing behind.

Clock: timestamps come from the caller (``now`` or this host's ``time.time()``), the same as
the in-memory store, so both backends share one test suite and a synthetic clock. Replicas
on different hosts should run NTP; skew only shifts window edges by the skew, it never
breaks the atomicity of a check.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Sequence
from itertools import count
from typing import Any, NoReturn

from gateway.limits.base import (
    ALLOW_ALL,
    SLOT_FREE,
    BudgetState,
    KeyLimits,
    LimitStore,
    LimitStoreUnavailable,
    PendingWrite,
    RateCounts,
    RateLimitName,
    RateResult,
    ReserveResult,
    SlotResult,
    validate_amount,
)
from gateway.limits.lua import (
    ACQUIRE_SLOT_LUA,
    RELEASE_SLOT_LUA,
    RESERVE_LUA,
    RESTORE_SPENT_LUA,
    SETTLE_LUA,
    STATE_LUA,
)
from gateway.limits.lua_rate import ADD_TOKENS_LUA, RATE_LUA
from gateway.limits.memory import DEFAULT_HOLD_TTL_S
from gateway.limits.resp import RespClient, RespConnectionError, RespError, Script
from gateway.limits.windows import (
    RATE_WINDOW_S,
    PeriodCache,
    PeriodWindow,
    token_correction_times,
)

logger = logging.getLogger(__name__)

_RATE_REASONS: dict[int, RateLimitName | None] = {0: None, 1: "rpm", 2: "tpm"}
# Rate logs only need to outlive the window; a second of slack absorbs clock jitter.
_RATE_KEY_TTL_MS = str(int(RATE_WINDOW_S * 1000) + 1000)

# Settle, made idempotent: a settle may be sent again (``PendingWrite``) after its first
# attempt ran but its reply was lost, so each one carries an id and leaves a marker (KEYS[6],
# kept ARGV[8] ms) that makes a second run a no-op. The marker is set first, in the same
# atomic script, so it exists exactly when the settle's writes do (an AOF or a replica has
# both or neither). Returns 0 when the settle had been applied already.
_IDEMPOTENT_SETTLE_LUA = (
    """
if not redis.call('SET', KEYS[6], '1', 'NX', 'PX', ARGV[8]) then return 0 end
"""
    + SETTLE_LUA
)
# How much of a resent write's useful life (the hold TTL) the retries may use: the rest is
# margin for a resend in flight when the settle's marker expires.
_RESEND_WINDOW = 0.9


def _escape_tag(key_id: str) -> str:
    # Braces would end (or start) the Redis Cluster hash tag early.
    return key_id.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def _ts(value: float) -> str:
    # repr() round-trips a float exactly, and Redis parses it back to the same double.
    return repr(float(value))


class RedisLimitStore(LimitStore):
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "xrouter",
        hold_ttl_s: float = DEFAULT_HOLD_TTL_S,
        timeout_s: float = 1.0,
    ) -> None:
        if not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ValueError("key_prefix must be non-empty and contain no braces")
        if hold_ttl_s <= 0:
            raise ValueError("hold_ttl_s must be > 0")
        self.key_prefix = key_prefix
        self.hold_ttl_s = hold_ttl_s
        self._periods = PeriodCache()
        self._hold_ttl_ms = str(max(1, int(hold_ttl_s * 1000)))
        # Short timeouts: a limit check is on every request's critical path, and failing fast
        # lets FailPolicyStore answer (503 or fail open) instead of hanging the client. The
        # client pipelines every call of one loop tick into one write on one connection and
        # never retries a command it has sent: a timed-out script may already have run, and
        # running settle twice would double-count.
        self._client = RespClient(url, timeout_s=timeout_s, connect_timeout_s=timeout_s)
        self._client.on_deferred_error = self._deferred_failed
        self._error_listener: Callable[[LimitStoreUnavailable], None] | None = None
        self._rate = Script(self._client, RATE_LUA)
        self._add_tokens = Script(self._client, ADD_TOKENS_LUA)
        self._reserve = Script(self._client, RESERVE_LUA)
        self._settle = Script(self._client, _IDEMPOTENT_SETTLE_LUA)
        self._state = Script(self._client, STATE_LUA)
        self._restore = Script(self._client, RESTORE_SPENT_LUA)
        self._acquire_slot = Script(self._client, ACQUIRE_SLOT_LUA)
        self._release_slot = Script(self._client, RELEASE_SLOT_LUA)
        # Present while the counters include the ledger's spend: a Redis that lost its data
        # (flushed, restarted without persistence) lost this too, and the gateway restores.
        self._restored_key = f"{key_prefix}:budgets-restored"
        # Unique, cheap log-entry ids: a random per-instance prefix plus a counter.
        self._instance = os.urandom(6).hex()
        self._seq = count()
        # Scripts this store has loaded for write-behind use (see ``_run_deferred``).
        self._deferred_loaded: set[str] = set()

    # -- keys --------------------------------------------------------------------------------

    def _base(self, limits: KeyLimits | None, reservation_id: str) -> str:
        tag = f"%anon:{reservation_id}" if limits is None else _escape_tag(limits.key_id)
        return f"{self.key_prefix}:{{{tag}}}"

    def _rate_keys(self, limits: KeyLimits) -> list[str]:
        base = self._base(limits, "")
        # The tpm keys were rl:tok and rl:toksum before the log was summed per tick: renamed,
        # so a gateway of each version never reads a log the other kept differently.
        return [
            f"{base}:rl:req",
            f"{base}:rl:tlog",
            f"{base}:rl:tsum",
            f"{base}:rl:tticks",
        ]

    def _budget_keys(self, base: str, period_id: str, reservation_id: str) -> list[str]:
        return [
            f"{base}:b:holds",
            f"{base}:b:held",
            f"{base}:b:reserved",
            f"{base}:b:spent:{period_id}",
            f"{base}:b:req:{reservation_id}",
        ]

    def _member(self) -> str:
        return f"{self._instance}.{next(self._seq)}"

    async def _run(self, script: Script, keys: Sequence[str], args: Sequence[str]) -> Any:
        """Run one script. Calls made in the same loop tick share one round trip; each is
        still its own atomic script."""
        try:
            return await script(keys, args)
        except (RespError, RespConnectionError, OSError) as exc:
            self._unavailable(exc)

    async def _run_deferred(
        self,
        script: Script,
        keys: Sequence[str],
        args: Sequence[str],
        op: str | None = None,
        *,
        spend: bool = False,
    ) -> None:
        """Run a bookkeeping script write-behind: queued behind this connection's earlier
        commands and ahead of its later ones (so the same request's next reserve sees it),
        sent with the next round trip anyone makes. Nobody waits for the reply.

        With ``op`` the write is idempotent and can be resent: a failure, now or when the
        reply comes, carries a ``PendingWrite`` that runs the same script with the same
        arguments (so the fail policy retries it). Without it (token corrections) it is
        sent once, as ``Script.send_deferred`` does."""
        if op is None:
            try:
                await script.send_deferred(keys, args)
            except (RespError, RespConnectionError, OSError) as exc:
                self._unavailable(exc)
            return
        pending = PendingWrite(
            op=op,
            resend=lambda: self._run(script, keys, args),
            deadline=time.monotonic() + self.hold_ttl_s * _RESEND_WINDOW,
            spend=spend,
        )
        command = ("EVALSHA", script.sha, str(len(keys)), *keys, *args)
        try:
            if script.sha not in self._deferred_loaded:
                # Load in the foreground on first use, so the common case keeps the
                # write-behind order instead of taking the NOSCRIPT resend below.
                await script.load()
                self._deferred_loaded.add(script.sha)
            await self._client.send_deferred(
                *command, on_error=lambda exc: self._deferred_failed(exc, pending)
            )
        except (RespError, RespConnectionError, OSError) as exc:
            raise LimitStoreUnavailable(f"redis: {type(exc).__name__}: {exc}", pending) from exc

    def set_error_listener(self, listener: Callable[[LimitStoreUnavailable], None]) -> None:
        self._error_listener = listener

    def _deferred_failed(self, exc: Exception, pending: PendingWrite | None = None) -> None:
        if pending is not None and isinstance(exc, RespError) and str(exc).startswith("NOSCRIPT"):
            # Redis restarted and forgot the script, so it did not run: send it again at
            # once (the awaited call loads it), not after the retry queue's backoff.
            task = asyncio.get_running_loop().create_task(self._resend_now(pending))
            self._client.track(task)
            return
        error = LimitStoreUnavailable(f"redis: {type(exc).__name__}: {exc}", pending)
        if self._error_listener is not None:
            self._error_listener(error)
        else:
            logger.warning("limit store write-behind failed: %s", error)

    async def _resend_now(self, pending: PendingWrite) -> None:
        try:
            await pending.resend()
        except LimitStoreUnavailable as exc:
            self._deferred_failed(exc, pending)

    @staticmethod
    def _unavailable(exc: BaseException) -> NoReturn:
        raise LimitStoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

    # -- parallel requests -------------------------------------------------------------------

    def _slots_key(self, limits: KeyLimits) -> str:
        return f"{self._base(limits, '')}:slots"

    async def acquire_slot(
        self, limits: KeyLimits, request_id: str, now: float | None = None
    ) -> SlotResult:
        if limits.max_parallel is None:
            return SLOT_FREE
        now = time.time() if now is None else now
        taken, held = await self._run(
            self._acquire_slot,
            [self._slots_key(limits)],
            [
                _ts(now),
                _ts(now + self.hold_ttl_s),
                str(limits.max_parallel),
                request_id,
                self._hold_ttl_ms,
            ],
        )
        return SlotResult(ok=bool(taken), in_flight=int(held))

    async def release_slot(self, limits: KeyLimits, request_id: str) -> None:
        # Write-behind, as settle: nobody waits on a request that has ended. ZREM is
        # idempotent, so a failed release can simply be sent again.
        await self._run_deferred(
            self._release_slot, [self._slots_key(limits)], [request_id], "release_slot"
        )

    # -- rate limits -------------------------------------------------------------------------

    async def check_rate(
        self, limits: KeyLimits, tokens_estimate: int, now: float | None = None
    ) -> RateResult:
        validate_amount("tokens_estimate", tokens_estimate)
        if limits.rpm is None and limits.tpm is None:
            return ALLOW_ALL
        now = time.time() if now is None else now
        reply = await self._run(
            self._rate,
            self._rate_keys(limits),
            [
                _ts(now),
                _ts(now - RATE_WINDOW_S),
                _ts(RATE_WINDOW_S),
                str(-1 if limits.rpm is None else limits.rpm),
                str(-1 if limits.tpm is None else limits.tpm),
                str(tokens_estimate),
                self._member(),
                _RATE_KEY_TTL_MS,
            ],
        )
        allowed, reason, requests, reset_req, used, reset_tok, retry = reply
        retry_s = float(retry)
        return RateCounts(
            allowed=bool(allowed),
            limit=_RATE_REASONS[int(reason)],
            requests=int(requests),
            reset_requests_s=float(reset_req),
            tokens=int(used),
            reset_tokens_s=float(reset_tok),
            retry_after_s=None if retry_s < 0 else retry_s,
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
        keys = self._rate_keys(limits)[1:]
        args = [_ts(now - RATE_WINDOW_S), _ts(at), str(int(tokens)), self._member()]
        await self._run_deferred(self._add_tokens, keys, [*args, _RATE_KEY_TTL_MS])

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
        keys = self._budget_keys(self._base(limits, reservation_id), period.id, reservation_id)
        reply = await self._run(
            self._reserve,
            keys,
            [
                _ts(now),
                reservation_id,
                str(amount_micros),
                str(-1 if budget is None else budget),
                str(-1 if request_budget_micros is None else request_budget_micros),
                _ts(now + self.hold_ttl_s),
                self._hold_ttl_ms,
            ],
        )
        ok, reason, key_left, req_left, *held_only = (int(v) for v in reply)
        return ReserveResult(
            ok=bool(ok),
            limit=None if ok else ("budget" if reason == 1 else "request_budget"),
            remaining_micros=None if budget is None else max(0, key_left),
            request_remaining_micros=None if request_budget_micros is None else max(0, req_left),
            resets_at=period.end if budget is not None else None,
            held_only=bool(held_only and held_only[0]),
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
        period = self._periods.window(None if limits is None else limits.budget_period, now)
        counter_ttl = period.counter_ttl_s(now)
        base = self._base(limits, reservation_id)
        keys = self._budget_keys(base, period.id, reservation_id)
        # One id per settle (a request may settle several parts under one reservation id).
        keys.append(f"{base}:b:done:{self._member()}")
        await self._run_deferred(
            self._settle,
            keys,
            [
                _ts(now),
                reservation_id,
                str(reserved_micros),
                str(actual_micros),
                "-1" if counter_ttl is None else str(int(counter_ttl * 1000)),
                self._hold_ttl_ms,
                "0" if limits is None else "1",
                self._hold_ttl_ms,
            ],
            "settle" if actual_micros else "release",
            spend=limits is not None and actual_micros > 0,
        )

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
        keys = self._budget_keys(self._base(limits, ""), period.id, "")
        reserved, spent = (int(v) for v in await self._run(self._state, keys, [_ts(now)]))
        remaining = None
        if limits.budget_micros is not None:
            remaining = max(0, limits.budget_micros - spent - reserved)
        return BudgetState(
            spent=spent,
            reserved=reserved,
            remaining=remaining,
            period_start=period.start,
            resets_at=period.end,
        )

    async def restore_spent(
        self, limits: KeyLimits, period: PeriodWindow, micros: int, now: float | None = None
    ) -> int:
        validate_amount("micros", micros)
        now = time.time() if now is None else now
        ttl = period.counter_ttl_s(now)
        key = self._budget_keys(self._base(limits, ""), period.id, "")[3]
        args = [str(micros), "-1" if ttl is None else str(max(1, int(ttl * 1000)))]
        return int(await self._run(self._restore, [key], args))

    async def spend_restored(self) -> bool:
        try:
            return bool(await self._client.execute("EXISTS", self._restored_key))
        except (RespError, RespConnectionError, OSError) as exc:
            self._unavailable(exc)

    async def mark_spend_restored(self) -> None:
        try:
            await self._client.execute("SET", self._restored_key, _ts(time.time()))
        except (RespError, RespConnectionError, OSError) as exc:
            self._unavailable(exc)

    async def ping(self) -> bool:
        try:
            return bool(await self._client.execute("PING") == "PONG")
        except (RespError, RespConnectionError, OSError) as exc:
            logger.warning("redis limit store ping failed: %s", exc)
            return False

    async def aclose(self) -> None:
        await self._client.aclose()
