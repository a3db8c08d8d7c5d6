"""What a caller can do with a request it made once it is answered: score it
(``POST /v1/feedback``) and read what it cost (``GET /v1/generation``, as OpenRouter's
generation stats). Both name the request by any id the response carried and answer only
to the key that made it."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.echo import echo
from gateway.errors import APIError, bad_request
from gateway.ledger.records import FeedbackRecord
from gateway.ledger.spend import get_calls, get_request
from gateway.openapi import Param, json_body, query
from gateway.principal import Principal
from gateway.request_body import read_model
from gateway.response_models import FeedbackRecorded, Generation
from gateway.routes.ledger_read import ledger_read
from gateway.routes.openai import services
from gateway.schemas import FeedbackRequest, request_id_from
from gateway.services import Services
from pricing import micros_to_usd
from router.reward import RewardConfig, RewardTerms, compute_reward

router = APIRouter()

# How long past another process's flush interval a request's row may take to be written
# (a batch's commit), and how often to look for it meanwhile.
_GRACE_S = 1.5  # a loaded process commits late; this only delays a 404
_POLL_S = 0.05


def _not_found(request_id: str, param: str) -> APIError:
    return APIError(
        404, f"no request {echo(request_id)} in the ledger", param=param, code="request_not_found"
    )


async def logged_request(
    s: Services, who: Principal, request_id: str, param: str = "request_id", sent: str = ""
) -> dict[str, Any]:
    """The ledger's row of a request ``who`` made, or a 404 (also for another key's request:
    the answer must not reveal which ids exist) naming the id as the client ``sent`` it
    (``chatcmpl-…``: the ledger's is without the prefix, which the client never saw).

    The row is written behind the response (batched): a call right after the answer may
    find it still queued or, for a stream whose bookkeeping runs after its last chunk, not
    yet submitted. Only then is the batch forced, so calls at a steady rate do not defeat
    the batching."""
    # Whether keys are checked is the authenticator's (built at start, as the whole auth
    # section is read): a reload that turned auth.enabled off must not open every
    # request's record to every key while keys are still asked for.
    assert s.auth is not None
    checked = s.auth.enabled

    async def mine() -> dict[str, Any] | None:
        # Another key's request is looked for exactly as an unknown one is, so that not
        # even the time of the 404 says it exists.
        row = await get_request(s.ledger_engine(), request_id)
        return row if row is not None and (not checked or row.get("key_id") == who.key_id) else None

    row = await mine()
    if row is None:
        assert s.hooks is not None
        await s.hooks.bookkeeping.wait_current()
        # Shielded: a read given up on (ledger.read_timeout_s) must not cancel the flush.
        await asyncio.shield(s.ledger_writer().flush())
        row = await mine()
    if row is None:
        # Another worker or replica may have answered it, its row still in that process's
        # queue: written within its flush interval, so look again until then (this only
        # delays a 404, never an answer).
        deadline = time.monotonic() + s.settings.ledger.flush_interval_ms / 1000 + _GRACE_S
        while row is None and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
            row = await mine()
    if row is None:
        raise _not_found(sent or request_id, param)
    return row


@router.post(
    "/v1/feedback", response_model=FeedbackRecorded, openapi_extra=json_body(FeedbackRequest)
)
async def feedback(request: Request) -> Response:
    s = services(request)
    assert s.auth is not None
    who = await s.auth.caller(request.headers)
    fb = await read_model(request, FeedbackRequest)
    row = await s.read_ledger(_scored_request(s, who, fb.ledger_id, fb.request_id))
    terms = logged_reward(row, fb.score, s.settings.router.reward.config())
    record = FeedbackRecord(
        request_id=fb.ledger_id,
        score=fb.score,
        source=fb.source,
        comment=fb.comment,
        created_at=time.time(),
        reward=terms.reward,
        cost_usd=terms.cost_usd,
        cost_weight=terms.cost_weight,
        normalized_cost=terms.normalized_cost,
        penalty=terms.penalty,
    )
    await s.ledger_writer().submit_durable(record)
    if s.metrics is not None:
        s.metrics.feedback(row["policy"], fb.score, terms.reward)
    body = {
        "status": "recorded",
        "request_id": fb.ledger_id,
        "feedback_id": record.feedback_id,
        "reward": terms.as_dict(),
    }
    return Response(orjson.dumps(body), media_type="application/json")


async def _scored_request(
    s: Services, who: Principal, request_id: str, sent: str
) -> dict[str, Any]:
    """The ledger row a feedback score is filed under (read, bounded by the caller; the
    score's record is written apart, since a write given up on may still be made)."""
    row = await logged_request(s, who, request_id, sent=sent)
    if row["cached_from"] is not None:
        # A cache hit's answer is the request's it reused, which the export files this score
        # under: its reward is that trajectory's (its cost and cost weight), not the hit's
        # own free one at no cost weight.
        row = await get_request(s.ledger_engine(), row["cached_from"]) or row
    return row


def logged_reward(row: dict[str, Any], score: float, config: RewardConfig) -> RewardTerms:
    """The reward training and evaluation would give this request's trajectory for
    ``score``: its whole cost (router tokens included), at the cost weight it was routed
    with (0 for one that never reached routing — refused before it — and so has none)."""
    cost_usd = micros_to_usd(row["total_cost_micros"])
    cost_weight = row["cost_weight"] if row["cost_weight"] is not None else 0.0
    return compute_reward(score, float(cost_usd), float(cost_weight), config)


@router.get(
    "/v1/generation",
    response_model=Generation,
    openapi_extra=query(
        Param(
            "id",
            {"type": "string"},
            "a request id: x-request-id, or the completion's, response's or message's id",
            required=True,
        )
    ),
)
@ledger_read
async def generation(request: Request) -> Response:
    """What a request cost and how it was served, from the ledger: what a client that
    missed a stream's usage chunk (or never asked for it) reads afterwards."""
    s = services(request)
    assert s.auth is not None
    who = await s.auth.caller(request.headers)
    raw_id = request.query_params.get("id")
    try:
        request_id = request_id_from(raw_id or "")
    except ValueError as exc:
        raise bad_request(f"id: {exc}", param="id") from None
    row = await logged_request(s, who, request_id, param="id", sent=raw_id or "")
    calls = await get_calls(s.ledger_engine(), request_id)
    data = _generation(row, calls)
    if row["cached_from"] is not None:
        # A hit paid for no tokens (its row counts none: spend reports would count the
        # answer's twice), but its usage reported the answer's, and this is where a client
        # that missed that usage chunk reads it: the same counts, from the request that paid.
        # (None once retention has pruned that request.)
        origin = await get_request(s.ledger_engine(), row["cached_from"])
        data["tokens_prompt"] = origin["prompt_tokens"] if origin else None
        data["tokens_completion"] = origin["completion_tokens"] if origin else None
    return Response(orjson.dumps({"data": data}), media_type="application/json")


def _generation(row: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    decision = row.get("decision")
    return {
        "id": row["request_id"],
        "created_at": row["created_at"].isoformat(),
        "api": row["api"],
        "model": row["final_model"],
        "requested_model": row["requested_model"],
        "policy": row["policy"],
        "status": row["status"],
        "error": row["error_type"],
        "streamed": bool(row["stream"]),
        "cancelled": row["status"] == 499,
        "cached_from": row["cached_from"],
        "user": row["end_user"],
        "total_cost": micros_to_usd(row["total_cost_micros"]),
        "router_cost": micros_to_usd(row["router_cost_micros"]),
        "downstream_cost": micros_to_usd(row["downstream_cost_micros"]),
        "tokens_prompt": row["prompt_tokens"],
        "tokens_completion": row["completion_tokens"],
        "latency_ms": row["latency_ms"],
        "overhead_ms": row["overhead_ms"],
        "cost_weight": row["cost_weight"],
        "decision": decision,
        "calls": [
            {
                "model": c["model"],
                "role": c["role"],
                "turn": c["turn"],
                "status": c["status"],
                "error": c["error_type"],
                "tokens_prompt": c["prompt_tokens"],
                "tokens_completion": c["completion_tokens"],
                "tokens_cached": c["cached_tokens"],
                "tokens_reasoning": c["reasoning_tokens"],
                "cost": micros_to_usd(c["cost_micros"]),
                "latency_ms": c["latency_ms"],
                "attempts": c["attempts"],
                "fallback_from": c["fallback_from"],
                "fallback_reason": c["fallback_reason"],
                "deployment": c["deployment"],
            }
            for c in calls
        ],
    }
