"""Budget periods and rate windows: the time arithmetic both limit backends share.

Budget periods are calendar windows in UTC (a key's "daily" budget resets at 00:00 UTC, not at
the operator's local midnight), so every replica and every backend agrees on where a period
starts without any configuration. Each period has a stable string id; the stores key spend
counters by it, so a new period starts from zero simply by addressing a new counter, and no
job has to "reset" anything at midnight.

Rate limits use a fixed 60-second sliding window (see ``RATE_WINDOW_S``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

BudgetPeriod = Literal["daily", "weekly", "monthly", "total"]
BUDGET_PERIODS: tuple[BudgetPeriod, ...] = ("daily", "weekly", "monthly", "total")

# rpm and tpm are "per minute": the window a request or token counts in is the last 60 s.
RATE_WINDOW_S = 60.0


def token_correction_times(now: float | None, at: float | None) -> tuple[float, float] | None:
    """``(now, at)`` for a tpm correction counted ``at`` (default: now, never later), or
    None when the estimate it corrects has left the rate window already and nothing in the
    window is left to correct."""
    now = time.time() if now is None else now
    at = now if at is None else min(at, now)
    return None if at <= now - RATE_WINDOW_S else (now, at)


# Spend counters outlive their period by this much so a report taken just after a rollover
# can still read the previous period from the store; the ledger is the long-term record.
PERIOD_COUNTER_GRACE_S = 86_400.0


@dataclass(frozen=True, slots=True)
class PeriodWindow:
    """One budget period: ``[start, end)`` in Unix seconds; ``end`` is None for "total"."""

    id: str
    start: float | None
    end: float | None

    def seconds_left(self, now: float) -> float | None:
        return None if self.end is None else max(0.0, self.end - now)

    def counter_ttl_s(self, now: float) -> float | None:
        """How long the store should keep this period's spend counter (None: forever).

        Relative to ``now`` rather than an absolute expiry time, so a store driven with a
        synthetic clock (tests, replays) never expires a counter early by comparing the
        synthetic time with the server's real clock."""
        left = self.seconds_left(now)
        return None if left is None else left + PERIOD_COUNTER_GRACE_S


_TOTAL = PeriodWindow(id="total", start=None, end=None)


def period_window(period: BudgetPeriod | None, now: float) -> PeriodWindow:
    """The budget period containing ``now`` (Unix seconds). ``None`` means "total"."""
    if period is None or period == "total":
        return _TOTAL
    dt = datetime.fromtimestamp(now, tz=UTC)
    day = dt.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "daily":
        start = day
        end = start + timedelta(days=1)
        pid = f"d{start:%Y-%m-%d}"
    elif period == "weekly":
        # ISO 8601 weeks start on Monday; the id uses the ISO year, which differs from the
        # calendar year around New Year (2024-12-30 is in 2025-W01).
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
        iso_year, iso_week, _ = start.isocalendar()
        pid = f"w{iso_year:04d}-W{iso_week:02d}"
    elif period == "monthly":
        start = day.replace(day=1)
        end = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else start.replace(month=start.month + 1)
        )
        pid = f"m{start:%Y-%m}"
    else:
        raise ValueError(f"unknown budget period {period!r}; expected one of {BUDGET_PERIODS}")
    return PeriodWindow(id=pid, start=start.timestamp(), end=end.timestamp())


class PeriodCache:
    """``period_window`` with the last answer per period kept: periods change at most once
    a day, and date arithmetic was the largest CPU cost of a budget check. One per store
    (not module-global), so there is no shared mutable state."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[BudgetPeriod | None, PeriodWindow] = {}

    def window(self, period: BudgetPeriod | None, now: float) -> PeriodWindow:
        last = self._last.get(period)
        if last is not None and (
            last.start is None or (last.start <= now and last.end is not None and now < last.end)
        ):
            return last
        window = self._last[period] = period_window(period, now)
        return window
