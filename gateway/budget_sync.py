"""Key budgets that outlive the limit store's counters.

Admission reads each key's spend from the limit store (atomic, fast), but the store is not the
record: the in-process store starts empty with every process, and a Redis that is flushed or
restarted without persistence forgets its counters — without this module a restart would give
every key its whole budget again. The ledger is the record. ``BudgetSync`` raises each budgeted
key's counter for its current period to what the ledger says the key spent in it:

* at startup, before the gateway reports ready (after the ledger has replayed its journal, so
  the requests of a process killed with ``kill -9`` count too) — if the store lacks its
  "restored" marker, or if this process took over the journal of a stopped one: the store
  may have been restored (by a replica that kept running) from a ledger that did not have
  those requests yet;
* whenever the store has lost its "restored" marker — a Redis that lost its data lost the
  marker with it — checked every ``limits.budget_sync_s`` by every worker (one ``EXISTS``);
* for one key, when an operator changes its budget or period (a key moved from a monthly to a
  daily budget has spent today what the ledger says, not nothing);
* once more, ``in_flight_s`` after a loss (the longest a request runs, plus the ledger's
  flush interval): requests in flight when the store lost its counters, or settled between
  the loss and the check that found it, are in the ledger by then;
* at the next check after this process gave up sending a settle (``spend_writes_lost``: the
  store stayed unreachable past the settle's deadline, or too many were waiting), and again
  ``in_flight_s`` later: that spend is in the ledger, not in the counter. A settle that only
  failed for a moment is not lost: the limit store's fail policy sends it again.

Counters are only ever raised (``LimitStore.restore_spent``): the ledger lags them (a request's
row is written after its calls settle), so in steady state a restore changes nothing, and any
number of workers may run it at once. A loss of the store forgets, until that second restore,
the spend of requests in flight or not yet in the ledger at the check that found it (the store
counted what settled after the loss, but a restore takes the larger of the two figures, not
their sum). A restore counts a request in the period it started in (``requests.created_at``);
the store counts each call when it settles, so a request straddling midnight may land on the
other side of a daily boundary.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gateway.ledger.spend import budget_spend
from gateway.limits.windows import PeriodWindow, period_window
from gateway.periodic import OutageLog, Periodic

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from gateway.ledger.keys import KeyInfo, KeyRepository
    from gateway.limits.base import LimitStore
    from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

# How long startup waits for the ledger to take its journal before restoring anyway (the
# periodic check restores again if a restore did not complete).
_FLUSH_WAIT_S = 10.0


class BudgetSync:
    def __init__(
        self,
        store: LimitStore,
        keys: KeyRepository,
        engine: AsyncEngine,
        *,
        interval_s: float,
        flush: Callable[[], Any] | None = None,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.time,
        in_flight_s: float = 0.0,
    ) -> None:
        self.store = store
        self.keys = keys
        self.engine = engine
        self._flush = flush
        self._metrics = metrics
        self._clock = clock
        self._task = Periodic("xrouter-budget-sync", interval_s, self.check)
        # Whether this process has seen the store restored (by itself or by another worker
        # or an earlier process): a restore after that is a loss of the store, not startup.
        self._restored_once = False
        self._must_restore = False
        # After a loss: restore again at this time (clock), when what was in flight at the
        # loss has settled and reached the ledger. None: nothing pending.
        self._in_flight_s = in_flight_s
        self._recount_at: float | None = None
        # The store's count of settles given up (``spend_writes_lost``) at the last restore.
        self._lost_writes_seen = 0
        self._outage = OutageLog(
            log,
            "budgets: restoring spend counters from the ledger failed",
            "budgets: the spend counters are restored again",
        )

    async def start(self, *, replayed: bool = False) -> None:
        """Restore what the store lacks (waiting for the ledger's journal first), then keep
        checking in the background. ``replayed``: the ledger took over the journal of a
        stopped process, so restore even if the store is marked restored (restores only
        raise counters: the keys whose spend the store has already are unchanged). A failure
        here is logged, not raised: the gateway serves, and the periodic check tries again."""
        self._must_restore = replayed  # until a restore succeeds
        await self._flush_ledger()
        await self.check()
        self._task.start()

    async def aclose(self) -> None:
        await self._task.aclose()

    async def check(self) -> bool:
        """Restore every budgeted key if the store lost its counters (or this process
        replayed a stopped one's journal and has not restored since); True if it did."""
        lost_writes = self.store.spend_writes_lost()
        try:
            if not self._must_restore and await self.store.spend_restored():
                # Restored already (a restart on a persistent Redis, or another worker
                # first): if the marker goes later, the store lost it.
                self._restored_once = True
                self._outage.recovered()
                if lost_writes > self._lost_writes_seen:
                    await self._recount_lost_writes(lost_writes)
                    return True
                await self._recount_in_flight()
                return False
            trigger = "store_lost" if self._restored_once else "startup"
            if trigger == "store_lost":
                # Settles queued while the store was away land first: restored before
                # them, a settle whose row is in the ledger would be counted twice (the
                # restore only raises counters, so nothing would take it back).
                if not await self.store.send_pending():
                    return False  # the store refuses them: restored at a later check
                await self._flush_ledger()  # what this process has settled counts too
            restored = await self.restore_all()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._outage.failed(exc)
            return False
        self._outage.recovered()
        if trigger == "store_lost":
            log.warning(
                "budgets: the limit store lost its spend counters; restored %d key(s) from "
                "the ledger",
                restored,
            )
        else:
            log.info("budgets: restored %d key(s)' spend from the ledger", restored)
        self._restored_once = True
        self._must_restore = False
        self._lost_writes_seen = max(self._lost_writes_seen, lost_writes)
        if trigger == "store_lost" and self._in_flight_s > 0:
            self._recount_at = self._clock() + self._in_flight_s
        self._count(trigger)
        return True

    async def _recount_lost_writes(self, lost_writes: int) -> None:
        """Raise the counters to the ledger's figures because this process gave up settles
        (their spend is in the ledger only), and once more ``in_flight_s`` later for a
        request whose row was not yet written. Not a loss of the store (not counted)."""
        await self._flush_ledger()  # the requests whose settles were given up count
        restored = await self.restore_all()
        log.warning(
            "budgets: %d settle(s) could not reach the limit store; restored %d key(s) from "
            "the ledger",
            lost_writes - self._lost_writes_seen,
            restored,
        )
        self._lost_writes_seen = lost_writes
        if self._in_flight_s > 0:
            self._recount_at = self._clock() + self._in_flight_s

    async def _recount_in_flight(self) -> None:
        """The second restore after a loss, once its time has come: not a loss of its own
        (not counted in the metric), the same loss's requests reaching the ledger."""
        if self._recount_at is None or self._clock() < self._recount_at:
            return
        await self._flush_ledger()
        restored = await self.restore_all()
        self._recount_at = None
        log.info(
            "budgets: restored %d key(s) again from the ledger, now with the requests that "
            "were in flight when the limit store lost its counters",
            restored,
        )

    async def restore_all(self) -> int:
        """Raise every budgeted key's counter to the ledger's figure, then mark the store
        restored. Returns how many keys had spend in their current period."""
        infos = [k for k in await self.keys.list() if k.budget_micros is not None]
        restored = await self._restore(infos)
        await self.store.mark_spend_restored()
        return restored

    async def restore_key(self, info: KeyInfo) -> None:
        """Restore one key (its budget or period just changed). Failures are logged: the
        key's counter is then what the store had, as before the change."""
        if info.budget_micros is None or info.revoked:
            return
        await self._flush_ledger()  # the key's latest requests count too
        try:
            await self._restore([info])
        except Exception as exc:
            log.warning("budgets: could not restore key %s from the ledger: %s", info.key_id, exc)
            return
        self._count("key_update")

    async def _flush_ledger(self) -> None:
        if self._flush is None:
            return
        try:
            await asyncio.wait_for(self._flush(), _FLUSH_WAIT_S)
        except Exception as exc:  # the database may be down: restore from what it has
            log.warning("budgets: the ledger did not flush before restoring: %s", exc)

    async def _restore(self, infos: Sequence[KeyInfo]) -> int:
        now = self._clock()
        by_window: dict[PeriodWindow, list[KeyInfo]] = {}
        for info in infos:
            window = period_window(info.limits().budget_period, now)
            by_window.setdefault(window, []).append(info)
        restored = 0
        for window, group in by_window.items():
            spend = await budget_spend(self.engine, [k.key_id for k in group], window.start)
            for info in group:
                micros = spend.get(info.key_id, 0)
                if micros:
                    await self.store.restore_spent(info.limits(), window, micros, now)
                    restored += 1
        return restored

    def _count(self, trigger: str) -> None:
        if self._metrics is not None:
            self._metrics.budget_restored(trigger)
