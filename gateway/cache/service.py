"""The answer cache as the chat service uses it: a lookup before routing, a store after an
answer was served, the request's own controls, metrics, and a backend that fails open.

A failing backend (Redis down or slow) makes lookups misses and stores no-ops: the cache
only ever saves money, it never fails or delays a request by more than one lookup's
timeout — and after a failure it is left alone for ``_BACKOFF_S`` seconds, so an outage
costs one timeout per backoff period, not one per request.

Identical requests that arrive together are coalesced (in each process): the first miss
leads, routing and paying for the answer, and the others wait for it (at most
``coalesce_wait_s``) instead of each buying the same answer — what nginx's ``proxy_cache_lock``
does for a web cache. A leader that ends without an answer to share (an error, a fallback)
releases its followers, each routing for itself; one whose client hung up hands the lead to
one follower, and the others keep waiting for that one's answer, within the same bound."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.cache.backends import CacheBackend, CacheUnavailable, MemoryBackend, RedisBackend
from gateway.cache.entry import CachedAnswer, cache_key

if TYPE_CHECKING:
    from gateway.metrics import GatewayMetrics
    from gateway.schemas import CacheControls
    from gateway.settings import CacheSettings, LimitsSettings

log = logging.getLogger(__name__)

__all__ = ["AnswerCache", "CacheTicket", "build_answer_cache"]

_BACKOFF_S = 5.0


class _Flight:
    """A leader's answer in the making, which identical requests wait for."""

    __slots__ = ("answer", "flights", "heirs", "key", "started", "successor")

    def __init__(self, flights: dict[str, _Flight], key: str) -> None:
        self.flights = flights
        self.key = key
        self.started = time.monotonic()
        self.answer: asyncio.Future[CachedAnswer | None] = (
            asyncio.get_running_loop().create_future()
        )
        # The followers that may take the lead, first come first: each would store its
        # answer. A follower leaves the list when it stops waiting.
        self.heirs: list[CacheTicket] = []
        # The flight the lead was handed on to, when this one's client left.
        self.successor: _Flight | None = None

    def land(self, answer: CachedAnswer | None, handoff: bool = False) -> None:
        if self.answer.done():
            return
        if self.flights.get(self.key) is self:
            del self.flights[self.key]
            if answer is None and handoff and self.heirs:
                # Chosen here, not by whichever waiter wakes first: a follower that may not
                # lead must not take the empty slot for one that may.
                heir = self.heirs.pop(0)
                heir.flight = self.successor = self.flights[self.key] = _Flight(
                    self.flights, self.key
                )
        self.answer.set_result(answer)


@dataclass(slots=True)
class CacheTicket:
    """One request's place in the cache: its key, its controls, and what the lookup found
    (``hit``, ``coalesced`` — another request's answer, bought while this one waited —
    ``miss``, ``bypass`` or ``error``), which the response reports."""

    key: str
    controls: CacheControls | None
    result: str = "miss"
    # Set when this request leads identical ones: they wait for its answer.
    flight: _Flight | None = field(default=None, repr=False)

    @property
    def storable(self) -> bool:
        return self.controls is None or not self.controls.no_store

    @property
    def reused(self) -> bool:
        """Answered with a stored or a coalesced answer."""
        return self.result in ("hit", "coalesced")

    def end(self, client_left: bool = False) -> None:
        """The request is over: whoever still waits for its answer routes for itself — or,
        when it ended only because its ``client_left``, one of them takes the lead and the
        others wait for that one. (Idempotent; an answer handed over by
        ``AnswerCache.store`` stays handed over.)"""
        if self.flight is not None:
            self.flight.land(None, handoff=client_left)


