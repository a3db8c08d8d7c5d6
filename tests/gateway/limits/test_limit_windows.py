from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.limits.windows import PERIOD_COUNTER_GRACE_S, PeriodCache, period_window


def ts(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("period", "now", "pid", "start", "end"),
    [
        ("daily", ts(2025, 1, 31, 23, 59, 59), "d2025-01-31", ts(2025, 1, 31), ts(2025, 2, 1)),
        ("daily", ts(2025, 2, 1), "d2025-02-01", ts(2025, 2, 1), ts(2025, 2, 2)),
        # 2025-02-05 is a Wednesday; ISO weeks start on Monday
        ("weekly", ts(2025, 2, 5, 8), "w2025-W06", ts(2025, 2, 3), ts(2025, 2, 10)),
        # Monday 2024-12-30 belongs to ISO year 2025
        ("weekly", ts(2025, 1, 1), "w2025-W01", ts(2024, 12, 30), ts(2025, 1, 6)),
        ("weekly", ts(2024, 12, 29, 23, 59), "w2024-W52", ts(2024, 12, 23), ts(2024, 12, 30)),
        ("monthly", ts(2024, 2, 29, 12), "m2024-02", ts(2024, 2, 1), ts(2024, 3, 1)),
        ("monthly", ts(2024, 12, 31, 23, 59), "m2024-12", ts(2024, 12, 1), ts(2025, 1, 1)),
    ],
)
def test_calendar_periods_in_utc(
    period: str, now: float, pid: str, start: float, end: float
) -> None:
    window = period_window(period, now)  # type: ignore[arg-type]
    assert (window.id, window.start, window.end) == (pid, start, end)
    assert window.start is not None and window.start <= now < end
    assert window.seconds_left(now) == end - now
    assert window.counter_ttl_s(now) == end - now + PERIOD_COUNTER_GRACE_S


@pytest.mark.parametrize("period", ["total", None])
def test_total_never_resets(period: str | None) -> None:
    window = period_window(period, ts(2030, 6, 1))  # type: ignore[arg-type]
    assert window == period_window(period, ts(2001, 1, 1))  # type: ignore[arg-type]
    assert (window.id, window.start, window.end) == ("total", None, None)
    assert window.seconds_left(0.0) is None and window.counter_ttl_s(0.0) is None


def test_unknown_period_rejected() -> None:
    with pytest.raises(ValueError, match="unknown budget period"):
        period_window("hourly", 0.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("period", ["daily", "weekly", "monthly", "total", None])
def test_period_cache_matches_uncached(period: str | None) -> None:
    cache = PeriodCache()
    # forwards across several boundaries, then backwards (a caller-supplied clock may jump)
    times = [ts(2024, 12, 30) + h * 3600 * 7.5 for h in range(0, 200)]
    for now in [*times, *reversed(times)]:
        assert cache.window(period, now) == period_window(period, now)  # type: ignore[arg-type]
