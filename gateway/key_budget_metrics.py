"""Per-key budget series: ``xrouter_key_budget_remaining_usd`` and
``xrouter_key_budget_refusals_total``, labelled by key alias.

Key aliases are the one label that operators, not the config, create, so the series are
bounded here: only the first ``limit`` keys seen get them (per process). A key that is
revoked, renamed or loses its budget frees its slot (``forget``).

The remaining budget is read back from the limit store after a key's calls settle; this
class also throttles those reads to one a second per key (``refresh_delay``), so a busy or
refused key costs the store one read a second rather than one per call.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.metrics_render import multiprocess_enabled
from pricing.money import MICROS_PER_USD

# How often a key's budget gauge is read back from the limit store after its settles.
BUDGET_REFRESH_S = 1.0


class KeyBudgetSeries:
    def __init__(self, registry: CollectorRegistry, *, limit: int) -> None:
        self._limit = limit
        self._aliases: set[str] = set()
        self._read_at: dict[str, float] = {}  # alias -> last gauge read (monotonic s)
        self._read_pending: set[str] = set()  # aliases with a read scheduled
        self._remaining = Gauge(
            "xrouter_key_budget_remaining_usd",
            "Budget minus spend in the current period, at least 0 (holds of calls in flight "
            "not deducted), read after each call settles and at each refusal, for at most "
            "metrics.budget_gauge_keys keys.",
            ["key_alias"],
            registry=registry,
            # All workers read the same store: the latest reading is the truth.
            multiprocess_mode="mostrecent",
        )
        # What is left can stay above 0 and still pay for no call (less than any call's
        # worst case): the refusals say the key is out, for the same keys as the gauge.
        self._refusals = Counter(
            "xrouter_key_budget_refusals",
            "Calls refused by their key's budget, for the keys in "
            "xrouter_key_budget_remaining_usd.",
            ["key_alias"],
            registry=registry,
        )

    def exports(self, key_alias: str) -> bool:
        """Whether a key has (or would get) budget series: callers skip reading the store
        for keys past the limit."""
        return key_alias in self._aliases or len(self._aliases) < self._limit

    def refresh_delay(self, key_alias: str, now: float) -> float | None:
        """When to read a key's budget back from the store after a settle: at once, or
        when a second has passed since the last read; None when a read is already
        scheduled (it will see this settle). The last settle of a burst is still read."""
        if key_alias in self._read_pending:
            return None
        delay = max(0.0, self._read_at.get(key_alias, -math.inf) + BUDGET_REFRESH_S - now)
        self._read_pending.add(key_alias)
        self._read_at[key_alias] = now + delay
        return delay

    def refresh_done(self, key_alias: str) -> None:
        self._read_pending.discard(key_alias)

    def remaining(self, key_alias: str, remaining_micros: int) -> bool:
        """Export a key's remaining budget; returns False for a key that isn't exported
        (past the limit)."""
        if not self._slot(key_alias):
            return False
        self._remaining.labels(key_alias=key_alias).set(remaining_micros / MICROS_PER_USD)
        return True

    def claim(self, key_alias: str) -> bool:
        """Take a series slot for a key before its first reading (the gauges' start-up
        pass); False past the limit."""
        return self._slot(key_alias)

    def refused(self, key_alias: str) -> bool:
        """Count a call the key's budget refused (for exported keys only, as the gauge);
        returns False for a key that isn't exported."""
        if not self._slot(key_alias):
            return False
        self._refusals.labels(key_alias=key_alias).inc()
        return True

    def forget(self, key_alias: str) -> None:
        """Stop exporting a key (revoked, its budget removed, or renamed) and free its slot.

        In multiprocess mode series cannot be removed from the workers' files: the last
        reading would stay (a revoked key that was out of budget alerting until restart),
        and a freed slot would let short-lived keys grow the series without bound. There
        the reading becomes NaN (no reading: no alert fires on it) and the slot stays taken
        until the workers restart (a key that keeps its alias exports again at its next
        call)."""
        if key_alias not in self._aliases:
            return
        if multiprocess_enabled():
            self._remaining.labels(key_alias=key_alias).set(math.nan)
            return
        self._aliases.discard(key_alias)
        self._remaining.remove(key_alias)
        self._refusals.remove(key_alias)

    def _slot(self, key_alias: str) -> bool:
        if key_alias not in self._aliases:
            if len(self._aliases) >= self._limit:
                return False
            self._aliases.add(key_alias)
        return True