class AnswerCache:
    def __init__(
        self,
        settings: CacheSettings,
        backend: CacheBackend,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        self.metrics = metrics
        self._down_until = 0.0  # monotonic: the backend is skipped until then
        self._pending: set[asyncio.Task[None]] = set()
        self._flights: dict[str, _Flight] = {}

    def ticket(
        self,
        data: dict[str, Any],
        *,
        key_id: str | None,
        policy: str,
        checkpoint: str | None,
        controls: CacheControls | None,
        routing: dict[str, Any] | None = None,
    ) -> CacheTicket:
        scope = "*" if self.settings.scope == "global" else f"key:{key_id or '-'}"
        key = cache_key(data, scope=scope, policy=policy, checkpoint=checkpoint, routing=routing)
        return CacheTicket(key, controls)

    async def lookup(
        self,
        ticket: CacheTicket,
        usable: Callable[[CachedAnswer], bool] | None = None,
        *,
        may_lead: bool = True,
        max_wait_s: float | None = None,
    ) -> CachedAnswer | None:
        """The stored answer for ``ticket``, or one an identical request in flight is
        buying, or None (recording why on the ticket). An answer ``usable`` rejects is a
        miss. After a miss the request leads identical ones — they wait for its answer —
        if ``may_lead`` (its answer will likely be stored) and it may store at all."""
        controls = ticket.controls
        if controls is not None and controls.no_cache:
            return self._found(ticket, "bypass", None)
        result = "miss"
        answer: CachedAnswer | None = None
        if time.monotonic() < self._down_until:
            result = "error"
        else:
            try:
                raw = await self.backend.get(ticket.key)
            except CacheUnavailable as exc:
                self._failed("lookup", exc)
                result = "error"
            else:
                self._recovered()
                answer = CachedAnswer.decode(raw) if raw is not None else None
        if answer is not None and controls is not None and controls.max_age_s is not None:
            if time.time() - answer.created_at > controls.max_age_s:
                answer = None
        if answer is not None and usable is not None and not usable(answer):
            answer = None
        if answer is not None:
            return self._found(ticket, "hit", answer)
        answer = await self._coalesce(ticket, may_lead, max_wait_s)
        if answer is not None and (usable is None or usable(answer)):
            return self._found(ticket, "coalesced", answer)
        return self._found(ticket, result, None)

    async def _coalesce(
        self, ticket: CacheTicket, may_lead: bool, max_wait_s: float | None
    ) -> CachedAnswer | None:
        """After a miss: wait for an identical request's answer if one is being bought, else
        lead. None: nothing to share.

        A leader whose client hung up hands the lead to ONE of its followers, which routes
        while the others wait for it, instead of every follower buying the same answer at
        once (a client timing out before the answer, then retrying, is the usual case). A
        leader that failed, or settled for an answer not to share (a fallback), releases
        them all: what stopped it likely stops each of them, and taking turns would only
        queue them behind it. The hand-off never stretches a follower's wait: it is bounded
        by the first flight's ``coalesce_wait_s`` and the caller's ``max_wait_s``."""
        wait_s = self.settings.coalesce_wait_s
        if wait_s <= 0:
            return None
        deadline: float | None = None
        flight = self._flights.get(ticket.key)
        while True:
            now = time.monotonic()
            left = 0.0 if flight is None else flight.started + wait_s - now
            if flight is None or left <= 0:
                # No leader, or one past the wait (a request that never ended): this one
                # leads.
                if may_lead and ticket.storable:
                    ticket.flight = self._flights[ticket.key] = _Flight(self._flights, ticket.key)
                return None
            if deadline is None:
                deadline = now + (left if max_wait_s is None else min(left, max_wait_s))
            left = min(left, deadline - now)
            if left <= 0:
                return None
            heir = may_lead and ticket.storable
            if heir:
                flight.heirs.append(ticket)
            try:
                # Shielded: a follower that gives up, or is cancelled, leaves the leader's
                # answer to the others.
                answer = await asyncio.wait_for(asyncio.shield(flight.answer), left)
            except TimeoutError:
                return None
            finally:
                if heir and ticket in flight.heirs:
                    flight.heirs.remove(ticket)
            if answer is not None or ticket.flight is not None:
                return answer  # the answer, or the lead: it routes for the others now
            if flight.successor is None:
                return None  # released: the leader failed or kept its answer
            # Followed by the flight itself, not looked up again: an heir quick enough to
            # have landed already left its answer there.
            flight = flight.successor

    def _found(
        self, ticket: CacheTicket, result: str, answer: CachedAnswer | None
    ) -> CachedAnswer | None:
        ticket.result = result
        if self.metrics is not None:
            self.metrics.cache_lookup(result)
        return answer

    def store(self, ticket: CacheTicket, answer: CachedAnswer) -> None:
        """Store ``answer`` in the background (a response never waits for it), and hand it
        to the identical requests waiting for it."""
        if ticket.flight is not None:
            ticket.flight.land(answer)
        if not ticket.storable or ticket.reused:
            return
        value = answer.encode()
        if len(value) > self.settings.max_entry_bytes:
            self._stored("too_large")
            return
        ttl = self.settings.ttl_s
        if ticket.controls is not None and ticket.controls.ttl_s is not None:
            ttl = min(ttl, ticket.controls.ttl_s)  # a client may shorten, never lengthen
        if time.monotonic() < self._down_until:
            self._stored("error")
            return
        if self.backend.put_nowait(ticket.key, value, ttl):
            self._stored("stored")
            return
        task = asyncio.get_running_loop().create_task(self._put(ticket.key, value, ttl))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _put(self, key: str, value: bytes, ttl_s: float) -> None:
        try:
            await self.backend.put(key, value, ttl_s)
        except CacheUnavailable as exc:
            self._failed("store", exc)
            self._stored("error")
            return
        self._stored("stored")

    def _stored(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.cache_store(result)

    def _failed(self, what: str, exc: Exception) -> None:
        if self._down_until == 0.0:
            log.warning(
                "answer cache %s failed (%s); serving without the cache, retrying every %g s",
                what,
                exc,
                _BACKOFF_S,
            )
        self._down_until = time.monotonic() + _BACKOFF_S

    def _recovered(self) -> None:
        if self._down_until != 0.0:
            log.info("answer cache reachable again")
            self._down_until = 0.0

    async def clear(self) -> int:
        """Drop every stored answer (``DELETE /admin/cache``); how many there were. Raises
        ``CacheUnavailable`` when the backend cannot be reached."""
        return await self.backend.clear()

    async def aclose(self) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=2.0)
        await self.backend.aclose()


def build_answer_cache(
    settings: CacheSettings, limits: LimitsSettings, metrics: GatewayMetrics | None = None
) -> AnswerCache | None:
    """The configured cache, or None when it is off."""
    if not settings.enabled:
        return None
    backend: CacheBackend
    if settings.backend == "redis":
        backend = RedisBackend(
            settings.redis_url or limits.redis_url,
            prefix=settings.key_prefix,
            timeout_s=settings.timeout_ms / 1000,
        )
    else:
        backend = MemoryBackend(settings.max_entries, settings.max_bytes)
    return AnswerCache(settings, backend, metrics)
