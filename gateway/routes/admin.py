"""The admin API (admin key): keys, pricing, the answer cache, router state and reload.
The keys' wire formats are in ``gateway.routes.admin_models``, spend reports in
``gateway.routes.admin_spend``."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.echo import echo
from gateway.errors import APIError, bad_request
from gateway.ledger.deployments import DeploymentSuperseded
from gateway.ledger.keys import (
    DuplicateAliasError,
    KeyInfo,
    KeyNotFoundError,
    RotateConflictError,
)
from gateway.openapi import Param, json_body, query
from gateway.principal import Principal
from gateway.request_body import read_model
from gateway.response_models import (
    CacheCleared,
    KeyList,
    KeyRevoked,
    KeyView,
    KeyWithSecret,
    Prices,
    Reloaded,
    RouterState,
)
from gateway.routes.admin_models import KeyCreate, KeyRouting, KeyUpdate, ReloadRequest, expiry
from gateway.routes.ledger_read import ledger_read
from gateway.routes.openai import services
from gateway.services import Services
from pricing.money import usd_to_micros

log = logging.getLogger(__name__)

router = APIRouter(prefix="/admin")


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data, default=str),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


# A body carrying a key's secret: no cache or proxy in between may keep a copy.
_SECRET = {"cache-control": "no-store"}


async def admin_services(request: Request) -> Services:
    s = services(request)
    assert s.auth is not None
    s.auth.require_admin(request.headers.get("authorization"))
    return s


def _key_view(info: KeyInfo) -> dict[str, Any]:
    return info.to_dict()


def _check_default_policy(
    s: Services,
    routing: KeyRouting | None,
    allowed: list[str] | tuple[str, ...] | None,
    models: list[str] | tuple[str, ...] | None,
) -> None:
    policy = routing.default_policy if routing is not None else None
    if policy is None:
        return
    rt = s.current()
    if rt.policy(policy) is None:
        raise bad_request(
            f"unknown router policy {echo(policy)}; available: {', '.join(rt.policy_names)} "
            "or fixed:<pool model>",
            param="routing.default_policy",
        )
    if allowed is not None and policy not in allowed:
        raise bad_request(
            f"the default policy {echo(policy)} is not among the key's allowed_policies",
            param="routing.default_policy",
        )
    who = Principal(allowed_models=None if models is None else list(models))
    if not who.may_use_policy(policy):
        raise bad_request(
            f"the default policy {echo(policy)} calls a model that is not among the key's "
            "allowed_models",
            param="routing.default_policy",
        )


def _unserved(
    s: Services, models: list[str] | None, policies: list[str] | None
) -> dict[str, list[str]]:
    """``warnings`` for a key's answer: the allow-list names this gateway does not serve now.
    Not refused, as LiteLLM does not refuse them: a key may be made before the reload that
    adds its model. But a typo (a trailing space, a misspelt name) would otherwise show only
    as the key's requests failing with 403s."""
    rt = s.current()
    warnings = [
        f"allowed_models: {echo(name)} is not a model of this gateway's pool"
        for name in models or ()
        if name not in rt.pool
    ]
    warnings += [
        f"allowed_policies: {echo(name)} is not a router policy of this gateway "
        f"(available: {', '.join(rt.policy_names)} or fixed:<pool model>)"
        for name in policies or ()
        if rt.policy(name) is None
    ]
    if models is not None and not any(name in rt.pool for name in models):
        warnings.append(
            "allowed_models: no model of this gateway's pool, so the key can call none "
            "(every request is a 403)"
        )
    return {"warnings": warnings} if warnings else {}


@router.post(
    "/keys",
    status_code=201,
    response_model=KeyWithSecret,
    openapi_extra=json_body(KeyCreate),
)
async def create_key(request: Request) -> Response:
    s = await admin_services(request)
    body: KeyCreate = await read_model(request, KeyCreate)
    # A budget without a period never resets, as LiteLLM's max_budget without
    # budget_duration and OpenRouter's key limit without a reset.
    period = body.budget_period or ("total" if body.budget_usd is not None else None)
    _check_default_policy(s, body.routing, body.allowed_policies, body.allowed_models)
    expires_at = expiry(body.expires_at, body.duration)
    if expires_at is not None and expires_at <= dt.datetime.now(dt.UTC):
        # Named as the body named it: duration "0s" is as wrong as a past expires_at.
        which = "duration" if body.duration is not None else "expires_at"
        raise bad_request(
            f"{which} puts the expiry in the past: the key would never work", param=which
        )
    try:
        info, secret = await s.key_repository().create(
            alias=body.alias,
            expires_at=expires_at,
            routing=body.routing.model_dump() if body.routing is not None else None,
            budget_usd=body.budget_usd,
            budget_period=period,
            rpm=body.rpm,
            tpm=body.tpm,
            max_parallel=body.max_parallel,
            allowed_models=body.allowed_models,
            allowed_policies=body.allowed_policies,
            metadata=body.metadata,
        )
    except DuplicateAliasError as exc:
        raise APIError(409, str(exc), param="alias", code="alias_taken") from None
    # The secret is returned exactly once; only its hash is stored.
    unserved = _unserved(s, body.allowed_models, body.allowed_policies)
    return json_response(
        {**_key_view(info), "key": secret, **unserved}, status=201, headers=_SECRET
    )


