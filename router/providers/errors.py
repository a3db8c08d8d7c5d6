"""One error type for every downstream failure, with a sanitized message."""

from __future__ import annotations

import logging
import math
import random
import re
from typing import TYPE_CHECKING, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

if TYPE_CHECKING:
    from router.pool import PoolModel

log = logging.getLogger(__name__)

ErrorKind = Literal[
    "timeout",
    "rate_limited",
    # The upstream refused the request itself as invalid (400, 413, 422: a parameter the
    # model does not take, a prompt too long, a content filter): the client's to fix.
    "bad_request",
    # Any other 4xx (401, 403, 409…): the gateway's credentials or setup, not the request.
    "upstream_4xx",
    "upstream_5xx",
    "connection",
    "bad_response",
    "not_found",
    "circuit_open",  # not called: the model's recent calls failed (router.health)
]

# Failures that say the upstream itself is in trouble: worth a retry, and they count
# against the model's circuit breaker (router.health). Client errors are neither.
UPSTREAM_TROUBLE: frozenset[str] = frozenset(
    {"timeout", "rate_limited", "upstream_5xx", "connection"}
)

# Refusals of the gateway's own setup at one upstream (401, 403, 409: a revoked key, an
# account without the model; 404: a model the upstream does not serve): not worth a retry
# of the same upstream, but another deployment of the model (another account, region or
# replica) may well answer. A 400 is the request's own fault, the same everywhere.
DEPLOYMENT_LOCAL: frozenset[str] = frozenset({"upstream_4xx", "not_found"})

# Things that must never reach a client or a log line from an upstream error: API keys and
# bearer tokens, URLs (internal hostnames, signed URLs), and IP addresses.
_SECRET_PATTERNS = (
    re.compile(r"\b(?:sk|xr|pk|rk|key)-[A-Za-z0-9_\-]{6,}"),
    # Providers' other key shapes: Google (AIza…), Groq (gsk_), Hugging Face (hf_),
    # GitHub (ghp_, gho_, github_pat_), xAI (xai-).
    re.compile(r"\b(?:AIza|gsk_|hf_|ghp_|gho_|github_pat_|xai-)[A-Za-z0-9_\-]{16,}"),
    re.compile(r"(?i)\b(?:bearer|basic)\s+[A-Za-z0-9._~+/\-]+=*"),
    re.compile(
        r"(?i)(api[_-]?key|authorization|token|secret|password|passwd)([\"'\s:=]+)[^\s\"',}]+"
    ),
    # A URL, less the punctuation closing the sentence around it ("(at https://h/v1).").
    re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]*[^\s\"'<>).,;:!?\]]"),
    # A query string's values where no whole URL is (an upstream quoting the path it was
    # sent to, "/v1/chat/completions?key=…"), in whatever percent-encoding it quotes them.
    re.compile(r"([?&][A-Za-z0-9_.~\-]+)(=)[^\s&#\"'<>,;)]+"),
    re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"),
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
)
_MAX_MESSAGE = 300


def sanitize(message: str, *secrets: str | None) -> str:
    """Strip keys, URLs and addresses from an upstream message and bound its length."""
    out = message
    for s in secrets:
        if s:
            out = out.replace(s, "[redacted]")
    for pattern in _SECRET_PATTERNS:
        out = pattern.sub(lambda m: _keep_label(m), out)
    out = " ".join(out.split())
    return out[:_MAX_MESSAGE] + ("…" if len(out) > _MAX_MESSAGE else "")


def _keep_label(m: re.Match[str]) -> str:
    # For "api_key: XYZ" keep the label so the message still says what was wrong.
    if m.lastindex and m.lastindex >= 2:
        return f"{m.group(1)}{m.group(2)}[redacted]"
    return "[redacted]"


class ProviderError(Exception):
    """A downstream call failed. ``message`` is already safe to show a client."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        model: str = "",
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.model = model
        self.status = status
        self.retry_after = retry_after
        # Which of the model's deployments failed (models with several), set by the client.
        self.deployment: str | None = None
        # The upstream attempts the call made (retries, fallbacks), set by the client when
        # it gives up: 0 when every model's circuit was open and none was called.
        self.attempts = 0
        # Whether asking again later may succeed: this failure is the upstream's trouble, or
        # (set by the client when it gives up) any attempt of the call failed on trouble —
        # a 503 on one deployment and a 401 on the other ends on the 401, yet the first
        # deployment may answer once it recovers.
        self.transient = self.retryable
        # Set by the client when it gives up on a call that went on to the model's fallbacks:
        # why it left the model asked for, that model's first error (``circuit_open`` when it
        # was never called). The error itself is the last model's, so it cannot say that.
        self.fallback_reason: str | None = None

    @property
    def retryable(self) -> bool:
        return self.kind in UPSTREAM_TROUBLE

    def __repr__(self) -> str:
        return f"ProviderError({self.kind!r}, status={self.status}, model={self.model!r})"


def client_error_kind(status: int) -> ErrorKind:
    """The kind of an upstream's 4xx other than 404, 408 and 429 (which have their own)."""
    return "bad_request" if status in (400, 413, 422) else "upstream_4xx"


