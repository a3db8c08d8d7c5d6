"""The ledger writer's circuit breaker for its database: after a failure, batches go
straight to the spill journal until a retry is due, with exponential backoff, so a database
that is down is not hammered (and each batch does not wait out a timeout first)."""

from __future__ import annotations

import logging
import time

from gateway.ledger.store import describe_error

logger = logging.getLogger(__name__)

_BACKOFF_MIN_S = 0.25
_BACKOFF_MAX_S = 30.0


class LogThrottle:
    """At most one log line per interval for a failure that repeats every flush."""

    def __init__(self, interval_s: float) -> None:
        self._interval = interval_s
        self._last = -float("inf")

    def ready(self) -> bool:
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            return True
        return False


class DatabaseBackoff:
    def __init__(self) -> None:
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self._log = LogThrottle(10.0)

    def ready(self) -> bool:
        """Whether a batch should try the database now."""
        return time.monotonic() >= self._retry_at

    def failed(self, exc: BaseException) -> None:
        self._backoff_s = min(max(self._backoff_s * 2, _BACKOFF_MIN_S), _BACKOFF_MAX_S)
        self._retry_at = time.monotonic() + self._backoff_s
        if self._log.ready():
            logger.warning(
                "ledger database unavailable (%s); journaling, next try in %.2fs",
                describe_error(exc),
                self._backoff_s,
            )

    def ok(self) -> None:
        if self._backoff_s:
            logger.info("ledger database reachable again")
        self._backoff_s = 0.0
        self._retry_at = 0.0