# A page of keys: each one with a budget costs a limit-store read for its spend. The spend
# report pages the same way.
KEYS_PAGE_DEFAULT, KEYS_PAGE_MAX = 100, 1000
PAGE_PARAMS = (
    Param(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": KEYS_PAGE_MAX},
        f"rows per page ({KEYS_PAGE_DEFAULT})",
    ),
    Param("after", {"type": "string"}, "the previous page's last_id"),
)


def _flag(value: str | None, name: str) -> bool:
    """A yes/no query parameter; anything else is a 400 (``include_revoked=yes`` used to
    list without the revoked keys, silently)."""
    if value is None:
        return False
    v = value.strip().lower()
    if v in ("1", "true"):
        return True
    if v in ("0", "false"):
        return False
    raise bad_request(f"{name} must be true or false", param=name)


def page_limit(value: str | None) -> int:
    if value is None:
        return KEYS_PAGE_DEFAULT
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= KEYS_PAGE_MAX:
        raise bad_request(f"limit must be an integer from 1 to {KEYS_PAGE_MAX}", param="limit")
    return limit


@router.get(
    "/keys",
    response_model=KeyList,
    openapi_extra=query(
        *PAGE_PARAMS, Param("include_revoked", {"type": "boolean"}, "list revoked keys too")
    ),
)
@ledger_read
async def list_keys(request: Request) -> Response:
    """A page of keys, oldest first, as OpenAI's list endpoints page: ``limit`` (100, at
    most 1000) and ``after`` (the last key id of the previous page); ``has_more`` says
    whether another page follows."""
    s = await admin_services(request)
    q = request.query_params
    include = _flag(q.get("include_revoked"), "include_revoked")
    limit, after = page_limit(q.get("limit")), q.get("after") or None
    try:
        # One more than asked: whether another page follows, without counting.
        keys = await s.key_repository().list(include_revoked=include, limit=limit + 1, after=after)
    except KeyNotFoundError:
        raise bad_request(f"after: no key {echo(after)}", param="after") from None
    has_more, keys = len(keys) > limit, keys[:limit]
    out = []
    for k in keys:
        out.append(await _key_view_with_spend(s, k))
    return json_response(
        {
            "object": "list",
            "data": out,
            "first_id": keys[0].key_id if keys else None,
            "last_id": keys[-1].key_id if keys else None,
            "has_more": has_more,
        }
    )


@router.get("/keys/{key_id}", response_model=KeyView)
@ledger_read
async def get_key(key_id: str, request: Request) -> Response:
    """One key as the list shows it (as LiteLLM's /key/info), revoked ones too: an operator
    looking up the key id a ledger row or a log line names finds it without paging."""
    s = await admin_services(request)
    info = await s.key_repository().get(key_id)
    if info is None:
        raise APIError(404, f"no key {echo(key_id)}", param="key_id", code="key_not_found")
    return json_response(await _key_view_with_spend(s, info))


