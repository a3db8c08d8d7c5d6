"""API-key authentication with a short in-process cache (a key lookup per request would
put a database round trip on the hot path; revocations take effect within the TTL).

A client's key is read by one rule on every route that takes one (:func:`presented_key`):
``Authorization: Bearer`` (OpenAI's clients), else ``x-api-key`` (Anthropic's), else
``api-key`` (Azure OpenAI's), as LiteLLM's proxy reads them. The operators' credentials
(the admin key, the dashboard's, the metrics scrape token) are read from ``Authorization``
only, as the README documents them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gateway.deadline import Deadline, DeadlineExceeded
from gateway.errors import (
    DATABASE_OUTAGES,
    STORE_RETRY_AFTER_S,
    APIError,
    database_unavailable,
)
from gateway.ledger.store import describe_error
from gateway.principal import Principal
from pricing import usd_to_micros

if TYPE_CHECKING:
    from gateway.ledger.keys import KeyRepository

log = logging.getLogger(__name__)

# A key lookup is one indexed read: one that has not answered in this long is a database
# that is hung (a network partition, a stopped server keeping its sockets open) or has no
# connection to give, and the request is better served by the key as last read, or a 503,
# than by waiting on it.
KEY_LOOKUP_TIMEOUT_S = 3.0

CACHE_TTL_S = 5.0
# How long past its TTL a known key is still taken while the ledger database does not
# answer its lookup: an outage must not stop traffic the keys in hand already serve (rows
# wait in the spill directory meanwhile), but a key revoked before it began is only
# unseen for so long.
STALE_IF_ERROR_S = 600.0
_CACHE_MAX = 10_000


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


# The headers besides ``Authorization: Bearer`` a client's key may come in, in the order they
# are read: Anthropic's clients send ``x-api-key``, Azure OpenAI's ``api-key``.
_KEY_HEADERS = ("x-api-key", "api-key")


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key a request presents: ``Authorization: Bearer``, else ``x-api-key``, else
    ``api-key`` (None: none of them); an ``Authorization`` header of another scheme carries
    no key. The first wins when several disagree, as LiteLLM's proxy reads them: a client
    that keeps a placeholder in one (an Anthropic SDK's ``api_key="unused"`` beside a real
    ``Authorization``) is served with the key it meant."""
    bearer = _bearer(headers.get("authorization"))
    if bearer is not None:
        return bearer
    for name in _KEY_HEADERS:
        value = (headers.get(name) or "").strip()
        if value:
            return value
    return None


def _basic_password(header: str | None) -> str | None:
    """The password of HTTP Basic credentials (what a browser sends after its login prompt)."""
    if not header:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded.strip():
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    _, sep, password = decoded.partition(":")
    return password if sep and password else None


def unauthorized(
    message: str = "missing or invalid API key", code: str = "invalid_api_key"
) -> APIError:
    return APIError(
        401,
        message,
        type="authentication_error",
        code=code,
        headers={"WWW-Authenticate": "Bearer"},
    )


def require_scrape_token(authorization: str | None, token: str) -> None:
    """``/metrics`` behind ``metrics.bearer_token``: a token of its own, so that Prometheus
    needs neither the admin key nor a key that can spend."""
    given = _bearer(authorization) or ""
    if not hmac.compare_digest(
        hashlib.sha256(given.encode()).digest(), hashlib.sha256(token.encode()).digest()
    ):
        raise unauthorized("/metrics needs the scrape token (metrics.bearer_token)")


