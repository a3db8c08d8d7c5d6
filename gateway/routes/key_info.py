"""``GET /v1/key``: a key's own limits and what it has spent (as OpenRouter's ``/key``), so
an application can check its remaining budget without the admin key."""

from __future__ import annotations

import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.errors import APIError
from gateway.hooks import limits_unavailable
from gateway.ledger.keys import KeyInfo
from gateway.ledger.spend import budget_spend
from gateway.limits import LimitStoreUnavailable
from gateway.limits.base import BudgetState
from gateway.limits.windows import period_window
from gateway.response_models import OwnKey
from gateway.routes.ledger_read import ledger_read
from gateway.routes.openai import services
from gateway.services import Services
from pricing import micros_to_usd

router = APIRouter()


async def _from_ledger(s: Services, info: KeyInfo) -> BudgetState:
    """The key's spend in its budget period as the ledger records it — what the limit store
    is restored from, and what the admin's key list shows while the store is down — so a
    client can still read its budget during a Redis outage. Holds of requests in flight are
    not in the ledger yet: ``reserved`` is 0."""
    if s.engine is None:
        raise limits_unavailable()
    window = period_window(info.budget_period, time.time())
    spent = (await budget_spend(s.engine, [info.key_id], window.start)).get(info.key_id, 0)
    budget = info.limits().budget_micros
    return BudgetState(
        spent=spent,
        reserved=0,
        remaining=None if budget is None else max(0, budget - spent),
        period_start=window.start,
        resets_at=window.end,
    )


@router.get("/v1/key", response_model=OwnKey)
@ledger_read
async def key_info(request: Request) -> Response:
    s = services(request)
    assert s.auth is not None
    who = await s.auth.caller(request.headers)
    info = await s.key_repository().get(who.key_id) if who.key_id is not None else None
    if info is None:
        raise APIError(
            404,
            "authentication is off: requests carry no key, so there is nothing to report",
            code="key_not_found",
        )
    if info.budget_usd is None:
        # The limit store counts a key's spend only against a budget (no budget, no holds
        # to settle), so it would say $0: the ledger has what the key spent, all time.
        state: BudgetState | None = await _from_ledger(s, info)
    else:
        try:
            state = await s.limits.spent(info.limits()) if s.limits is not None else None
        except LimitStoreUnavailable:
            state = await _from_ledger(s, info)
    spent = micros_to_usd(state.spent) if state is not None else None
    remaining = (
        micros_to_usd(state.remaining)
        if state is not None and state.remaining is not None
        else None
    )
    data: dict[str, Any] = {
        "key_id": info.key_id,
        "alias": info.alias,
        "budget_usd": info.budget_usd,
        "budget_period": info.budget_period,
        "spent_usd": spent,
        "remaining_usd": remaining,
        "period_start": state.period_start if state is not None else None,
        "resets_at": state.resets_at if state is not None else None,
        "rpm": info.rpm,
        "tpm": info.tpm,
        "max_parallel": info.max_parallel,
        "allowed_models": list(info.allowed_models) if info.allowed_models is not None else None,
        "allowed_policies": (
            list(info.allowed_policies) if info.allowed_policies is not None else None
        ),
        "expires_at": info.expires_at.isoformat() if info.expires_at is not None else None,
        "routing": dict(info.routing) if info.routing is not None else None,
        # OpenRouter's names for the same figures, for clients written against it.
        "label": info.alias,
        "limit": info.budget_usd,
        "usage": spent,
        "limit_remaining": remaining,
    }
    return Response(orjson.dumps({"data": data}), media_type="application/json")
