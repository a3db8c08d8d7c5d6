"""The admin API (admin key): keys, spend reports, pricing, router reload."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import re
from typing import Any, Literal, cast

import orjson
from fastapi import APIRouter, Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.responses import Response

from gateway.errors import APIError, bad_request
from gateway.ledger.keys import DuplicateAliasError, KeyInfo, KeyNotFoundError
from gateway.ledger.spend import GROUP_BY_CHOICES, GroupBy, spend_report, to_utc
from gateway.routes.openai import read_body, services
from gateway.services import Services
from pricing.money import MAX_USD, usd_to_micros

router = APIRouter(prefix="/admin")

Period = Literal["daily", "weekly", "monthly", "total"]

# What the ledger's columns hold: budgets are BIGINT micro-USD (at most MAX_USD), rpm/tpm are
# INTEGER (32-bit on PostgreSQL).
MAX_RATE = 2**31 - 1


def _alias_text(alias: str | None) -> str | None:
    # PostgreSQL's text types refuse NUL characters; say so rather than fail the insert.
    if alias is not None and "\x00" in alias:
        raise ValueError("may not contain NUL characters")
    # The repository stores the alias stripped: one of only spaces would be empty there.
    if alias is not None and not alias.strip():
        raise ValueError("may not be blank")
    return alias


def _budget() -> Any:
    return Field(default=None, ge=0, le=MAX_USD, allow_inf_nan=False)


def _rate() -> Any:
    return Field(default=None, ge=1, le=MAX_RATE)


_DURATION = re.compile(r"^\s*(\d{1,9})\s*([smhdw])\s*$")
_DURATION_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
# What a datetime can hold, and then some: a key "for 100 years" is a key that never expires.
MAX_DURATION_S = 100 * 365 * 86400


def _duration_s(value: str) -> int:
    """Seconds in a duration (``30s``, ``15m``, ``12h``, ``30d``, ``2w``)."""
    m = _DURATION.match(value)
    if m is None:
        raise ValueError("a duration is a number and a unit: 30s, 15m, 12h, 30d or 2w")
    seconds = int(m[1]) * _DURATION_S[m[2]]
    if seconds > MAX_DURATION_S:
        raise ValueError("at most 100 years; leave expires_at unset for a key that never expires")
    return seconds


def _duration(value: str | None) -> str | None:
    if value is not None:
        _duration_s(value)
    return value


def expiry(expires_at: dt.datetime | None, duration: str | None) -> dt.datetime | None:
    """When a key made or changed now expires: ``expires_at`` (naive = UTC), or ``duration``
    from now (as LiteLLM's key ``duration``)."""
    if duration is not None:
        return dt.datetime.now(dt.UTC) + dt.timedelta(seconds=_duration_s(duration))
    return to_utc(expires_at)


class _Expiry(BaseModel):
    expires_at: dt.datetime | None = None
    duration: str | None = None

    _duration = field_validator("duration")(_duration)
    # In UTC from the start, so a time outside what UTC can hold is refused here (400).
    _expires_at = field_validator("expires_at")(to_utc)

    @model_validator(mode="after")
    def _one_of(self) -> _Expiry:
        if self.duration is not None and self.expires_at is not None:
            raise ValueError("give expires_at or duration, not both")
        return self


class KeyRouting(BaseModel):
    """A key's routing defaults: what its requests get when their ``xrouter`` controls do
    not say (``cost_weight``), or at most (``max_cost_usd``, a ceiling on the request's own
    cap), and the policy the model name ``xrouter`` means for it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    default_policy: str | None = Field(default=None, min_length=1, max_length=64)
    cost_weight: float | None = Field(default=None, ge=0, le=1e6)
    max_cost_usd: float | None = Field(default=None, gt=0, le=MAX_USD, allow_inf_nan=False)


# Strict types, as the chat API's: `"rpm": true` is not a rate of 1, nor `"budget_usd": "5"`
# a budget (JSON's own types still convert: a whole number is a float, a timestamp string
# a time).
class KeyCreate(_Expiry):
    model_config = ConfigDict(extra="forbid", strict=True)

    alias: str = Field(min_length=1, max_length=128)
    budget_usd: float | None = _budget()
    budget_period: Period | None = None
    rpm: int | None = _rate()
    tpm: int | None = _rate()
    allowed_models: list[str] | None = None
    allowed_policies: list[str] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    routing: KeyRouting | None = None

    _alias = field_validator("alias")(_alias_text)


def _alias_not_null(alias: str | None) -> str | None:
    # Called only for an alias the body sets: null would clear a required field (a 500 from
    # the repository, before this).
    if alias is None:
        raise ValueError("a key's alias cannot be removed; give a new one")
    return alias


class KeyUpdate(_Expiry):
    model_config = ConfigDict(extra="forbid", strict=True)

    alias: str | None = Field(default=None, min_length=1, max_length=128)
    budget_usd: float | None = _budget()
    budget_period: Period | None = None
    rpm: int | None = _rate()
    tpm: int | None = _rate()
    allowed_models: list[str] | None = None
    allowed_policies: list[str] | None = None
    metadata: dict[str, Any] | None = None
    routing: KeyRouting | None = None

    _alias = field_validator("alias")(_alias_text)
    _alias_set = field_validator("alias")(_alias_not_null)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data, default=str),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


# A body carrying a key's secret: no cache or proxy in between may keep a copy.
_SECRET = {"cache-control": "no-store"}


async def _admin(request: Request) -> Services:
    s = services(request)
    assert s.auth is not None
    s.auth.require_admin(request.headers.get("authorization"))
    return s


async def _body(request: Request, model: type[BaseModel]) -> Any:
    raw = await read_body(request, 64 * 1024)
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        # A body that is not JSON, or not an object, is `invalid_json`, as on every other
        # JSON endpoint (the README's error table).
        code = "invalid_json" if err["type"] in ("json_invalid", "model_type") else None
        message = f"{param}: {err['msg']}" if param else err["msg"]
        raise bad_request(message, param=param, code=code) from None


def _key_view(info: KeyInfo) -> dict[str, Any]:
    return info.to_dict()


def _check_default_policy(
    s: Services, routing: KeyRouting | None, allowed: list[str] | tuple[str, ...] | None
) -> None:
    policy = routing.default_policy if routing is not None else None
    if policy is None:
        return
    rt = s.current()
    if rt.policy(policy) is None:
        raise bad_request(
            f"unknown router policy {policy!r}; available: {', '.join(rt.policy_names)} "
            "or fixed:<pool model>",
            param="routing.default_policy",
        )
    if allowed is not None and policy not in allowed:
        raise bad_request(
            f"the default policy {policy!r} is not among the key's allowed_policies",
            param="routing.default_policy",
        )


@router.post("/keys")
async def create_key(request: Request) -> Response:
    s = await _admin(request)
    body: KeyCreate = await _body(request, KeyCreate)
    # A budget without a period never resets, as LiteLLM's max_budget without
    # budget_duration and OpenRouter's key limit without a reset.
    period = body.budget_period or ("total" if body.budget_usd is not None else None)
    _check_default_policy(s, body.routing, body.allowed_policies)
    expires_at = expiry(body.expires_at, body.duration)
    if expires_at is not None and expires_at <= dt.datetime.now(dt.UTC):
        # Named as the body named it: duration "0s" is as wrong as a past expires_at.
        which = "duration" if body.duration is not None else "expires_at"
        raise bad_request(
            f"{which} puts the expiry in the past: the key would never work", param=which
        )
    try:
        info, secret = await s.keys.create(
            alias=body.alias,
            expires_at=expires_at,
            routing=body.routing.model_dump() if body.routing is not None else None,
            budget_usd=body.budget_usd,
            budget_period=period,
            rpm=body.rpm,
            tpm=body.tpm,
            allowed_models=body.allowed_models,
            allowed_policies=body.allowed_policies,
            metadata=body.metadata,
        )
    except DuplicateAliasError as exc:
        raise APIError(409, str(exc), param="alias", code="alias_taken") from None
    # The secret is returned exactly once; only its hash is stored.
    return _json({**_key_view(info), "key": secret}, status=201, headers=_SECRET)


# A page of keys: each one with a budget costs a limit-store read for its spend. The spend
# report pages the same way.
KEYS_PAGE_DEFAULT, KEYS_PAGE_MAX = 100, 1000


def _flag(value: str | None, name: str) -> bool:
    """A yes/no query parameter; anything else is a 400 (``include_revoked=yes`` used to
    list without the revoked keys, silently)."""
    if value is None:
        return False
    v = value.strip().lower()
    if v in ("1", "true"):
        return True
    if v in ("0", "false", ""):
        return False
    raise bad_request(f"{name} must be true or false", param=name)


def _page_limit(value: str | None) -> int:
    if value is None:
        return KEYS_PAGE_DEFAULT
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if not 1 <= limit <= KEYS_PAGE_MAX:
        raise bad_request(f"limit must be an integer from 1 to {KEYS_PAGE_MAX}", param="limit")
    return limit


@router.get("/keys")
async def list_keys(request: Request) -> Response:
    """A page of keys, oldest first, as OpenAI's list endpoints page: ``limit`` (100, at
    most 1000) and ``after`` (the last key id of the previous page); ``has_more`` says
    whether another page follows."""
    s = await _admin(request)
    q = request.query_params
    include = _flag(q.get("include_revoked"), "include_revoked")
    limit, after = _page_limit(q.get("limit")), q.get("after") or None
    try:
        # One more than asked: whether another page follows, without counting.
        keys = await s.keys.list(include_revoked=include, limit=limit + 1, after=after)
    except KeyNotFoundError:
        raise bad_request(f"after: no key {after!r}", param="after") from None
    has_more, keys = len(keys) > limit, keys[:limit]
    out = []
    for k in keys:
        view = _key_view(k)
        if k.budget_micros is not None and s.limits is not None:
            view["spent_usd"], view["remaining_usd"] = await s.key_spend(k)
        out.append(view)
    return _json(
        {
            "object": "list",
            "data": out,
            "first_id": keys[0].key_id if keys else None,
            "last_id": keys[-1].key_id if keys else None,
            "has_more": has_more,
        }
    )


@router.get("/keys/{key_id}")
async def get_key(key_id: str, request: Request) -> Response:
    """One key as the list shows it (as LiteLLM's /key/info), revoked ones too: an operator
    looking up the key id a ledger row or a log line names finds it without paging."""
    s = await _admin(request)
    info = await s.keys.get(key_id)
    if info is None:
        raise APIError(404, f"no key {key_id!r}", param="key_id", code="key_not_found")
    view = _key_view(info)
    if info.budget_micros is not None and s.limits is not None:
        view["spent_usd"], view["remaining_usd"] = await s.key_spend(info)
    return _json(view)


@router.patch("/keys/{key_id}")
async def update_key(key_id: str, request: Request) -> Response:
    s = await _admin(request)
    body: KeyUpdate = await _body(request, KeyUpdate)
    fields = body.model_dump(exclude_unset=True)
    if "budget_usd" in fields:
        usd = fields.pop("budget_usd")
        fields["budget_micros"] = usd_to_micros(usd) if usd is not None else None
    if "duration" in fields or "expires_at" in fields:
        # A time in the past expires the key now; null: it never expires.
        fields["expires_at"] = expiry(fields.get("expires_at"), fields.pop("duration", None))
    current = await s.keys.get(key_id)
    if current is None or current.revoked:
        # A revoked key stays as it was revoked (as rotate refuses one).
        raise _no_live_key(key_id)
    budget = fields.get("budget_micros", current.budget_micros)
    if budget is not None and fields.get("budget_period", current.budget_period) is None:
        # A budget without a period never resets, said as create_key says it ("total"):
        # a key given its budget later, or whose period is cleared, reads the same.
        fields["budget_period"] = "total"
    if "routing" in fields or "allowed_policies" in fields:
        # The default policy must stay one the key may use, whichever of the two changes.
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
        _check_default_policy(s, routing, allowed)
    try:
        info = await s.keys.update(key_id, **fields)
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
            s.metrics.forget_key_budget(current.alias)
        if budget_changed:
            s.metrics.forget_key_budget(info.alias)
    return _json(_key_view(info))


def _no_live_key(key_id: str) -> APIError:
    return APIError(404, f"no live key {key_id!r}", param="key_id", code="key_not_found")


@router.post("/keys/{key_id}/rotate")
async def rotate_key(key_id: str, request: Request) -> Response:
    """A new secret for a key (as LiteLLM's /key/regenerate): the old one is refused from
    now on (on other workers and replicas within the 5 s lookup cache); budget, spend,
    limits and history stay with the key id."""
    s = await _admin(request)
    try:
        info, secret = await s.keys.rotate(key_id)
    except KeyNotFoundError:
        raise APIError(
            404, f"no live key {key_id!r}", param="key_id", code="key_not_found"
        ) from None
    assert s.auth is not None
    s.auth.invalidate()
    return _json({**_key_view(info), "key": secret}, headers=_SECRET)


@router.delete("/keys/{key_id}")
async def revoke_key(key_id: str, request: Request) -> Response:
    s = await _admin(request)
    try:
        info = await s.keys.revoke(key_id)
    except KeyNotFoundError:
        raise APIError(404, f"no key {key_id!r}", param="key_id", code="key_not_found") from None
    assert s.auth is not None
    s.auth.invalidate()
    if s.metrics is not None:
        # Its budget series would stay at their last value and hold a slot.
        s.metrics.forget_key_budget(info.alias)
    return _json({"key_id": key_id, "revoked": True})


_EPOCH = re.compile(r"^[+-]?\d+(\.\d+)?$")


def _time(v: str | None, name: str) -> dt.datetime | None:
    if not v:
        return None
    try:
        try:
            return to_utc(dt.datetime.fromisoformat(v))
        except ValueError:
            # Epoch seconds, as the ledger's to_utc takes them. ISO first: 8 digits are an
            # ISO date (20250131), as they were before epoch seconds were accepted.
            if _EPOCH.match(v.strip()) is None:
                raise
            return to_utc(float(v) if "." in v else int(v))
    except ValueError:
        raise bad_request(
            f"{name} must be an ISO-8601 date or time, or epoch seconds, between years 1 and "
            "9999 UTC",
            param=name,
        ) from None


# Spend rows are groups, not records with ids: a page's cursor is its last row's group (the
# values of its group_by columns, base64url JSON so that it travels as one query value). The
# rows are ordered by group, None first, then by value in byte (code point) order — the
# database orders and pages them (``spend_report``'s ``after`` and ``limit``) — so "after" is
# a position, not a row that has to exist: a group that appears between two pages (a new key,
# a new day) lands on its page, and a cursor stays valid however the ledger grows.
SpendGroup = list[str | None]


def _spend_cursor(row: dict[str, Any], fields: list[str]) -> str:
    group = [None if row[f] is None else str(row[f]) for f in fields]
    return base64.urlsafe_b64encode(orjson.dumps(group)).decode().rstrip("=")


def _spend_cursor_group(cursor: str | None, width: int) -> SpendGroup | None:
    """The group a cursor (a previous page's ``last_id``) names, for rows of ``width``
    groups."""
    if not cursor:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        group = orjson.loads(raw)
    except ValueError:  # not base64 or not JSON (both errors are ValueErrors)
        group = None
    if (
        not isinstance(group, list)
        or len(group) != width
        or not all(v is None or isinstance(v, str) for v in group)
    ):
        raise bad_request(
            "after must be the last_id of a previous page of this report, with the same group_by",
            param="after",
        )
    return cast(SpendGroup, group)


@router.get("/spend")
async def spend(request: Request) -> Response:
    """Spend per group, a page at a time as ``GET /admin/keys`` pages: ``limit`` (100, at most
    1000) groups, ``after`` the previous page's ``last_id``, ``has_more``."""
    s = await _admin(request)
    q = request.query_params
    # Order kept, repeats dropped: the answer echoes the grouping the rows are keyed by.
    group_by = list(dict.fromkeys(g.strip() for g in (q.get("group_by") or "key").split(",")))
    group_by = [g for g in group_by if g]
    bad = [g for g in group_by if g not in GROUP_BY_CHOICES]
    if bad:
        raise bad_request(
            f"group_by accepts {', '.join(GROUP_BY_CHOICES)}; got {bad}", param="group_by"
        )
    # The rows' names for their groups: grouped by key, a row says key_id.
    fields = ["key_id" if g == "key" else g for g in group_by]
    limit = _page_limit(q.get("limit"))
    after = _spend_cursor_group(q.get("after"), len(fields))
    since, until = _time(q.get("since"), "since"), _time(q.get("until"), "until")
    await s.ledger.flush()
    # The page and one row more, to know whether there is a next page.
    rows = await spend_report(
        s.engine,
        cast(list[GroupBy], group_by),
        since=since,
        until=until,
        key_id=q.get("key"),
        end_user=q.get("user"),
        tag=q.get("tag"),
        after=after,
        limit=limit + 1,
    )
    has_more, rows = len(rows) > limit, rows[:limit]
    return _json(
        {
            "object": "list",
            "group_by": group_by,
            "data": rows,
            "first_id": _spend_cursor(rows[0], fields) if rows else None,
            "last_id": _spend_cursor(rows[-1], fields) if rows else None,
            "has_more": has_more,
        }
    )


@router.delete("/cache")
async def clear_cache(request: Request) -> Response:
    """Drop every answer the answer cache holds (after a model changed behind its name, say).
    With the in-process backend, only the answering worker's: use Redis with several."""
    from gateway.cache import CacheUnavailable

    s = await _admin(request)
    if s.cache is None:
        raise APIError(409, "the answer cache is off (cache.enabled: false)", code="cache_disabled")
    try:
        deleted = await s.cache.clear()
    except CacheUnavailable as exc:
        raise APIError(
            503, f"the answer cache's backend is unavailable: {exc}", type="server_error",
            code="cache_unavailable",
        ) from None  # fmt: skip
    return _json({"deleted": deleted, "backend": s.settings.cache.backend})


@router.get("/pricing")
async def pricing(request: Request) -> Response:
    s = await _admin(request)
    rt = s.current()
    return _json({"catalog_version": rt.catalog.version, "pool": rt.pool.price_snapshot()})


@router.get("/router")
async def router_state(request: Request) -> Response:
    """What is serving now: the default policy, the policies by name and the compact
    checkpoint (path, content version, kind, feature version) — the same object a reload
    answers with, without reloading."""
    s = await _admin(request)
    rt = s.current()
    deployment = s.active_deployment
    return _json(
        {
            "default_policy": rt.default_policy,
            "policies": rt.policy_names,
            "pool": rt.pool.names,
            "checkpoint": rt.checkpoint_info,
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


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Deploy a router checkpoint (a path on the gateway's filesystem) without a config edit.
    checkpoint: str | None = None


@router.post("/reload")
async def reload(request: Request) -> Response:
    """Re-read the config file (pool, prices, checkpoint) and swap the runtime; with
    ``{"checkpoint": path}``, deploy that checkpoint: this worker loads it, and the ledger
    database records it for every other worker and replica, which follow within
    ``router.deployment_poll_s``, and for restarts. A deployed checkpoint holds across
    reloads until the config's own ``router.checkpoint`` changes. In-flight requests finish
    on the runtime they started with."""
    s = await _admin(request)
    from gateway.settings import SettingsError, load_settings

    body: ReloadRequest = await _body(request, ReloadRequest)
    path = request.app.state.config_path
    try:
        # Off the event loop, as the file watcher reads it: a config on a slow or stuck
        # filesystem must not stall every request this worker serves.
        settings = await asyncio.to_thread(load_settings, path) if path else s.file_settings
        if body.checkpoint is not None:
            rt = await s.deploy(body.checkpoint, settings)
        else:
            rt = await s.reload(settings)
    except (SettingsError, ValueError, OSError) as exc:
        raise APIError(
            400, f"reload failed, still serving the previous config: {exc}", code="reload_failed"
        ) from None
    deployment = s.active_deployment
    return _json(
        {
            "status": "reloaded",
            "pool": rt.pool.names,
            "policies": rt.policy_names,
            "checkpoint": rt.checkpoint_info,
            "deployment": deployment.to_dict() if deployment is not None else None,
        }
    )