@router.patch(
    "/keys/{key_id}", response_model=KeyView, openapi_extra=json_body(KeyUpdate, required=False)
)
async def update_key(key_id: str, request: Request) -> Response:
    s = await admin_services(request)
    body: KeyUpdate = await read_model(request, KeyUpdate)
    fields = body.model_dump(exclude_unset=True)
    if "budget_usd" in fields:
        usd = fields.pop("budget_usd")
        fields["budget_micros"] = usd_to_micros(usd) if usd is not None else None
    if "duration" in fields or "expires_at" in fields:
        # A time in the past expires the key now; null: it never expires.
        fields["expires_at"] = expiry(fields.get("expires_at"), fields.pop("duration", None))
    current = await s.key_repository().get(key_id)
    if current is None or current.revoked:
        # A revoked key stays as it was revoked (as rotate refuses one).
        raise _no_live_key(key_id)
    budget = fields.get("budget_micros", current.budget_micros)
    if budget is not None and fields.get("budget_period", current.budget_period) is None:
        # A budget without a period never resets, said as create_key says it ("total"):
        # a key given its budget later, or whose period is cleared, reads the same.
        fields["budget_period"] = "total"
    if "routing" in fields or "allowed_policies" in fields or "allowed_models" in fields:
        # The default policy must stay one the key may use, whichever of these changes.
        routing = (
            body.routing
            if "routing" in fields
            else KeyRouting(**current.routing)
            if current.routing
            else None
        )
        allowed = (
            fields["allowed_policies"] if "allowed_policies" in fields else current.allowed_policies
        )
        models = fields["allowed_models"] if "allowed_models" in fields else current.allowed_models
        _check_default_policy(s, routing, allowed, models)
    try:
        info = await s.key_repository().update(key_id, **fields)
    except DuplicateAliasError as exc:
        raise APIError(409, str(exc), param="alias", code="alias_taken") from None
    except KeyNotFoundError:
        raise _no_live_key(key_id) from None  # revoked meanwhile
    assert s.auth is not None
    s.auth.invalidate()
    budget_changed = "budget_micros" in fields or "budget_period" in fields
    if s.budgets is not None and budget_changed:
        # A new period has its own counter, which the ledger may already have spend for.
        await s.budgets.restore_key(info)
    if s.metrics is not None:
        # Budget series under the old alias, or read against the old budget, would keep
        # their last value (and hold one of the budget_gauge_keys slots): drop them; the
        # key's next call exports it again if it still has a budget.
        if info.alias != current.alias:
            s.metrics.key_budgets.forget(current.alias)
        if budget_changed:
            s.metrics.key_budgets.forget(info.alias)
    # As GET answers it: a changed budget or period is read against the spend it now has.
    unserved = _unserved(s, fields.get("allowed_models"), fields.get("allowed_policies"))
    return json_response({**await _key_view_with_spend(s, info), **unserved})


async def _key_view_with_spend(s: Services, info: KeyInfo) -> dict[str, Any]:
    """A key's view with its spend and what remains when it has a budget (as the list, the
    lookup and a change answer it)."""
    view = _key_view(info)
    if info.budget_micros is not None and s.limits is not None:
        view["spent_usd"], view["remaining_usd"] = await s.key_spend(info)
    return view


def _no_live_key(key_id: str) -> APIError:
    return APIError(404, f"no live key {echo(key_id)}", param="key_id", code="key_not_found")


@router.post("/keys/{key_id}/rotate", response_model=KeyWithSecret)
async def rotate_key(key_id: str, request: Request) -> Response:
    """A new secret for a key (as LiteLLM's /key/regenerate): the old one is refused from
    now on (on other workers and replicas within the 5 s lookup cache); budget, spend,
    limits and history stay with the key id. Of concurrent rotations one wins; the others
    are 409 ``rotate_conflict`` and hand out no secret."""
    s = await admin_services(request)
    try:
        info, secret = await s.key_repository().rotate(key_id)
    except KeyNotFoundError:
        raise APIError(
            404, f"no live key {echo(key_id)}", param="key_id", code="key_not_found"
        ) from None
    except RotateConflictError:
        # A concurrent rotation won: this one's secret was never stored, so it must not be
        # handed out. Nothing changed; a retry rotates again and returns a live secret.
        raise APIError(
            409,
            f"key {echo(key_id)} was rotated by a concurrent request; this rotation changed "
            "nothing: retry to get a new secret",
            param="key_id",
            code="rotate_conflict",
        ) from None
    assert s.auth is not None
    s.auth.invalidate()
    return json_response({**_key_view(info), "key": secret}, headers=_SECRET)


@router.delete("/keys/{key_id}", response_model=KeyRevoked)
async def revoke_key(key_id: str, request: Request) -> Response:
    s = await admin_services(request)
    try:
        info = await s.key_repository().revoke(key_id)
    except KeyNotFoundError:
        raise APIError(
            404, f"no key {echo(key_id)}", param="key_id", code="key_not_found"
        ) from None
    assert s.auth is not None
    s.auth.invalidate()
    if s.metrics is not None:
        # Its budget series would stay at their last value and hold a slot.
        s.metrics.key_budgets.forget(info.alias)
    return json_response({"key_id": key_id, "revoked": True})


