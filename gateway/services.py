"""The gateway's service objects, built once per process in the app factory's lifespan."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from gateway.auth import Authenticator
from gateway.chat import ChatService
from gateway.hooks import RequestHooks
from gateway.runtime import Runtime, build_runtime
from gateway.settings import Settings

if TYPE_CHECKING:  # built lazily in start(), by what the settings turn on
    from sqlalchemy.ext.asyncio import AsyncEngine

    from gateway.budget_gauges import BudgetGauges
    from gateway.budget_sync import BudgetSync
    from gateway.cache.service import AnswerCache
    from gateway.circuits import SharedCircuits
    from gateway.ledger.deployments import Deployment, DeploymentRepository
    from gateway.ledger.keys import KeyInfo, KeyRepository
    from gateway.ledger.retention import LedgerRetention
    from gateway.ledger.writer import LedgerWriter
    from gateway.limits.base import FailPolicyStore
    from gateway.metrics import GatewayMetrics

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

    def on_deployment(self, model: str, deployment: str, ok: bool) -> None:
        if self._s.metrics is not None:
            self._s.metrics.deployment_call(model, deployment, ok)

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
    reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    requests: set[asyncio.Task[Any]] = field(default_factory=set)  # serving HTTP requests
    # What the config says; ``settings`` is what serves: the same, except for a deployed
    # router checkpoint (``xrouter deploy``), which holds until the config's own changes.
    file_settings: Settings | None = None
    deployments: DeploymentRepository | None = None
    deployment: Deployment | None = None  # the newest this process has seen
    _seen_deployment: int | None = None
    # A deployment whose checkpoint did not load here: (id, retry after (monotonic s), delay s).
    _deploy_retry: tuple[int, float, float] | None = None
    _poll_error: str | None = None  # the last polling failure, so an outage is logged once

    def __post_init__(self) -> None:
        if self.file_settings is None:
            self.file_settings = self.settings

    async def key_spend(self, info: KeyInfo) -> tuple[float | None, float | None]:
        """A key's spend and remaining budget (USD) in its current period, from the limit
        store, or from the ledger (the record the store is restored from) while the store is
        down; (None, None) without a budget or a store."""
        if info.budget_micros is None or self.limits is None:
            return None, None
        from gateway.limits.base import LimitStoreUnavailable
        from gateway.limits.windows import period_window
        from pricing import micros_to_usd

        try:
            state = await self.limits.spent(info.limits())
            spent, remaining = state.spent, state.remaining
        except LimitStoreUnavailable:
            if self.engine is None:
                return None, None
            from gateway.ledger.spend import budget_spend

            window = period_window(info.budget_period, time.time())
            spent = (await budget_spend(self.engine, [info.key_id], window.start)).get(
                info.key_id, 0
            )
            remaining = info.budget_micros - spent
        return micros_to_usd(spent), micros_to_usd(remaining) if remaining is not None else None

    def _observe_checkpoint(self) -> None:
        if self.metrics is not None and self.runtime is not None:
            info = self.runtime.checkpoint_info or {}
            self.metrics.serving_checkpoint(info.get("version"), info.get("kind"))

    def _observe_runtime(self) -> None:
        """After a reload or deploy swapped the runtime: its checkpoint, and its models and
        policies as metric labels (without this, ones the config gained since start-up
        would be reported as "other")."""
        self._observe_checkpoint()
        if self.metrics is not None and self.runtime is not None:
            models, policies = _metric_labels(self.runtime)
            self.metrics.add_known(models=models, policies=policies)

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

        ``deployment`` is the ledger's newest router deployment: where it still applies, the
        snapshot is built on its checkpoint alone, so a restart does not depend on the
        config's checkpoint loading (it may have been deleted since it was replaced). If the
        deployed one does not load here, the config's serves and the poller retries."""
        if self.runtime is not None:
            return
        events = _MetricEvents(self)
        if deployment is not None and deployment.applies_to(self.settings.router.checkpoint):
            serving = _with_checkpoint(self.settings, deployment.checkpoint)
            try:
                runtime = build_runtime(serving, events=events)
                check_deployed_version(runtime, deployment)
            except Exception as exc:
                delay = 2 * self.settings.router.deployment_poll_s
                self._deploy_retry = (deployment.id, time.monotonic() + delay, delay)
                log.error(
                    "could not load the deployed router checkpoint (deployment %d, %s); "
                    "serving the config's, retrying in %.0f s: %s",
                    deployment.id,
                    deployment.checkpoint,
                    delay,
                    exc,
                )
            else:
                self.runtime, self.settings = runtime, serving
                self.deployment, self._seen_deployment = deployment, deployment.id
                return
        self.runtime = build_runtime(self.settings, events=events)

    async def start(self) -> None:
        from gateway.ledger.keys import KeyRepository
        from gateway.ledger.store import open_ledger_engine
        from gateway.ledger.writer import LedgerWriter
        from gateway.metrics import GatewayMetrics

        s = self.settings
        self.engine = await open_ledger_engine(s.ledger.url)
        if self.runtime is None:
            # Off the loop: building loads the checkpoint from disk.
            await asyncio.to_thread(self.prepare, await self._latest_deployment())
        assert self.runtime is not None
        if s.metrics.enabled:
            models, policies = _metric_labels(self.runtime)
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
        await self._start_deployments()
        self._observe_checkpoint()
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
        ref = (
            self.runtime.catalog.get(s.metrics.reference_model)
            if s.metrics.reference_model
            else None
        )
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

        # Built once: a reload keeps the cached answers (a new router checkpoint has keys
        # of its own); the cache section's own settings take effect at restart.
        self.cache = build_answer_cache(s.cache, s.limits, self.metrics)
        self.chat = ChatService(self.current, self.hooks, self.cache)
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

    async def reload(
        self, settings: Settings | None = None, *, following: Deployment | None = None
    ) -> Runtime:
        """Build a new runtime snapshot from ``settings`` (the config as read; default: the
        last one) with the deployed checkpoint, if it still applies, and swap it in.
        In-flight requests keep the old one. ``following``: the deployment this reload
        takes up, whose recorded version the loaded checkpoint must be."""
        async with self.reload_lock:
            if following is not None and following.id <= (self._seen_deployment or 0):
                # Taken up (or overtaken by this worker's own deploy) while this reload
                # waited for the lock: loading it now would replace a newer deployment.
                return self.current()
            file_settings = settings or self.file_settings or self.settings
            # The deployment this reload serves, read once under the lock: the poller may
            # take up a newer one while the build runs, and what is served and recorded
            # must be what was built.
            deployment = following if following is not None else self.deployment
            serving = self._effective(file_settings, deployment)
            runtime = await self._build(serving)
            if following is not None:
                check_deployed_version(runtime, following)
                self._seen_deployment = following.id
            elif serving is not file_settings:
                deployment = await self._record_rewritten_deployment(runtime, deployment)
            runtime.take_over()
            self.file_settings, self.settings, self.runtime = file_settings, serving, runtime
            self.deployment = deployment
            self._observe_runtime()
            log.info("reloaded: pool=%s policies=%s", runtime.pool.names, runtime.policy_names)
            return runtime

    async def _record_rewritten_deployment(
        self, runtime: Runtime, d: Deployment | None
    ) -> Deployment | None:
        """The deployed checkpoint ``d`` was rewritten in place (retrained into its
        directory) and this reload (the file watcher's, or an admin one) loaded it: that
        content is the deployment now. Recorded as a new deployment of the same path, so
        restarts and the other workers and replicas take it instead of refusing it as a
        stale copy; if it cannot be recorded the reload fails and the recorded content keeps
        serving. Returns the deployment the runtime serves."""
        found = (runtime.checkpoint_info or {}).get("version")
        if d is None or self.deployments is None or found is None or found == d.version:
            return d
        latest = await self.deployments.latest()
        if latest is not None and (latest.checkpoint, latest.version) == (d.checkpoint, found):
            d = latest  # another worker recorded it first
        else:
            d = await self.deployments.record(d.checkpoint, found, d.config_checkpoint)
            log.info(
                "the deployed checkpoint %s changed in place (version %s): recorded as "
                "deployment %d",
                d.checkpoint,
                found,
                d.id,
            )
        self._seen_deployment = d.id
        return d

    async def deploy(self, checkpoint: str, settings: Settings | None = None) -> Runtime:
        """Serve ``checkpoint`` here and record it for every other worker and replica (and
        for restarts). The runtime is built first: a checkpoint that does not load is
        refused (``ValueError``/``OSError``) and nothing is recorded."""
        async with self.reload_lock:
            file_settings = settings or self.file_settings or self.settings
            serving = _with_checkpoint(file_settings, checkpoint)
            runtime = await self._build(serving)
            if self.deployments is not None:
                info = runtime.checkpoint_info or {}
                self.deployment = await self.deployments.record(
                    checkpoint, info.get("version"), file_settings.router.checkpoint
                )
                self._seen_deployment = self.deployment.id
            runtime.take_over()
            self.file_settings, self.settings, self.runtime = file_settings, serving, runtime
            self._observe_runtime()
            log.info("deployed %s (deployment %s)", checkpoint, self._seen_deployment)
            return runtime

    async def _build(self, settings: Settings) -> Runtime:
        # Building loads a checkpoint from disk: keep it off the event loop.
        return await asyncio.to_thread(
            build_runtime, settings, events=_MetricEvents(self), previous=self.runtime
        )

    def _effective(self, file_settings: Settings, d: Deployment | None) -> Settings:
        if d is None or not d.applies_to(file_settings.router.checkpoint):
            return file_settings
        return _with_checkpoint(file_settings, d.checkpoint)

    @property
    def active_deployment(self) -> Deployment | None:
        """The deployment serving here, if any (None once the config's checkpoint changed)."""
        d, f = self.deployment, self.file_settings
        return d if d is not None and f is not None and d.applies_to(f.router.checkpoint) else None

    async def _latest_deployment(self) -> Deployment | None:
        """The newest recorded deployment, or None (also when it cannot be read: the
        config's router then serves, and the poller takes the deployment up later)."""
        from gateway.ledger.store import describe_error

        try:
            return await self._deployment_repo().latest()
        except Exception as exc:
            log.error("reading router deployments failed: %s", describe_error(exc))
            return None

    async def _start_deployments(self) -> None:
        """Start on the newest deployment unless ``prepare`` did (a restart keeps what was
        deployed), then follow the ones other workers record."""
        self._deployment_repo()
        try:
            await self._follow_deployment()
        except Exception as exc:  # a checkpoint missing here must not stop the gateway
            log.error(
                "could not load the deployed router checkpoint; serving the config's: %s", exc
            )
        interval = self.settings.router.deployment_poll_s
        self.background.append(
            asyncio.create_task(self._poll_deployments(interval), name="xrouter-deployments")
        )

    def _deployment_repo(self) -> DeploymentRepository:
        from gateway.ledger.deployments import DeploymentRepository

        if self.deployments is None:
            assert self.engine is not None, "deployments are recorded in the ledger"
            self.deployments = DeploymentRepository(self.engine)
        return self.deployments

    async def _follow_deployment(self) -> None:
        latest = await self._deployment_repo().latest()
        if latest is None or latest.id == self._seen_deployment:
            return
        # A backed-off retry of this very deployment, if one is pending.
        retry = (
            self._deploy_retry
            if self._deploy_retry and self._deploy_retry[0] == latest.id
            else None
        )
        if retry is not None and time.monotonic() < retry[1]:
            return
        file_checkpoint = (self.file_settings or self.settings).router.checkpoint
        if latest.applies_to(file_checkpoint):
            # ``reload`` takes ``latest`` up under the reload lock, and only once it loaded:
            # set here, before the lock, a reload or deploy already building would serve or
            # record it in place of what it built.
            try:
                await self.reload(following=latest)
            except Exception as exc:
                # The checkpoint may not have reached this replica yet (a volume still
                # syncing): keep serving the previous router and try again later, backing
                # off so that a checkpoint that never loads is not rebuilt every poll.
                delay = (
                    min(2 * retry[2], _MAX_DEPLOY_RETRY_S)
                    if retry is not None
                    else 2 * self.settings.router.deployment_poll_s
                )
                self._deploy_retry = (latest.id, time.monotonic() + delay, delay)
                raise DeploymentLoadError(
                    f"deployment {latest.id} ({latest.checkpoint}): {exc}; "
                    f"retrying in {delay:.0f} s"
                ) from exc
            log.info("following deployment %d: %s", latest.id, latest.checkpoint)
        elif latest.id > (self._seen_deployment or 0):
            self.deployment = latest  # the config's own checkpoint has since won
        self._seen_deployment = max(latest.id, self._seen_deployment or 0)
        self._deploy_retry = None

    async def _poll_deployments(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self._follow_deployment()
            except asyncio.CancelledError:
                raise
            except DeploymentLoadError as exc:
                # Keep serving the previous router; logged at each (backed-off) attempt.
                log.error("could not load the deployed router checkpoint: %s", exc)
            except Exception as exc:
                # The database is unreachable: keep serving. An outage is logged when it
                # starts (or its error changes) and when it ends, not at every poll.
                from gateway.ledger.store import describe_error

                message = describe_error(exc)  # one line, without SQLAlchemy's statement
                if message != self._poll_error:
                    log.error("reading router deployments failed: %s", message)
                self._poll_error = message
                continue
            if self._poll_error is not None:
                log.info("reading router deployments again")
                self._poll_error = None

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


_MAX_DEPLOY_RETRY_S = 300.0


class DeploymentLoadError(Exception):
    """A recorded deployment's checkpoint did not load in this process."""


def check_deployed_version(runtime: Runtime, deployment: Deployment) -> None:
    """Refuse a deployed checkpoint whose content is not the one recorded: another file
    at the same path (a replica's stale copy of a run directory) must not serve under the
    deployment's name. Packaged checkpoints are exempt (named ``packaged:<name>`` or by
    their path in the installation): they are the ones shipped with this installation,
    which an upgrade may change."""
    from router.checkpoint import is_packaged

    if deployment.version is None or is_packaged(deployment.checkpoint):
        return
    found = (runtime.checkpoint_info or {}).get("version")
    if found != deployment.version:
        raise ValueError(
            f"{deployment.checkpoint} here is checkpoint version {found}, not version "
            f"{deployment.version} as deployment {deployment.id} recorded"
        )


def _with_checkpoint(settings: Settings, checkpoint: str) -> Settings:
    router = settings.router.model_copy(update={"checkpoint": checkpoint})
    return settings.model_copy(update={"router": router})


def multiproc_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


def _metric_labels(runtime: Runtime) -> tuple[list[str], list[str]]:
    """The model and policy names a runtime may report under: its pool ("router": an answer
    the router gave itself) and its policies (with "passthrough": a pool model asked for by
    name)."""
    return [*runtime.pool.names, "router"], [*runtime.policy_names, "passthrough"]


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
