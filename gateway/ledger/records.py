"""What the gateway hands to the ledger: plain dataclasses, cheap to build on the request path.

The writer turns them into rows in a background task. Each record round-trips through a
JSON-ready dict (``to_json``/``from_json``) because records that cannot reach the database
are journaled to the spill file and replayed later, possibly by another process.

Content (the prompt and the answer) is governed by ``LedgerSettings.log_content``. The
writer applies it with :func:`apply_content_policy` before a record is stored *or* spilled,
so raw text never touches the disk unless the operator asked for ``full``.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

import orjson

ContentMode = Literal["none", "hash", "full"]


def _json_default(obj: Any) -> Any:
    """Fallback for values orjson does not know (numpy scalars, Decimals, sets, ...): the
    ledger must never lose a record because a policy put an exotic number in its decision."""
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real | Decimal):
        return float(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    return str(obj)


def dumps(value: Any) -> bytes:
    """JSON encoding shared by the spill journal and the database JSON columns. Never fails
    on what a record can hold (see ``storable``)."""
    return _orjson(value, orjson.OPT_NON_STR_KEYS)


def _orjson(value: Any, option: int) -> bytes:
    try:
        return orjson.dumps(value, default=_json_default, option=option)
    except orjson.JSONEncodeError:
        # Rare (see ``storable``): the copy costs nothing on the usual path.
        return orjson.dumps(storable(value), default=_json_default, option=option)


# orjson encodes at most 254 levels of nesting; stay below with room for the envelope
# (journal) or content dict (database) around a record's messages.
_MAX_DEPTH = 200
_TOO_DEEP = "[nested too deep to store]"
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


def storable(value: Any, depth: int = 0) -> Any:
    """``value`` as orjson can encode it. Clients and upstreams can put in a record what
    orjson refuses: nesting deeper than it encodes (its own parser, which reads request
    bodies, takes 1,024 levels), lone surrogates (the stdlib JSON parser behind LiteLLM's
    providers accepts ``"\\ud800"``, which no UTF-8 encoder takes) and integers beyond 64
    bits. A row must never be lost for them (nor block the rows batched with it), so
    lone surrogates become U+FFFD, as NUL characters do in text columns, too-deep parts a
    placeholder and huge integers their digits."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # Through UTF-16, surrogate pairs stored as two characters are joined and lone
            # ones replaced.
            return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        return value
    if isinstance(value, bool | float) or value is None:
        return value
    if isinstance(value, int):
        return value if _INT_MIN <= value <= _INT_MAX else str(value)
    if isinstance(value, dict | list | tuple):
        if depth >= _MAX_DEPTH:
            return _TOO_DEEP
        if isinstance(value, dict):
            return {
                storable(k, depth + 1) if isinstance(k, str) else k: storable(v, depth + 1)
                for k, v in value.items()
            }
        return [storable(v, depth + 1) for v in value]
    return value  # left to ``_json_default``


def dumps_str(value: Any) -> str:
    return dumps(value).decode()


@dataclass(slots=True)
class CallRecord:
    """One router or downstream model call made while serving a request."""

    request_id: str
    turn: int
    role: str  # "router" | "downstream"
    model: str
    status: str  # "ok" | "error" | "refused"
    error_type: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    cost_micros: int
    latency_ms: float
    attempts: int = 1
    fallback_from: str | None = None
    deployment: str | None = None  # which deployment of ``model`` served it, if several
    # Why it fell back from ``fallback_from``: that model's first error, ``circuit_open``
    # when it was never called. None: no fallback, or not known.
    fallback_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CallRecord:
        return cls(**_known(cls, data))


@dataclass(slots=True)
class RequestRecord:
    """One served (or refused) request with its calls.

    ``messages``/``response_text`` are the raw content; the writer replaces them with
    ``content`` according to ``log_content`` (callers leave ``content`` as None).
    """

    request_id: str
    created_at: float  # epoch seconds, UTC
    key_id: str | None
    policy: str
    requested_model: str
    final_model: str | None
    status: int
    error_type: str | None
    total_cost_micros: int
    router_cost_micros: int
    downstream_cost_micros: int
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    overhead_ms: float
    cost_weight: float | None
    decision: dict[str, Any] | None
    messages: list[Any] | None
    response_text: str | None
    stream: bool
    api: str = "chat"  # "chat", "responses" or "messages": the API shape it came in
    # Answered from the answer cache: the id of the request that paid for the answer.
    cached_from: str | None = None
    # The request's ``user`` (else ``safety_identifier``), made storable (see ``end_user``).
    end_user: str | None = None
    tags: list[str] | None = None  # ``xrouter.tags``
    calls: list[CallRecord] = field(default_factory=list)
    content: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "calls"}
        data["calls"] = [c.to_json() for c in self.calls]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        values = _known(cls, data)
        values["calls"] = [CallRecord.from_json(c) for c in data.get("calls") or []]
        return cls(**values)


@dataclass(slots=True)
class FeedbackRecord:
    """A quality signal attached to a logged request (``POST /v1/feedback``).

    ``feedback_id`` makes replays idempotent: the same record journaled twice is stored once.
    """

    request_id: str
    score: float
    source: str
    comment: str | None
    created_at: float  # epoch seconds, UTC
    feedback_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The logged reward (``router.reward``) of the score at the request's cost and cost
    # weight, every term: see ``gateway.routes.logged.feedback``. None in records journaled
    # before the gateway logged it.
    reward: float | None = None
    cost_usd: float | None = None
    cost_weight: float | None = None
    normalized_cost: float | None = None
    penalty: float | None = None

    def __post_init__(self) -> None:
        # Reject bad scores where they are made (the endpoint), not in the background writer
        # where the only option would be to drop them.
        if not (isinstance(self.score, int | float) and math.isfinite(self.score)):
            raise ValueError(f"feedback score must be a finite number, got {self.score!r}")
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"feedback score must be in [0, 1], got {self.score}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FeedbackRecord:
        return cls(**_known(cls, data))