@router.delete("/cache", response_model=CacheCleared)
async def clear_cache(request: Request) -> Response:
    """Drop every answer the answer cache holds (after a model changed behind its name, say).
    With the in-process backend, only the answering worker's: use Redis with several."""
    from gateway.cache import CacheUnavailable

    s = await admin_services(request)
    if s.cache is None:
        raise APIError(409, "the answer cache is off (cache.enabled: false)", code="cache_disabled")
    try:
        deleted = await s.cache.clear()
    except CacheUnavailable as exc:
        raise APIError(
            503, f"the answer cache's backend is unavailable: {exc}", type="server_error",
            code="cache_unavailable",
        ) from None  # fmt: skip
    return json_response({"deleted": deleted, "backend": s.settings.cache.backend})


@router.get("/pricing", response_model=Prices)
async def pricing(request: Request) -> Response:
    s = await admin_services(request)
    rt = s.current()
    return json_response({"catalog_version": rt.catalog.version, "pool": rt.pool.price_snapshot()})


@router.get("/router", response_model=RouterState)
async def router_state(request: Request) -> Response:
    """What is serving now: the default policy, the policies by name and the compact
    checkpoint (path, content version, kind, feature version) — the same object a reload
    answers with, without reloading."""
    s = await admin_services(request)
    rt = s.current()
    deployment = s.active_deployment
    return json_response(
        {
            "default_policy": rt.default_policy,
            "policies": rt.policy_names,
            "pool": rt.pool.names,
            "checkpoint": rt.checkpoint_info,
            # How the compact policy explores (what the logged propensities come from): an
            # operator checks it before counting on traffic for off-policy training.
            "exploration": {
                "epsilon": s.settings.router.epsilon,
                "sample": s.settings.router.sample,
                "temperature": s.settings.router.temperature,
            },
            # The `xrouter deploy` it serves (None: the config's checkpoint), and which worker
            # answered: each worker follows the newest deployment within
            # router.deployment_poll_s.
            "deployment": deployment.to_dict() if deployment is not None else None,
            "worker": os.getpid(),
            # Models whose circuit breaker is not closed, in the worker that answered.
            "circuits": {m: rt.client.breakers.state(m) for m in rt.client.breakers.open_models()},
            # Deployments passed over after a failure, in the worker that answered.
            "deployments_cooling": rt.client.balancer.cooling(),
        }
    )


@router.post(
    "/reload", response_model=Reloaded, openapi_extra=json_body(ReloadRequest, required=False)
)
async def reload(request: Request) -> Response:
    """Re-read the config file (pool, prices, checkpoint) and swap the runtime; with
    ``{"checkpoint": path}``, deploy that checkpoint: this worker loads it, and the ledger
    database records it for every other worker and replica, which follow within
    ``router.deployment_poll_s``, and for restarts. A deployed checkpoint holds across
    reloads until the config's own ``router.checkpoint`` changes. In-flight requests finish
    on the runtime they started with."""
    s = await admin_services(request)
    from gateway.settings import SettingsError, load_settings

    body: ReloadRequest = await read_model(request, ReloadRequest)
    path = request.app.state.config_path
    try:
        # Off the event loop, as the file watcher reads it: a config on a slow or stuck
        # filesystem must not stall every request this worker serves.
        settings = await asyncio.to_thread(load_settings, path) if path else s.file_settings
        if body.checkpoint is not None:
            rt = await s.deploy(body.checkpoint, settings)
        else:
            rt = await s.reload(settings)
    except DeploymentSuperseded as exc:
        # Not an error of the checkpoint's: a deploy that overlapped this one was recorded
        # first, and that is what every worker follows. A 200 here would tell the operator
        # their checkpoint serves when it does not.
        log.warning("admin deploy of %s not recorded: %s", body.checkpoint, exc)
        raise APIError(
            409,
            f"{exc}: it is what every worker and replica follows, and {body.checkpoint} was "
            "not deployed (deploy again to replace it)",
            param="checkpoint",
            code="deployment_superseded",
        ) from None
    except (SettingsError, ValueError, OSError) as exc:
        # Logged as the file watcher's failures are: operators read the gateway's log, not
        # the deploying client's output.
        what = f"deploy of {body.checkpoint}" if body.checkpoint is not None else "reload"
        log.warning("admin %s refused, still serving the previous config: %s", what, exc)
        raise APIError(
            400, f"reload failed, still serving the previous config: {exc}", code="reload_failed"
        ) from None
    deployment = s.active_deployment
    return json_response(
        {
            "status": "reloaded",
            # A reload is this worker's (a deployment is every worker's): with several, the
            # others take a config change up through their file watchers.
            "worker": os.getpid(),
            "pool": rt.pool.names,
            "policies": rt.policy_names,
            "checkpoint": rt.checkpoint_info,
            "deployment": deployment.to_dict() if deployment is not None else None,
        }
    )
