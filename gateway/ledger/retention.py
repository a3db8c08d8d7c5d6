"""Ledger retention: logged prompts and answers, and whole requests, dropped once old enough.

``ledger.log_content: full`` keeps every prompt and answer, which is what retraining the
router from traffic needs and what a privacy policy usually limits ("prompts are kept 30
days"). With ``ledger.content_retention_days`` set, a background task in each worker clears
``requests.content`` of requests older than that, a batch at a time, every
``ledger.retention_interval_s``. The rest of the row stays: costs, tokens, the routing
decision with its propensities, feedback — spend reports, budgets (restored from the ledger)
and ``xrouter export`` are unaffected, except that an exported old request has no prompt
(``content_logged: none``), as if it had been logged without content.

The rows themselves grow the ledger by about 1 KB a request (``bench/gateway/soak.sh``). With
``ledger.request_retention_days`` set (32 days at least), the same task deletes requests older
than that with their calls, feedback and tags. Two kinds of row stay whatever their age: none
of a key with a lifetime budget (``budget_period: total``, or none) is deleted, since that
budget is restored from all of the key's rows; and the budgets of the current day, week or
month only need rows younger than 32 days. Spend reports, exports and training then cover
what is left.

Several workers may run it at once: each batch is one short transaction over at most
``batch`` requests, so they only ever contend for a moment; a row is cleared or deleted once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.migrations import SQLITE_BEGIN_OPTION
from gateway.ledger.schema import api_keys, calls, feedback, request_tags, requests
from gateway.periodic import OutageLog, Periodic

if TYPE_CHECKING:
    from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

DEFAULT_BATCH = 1000


def _writes(engine: AsyncEngine) -> AsyncEngine:
    """The engine for a batch, which takes SQLite's write lock at BEGIN (as the ledger's
    inserter does): a transaction that has read cannot wait for the lock later — the upgrade
    fails at once with "database is locked" while the ledger writer holds it — so a batch
    that reads its ids first must hold it from the start, where the busy timeout applies."""
    return engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})


async def _yield_to_writers(batch_started: float) -> None:
    """Wait as long as the batch held the database: the ledger writer (and other workers'
    requests) get at least half of it. Without a pause a waiting writer lost the race for
    SQLite's write lock to the next batch again and again (its inserts waited up to half a
    second behind a large backlog's deletion, ``bench/ledger_retention.py``)."""
    await asyncio.sleep(max(time.monotonic() - batch_started, 0.001))


async def drop_content(engine: AsyncEngine, before: datetime, *, batch: int = DEFAULT_BATCH) -> int:
    """Clear the content of every request created before ``before``; returns how many.
    One short transaction per ``batch`` rows, so a large backlog never holds a long lock
    (SQLite has one writer; the gateway's ledger writer must get its turn)."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    old = (
        sa.select(requests.c.request_id)
        .where(requests.c.created_at < before, requests.c.content.is_not(None))
        .limit(batch)
        .scalar_subquery()
    )
    statement = (
        requests.update()
        .where(requests.c.request_id.in_(old))
        .values(content=None)
        .execution_options(synchronize_session=False)
    )
    writes = _writes(engine)
    dropped = 0
    while True:
        started = time.monotonic()
        async with writes.begin() as conn:
            n = (await conn.execute(statement)).rowcount
        dropped += n
        if n < batch:
            return dropped
        await _yield_to_writers(started)


def _lifetime_budget_keys() -> sa.Select[tuple[str]]:
    """Keys whose budget runs for their lifetime: restored from every row they have."""
    return sa.select(api_keys.c.key_id).where(
        api_keys.c.budget_micros.is_not(None),
        sa.or_(api_keys.c.budget_period.is_(None), api_keys.c.budget_period == "total"),
    )


async def delete_requests(
    engine: AsyncEngine, before: datetime, *, batch: int = DEFAULT_BATCH
) -> int:
    """Delete every request created before ``before`` — with its calls, feedback and tags —
    except those of keys with a lifetime budget; returns how many requests. One short
    transaction per ``batch`` requests (the gateway's ledger writer must get its turn)."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    pick = (
        sa.select(requests.c.request_id, requests.c.created_at)
        .where(
            requests.c.created_at < before,
            sa.or_(requests.c.key_id.is_(None), requests.c.key_id.not_in(_lifetime_budget_keys())),
        )
        .order_by(requests.c.created_at)
        .limit(batch)
    )
    writes = _writes(engine)  # each batch reads its ids, then deletes
    deleted = 0
    # Where the last batch ended: the next one starts there, oldest first, so the rows kept
    # before it (a lifetime-budgeted key's, which stay whatever their age) are read once a
    # run rather than once a batch — a backlog of such rows made every batch, under the
    # write lock, read them all again.
    frontier: datetime | None = None
    while True:
        started = time.monotonic()
        page = pick if frontier is None else pick.where(requests.c.created_at >= frontier)
        async with writes.begin() as conn:
            picked = (await conn.execute(page)).all()
            ids = [rid for rid, _ in picked]
            if ids:
                # Children first: no foreign keys bind them, and a batch that fails midway
                # rolls back whole.
                for table in (calls, feedback, request_tags):
                    await conn.execute(table.delete().where(table.c.request_id.in_(ids)))
                await conn.execute(requests.delete().where(requests.c.request_id.in_(ids)))
        deleted += len(ids)
        if len(ids) < batch:
            return deleted
        frontier = picked[-1][1]
        await _yield_to_writers(started)


@dataclass(frozen=True, slots=True)
class RetentionRun:
    content_dropped: int = 0
    requests_deleted: int = 0


class LedgerRetention:
    """Runs ``drop_content`` (content older than ``content_days``) and ``delete_requests``
    (requests older than ``request_days``) at startup and every ``interval_s``; either may
    be None (not done). Failures (the database down) are logged once per outage and
    retried."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        content_days: float | None = None,
        request_days: float | None = None,
        interval_s: float,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.content_days = content_days
        self.request_days = request_days
        self._metrics = metrics
        self._clock = clock
        self._task = Periodic("xrouter-ledger-retention", interval_s, self.run_once, first_now=True)
        self._outage = OutageLog(
            log,
            "ledger: retention (old content, old requests) failed",
            "ledger: retention works again",
        )

    def start(self) -> None:
        self._task.start()

    async def aclose(self) -> None:
        await self._task.aclose()

    async def run_once(self) -> RetentionRun:
        now = self._clock()
        dropped = deleted = 0
        try:
            if self.request_days is not None:  # first: no use clearing what goes next
                deleted = await delete_requests(
                    self.engine, now - timedelta(days=self.request_days)
                )
                # Counted at once: the deletion stands whatever the content step does next.
                if deleted:
                    log.info(
                        "ledger: deleted %d request(s) older than %g days",
                        deleted,
                        self.request_days,
                    )
                    if self._metrics is not None:
                        self._metrics.requests_deleted(deleted)
            if self.content_days is not None:
                dropped = await drop_content(self.engine, now - timedelta(days=self.content_days))
                if dropped:
                    log.info(
                        "ledger: dropped the content of %d request(s) older than %g days",
                        dropped,
                        self.content_days,
                    )
                    if self._metrics is not None:
                        self._metrics.content_dropped(dropped)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._outage.failed(exc)
            return RetentionRun(dropped, deleted)
        self._outage.recovered()
        return RetentionRun(dropped, deleted)
