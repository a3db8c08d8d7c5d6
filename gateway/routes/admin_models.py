"""The admin API's wire formats: the bodies of ``POST /admin/keys`` and ``PATCH
/admin/keys/{id}`` and the values they take (budgets, rates, expiry as a time or a
duration, a key's routing defaults), and ``POST /admin/reload``'s. Validation here answers
400 naming the field, before anything reaches the key repository."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gateway.ledger.spend import to_utc
from pricing.money import MAX_USD
from router.outcomes import MAX_COST_WEIGHT

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


# pydantic's own datetime parsing of a string, as it reads one from JSON, which also takes a
# date alone (that day's start).
_DATETIME: TypeAdapter[dt.datetime] = TypeAdapter(dt.datetime)


def _iso_time(value: Any) -> Any:
    """An ISO 8601 time as pydantic reads one from JSON, or a date alone — that day's start
    (UTC, as any time without an offset), as ``GET /admin/spend?since=`` reads one; the
    strict JSON parsing refuses a date ("invalid datetime separator"). Parsed here for
    both, since a value a validator has seen first is checked in Python mode, where a strict
    datetime takes no string."""
    if not isinstance(value, str):
        return value
    try:
        return _DATETIME.validate_strings(value.strip())
    except ValidationError:
        raise ValueError(
            "must be an ISO 8601 time (2031-01-31T12:00:00Z) or date (2031-01-31)"
        ) from None


# What the API document says expires_at takes: what ``_iso_time`` reads.
_TIME_OR_DATE = WithJsonSchema(
    {
        "anyOf": [
            {"type": "string", "format": "date-time"},
            {"type": "string", "format": "date"},
            {"type": "null"},
        ]
    }
)


class _Expiry(BaseModel):
    expires_at: Annotated[dt.datetime | None, _TIME_OR_DATE] = None
    duration: str | None = None

    _duration = field_validator("duration")(_duration)
    _iso = field_validator("expires_at", mode="before")(_iso_time)
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
    cost_weight: float | None = Field(default=None, ge=0, le=MAX_COST_WEIGHT)
    max_cost_usd: float | None = Field(default=None, gt=0, le=MAX_USD, allow_inf_nan=False)


def _whole_micros(budget: float | None) -> float | None:
    # The ledger counts micro-dollars: a positive budget under half of one was stored as 0,
    # a key that refuses every request, without a word.
    if budget is not None and 0 < budget < 0.5e-6:
        raise ValueError(
            "a positive budget under $0.0000005 rounds to 0 (budgets are kept in whole "
            "micro-dollars): give 0 to allow nothing, or at least 0.000001"
        )
    return budget


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
    max_parallel: int | None = _rate()
    allowed_models: list[str] | None = None
    allowed_policies: list[str] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    routing: KeyRouting | None = None

    _alias = field_validator("alias")(_alias_text)
    _budget_micros = field_validator("budget_usd")(_whole_micros)


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
    max_parallel: int | None = _rate()
    allowed_models: list[str] | None = None
    allowed_policies: list[str] | None = None
    metadata: dict[str, Any] | None = None
    routing: KeyRouting | None = None

    _alias = field_validator("alias")(_alias_text)
    _alias_set = field_validator("alias")(_alias_not_null)
    _budget_micros = field_validator("budget_usd")(_whole_micros)


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Deploy a router checkpoint (a path on the gateway's filesystem) without a config edit.
    checkpoint: str | None = None

    @field_validator("checkpoint")
    @classmethod
    def _a_path(cls, value: str | None) -> str | None:
        # An empty path was deployed as "the default checkpoint", a deployment every worker
        # then followed; leave the field out to reload the config instead.
        if value is not None and not value.strip():
            raise ValueError("must be a checkpoint's path; leave it out to reload the config")
        return value