def parse_retry_after(value: object) -> float | None:
    """Seconds from an upstream's ``retry-after`` (a header, or the same value a provider SDK
    carries on its error), or None. Only finite non-negative numbers: ``nan`` or ``inf`` would
    reach ``asyncio.sleep``, which uvloop refuses with a ValueError (a raw 500), and a
    negative wait means nothing. An HTTP date is not read: the backoff applies instead."""
    if value is None or isinstance(value, bool):
        return None
    try:
        seconds = float(value) if isinstance(value, int | float | str | bytes) else None
    except ValueError:
        return None
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return seconds


class ProviderCancelled(Exception):
    """The caller went away (client disconnect); not an upstream failure."""


# A query value shorter than this is a setting (``?v=1``), not a credential: redacting it
# everywhere would mangle the message it occurs in.
_MIN_QUERY_SECRET = 4


def model_secrets(model: PoolModel) -> tuple[str, ...]:
    """What of ``model``'s setup an upstream error may quote and no client or log line may
    show: its API key, the password of its ``api_base`` and the values of the api_base's
    query string (``?key=…``, ``?sig=…``: credentials some providers take in the URL, which
    an upstream's "no route for /v1/chat/completions?key=…" quotes outside any whole URL the
    patterns would find), as written and percent-decoded; the longest first, so that none
    leaves part of another behind."""
    found: set[str] = set()
    if model.api_key:
        found.add(model.api_key)
    url = urlsplit(model.api_base or "")
    if url.password:
        found |= {url.password, unquote(url.password)}
    values = {raw.partition("=")[2] for raw in url.query.split("&")}
    values |= {value for _, value in parse_qsl(url.query)}
    found |= {v for v in values if len(v) >= _MIN_QUERY_SECRET}
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def could_not_call(model: PoolModel, exc: BaseException) -> ProviderError:
    """A call the gateway could not make or read, for a reason no handler expects (LiteLLM's
    "Missing credentials", aiohttp refusing an Authorization header beside credentials in
    the api_base, a bug): an ``upstream_4xx`` — the gateway's setup, neither the request's
    fault nor the upstream's trouble, so not retried nor counted by the circuit breaker, and
    the next fallback is tried — rather than a raw 500 that loses the call's row. The
    message is the exception's type and text with the model's secrets and every URL taken
    out; it is logged once as a warning."""
    detail = sanitize(str(exc), *model_secrets(model))
    kind = type(exc).__name__
    log.warning("calling upstream %s failed: %s: %s", model.name, kind, detail)
    return ProviderError(
        "upstream_4xx",
        f"upstream {model.name} could not be called ({kind}): {detail}",
        model=model.name,
    )


def retry_after_s(err: ProviderError) -> float | None:
    """The wait the upstream asked for, in seconds, if it gave a usable one."""
    return parse_retry_after(err.retry_after)


# The longest wait before a retry; an upstream that asks for more is not retried in the call.
BACKOFF_MAX_S = 2.0


def waits_too_long(err: ProviderError, max_s: float = BACKOFF_MAX_S) -> bool:
    """Whether the upstream asked for a longer wait than a retry would give it: calling
    it again sooner would be refused again, and adds to its load."""
    wait_s = retry_after_s(err)
    return wait_s is not None and wait_s > max_s


def retry_delay(
    attempt: int, err: ProviderError, base_s: float = 0.1, max_s: float = BACKOFF_MAX_S
) -> float:
    """Seconds to wait before retry ``attempt + 1``: the upstream's ``retry-after`` if it
    gave one, else exponential backoff with full jitter, which spreads the retries of many
    concurrent callers; never more than ``max_s`` (the client does not retry an upstream
    that asked for a longer wait: it moves on, see ``DownstreamClient``)."""
    # Checked again here: a ProviderError may be built anywhere, and a bad value must not
    # reach the sleep.
    retry_after = retry_after_s(err)
    if retry_after is not None:
        return min(retry_after, max_s)
    return random.uniform(0, min(max_s, base_s * (2**attempt)))
