"""The app factory. Nothing is created at import: every service object is built in the
lifespan of the app that uses it, so tests and workers each get their own."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.routing import Route

from gateway.errors import install_error_handlers
from gateway.routes import admin, anthropic, dashboard, key_info, logged, openai, ops
from gateway.services import Services
from gateway.settings import Settings, load_settings

log = logging.getLogger(__name__)

CONFIG_ENV = "XROUTER_CONFIG"


def create_app(
    settings: Settings | None = None,
    *,
    config_path: str | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    if settings is None:
        settings = load_settings(config_path)
    services = Services(settings=settings, registry=registry or CollectorRegistry())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        watcher = None
        if settings.router.watch_files:
            from gateway.watch import FileWatcher

            watcher = FileWatcher(services, config_path)
            watcher.start()
        try:
            yield
        finally:
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
    )
    app.state.services = services
    app.state.config_path = config_path
    install_error_handlers(app)
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
    app.include_router(dashboard.router)
    return app


def create_app_from_env() -> FastAPI:
    """Entry point for ``uvicorn --factory`` (used with several workers): the config path
    comes from ``XROUTER_CONFIG``."""
    path = os.environ.get(CONFIG_ENV) or None
    return create_app(config_path=path)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("xrouter")
    except Exception:
        return "0.0.0"