class Authenticator:
    def __init__(
        self,
        repo: KeyRepository | None,
        *,
        enabled: bool,
        admin_key: str | None,
        cache_size: int = _CACHE_MAX,
        ttl_s: float = CACHE_TTL_S,
        stale_if_error_s: float = STALE_IF_ERROR_S,
        lookup_timeout_s: float = KEY_LOOKUP_TIMEOUT_S,
    ) -> None:
        self.repo = repo
        self.enabled = enabled
        self._admin_digest = hashlib.sha256(admin_key.encode()).digest() if admin_key else None
        self._cache_size = cache_size
        self._ttl_s = ttl_s
        self._stale_if_error_s = stale_if_error_s
        self._lookups = Deadline(lookup_timeout_s)
        # Known keys and refused tokens are cached apart: anyone can send random tokens, and
        # a flood of them must not push the real keys out (every request of every key would
        # then go to the database).
        self._cache: dict[bytes, tuple[float, Principal]] = {}
        self._refused: dict[bytes, float] = {}
        self._stale = False  # serving keys as last read (logged once per outage)
        # After a lookup failed, no other is made until then (one lookup then probes the
        # database, and moves it on as it starts): a hung database held every request of
        # every key for the lookup's timeout, each starting a lookup of its own, for the
        # whole outage. 0: the last lookup answered.
        self._retry_at = 0.0

    def invalidate(self) -> None:
        self._cache.clear()
        self._refused.clear()

    async def caller(self, headers: Mapping[str, str]) -> Principal:
        """Who sent a request with these headers: its key as :func:`presented_key` reads
        it, on every route that takes a client's key. With auth off, nobody (the headers
        are not read)."""
        if not self.enabled:
            return Principal()
        return await self._principal(presented_key(headers))

    async def _principal(self, token: str | None) -> Principal:
        if token is None:
            raise unauthorized()
        digest = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            who = hit[1]
        elif self._refused.get(digest, 0.0) > now:
            raise unauthorized()
        elif now < self._retry_at:
            return self._as_last_read(hit, now, None)  # a lookup failed moments ago
        else:
            if self._retry_at:
                self._retry_at = now + self._ttl_s  # this lookup probes; the others wait
            try:
                found = await self._lookups.run(self._lookup(token))
            except (*DATABASE_OUTAGES, DeadlineExceeded) as exc:
                self._retry_at = time.monotonic() + self._ttl_s
                why = str(exc) if isinstance(exc, DeadlineExceeded) else describe_error(exc)
                return self._as_last_read(hit, now, why)
            self._stale = False
            self._retry_at = 0.0
            if found is None:
                self._remember(self._refused, digest, now + self._ttl_s)
                raise unauthorized()
            who = found
            self._remember(self._cache, digest, (now + self._ttl_s, who))
        return self._unexpired(who)

    def _as_last_read(
        self, hit: tuple[float, Principal] | None, now: float, why: str | None
    ) -> Principal:
        """The key of cache entry ``hit`` as it was, while the database does not answer its
        lookup (``why``: the lookup's error; None when none was made, one having failed
        moments ago): taken until the database answers again, for so long at most; a key
        never read, or read too long ago, is the outage, a 503."""
        if hit is None or now - hit[0] > self._stale_if_error_s:
            if why is not None:
                log.warning("key lookup failed, the ledger database: %s", why)
            # Asked again before ``_retry_at``, the gateway would not look it up.
            wait = self._retry_at - time.monotonic()
            raise database_unavailable(max(wait, STORE_RETRY_AFTER_S))
        if not self._stale:
            log.warning(
                "ledger database unavailable: taking known keys as last read (%s)",
                why or "a lookup failed",
            )
        self._stale = True
        return self._unexpired(hit[1])

    @staticmethod
    def _unexpired(who: Principal) -> Principal:
        # Checked on every request, not only at lookup: a cached key expires on time.
        if who.expires_at is not None and time.time() >= who.expires_at:
            when = datetime.fromtimestamp(who.expires_at, UTC).isoformat()
            raise unauthorized(f"this API key expired at {when}", code="key_expired")
        return who

    def _remember(self, cache: dict[bytes, Any], digest: bytes, entry: Any) -> None:
        if len(cache) >= self._cache_size:
            cache.clear()
        cache[digest] = entry

    async def _lookup(self, token: str) -> Principal | None:
        if self.repo is None:
            return None
        info: Any = await self.repo.by_secret(token)
        if info is None or getattr(info, "revoked_at", None) is not None:
            return None
        limits = info.limits()
        routing = info.routing or {}
        return Principal(
            key_id=info.key_id,
            alias=info.alias,
            allowed_models=list(info.allowed_models) if info.allowed_models is not None else None,
            allowed_policies=list(info.allowed_policies)
            if info.allowed_policies is not None
            else None,
            limits=limits,
            expires_at=info.expires_at.timestamp() if info.expires_at is not None else None,
            default_policy=routing.get("default_policy"),
            cost_weight=routing.get("cost_weight"),
            max_cost_micros=usd_to_micros(cap) if (cap := routing.get("max_cost_usd")) else None,
        )

    def _admin_disabled(self, what: str) -> APIError:
        return APIError(403, what, type="permission_error", code="admin_disabled")

    def _is_admin(self, token: str | None) -> bool:
        assert self._admin_digest is not None
        return token is not None and hmac.compare_digest(
            hashlib.sha256(token.encode()).digest(), self._admin_digest
        )

    def require_dashboard(self, authorization: str | None) -> None:
        """The dashboard is open when auth is off (like the rest of the gateway); with auth on
        it takes the admin key, as a bearer token or as the password of a browser's Basic
        login prompt."""
        if not self.enabled:
            return
        if self._admin_digest is None:
            raise self._admin_disabled("the dashboard needs auth.admin_key when auth is enabled")
        if not self._is_admin(_bearer(authorization) or _basic_password(authorization)):
            raise APIError(
                401,
                "the dashboard needs the admin key",
                type="authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": 'Basic realm="xrouter", charset="UTF-8"'},
            )

    def require_admin(self, authorization: str | None) -> None:
        if self._admin_digest is None:
            raise self._admin_disabled("the admin API is disabled: set auth.admin_key")
        if not self._is_admin(_bearer(authorization)):
            raise unauthorized("missing or invalid admin key")
