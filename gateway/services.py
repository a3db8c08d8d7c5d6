"""The gateway's service objects, built once per process in the app factory's lifespan."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry

from gateway.auth import Authenticator
from gateway.chat import ChatService
from gateway.deadline import Deadline, DeadlineExceeded
from gateway.errors import database_unavailable
from gateway.hooks import RequestHooks
from gateway.reload import Reloader
from gateway.runtime import Runtime
from gateway.settings import Settings

if TYPE_CHECKING:  # built lazily in start(), by what the settings turn on
    from sqlalchemy.ext.asyncio import AsyncEngine

    from gateway.budget_gauges import BudgetGauges
    from gateway.budget_sync import BudgetSync
    from gateway.cache.service import AnswerCache
    from gateway.circuits import SharedCircuits
    from gateway.ledger.deployments import Deployment
    from gateway.ledger.keys import KeyInfo, KeyRepository
    from gateway.ledger.retention import LedgerRetention
    from gateway.ledger.writer import LedgerWriter
    from gateway.limits.fail_policy import FailPolicyStore
    from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class Services:
    settings: Settings
    registry: CollectorRegistry
    runtime: Runtime | None = None
    metrics: GatewayMetrics | None = None
    engine: AsyncEngine | None = None
    ledger: LedgerWriter | None = None
    limits: FailPolicyStore | None = None
    circuits: SharedCircuits | None = None  # with a Redis limit store
    keys: KeyRepository | None = None
    auth: Authenticator | None = None
    hooks: RequestHooks | None = None
    chat: ChatService | None = None
    cache: AnswerCache | None = None  # when cache.enabled
    budgets: BudgetSync | None = None  # when auth is on
    retention: LedgerRetention | None = None  # when configured
    budget_gauges: BudgetGauges | None = None  # with auth and metrics
    ready: bool = False
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    requests: set[asyncio.Task[Any]] = field(default_factory=set)  # serving HTTP requests
    # What the config says; ``settings`` is what serves: the same, except for a deployed
    # router checkpoint (``xrouter deploy``), which holds until the config's own changes.
    file_settings: Settings | None = None
    # The server settings serve's command line set, not the file (see Reloader).
    serve_flags: frozenset[str] = frozenset()
    # Builds and swaps ``runtime`` and ``settings``; follows the router deployments.
    reloader: Reloader = field(init=False)
    ledger_reads: Deadline = field(init=False)

    def __post_init__(self) -> None:
        if self.file_settings is None:
            self.file_settings = self.settings
        self.reloader = Reloader(self)
        self.ledger_reads = Deadline(self.settings.ledger.read_timeout_s)

    async def read_ledger(self, call: Awaitable[T]) -> T:
        """``call``, reading the ledger database for an admin or client read, given up
        after ``ledger.read_timeout_s`` as a 503 ``database_unavailable``, as a database that
        refuses it is."""
        try:
            return await self.ledger_reads.run(call)
        except DeadlineExceeded as exc:
            log.warning("ledger read given up, the ledger database: %s", exc)
            raise database_unavailable() from None

    async def key_spend(self, info: KeyInfo) -> tuple[float | None, float | None]:
        """A key's spend and remaining budget (USD) in its current period, from the limit
        store, or from the ledger (the record the store is restored from) while the store is
        down; (None, None) without a budget or a store."""
        if info.budget_micros is None or self.limits is None:
            return None, None
        from gateway.limits.base import LimitStoreUnavailable
        from gateway.limits.windows import period_window
        from pricing import micros_to_usd

        spent: int | None = None
        remaining: int | None = None
        try:
            state = await self.limits.spent(info.limits())
            spent, remaining = state.spent, state.remaining  # holds in flight counted
        except LimitStoreUnavailable:
            pass
        # The ledger too when the store cannot say: it is down, or the key is revoked — a
        # restart restores live keys' spend into the store, and a revoked key spends no
        # more, so its ledger rows are all of it.
        if spent is None or info.revoked:
            if self.engine is None:
                return None, None
            from gateway.ledger.spend import budget_spend

            window = period_window(info.budget_period, time.time())
            logged = (await budget_spend(self.engine, [info.key_id], window.start)).get(
                info.key_id, 0
            )
            if spent is None or logged > spent:
                # Clamped as the limit store's figure is: a key over budget has none left.
                spent, remaining = logged, max(0, info.budget_micros - logged)
        assert remaining is not None  # the key has a budget
        return micros_to_usd(spent), micros_to_usd(remaining)

    def current(self) -> Runtime:
        assert self.runtime is not None
        return self.runtime

    # The parts start() builds before the app takes requests: routes reach them here.

    def ledger_writer(self) -> LedgerWriter:
        assert self.ledger is not None, "the ledger starts before requests are served"
        return self.ledger

    def ledger_engine(self) -> AsyncEngine:
        assert self.engine is not None, "the ledger starts before requests are served"
        return self.engine

    def key_repository(self) -> KeyRepository:
        assert self.keys is not None, "the key repository starts with the ledger"
        return self.keys

    def prepare(self, deployment: Deployment | None = None) -> None:
        """Build the runtime snapshot (pool, prices, policies, checkpoint) unless built:
        ``xrouter serve`` calls it before the server starts, so that an unusable config is
        one error line, and the lifespan's ``start`` then uses it instead of building twice.
        ``deployment``: the ledger's newest router deployment (``Reloader.prepare``)."""
        self.reloader.prepare(deployment)

    async def reload(self, settings: Settings | None = None) -> Runtime:
        """Swap in a runtime built from ``settings`` (the config as read; default: the last
        one), on the deployed checkpoint if it still applies (``Reloader.reload``)."""
        return await self.reloader.reload(settings)

    async def deploy(self, checkpoint: str, settings: Settings | None = None) -> Runtime:
        """Serve ``checkpoint`` and record it for every worker and replica
        (``Reloader.deploy``)."""
        return await self.reloader.deploy(checkpoint, settings)

    @property
    def active_deployment(self) -> Deployment | None:
        """The deployment serving here, if any (None once the config's checkpoint changed)."""
        return self.reloader.active_deployment

    async def start(self) -> None:
        from gateway.ledger.keys import KeyRepository
        from gateway.ledger.store import open_ledger_engine
        from gateway.ledger.writer import LedgerWriter
        from gateway.metrics import GatewayMetrics

        s = self.settings
        self.engine = await open_ledger_engine(s.ledger.url)
        if self.runtime is None:
            # Off the loop: building loads the checkpoint from disk.
            await asyncio.to_thread(self.prepare, await self.reloader.latest_deployment())
        assert self.runtime is not None
        if s.metrics.enabled:
            models, policies = self.runtime.reported_names()
            self.metrics = GatewayMetrics(
                self.registry,
                models=models,
                policies=policies,
                budget_gauge_keys=s.metrics.budget_gauge_keys,
                version=build_version(),
            )
        self.ledger = LedgerWriter(self.engine, s.ledger, self.metrics)
        await self.ledger.start()
        if (
            s.ledger.content_retention_days is not None
            or s.ledger.request_retention_days is not None
        ):
            from gateway.ledger.retention import LedgerRetention

            self.retention = LedgerRetention(
                self.engine,
                content_days=s.ledger.content_retention_days,
                request_days=s.ledger.request_retention_days,
                interval_s=s.ledger.retention_interval_s,
                metrics=self.metrics,
            )
            self.retention.start()
        await self.reloader.start()
        self.keys = KeyRepository(self.engine)
        self.limits = self._limit_store()
        if s.auth.enabled:
            from gateway.budget_sync import BudgetSync

            # Before ready: a restarted gateway must not hand every key its budget again.
            self.budgets = BudgetSync(
                self.limits,
                self.keys,
                self.engine,
                interval_s=s.limits.budget_sync_s,
                flush=self.ledger.flush,
                metrics=self.metrics,
                # The longest a request runs, then its row's way into the ledger.
                in_flight_s=s.server.request_timeout_s + s.ledger.flush_interval_ms / 1000 + 30,
            )
            await self.budgets.start(replayed=self.ledger.adopted_at_start > 0)
        self.circuits = self._shared_circuits()
        admin = s.auth.admin_key.get_secret_value() if s.auth.admin_key else None
        self.auth = Authenticator(self.keys, enabled=s.auth.enabled, admin_key=admin)
        ref = self.runtime.reference_price
        if s.auth.enabled and self.metrics is not None and s.metrics.budget_gauge_keys > 0:
            from gateway.budget_gauges import BudgetGauges

            self.budget_gauges = BudgetGauges(
                self.limits, self.keys, self.metrics, interval_s=s.metrics.budget_refresh_s
            )
            self.budget_gauges.start()
        self.hooks = RequestHooks(
            limits=self.limits,
            ledger=self.ledger,
            metrics=self.metrics,
            reference_price=ref,
            budget_gauges=self.budget_gauges,
        )
        from gateway.cache import build_answer_cache

        # Built once: a reload keeps the cached answers (a new router checkpoint, or new
        # prices for a routed request's models, has keys of its own: see ChatService); the
        # cache section's own settings take effect at restart.
        self.cache = build_answer_cache(s.cache, s.limits, self.metrics)
        self.chat = ChatService(
            self.current, self.hooks, self.cache, request_timeout_s=s.server.request_timeout_s
        )
        self.ready = True

    def _limit_store(self) -> FailPolicyStore:
        from gateway.limits import build_limit_store

        mode = self.settings.limits.on_store_error

        def on_event(kind: str) -> None:
            if self.metrics is not None:
                self.metrics.limit_store_error(mode)

        # A hold older than the longest possible request is presumed abandoned.
        ttl = self.settings.server.request_timeout_s + 60
        return build_limit_store(self.settings.limits, hold_ttl_s=ttl, on_event=on_event)

    def _shared_circuits(self) -> SharedCircuits | None:
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

    async def stop(self) -> None:
        self.ready = False
        for t in self.background:
            t.cancel()
        if self.requests:
            # uvicorn cancels the requests still running when its graceful shutdown times
            # out and shuts the app down at once, before they ran: let them hand their
            # settles and ledger rows to the bookkeeping first, or those would reach a
            # ledger already closed (journaled, but in the database only after a restart).
            await asyncio.wait(list(self.requests), timeout=5)
        if self.hooks is not None:
            # Settles and ledger rows of requests that ended just now (a cancelled stream's
            # bookkeeping outlives its task) must land before the ledger and store close.
            await self.hooks.bookkeeping.drain()
        if self.ledger is not None:
            await self.ledger.close()
        if self.runtime is not None:
            await self.runtime.client.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        if self.budgets is not None:
            await self.budgets.aclose()
        if self.budget_gauges is not None:
            await self.budget_gauges.aclose()
        if self.retention is not None:
            await self.retention.aclose()
        if self.limits is not None:
            await self.limits.aclose()
        if self.circuits is not None:
            await self.circuits.aclose()
        if self.engine is not None:
            await self.engine.dispose()
        if multiproc_dir():
            # Live gauges of this worker must stop counting once it exits.
            from gateway.metrics_render import mark_process_dead

            mark_process_dead(os.getpid())


def multiproc_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


def build_version() -> str:
    """The running build's version for ``xrouter_build_info``: the installed package's, else
    (a source checkout run without installing) its pyproject's, else "unknown"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xrouter")
    except PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text()).get("project", {})
    except (OSError, ValueError):
        return "unknown"
    if project.get("name") == "xrouter" and isinstance(project.get("version"), str):
        return str(project["version"])
    return "unknown"
