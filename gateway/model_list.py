"""What ``GET /v1/models`` and ``GET /v1/models/{model}`` show a caller: the routers (``xrouter``
and ``xrouter/<policy>``) and the pool models with their prices, limited, as OpenAI and
LiteLLM's proxy do, to what the caller's key may use — in OpenAI's shape, or in Anthropic's
for Anthropic's clients."""

from __future__ import annotations

import datetime as dt
from typing import Any

from gateway.echo import echo
from gateway.errors import bad_request
from gateway.principal import Principal
from gateway.runtime import POLICY_PREFIX, ROUTER_MODEL, Runtime
from router.pool import PoolModel


def _router_entry(model_id: str, policy: str, created: int) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "xrouter",
        "xrouter": {"kind": "router", "policy": policy},
    }


def _pool_entry(m: PoolModel, created: int) -> dict[str, Any]:
    return {
        "id": m.name,
        "object": "model",
        "created": created,
        "owned_by": m.provider,
        "xrouter": {
            "kind": "pool",
            "price": {
                "input_per_mtok": str(m.price.input),
                "output_per_mtok": str(m.price.output),
            },
            "max_output_tokens": m.max_output_tokens,
            "description": m.description,
            # None: not declared (any input is routed to it).
            "input_modalities": (
                None if m.input_modalities is None else sorted(m.input_modalities)
            ),
            "output_modalities": (
                None if m.output_modalities is None else sorted(m.output_modalities)
            ),
            # As OpenRouter's context_length; None: not declared.
            "context_window": m.context_window,
        },
    }


def list_models(rt: Runtime, who: Principal) -> list[dict[str, Any]]:
    """Every model name the caller may send, the routers first (``xrouter/fixed:<model>``
    names are not listed: one per pool model would only repeat the pool)."""
    created = rt.created
    data: list[dict[str, Any]] = []
    if not _may_route(rt, who):
        # Every router needs a pool model the key may use: with none, each is a 403.
        return data
    default = who.default_policy or rt.default_policy  # the key's own, if it has one
    if who.may_use_policy(default):
        data.append(_router_entry(ROUTER_MODEL, default, created))
    data.extend(
        _router_entry(f"{POLICY_PREFIX}{p}", p, created)
        for p in rt.policy_names
        if who.may_use_policy(p)
    )
    data.extend(_pool_entry(m, created) for m in rt.pool if who.may_use_model(m.name))
    return data


def find_model(rt: Runtime, who: Principal, model_id: str) -> dict[str, Any] | None:
    """The entry for ``model_id`` as the chat endpoint would resolve it, or None when it does
    not exist or the caller's key may not use it."""
    created = rt.created
    if model_id == ROUTER_MODEL or model_id.startswith(POLICY_PREFIX):
        default = who.default_policy or rt.default_policy
        policy = default if model_id == ROUTER_MODEL else model_id[len(POLICY_PREFIX) :]
        if rt.policy(policy) is None or not who.may_use_policy(policy) or not _may_route(rt, who):
            return None
        return _router_entry(model_id, policy, created)
    m = rt.pool.get(model_id)
    if m is None or not who.may_use_model(model_id):
        return None
    return _pool_entry(m, created)


def anthropic_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry in Anthropic's shape (``type``, ``display_name``, an RFC 3339
    ``created_at``), the ``xrouter`` details kept."""
    created = dt.datetime.fromtimestamp(int(entry["created"]), dt.UTC)
    return {
        "type": "model",
        "id": entry["id"],
        "display_name": entry["id"],
        "created_at": created.isoformat().replace("+00:00", "Z"),
        "xrouter": entry["xrouter"],
    }


def anthropic_list(
    data: list[dict[str, Any]],
    limit: str | None = None,
    after_id: str | None = None,
    before_id: str | None = None,
) -> dict[str, Any]:
    """A model list as Anthropic's ``GET /v1/models`` answers: a page of ``limit`` entries
    (1 to 1000, 20 if not given, as Anthropic's) after ``after_id`` or before ``before_id``,
    with ``has_more`` saying whether entries lie beyond it in that direction."""
    size = _page_size(limit)
    ids = [e["id"] for e in data]
    if after_id is not None and before_id is not None:
        raise bad_request("give after_id or before_id, not both", param="before_id")
    if before_id is not None:
        end = _position(ids, before_id, "before_id")
        start = max(0, end - size)
        has_more = start > 0
    else:
        start = 0 if after_id is None else _position(ids, after_id, "after_id") + 1
        end = min(len(data), start + size)
        has_more = end < len(data)
    entries = [anthropic_entry(e) for e in data[start:end]]
    return {
        "data": entries,
        "has_more": has_more,
        "first_id": entries[0]["id"] if entries else None,
        "last_id": entries[-1]["id"] if entries else None,
    }


def _page_size(limit: str | None) -> int:
    if limit is None:
        return 20
    if not limit.isdigit() or not 1 <= int(limit) <= 1000:
        raise bad_request("limit: a whole number from 1 to 1000", param="limit")
    return int(limit)


def _position(ids: list[str], model_id: str, param: str) -> int:
    try:
        return ids.index(model_id)
    except ValueError:
        raise bad_request(
            f"{param}: the model {echo(model_id)} is not in the list", param=param
        ) from None


def _may_route(rt: Runtime, who: Principal) -> bool:
    """Whether the key may use some pool model: routing restricts the pool to those, and
    with none left every router's request is a 403 ``no_allowed_models``."""
    return who.allowed_models is None or any(who.may_use_model(m.name) for m in rt.pool)
