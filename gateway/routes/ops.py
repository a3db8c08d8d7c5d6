"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from gateway.auth import require_scrape_token
from gateway.response_models import Health, Readiness
from gateway.routes.openai import services

router = APIRouter()


# GET and HEAD: uptime monitors often probe with HEAD (UptimeRobot's default), Kubernetes
# and load balancers with GET. One route per method: a route with both gets one operation id
# for the two in the OpenAPI document, which requires them unique.
@router.get("/healthz", response_model=Health)
@router.head("/healthz", response_model=Health)
async def healthz() -> Response:
    return JSONResponse({"status": "ok"})


_NOT_READY: dict[int | str, dict[str, Any]] = {
    503: {"model": Readiness, "description": "Not ready: a check says which"}
}


@router.get("/readyz", response_model=Readiness, responses=_NOT_READY)
@router.head("/readyz", response_model=Readiness, responses=_NOT_READY)
async def readyz(request: Request) -> Response:
    s = services(request)
    # A ledger holding rows that neither its database nor its journal took is not ready:
    # another replica can book the next answers durably.
    checks = {
        "runtime": s.runtime is not None,
        "ledger": s.ledger is not None and not s.ledger.holding,
    }
    required = dict(checks)
    if s.limits is not None:
        checks["limits"] = await s.limits.ping()
        # Reported either way, but it gates readiness only with on_store_error: closed. With
        # open the gateway serves without the store by design; taking every replica out of
        # its Service because the shared Redis is down would turn "open" into an outage.
        # The store's own mode: it is built once, a reload does not change it.
        if s.limits.on_error == "closed":
            required["limits"] = checks["limits"]
    ok = s.ready and all(required.values())
    return JSONResponse(
        {"status": "ready" if ok else "not_ready", "checks": checks}, status_code=200 if ok else 503
    )


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    from gateway.metrics_render import arender_metrics

    s = services(request)
    token = s.settings.metrics.bearer_token
    if token is not None:
        require_scrape_token(request.headers.get("authorization"), token.get_secret_value())
    if s.ledger is not None and s.metrics is not None:
        s.metrics.queue_depth(s.ledger.pending)
    body, content_type = await arender_metrics(s.registry)
    return Response(body, media_type=content_type)
