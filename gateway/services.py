"""The gateway's service objects, built once per process in the app factory's lifespan."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.auth import Authenticator
from gateway.chat import ChatService
from gateway.hooks import RequestHooks
from gateway.runtime import Runtime, build_runtime
from gateway.settings import Settings

log = logging.getLogger(__name__)


class _MetricEvents:
    """Adapts DownstreamClient events to Prometheus."""

    def __init__(self, services: Services) -> None:
        self._s = services

    def on_retry(self, model: str, kind: str) -> None:
        pass

    def on_fallback(self, model: str) -> None:
        if self._s.metrics is not None:
            self._s.metrics.fallback(model)

    def on_upstream_error(self, model: str, kind: str) -> None:
        if self._s.metrics is not None:
            self._s.metrics.upstream_error(model, kind)

    def on_circuit(self, model: str, state: str) -> None:
        if self._s.metrics is not None:
            self._s.metrics.circuit(model, state != "closed")
        if self._s.circuits is not None:
            self._s.circuits.on_change(model, state)


@dataclass
class Services:
    settings: Settings
    registry: CollectorRegistry
    runtime: Runtime | None = None
    metrics: Any = None
    engine: Any = None
    ledger: Any = None
    limits: Any = None
    circuits: Any = None  # gateway.circuits.SharedCircuits, with a Redis limit store
    keys: Any = None
    auth: Authenticator | None = None
    hooks: RequestHooks | None = None
    chat: ChatService | None = None
    ready: bool = False
    reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    background: list[asyncio.Task[Any]] = field(default_factory=list)

    async def key_spend(self, info: Any) -> tuple[float | None, float | None]:
        """A key's spend and remaining budget (USD) in its current period, from the limit
        store; (None, None) without a budget or a store."""
        if info.budget_micros is None or self.limits is None:
            return None, None
        from gateway.limits.base import KeyLimits
        from pricing import micros_to_usd

        state = await self.limits.spent(
            KeyLimits(info.key_id, info.budget_micros, info.budget_period, info.rpm, info.tpm)
        )
        remaining = micros_to_usd(state.remaining) if state.remaining is not None else None
        return micros_to_usd(state.spent), remaining

    def current(self) -> Runtime:
        assert self.runtime is not None
        return self.runtime

    def prepare(self) -> None:
        """Build the runtime snapshot (pool, prices, policies, checkpoint) unless built:
        ``xrouter serve`` calls it before the server starts, so that an unusable config is
        one error line, and the lifespan's ``start`` then uses it instead of building twice."""
        if self.runtime is None:
            self.runtime = build_runtime(self.settings, events=_MetricEvents(self))

    async def start(self) -> None:
        from gateway.ledger.keys import KeyRepository
        from gateway.ledger.store import open_ledger_engine
        from gateway.ledger.writer import LedgerWriter
        from gateway.metrics import GatewayMetrics

        s = self.settings
        self.prepare()
        assert self.runtime is not None
        if s.metrics.enabled:
            self.metrics = GatewayMetrics(
                self.registry,
                models=[*self.runtime.pool.names, "router"],
                policies=[*self.runtime.policy_names, "passthrough"],
                budget_gauge_keys=s.metrics.budget_gauge_keys,
            )
        self.engine = await open_ledger_engine(s.ledger.url)
        self.ledger = LedgerWriter(self.engine, s.ledger, self.metrics)
        await self.ledger.start()
        self.keys = KeyRepository(self.engine)
        self.limits = self._limit_store()
        self.circuits = self._shared_circuits()
        admin = s.auth.admin_key.get_secret_value() if s.auth.admin_key else None
        self.auth = Authenticator(self.keys, enabled=s.auth.enabled, admin_key=admin)
        ref = (
            self.runtime.catalog.get(s.metrics.reference_model)
            if s.metrics.reference_model
            else None
        )
        self.hooks = RequestHooks(
            limits=self.limits, ledger=self.ledger, metrics=self.metrics, reference_price=ref
        )
        self.chat = ChatService(self.current, self.hooks)
        self.ready = True

    def _limit_store(self) -> Any:
        from gateway.limits import build_limit_store

        mode = self.settings.limits.on_store_error

        def on_event(kind: str) -> None:
            if self.metrics is not None:
                self.metrics.limit_store_error(mode)

        # A hold older than the longest possible request is presumed abandoned.
        ttl = self.settings.server.request_timeout_s + 60
        return build_limit_store(self.settings.limits, hold_ttl_s=ttl, on_event=on_event)

    def _shared_circuits(self) -> Any:
        """Workers and replicas share circuit openings through the limits' Redis."""
        cb, limits = self.settings.router.circuit_breaker, self.settings.limits
        if not (cb.shared and cb.failures > 0 and limits.backend == "redis"):
            return None
        from gateway.circuits import SharedCircuits
        from gateway.limits.resp import RespClient

        shared = SharedCircuits(
            RespClient(limits.redis_url),
            lambda: self.current().client.breakers,
            lambda: self.current().pool.names,
            interval_s=cb.sync_interval_s,
            prefix=f"{limits.key_prefix}:circuit:",
        )
        shared.start()
        return shared

    async def reload(self, settings: Settings | None = None) -> Runtime:
        """Build a new runtime snapshot and swap it in. In-flight requests keep the old one."""
        async with self.reload_lock:
            new_settings = settings or self.settings
            # Building loads a checkpoint from disk: keep it off the event loop.
            runtime = await asyncio.to_thread(
                build_runtime,
                new_settings,
                events=_MetricEvents(self),
                previous=self.runtime,
            )
            self.settings = new_settings
            self.runtime = runtime
            log.info("reloaded: pool=%s policies=%s", runtime.pool.names, runtime.policy_names)
            return runtime

    async def stop(self) -> None:
        self.ready = False
        for t in self.background:
            t.cancel()
        if self.hooks is not None:
            # Settles and ledger rows of requests that ended just now (a cancelled stream's
            # bookkeeping outlives its task) must land before the ledger and store close.
            await self.hooks.bookkeeping.drain()
        if self.ledger is not None:
            await self.ledger.close()
        if self.runtime is not None:
            await self.runtime.client.aclose()
        if self.limits is not None:
            await self.limits.aclose()
        if self.circuits is not None:
            await self.circuits.aclose()
        if self.engine is not None:
            await self.engine.dispose()
        if multiproc_dir():
            # Live gauges of this worker must stop counting once it exits.
            from gateway.metrics import mark_process_dead

            mark_process_dead(os.getpid())


def multiproc_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")
