"""Key budget gauges kept current between a key's calls.

``xrouter_key_budget_remaining_usd`` is read back from the limit store after a key's calls
settle (``gateway.hooks.KeyBudgetGuard``), in the process that served them. Left at that, a
reading only changes when that process serves the key again, and so it goes stale:

* at a period's reset, a key that was out of budget yesterday reads 0 until its next call
  here — which a client refused yesterday may never make — and the "budget exhausted" alert
  keeps firing;
* with several replicas, each exports what it last saw, and a replica the key's traffic
  left keeps its old figure;
* a budget raised or a period changed through the admin API on another replica is not
  seen here until the key calls here.

``BudgetGauges`` re-reads every exported key every ``metrics.budget_refresh_s``: the key as
the ledger has it now (its budget, its period, whether it was revoked or renamed), and its
spend from the limit store. That is one key lookup and one store read per exported key
(at most ``metrics.budget_gauge_keys``) per interval and process. Its first pass, at start,
takes up the live keys with a budget (oldest first, up to that limit): after a restart a
key exhausted before it, which may never call again, is exported as it was — the alert on
it does not clear because the process that exported it went away.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from gateway.limits.base import LimitStoreUnavailable
from gateway.periodic import OutageLog, Periodic

if TYPE_CHECKING:
    from gateway.ledger.keys import KeyRepository
    from gateway.limits.base import LimitStore
    from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)


class BudgetGauges:
    def __init__(
        self,
        store: LimitStore,
        keys: KeyRepository,
        metrics: GatewayMetrics,
        *,
        interval_s: float,
    ) -> None:
        self.store = store
        self.keys = keys
        self.metrics = metrics
        # Exported alias -> the key id it was exported for.
        self._tracked: dict[str, str] = {}
        self._seeded = False
        self._task = Periodic("xrouter-budget-gauges", interval_s, self.refresh, first_now=True)
        self._outage = OutageLog(
            log,
            "budget gauges: refreshing the keys' remaining budgets failed",
            "budget gauges: refreshing again",
        )

    def start(self) -> None:
        self._task.start()

    async def aclose(self) -> None:
        await self._task.aclose()

    def track(self, alias: str, key_id: str) -> None:
        """``alias``'s gauge was set for ``key_id``: keep it current from now on."""
        self._tracked[alias] = key_id

    def forget(self, alias: str) -> None:
        self._tracked.pop(alias, None)

    @property
    def tracked(self) -> dict[str, str]:
        return dict(self._tracked)

    async def refresh(self) -> None:
        """Re-read every tracked key. A key revoked, renamed or without a budget now stops
        being exported (as the admin API drops it in the process that answered it)."""
        try:
            if not self._seeded:
                await self._seed()
            for alias, key_id in list(self._tracked.items()):
                await self._refresh_one(alias, key_id)
        except asyncio.CancelledError:
            raise
        except LimitStoreUnavailable as exc:
            # The gauges keep their last readings until the store answers again.
            self._outage.failed(exc)
            return
        except Exception as exc:  # the key lookup: the database may be down
            self._outage.failed(exc)
            return
        self._outage.recovered()

    async def _seed(self) -> None:
        """Track the live keys with a budget and an alias (the gauge's label), as many as
        the gauge exports; those that call take their places first."""
        series = self.metrics.key_budgets
        for info in await self.keys.list():
            if info.alias and info.budget_micros is not None and series.claim(info.alias):
                self._tracked.setdefault(info.alias, info.key_id)
        self._seeded = True

    async def _refresh_one(self, alias: str, key_id: str) -> None:
        info = await self.keys.get(key_id)
        if info is None or info.revoked or info.budget_micros is None or info.alias != alias:
            self.forget(alias)
            self.metrics.key_budgets.forget(alias)
            return
        state = await self.store.spent(info.limits())
        if self._tracked.get(alias) == key_id:  # not forgotten while the store answered
            self.metrics.key_budgets.remaining(alias, max(info.budget_micros - state.spent, 0))
