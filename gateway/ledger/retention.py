"""Content retention: logged prompts and answers are dropped once they are old enough.

``ledger.log_content: full`` keeps every prompt and answer, which is what retraining the
router from traffic needs and what a privacy policy usually limits ("prompts are kept 30
days"). With ``ledger.content_retention_days`` set, a background task in each worker clears
``requests.content`` of requests older than that, a batch at a time, every
``ledger.retention_interval_s``. The rest of the row stays: costs, tokens, the routing
decision with its propensities, feedback — spend reports, budgets (restored from the ledger)
and ``xrouter export`` are unaffected, except that an exported old request has no prompt
(``content_logged: none``), as if it had been logged without content.

Several workers may run it at once: each batch is one ``UPDATE … WHERE content IS NOT NULL``
over at most ``batch`` rows, so they only ever contend for a moment, and a row is cleared once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.schema import requests
from gateway.periodic import OutageLog, Periodic

if TYPE_CHECKING:
    from gateway.metrics import GatewayMetrics

log = logging.getLogger(__name__)

DEFAULT_BATCH = 1000


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
    dropped = 0
    while True:
        async with engine.begin() as conn:
            n = (await conn.execute(statement)).rowcount
        dropped += n
        if n < batch:
            return dropped
        await asyncio.sleep(0)  # let the request path's own database work in between


class ContentRetention:
    """Runs ``drop_content`` at startup and every ``interval_s``, for content older than
    ``days``. Failures (the database down) are logged once per outage and retried."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        days: float,
        interval_s: float,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.days = days
        self._metrics = metrics
        self._clock = clock
        self._task = Periodic(
            "xrouter-content-retention", interval_s, self.run_once, first_now=True
        )
        self._outage = OutageLog(
            log, "ledger: dropping old content failed", "ledger: dropping old content works again"
        )

    def start(self) -> None:
        self._task.start()

    async def aclose(self) -> None:
        await self._task.aclose()

    async def run_once(self) -> int:
        cutoff = self._clock() - timedelta(days=self.days)
        try:
            dropped = await drop_content(self.engine, cutoff)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._outage.failed(exc)
            return 0
        self._outage.recovered()
        if dropped:
            log.info(
                "ledger: dropped the content of %d request(s) older than %g days",
                dropped,
                self.days,
            )
            if self._metrics is not None:
                self._metrics.content_dropped(dropped)
        return dropped
