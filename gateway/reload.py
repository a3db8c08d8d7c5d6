"""Building the runtime a gateway process serves, and hot-swapping it: on a reload (admin
endpoint, file watch), on ``xrouter deploy``, and when another worker or replica records a
deployment (the database side of deployments: ``gateway.ledger.deployments``).

What serves is ``Services.settings``: the config as read (``Services.file_settings``), with
the router checkpoint of the deployment that applies to it, if any. In-flight requests keep
the runtime they started with."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from gateway.ledger.deployments import DeploymentSuperseded
from gateway.runtime import Runtime, build_runtime

if TYPE_CHECKING:
    from gateway.ledger.deployments import Deployment, DeploymentRepository
    from gateway.services import Services
    from gateway.settings import Settings

# The sections whose services are built once, at start (see Reloader._kept_from_start).
START_ONLY_SECTIONS = ("server", "auth", "ledger", "limits", "cache")
# Single settings of other sections that only the start reads: the metrics registry and the
# budget gauges' task, the file watcher and the deployment poller, the circuit sharing task.
START_ONLY_FIELDS = (
    "metrics.enabled",
    "metrics.budget_gauge_keys",
    "metrics.budget_refresh_s",
    "router.watch_files",
    "router.deployment_poll_s",
    "router.circuit_breaker.shared",
    "router.circuit_breaker.sync_interval_s",
)

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
        # The gauge says whether calls are kept away (router.health: open, or probing); a
        # half-open circuit with no probe out, reported when its cooldown ends, is not.
        if self._s.metrics is not None:
            self._s.metrics.circuit(model, state in ("open", "probing"))
        if self._s.circuits is not None:
            self._s.circuits.on_change(model, state)


class Reloader:
    """Builds and swaps ``services.runtime`` (and its ``settings``), and keeps track of the
    router deployment serving here."""

    def __init__(self, services: Services) -> None:
        self._s = services
        self.reload_lock = asyncio.Lock()
        self.deployments: DeploymentRepository | None = None
        self.deployment: Deployment | None = None  # the newest this process has seen
        self._seen_deployment: int | None = None
        # A deployment whose checkpoint did not load here: (id, retry after (monotonic s), delay s).
        self._deploy_retry: tuple[int, float, float] | None = None
        # The last polling failure, so an outage is logged once.
        self._poll_error: str | None = None

    def _observe_checkpoint(self) -> None:
        s = self._s
        if s.metrics is not None and s.runtime is not None:
            info = s.runtime.checkpoint_info or {}
            s.metrics.serving_checkpoint(info.get("version"), info.get("kind"))

    def _observe_runtime(self) -> None:
        """After a reload or deploy swapped the runtime: its checkpoint, and its models and
        policies as metric labels (without this, ones the config gained since start-up
        would be reported as "other")."""
        self._observe_checkpoint()
        s = self._s
        if s.metrics is not None and s.runtime is not None:
            models, policies = s.runtime.reported_names()
            s.metrics.add_known(models=models, policies=policies)
        if s.hooks is not None and s.runtime is not None:
            # Savings are measured at the price the config now gives the reference model.
            s.hooks.reference_price = s.runtime.reference_price

    def prepare(self, deployment: Deployment | None = None) -> None:
        """Build the runtime snapshot unless built.

        ``deployment`` is the ledger's newest router deployment: where it still applies, the
        snapshot is built on its checkpoint alone, so a restart does not depend on the
        config's checkpoint loading (it may have been deleted since it was replaced). If the
        deployed one does not load here, the config's serves and the poller retries."""
        s = self._s
        if s.runtime is not None:
            return
        events = _MetricEvents(s)
        if deployment is not None and deployment.applies_to(s.settings.router.checkpoint):
            serving = _with_checkpoint(s.settings, deployment.checkpoint)
            try:
                runtime = build_runtime(serving, events=events)
                check_deployed_version(runtime, deployment)
            except Exception as exc:
                delay = 2 * s.settings.router.deployment_poll_s
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
                s.runtime, s.settings = runtime, serving
                self.deployment, self._seen_deployment = deployment, deployment.id
                # Said at start: what serves is not what the config names.
                log.info(
                    "serving the router checkpoint of deployment %d (%s, version %s), "
                    "recorded in the ledger, in place of the config's router.checkpoint",
                    deployment.id,
                    deployment.checkpoint,
                    deployment.version,
                )
                return
        s.runtime = build_runtime(s.settings, events=events)

    async def reload(
        self, settings: Settings | None = None, *, following: Deployment | None = None
    ) -> Runtime:
        """Build a new runtime snapshot from ``settings`` (the config as read; default: the
        last one) with the deployed checkpoint, if it still applies, and swap it in.
        In-flight requests keep the old one. ``following``: the deployment this reload
        takes up, whose recorded version the loaded checkpoint must be. A deployed
        checkpoint rewritten in place is recorded as its deployment (see
        ``_record_rewritten_deployment``) unless a newer deployment was recorded meanwhile:
        then that one is loaded and served."""
        s = self._s
        async with self.reload_lock:
            if following is not None and following.id <= (self._seen_deployment or 0):
                # Taken up (or overtaken by this worker's own deploy) while this reload
                # waited for the lock: loading it now would replace a newer deployment.
                return s.current()
            file_settings = settings or s.file_settings or s.settings
            # The deployment this reload serves, read once under the lock: the poller may
            # take up a newer one while the build runs, and what is served and recorded
            # must be what was built.
            deployment = following if following is not None else self.deployment
            applies = deployment is not None and deployment.applies_to(
                file_settings.router.checkpoint
            )
            kept = self._kept_from_start(file_settings)
            serving = self._effective(kept, deployment)
            runtime = await self._build(serving)
            if following is not None:
                check_deployed_version(runtime, following)
                self._seen_deployment = following.id
            elif applies:
                # The deployed checkpoint is what was built: a version other than the one
                # recorded means it was rewritten in place. (Where the config names another
                # checkpoint, the config's serves and there is nothing to record.)
                try:
                    deployment = await self._record_rewritten_deployment(runtime, deployment)
                except DeploymentSuperseded as exc:
                    # A deploy recorded since this process took ``deployment`` up (while
                    # this reload was loading, or within a poll before it): that is what
                    # every worker follows, and the rewritten checkpoint is no longer the
                    # deployed one. This reload serves it, as the poller would have.
                    deployment = exc.newer
                    serving = self._effective(kept, deployment)
                    runtime = await self._build(serving)
                    if deployment.applies_to(file_settings.router.checkpoint):
                        check_deployed_version(runtime, deployment)
                    self._seen_deployment = deployment.id
            runtime.take_over()
            s.file_settings, s.settings, s.runtime = file_settings, serving, runtime
            self.deployment = deployment
            self._observe_runtime()
            log.info("reloaded: pool=%s policies=%s", runtime.pool.names, runtime.policy_names)
            return runtime

    def _kept_from_start(self, new: Settings) -> Settings:
        """``new`` with the sections read at start as they were then: the services built from
        them (the server, auth, the ledger writer and its retention, the limit store, the
        answer cache) do not change under a running gateway, so ``settings`` must not say
        otherwise — a reload once took the file's `server.max_body_bytes` and reported the
        file's cache backend, while a changed `ledger.log_content` went on logging as
        before, silently. A change to them is logged: it takes a restart."""
        running = self._s.settings
        # What serve's --host, --port, --workers or --log-level set runs, not the file's
        # value: that is no change of the file's. (Only what the command line did set: a
        # port changed in a file that set it is a change that takes a restart.)
        as_run = new.model_copy(
            update={
                "server": new.server.model_copy(
                    update={f: getattr(running.server, f) for f in self._s.serve_flags}
                )
            }
        )
        changed = [
            name for name in START_ONLY_SECTIONS if getattr(as_run, name) != getattr(running, name)
        ]
        kept = new.model_copy(update={name: getattr(running, name) for name in START_ONLY_SECTIONS})
        fields = [f for f in START_ONLY_FIELDS if _get(new, f) != _get(running, f)]
        for dotted in fields:
            kept = _replaced(kept, dotted, _get(running, dotted))
        if fields:
            log.warning(
                "reload: %s %s read at start: a change takes a restart",
                ", ".join(fields),
                "are" if len(fields) > 1 else "is",
            )
        if not changed:
            return kept
        log.warning(
            "reload: the %s section%s read at start: %s change%s take%s a restart",
            ", ".join(changed),
            "s are" if len(changed) > 1 else " is",
            "their" if len(changed) > 1 else "its",
            "s" if len(changed) > 1 else "",
            "" if len(changed) > 1 else "s",
        )
        return kept

    async def _record_rewritten_deployment(
        self, runtime: Runtime, d: Deployment | None
    ) -> Deployment | None:
        """The deployed checkpoint ``d`` was rewritten in place (retrained into its
        directory) and this reload (the file watcher's, or an admin one) loaded it: that
        content is the deployment now. Recorded as a new deployment of the same path, so
        restarts and the other workers and replicas take it instead of refusing it as a
        stale copy; if it cannot be recorded the reload fails and the recorded content keeps
        serving. Returns the deployment the runtime serves.

        Recorded as a deploy is, only over ``d`` (``record_replacing``): a deploy recorded
        since ``d`` — by another worker or replica while this one loaded, or before its
        poller took it up — replaced ``d`` and its path, and was answered as deployed;
        recording the rewritten content over it would undo that deploy on every worker, its
        exit status 0 notwithstanding. Then nothing is recorded and ``DeploymentSuperseded``
        names the newer deployment, which the reload serves instead."""
        found = (runtime.checkpoint_info or {}).get("version")
        if d is None or self.deployments is None or found is None or found == d.version:
            return d
        try:
            recorded = await self.deployments.record_replacing(
                d.id, d.checkpoint, found, d.config_checkpoint
            )
        except DeploymentSuperseded as exc:
            newer = exc.newer
            if (newer.checkpoint, newer.version) != (d.checkpoint, found):
                log.warning(
                    "the deployed checkpoint %s changed in place (version %s), but deployment "
                    "%d (%s, version %s) was recorded after deployment %d, which it replaces: "
                    "not recorded; loading deployment %d instead",
                    d.checkpoint,
                    found,
                    newer.id,
                    newer.checkpoint,
                    newer.version,
                    d.id,
                    newer.id,
                )
                raise
            d = newer  # another worker or replica recorded the same content first
        else:
            d = recorded
            # A warning: a run retrained into the deployed directory goes live here with
            # no `xrouter deploy` (and no eval) — what the operator should know it did.
            log.warning(
                "the deployed checkpoint %s changed in place (version %s): recorded as "
                "deployment %d, which every worker and replica now serves",
                d.checkpoint,
                found,
                d.id,
            )
        self._seen_deployment = d.id
        return d

    async def deploy(self, checkpoint: str, settings: Settings | None = None) -> Runtime:
        """Serve ``checkpoint`` here and record it for every other worker and replica (and
        for restarts). The runtime is built first: a checkpoint that does not load is
        refused (``ValueError``/``OSError``) and nothing is recorded. So is one that another
        deploy overtook (``DeploymentSuperseded``): it is recorded only if the newest
        deployment is still the one it found on arrival, so that of two that overlap — here,
        on another worker or on another replica — the one answered as deployed is the one
        every worker follows."""
        s = self._s
        # Read before waiting for the lock: a deploy this worker is already loading counts
        # as one that overlaps.
        replacing = await self.deployments.latest() if self.deployments is not None else None
        async with self.reload_lock:
            file_settings = settings or s.file_settings or s.settings
            # A deploy re-reads the config as a reload does: the sections read at start stay.
            serving = self._kept_from_start(_with_checkpoint(file_settings, checkpoint))
            runtime = await self._build(serving)
            if self.deployments is not None:
                info = runtime.checkpoint_info or {}
                self.deployment = await self.deployments.record_replacing(
                    replacing.id if replacing is not None else None,
                    checkpoint,
                    info.get("version"),
                    file_settings.router.checkpoint,
                )
                self._seen_deployment = self.deployment.id
            runtime.take_over()
            s.file_settings, s.settings, s.runtime = file_settings, serving, runtime
            self._observe_runtime()
            log.info("deployed %s (deployment %s)", checkpoint, self._seen_deployment)
            return runtime

    async def _build(self, settings: Settings) -> Runtime:
        # Building loads a checkpoint from disk: keep it off the event loop.
        return await asyncio.to_thread(
            build_runtime, settings, events=_MetricEvents(self._s), previous=self._s.runtime
        )

    def _effective(self, file_settings: Settings, d: Deployment | None) -> Settings:
        if d is None or not d.applies_to(file_settings.router.checkpoint):
            return file_settings
        return _with_checkpoint(file_settings, d.checkpoint)

    @property
    def active_deployment(self) -> Deployment | None:
        """The deployment serving here, if any (None once the config's checkpoint changed)."""
        d, f = self.deployment, self._s.file_settings
        return d if d is not None and f is not None and d.applies_to(f.router.checkpoint) else None

    async def latest_deployment(self) -> Deployment | None:
        """The newest recorded deployment, or None (also when it cannot be read: the
        config's router then serves, and the poller takes the deployment up later)."""
        from gateway.ledger.store import describe_error

        try:
            return await self._deployment_repo().latest()
        except Exception as exc:
            log.error("reading router deployments failed: %s", describe_error(exc))
            return None

    async def start(self) -> None:
        """Start on the newest deployment unless ``prepare`` did (a restart keeps what was
        deployed), then follow the ones other workers record. The metrics exist by now:
        the checkpoint serving is reported."""
        self._deployment_repo()
        try:
            await self._follow_deployment()
        except Exception as exc:  # a checkpoint missing here must not stop the gateway
            log.error(
                "could not load the deployed router checkpoint; serving the config's: %s", exc
            )
        interval = self._s.settings.router.deployment_poll_s
        self._s.background.append(
            asyncio.create_task(self._poll_deployments(interval), name="xrouter-deployments")
        )
        self._observe_checkpoint()

    def _deployment_repo(self) -> DeploymentRepository:
        from gateway.ledger.deployments import DeploymentRepository

        if self.deployments is None:
            assert self._s.engine is not None, "deployments are recorded in the ledger"
            self.deployments = DeploymentRepository(self._s.engine)
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
        file_checkpoint = (self._s.file_settings or self._s.settings).router.checkpoint
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
                    else 2 * self._s.settings.router.deployment_poll_s
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


def _get(model: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        model = getattr(model, part)
    return model


def _replaced(model: Any, dotted: str, value: Any) -> Any:
    """``model`` (frozen) with the setting at ``dotted`` set to ``value``."""
    head, _, rest = dotted.partition(".")
    if not rest:
        return model.model_copy(update={head: value})
    return model.model_copy(update={head: _replaced(getattr(model, head), rest, value)})
