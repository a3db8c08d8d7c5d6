"""The app factory. Nothing is created at import: every service object is built in the
lifespan of the app that uses it, so tests and workers each get their own."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import openapi
from gateway.base_urls import RootAliases, api_segments
from gateway.cors import install_cors
from gateway.disconnect import WatchDisconnect
from gateway.errors import install_error_handlers
from gateway.load_shedding import MODEL_APIS, LoadShedding
from gateway.routes import admin, admin_spend, anthropic, dashboard, key_info, logged, openai, ops
from gateway.security_headers import NoSniff
from gateway.services import Services
from gateway.settings import Settings, load_settings
from gateway.trace_context import TraceContextMiddleware

log = logging.getLogger(__name__)

CONFIG_ENV = "XROUTER_CONFIG"
# The supervisor's pid, set by ``serve --workers N`` for its workers: a worker's parent at
# the time it builds its app is not necessarily its supervisor (see create_app_from_env).
SUPERVISOR_ENV = "XROUTER_SUPERVISOR_PID"
# The server settings `xrouter serve`'s command line set for its workers (comma-separated):
# a reload keeps them as running rather than report the file's value as a change.
SERVE_FLAGS_ENV = "XROUTER_SERVE_FLAGS"


def create_app(
    settings: Settings | None = None,
    *,
    config_path: str | None = None,
    registry: CollectorRegistry | None = None,
    supervisor: int | None = None,
    serve_flags: Collection[str] = (),
) -> FastAPI:
    """``supervisor``: the pid of the process that started this worker; once it is gone,
    the worker shuts down (gracefully) too. ``serve_flags``: the server settings the
    command line set (``host``, ``port``, ``workers``, ``log_level``), not the file."""
    config_seen = None
    if settings is None:
        from gateway.watch import fingerprint

        # Taken before the read, so that a change made while this worker starts is seen.
        config_seen = fingerprint([Path(config_path)]) if config_path else None
        settings = load_settings(config_path)
    services = Services(
        settings=settings,
        registry=registry or CollectorRegistry(),
        serve_flags=frozenset(serve_flags),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        watcher = None
        if settings.router.watch_files:
            from gateway.watch import FileWatcher

            watcher = FileWatcher(services, config_path, config_seen=config_seen)
            watcher.start()
        orphan_watch = (
            asyncio.create_task(_exit_with(supervisor), name="xrouter-supervisor-watch")
            if supervisor is not None
            else None
        )
        try:
            yield
        finally:
            if orphan_watch is not None:
                orphan_watch.cancel()
            if watcher is not None:
                await watcher.stop()
            await services.stop()

    app = FastAPI(
        title="xrouter",
        version=_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        # A path with a trailing slash is a 404 naming it, as OpenAI's API answers, not an
        # empty 307 to a Location built from the client's Host header: the SDKs do not
        # follow a redirected POST, and behind a TLS proxy it pointed at http://.
        redirect_slashes=False,
    )
    app.state.services = services
    app.state.config_path = config_path
    install_error_handlers(app)
    app.add_middleware(WatchDisconnect, paths=frozenset(MODEL_APIS))
    app.add_middleware(_TrackRequests, services=services)
    app.add_middleware(LoadShedding, services=services, limit=settings.server.max_in_flight)
    if settings.server.forward_trace_context:
        app.add_middleware(TraceContextMiddleware)
    app.router.routes.append(
        Route("/v1/chat/completions", openai.chat_completions, methods=["POST"])
    )
    app.router.routes.append(Route("/v1/responses", openai.create_response, methods=["POST"]))
    app.router.routes.append(Route("/v1/messages", anthropic.create_message, methods=["POST"]))
    app.router.routes.append(
        Route("/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"])
    )
    app.include_router(openai.router)
    app.include_router(logged.router)
    app.include_router(key_info.router)
    app.include_router(ops.router)
    app.include_router(admin.router)
    app.include_router(admin_spend.router)
    app.include_router(dashboard.router)
    openapi.install(app)
    install_cors(app, settings.server.cors_allow_origins)
    # Outside the rest (but for Starlette's own error middleware, which CatchUnexpected
    # keeps idle): every answer has it, CORS preflights and refusals included.
    app.add_middleware(NoSniff)
    # Added last, so outermost: every other middleware sees the /v1 path.
    app.add_middleware(RootAliases, segments=api_segments(app.router.routes))
    return app


def create_app_from_env() -> FastAPI:
    """Entry point for ``uvicorn --factory`` (used with several workers): the config path
    comes from ``XROUTER_CONFIG``. Runs in the worker, whose parent is the supervisor."""
    from gateway.cli import configure_logging
    from gateway.supervisor import workers_ignore_hangup

    configure_logging(worker=True)
    path = os.environ.get(CONFIG_ENV) or None
    # Not os.getppid() alone: a worker gets here only after seconds of imports, and a
    # supervisor killed meanwhile has already handed it to init (or a subreaper), whose pid
    # getppid() then returns; watching that pid, with a parent-death signal asked for after
    # the parent's death, left the worker running for good. With the supervisor's own pid,
    # ``_exit_with``'s first look sees it gone.
    supervisor = int(os.environ.get(SUPERVISOR_ENV) or os.getppid())
    _term_with_parent()
    workers_ignore_hangup()
    flags = [f for f in os.environ.get(SERVE_FLAGS_ENV, "").split(",") if f]
    return create_app(config_path=path, supervisor=supervisor, serve_flags=flags)


def _term_with_parent() -> None:
    """Ask Linux to send this worker SIGTERM (uvicorn's graceful shutdown) the moment the
    supervisor dies: the kernel's notice, where ``_exit_with``'s once-a-second look at the
    parent pid is the portable fallback (and covers a supervisor that died before this)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        log.debug("no parent-death signal here; polling the parent pid only")


class _TrackRequests:
    """Keeps the tasks serving HTTP requests in ``services.requests``, for shutdown to wait
    for (``Services.stop``)."""

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        if scope["type"] != "http" or task is None:
            await self.app(scope, receive, send)
            return
        self.services.requests.add(task)
        try:
            await self.app(scope, receive, send)
        finally:
            self.services.requests.discard(task)


async def _exit_with(supervisor: int) -> None:
    """Shut this worker down once its supervisor is gone. uvicorn's workers do not watch
    it: a supervisor killed with SIGKILL (no chance to stop them) left them serving on
    the port, without their supervisor, and the next start could not bind it. SIGTERM to
    ourselves is uvicorn's graceful shutdown: in-flight requests finish and the ledger
    drains."""
    while os.getppid() == supervisor:  # noqa: ASYNC110 - no event exists for "parent died"
        await asyncio.sleep(1.0)
    log.error("the supervisor (pid %d) is gone; shutting this worker down", supervisor)
    signal.raise_signal(signal.SIGTERM)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("xrouter")
    except Exception:
        return "0.0.0"
