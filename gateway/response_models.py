"""What each endpoint answers, as pydantic models for the OpenAPI document.

The answers themselves are written as dicts with orjson (the chat path renders thousands a
second, and the admin views come from the ledger's own ``to_dict``s), so these models
describe rather than build them; tests/gateway/test_openapi.py validates real answers
against the published schemas, so the two cannot drift apart unnoticed. Every model takes
fields beyond those listed (``extra="allow"``): an answer may grow a field without breaking
a client generated from an older document, as OpenAI's own objects do."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- errors ------------------------------------------------------------------------------


class ErrorDetail(_Answer):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, ... (README)")
    param: str | None = Field(description="the request field at fault, when one is")
    code: str | None = Field(description="a stable code for programs, e.g. budget_exceeded")


class Error(_Answer):
    """Every error of every endpoint but the Messages API: OpenAI's shape."""

    error: ErrorDetail


class AnthropicErrorDetail(_Answer):
    type: str
    message: str


class AnthropicError(_Answer):
    """The Messages API's errors, in Anthropic's shape (its clients parse nothing else)."""

    type: str = "error"
    error: AnthropicErrorDetail


# -- the routed APIs ---------------------------------------------------------------------


class RoutedCall(_Answer):
    model: str
    role: str = Field(description="downstream, or router for an llm router's own turns")
    turn: int
    status: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    latency_ms: float
    # Each of these only when it applies (the answer leaves the field out otherwise).
    error: str | None = Field(default=None, description="why the call failed")
    fallback_from: str | None = Field(
        default=None,
        description="the model asked for, when a configured fallback answered, failed last or was "
        "given up on",
    )
    fallback_reason: str | None = Field(
        default=None,
        description="why the call left fallback_from: that model's first error "
        "(circuit_open: it was never called)",
    )
    deployment: str | None = Field(
        default=None, description="which of the model's deployments served it, if several"
    )


class RoutingInfo(_Answer):
    """The ``xrouter`` object of every routed answer."""

    request_id: str
    policy: str
    calls: list[RoutedCall]
    cost_usd: float
    router_cost_usd: float
    downstream_cost_usd: float
    decision: dict[str, Any] | None = Field(
        default=None, description="actions, propensities, distribution, λ, feature version"
    )


class ChatUsage(_Answer):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost: float = Field(description="USD, every call of the request (router and downstream)")


class ChatMessage(_Answer):
    role: Literal["assistant"]
    content: str | None


class ChatChoice(_Answer):
    index: int
    message: ChatMessage
    finish_reason: str | None


class ChatCompletion(_Answer):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str = Field(description="the model that answered (xrouter when the router did)")
    choices: list[ChatChoice]
    usage: ChatUsage
    xrouter: RoutingInfo


class ResponseObject(_Answer):
    """A Responses API ``response`` (nothing is stored: ``store`` is false)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None
    xrouter: RoutingInfo


class AnthropicMessage(_Answer):
    """A Messages API ``message``."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    usage: dict[str, Any]
    xrouter: RoutingInfo


class TokenCount(_Answer):
    input_tokens: int


# -- models, feedback, a request's record, a key's own view -------------------------------


class ModelEntry(_Answer):
    """OpenAI's shape (``object``, ``created``, ``owned_by``, and ``xrouter``: kind, price,
    modalities); with Anthropic's ``anthropic-version`` header, Anthropic's (``type``,
    ``display_name``, ``created_at``)."""

    id: str


class ModelList(_Answer):
    """OpenAI's shape; a request with Anthropic's ``anthropic-version`` header gets
    Anthropic's list instead (``data``, ``has_more``, ``first_id``, ``last_id``)."""

    data: list[dict[str, Any]]


class LoggedReward(_Answer):
    """The reward logged with a feedback score (``router.reward``), every term."""

    reward: float
    score: float
    cost_usd: float = Field(description="the request's whole cost, router tokens included")
    normalized_cost: float = Field(description="cost_usd / router.reward.cost_scale")
    penalty: float = Field(
        description="cost_weight · normalized_cost, capped at c_max in the gated form"
    )
    cost_weight: float = Field(description="the λ the request was routed with")


class FeedbackRecorded(_Answer):
    status: Literal["recorded"]
    request_id: str
    feedback_id: str
    reward: LoggedReward


class Generation(_Answer):
    data: dict[str, Any] = Field(description="the request's ledger row and every call it made")


class OwnKey(_Answer):
    """``GET /v1/key``: the calling key's limits and spend (and OpenRouter's names for
    them: ``label``, ``limit``, ``usage``, ``limit_remaining``)."""

    data: dict[str, Any]


class Health(_Answer):
    status: Literal["ok"]


class Readiness(_Answer):
    status: Literal["ready", "not_ready"]
    checks: dict[str, bool]


# -- the admin API -----------------------------------------------------------------------


class KeyView(_Answer):
    key_id: str
    alias: str | None
    budget_usd: float | None
    budget_micros: int | None
    budget_period: str | None
    rpm: int | None
    tpm: int | None
    max_parallel: int | None
    allowed_models: list[str] | None
    allowed_policies: list[str] | None
    metadata: dict[str, Any]
    created_at: str
    revoked_at: str | None
    revoked: bool
    expires_at: str | None
    expired: bool
    routing: dict[str, Any] | None
    spent_usd: float | None = Field(default=None, description="keys with a budget")
    remaining_usd: float | None = Field(default=None, description="keys with a budget")
    warnings: list[str] | None = Field(
        default=None,
        description=(
            "creation and changes only: names in allowed_models or allowed_policies that this "
            "gateway does not serve now (a typo, or a model a later reload adds)"
        ),
    )


class KeyWithSecret(KeyView):
    """A new or rotated key: the secret is in ``key``, shown this once."""

    key: str


class KeyList(_Answer):
    object: Literal["list"]
    data: list[KeyView]
    first_id: str | None
    last_id: str | None
    has_more: bool


class KeyRevoked(_Answer):
    key_id: str
    revoked: Literal[True]


class SpendReport(_Answer):
    object: Literal["list"]
    group_by: list[str]
    data: list[dict[str, Any]] = Field(description="a row per group: requests, calls, costs")
    first_id: str | None
    last_id: str | None
    has_more: bool


class CacheCleared(_Answer):
    deleted: int
    backend: str


class Prices(_Answer):
    catalog_version: str | None
    pool: dict[str, dict[str, Any]]


class Exploration(BaseModel):
    epsilon: float
    sample: bool
    temperature: float


class RouterState(_Answer):
    default_policy: str
    policies: list[str]
    pool: list[str]
    checkpoint: dict[str, Any] | None
    exploration: Exploration
    deployment: dict[str, Any] | None
    worker: int
    circuits: dict[str, str]
    deployments_cooling: dict[str, Any]


class Reloaded(_Answer):
    status: Literal["reloaded"]
    worker: int  # the pid of the worker that reloaded (a reload is one worker's; a deployment, every one's)
    pool: list[str]
    policies: list[str]
    checkpoint: dict[str, Any] | None
    deployment: dict[str, Any] | None