LedgerRecord = RequestRecord | FeedbackRecord


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Only the fields ``cls`` knows: a spill file written by a newer version with extra
    fields still replays."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def record_to_envelope(record: LedgerRecord) -> dict[str, Any]:
    kind = "request" if isinstance(record, RequestRecord) else "feedback"
    return {"v": 1, "kind": kind, "record": record.to_json()}


def record_from_envelope(data: dict[str, Any]) -> LedgerRecord:
    kind = data.get("kind")
    body = data.get("record")
    if not isinstance(body, dict):
        raise ValueError("spill envelope has no record")
    if kind == "request":
        return RequestRecord.from_json(body)
    if kind == "feedback":
        return FeedbackRecord.from_json(body)
    raise ValueError(f"unknown spill record kind {kind!r}")


END_USER_MAX = 255


def end_user(value: str | None) -> str | None:
    """A request's ``user`` as the ledger can store it on every database: without NUL
    characters (PostgreSQL's text refuses them), at most 255 characters; None when empty.
    A client's value never fails a request nor a ledger write."""
    if not value:
        return None
    cleaned = value.replace("\x00", "")[:END_USER_MAX]
    return cleaned or None


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def messages_sha256(messages: list[Any]) -> str:
    """A stable hash of a conversation: key order in the JSON does not change it."""
    return sha256_hex(_orjson(messages, orjson.OPT_SORT_KEYS))


def text_sha256(text: str) -> str:
    """The hash of a text; one with lone surrogates (see ``storable``) hashes too, rather
    than cost its request the ledger row (valid text hashes as its UTF-8)."""
    return sha256_hex(text.encode("utf-8", "surrogatepass"))


def apply_content_policy(record: RequestRecord, mode: ContentMode) -> RequestRecord:
    """Replace raw ``messages``/``response_text`` with the stored ``content`` form.

    Idempotent: a record that was already processed (no raw content left) is returned as is,
    so a replayed spill record is never re-hashed or blanked a second time.
    """
    if record.messages is None and record.response_text is None:
        return record
    content: dict[str, Any] | None
    if mode == "none":
        content = None
    elif mode == "hash":
        content = {
            "prompt_sha256": (
                messages_sha256(record.messages) if record.messages is not None else None
            ),
            "response_sha256": (
                text_sha256(record.response_text) if record.response_text is not None else None
            ),
        }
    else:
        content = {"messages": record.messages, "response": record.response_text}
    return replace(record, messages=None, response_text=None, content=content)


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


Rows = list[dict[str, Any]]


def build_rows(records: Sequence[LedgerRecord], mode: ContentMode) -> tuple[Rows, Rows, Rows, Rows]:
    """Rows for the requests, calls, feedback and request_tags tables."""
    req_rows: Rows = []
    call_rows: Rows = []
    fb_rows: Rows = []
    tag_rows: Rows = []
    for record in records:
        if isinstance(record, FeedbackRecord):
            fb_rows.append(
                {
                    "feedback_id": record.feedback_id,
                    "request_id": record.request_id,
                    "score": float(record.score),
                    "source": record.source,
                    "comment": record.comment,
                    "created_at": _utc(record.created_at),
                    "reward": record.reward,
                    "cost_usd": record.cost_usd,
                    "cost_weight": record.cost_weight,
                    "normalized_cost": record.normalized_cost,
                    "penalty": record.penalty,
                }
            )
            continue
        r = apply_content_policy(record, mode)
        req_rows.append(
            {
                "request_id": r.request_id,
                "created_at": _utc(r.created_at),
                "key_id": r.key_id,
                "policy": r.policy,
                "requested_model": r.requested_model,
                "final_model": r.final_model,
                "status": int(r.status),
                "error_type": r.error_type,
                "total_cost_micros": int(r.total_cost_micros),
                "router_cost_micros": int(r.router_cost_micros),
                "downstream_cost_micros": int(r.downstream_cost_micros),
                "prompt_tokens": int(r.prompt_tokens),
                "completion_tokens": int(r.completion_tokens),
                "latency_ms": float(r.latency_ms),
                "overhead_ms": float(r.overhead_ms),
                "cost_weight": None if r.cost_weight is None else float(r.cost_weight),
                "decision": r.decision,
                "content": r.content,
                "stream": bool(r.stream),
                "api": r.api,
                "cached_from": r.cached_from,
                "end_user": r.end_user,
            }
        )
        for seq, c in enumerate(r.calls):
            call_rows.append(
                {
                    "request_id": r.request_id,
                    "seq": seq,
                    "turn": int(c.turn),
                    "role": c.role,
                    "model": c.model,
                    "status": c.status,
                    "error_type": c.error_type,
                    "prompt_tokens": int(c.prompt_tokens),
                    "completion_tokens": int(c.completion_tokens),
                    "cached_tokens": int(c.cached_tokens),
                    "reasoning_tokens": int(c.reasoning_tokens),
                    "cost_micros": int(c.cost_micros),
                    "latency_ms": float(c.latency_ms),
                    "attempts": int(c.attempts),
                    "fallback_from": c.fallback_from,
                    "deployment": c.deployment,
                    "fallback_reason": c.fallback_reason,
                }
            )
        tag_rows.extend({"request_id": r.request_id, "tag": t} for t in dict.fromkeys(r.tags or ()))
    return req_rows, call_rows, fb_rows, tag_rows
