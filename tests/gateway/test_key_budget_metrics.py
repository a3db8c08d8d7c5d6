from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.key_budget_metrics import BUDGET_REFRESH_S, KeyBudgetSeries

GAUGE = "xrouter_key_budget_remaining_usd"
REFUSALS = "xrouter_key_budget_refusals_total"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def series(registry: CollectorRegistry) -> KeyBudgetSeries:
    return KeyBudgetSeries(registry, limit=2)


def aliases(registry: CollectorRegistry, sample_name: str) -> set[str]:
    return {
        s.labels["key_alias"]
        for family in registry.collect()
        for s in family.samples
        if s.name == sample_name
    }


def test_gauges_are_capped(registry: CollectorRegistry, series: KeyBudgetSeries) -> None:
    assert series.remaining("team-a", 2_500_000)
    assert series.remaining("team-b", 0)
    assert not series.remaining("team-c", 1_000_000)  # over the limit of 2
    assert series.remaining("team-a", 1_250_000)  # known keys keep updating
    assert aliases(registry, GAUGE) == {"team-a", "team-b"}
    assert registry.get_sample_value(GAUGE, {"key_alias": "team-a"}) == 1.25
    series.forget("team-b")
    assert series.remaining("team-c", 1_000_000)
    assert aliases(registry, GAUGE) == {"team-a", "team-c"}


def test_refusals_share_the_gauges_slots(
    registry: CollectorRegistry, series: KeyBudgetSeries
) -> None:
    assert series.exports("team-a")
    assert series.refused("team-a")  # a key refused before any call settled
    assert series.remaining("team-b", 3_000)
    assert not series.exports("team-c")
    assert not series.refused("team-c")
    assert series.refused("team-a")
    assert registry.get_sample_value(REFUSALS, {"key_alias": "team-a"}) == 2
    assert aliases(registry, REFUSALS) == {"team-a"}
    # Forgetting a key (revoked, renamed, budget changed) drops both series and its slot.
    series.forget("team-a")
    assert aliases(registry, REFUSALS) == set()
    assert aliases(registry, GAUGE) == {"team-b"}
    assert series.exports("team-c") and series.refused("team-c")
    series.forget("never-exported")  # nothing to drop, no error


def test_store_reads_are_throttled_per_key(series: KeyBudgetSeries) -> None:
    t = 100.0
    assert series.refresh_delay("a", t) == 0.0  # the first settle is read at once
    assert series.refresh_delay("a", t + 0.1) is None  # that read is still pending
    series.refresh_done("a")
    # Within a second of the last read: read when the second has passed, not now.
    assert series.refresh_delay("a", t + 0.25) == pytest.approx(BUDGET_REFRESH_S - 0.25)
    assert series.refresh_delay("a", t + 0.5) is None  # the scheduled read will see it
    assert series.refresh_delay("b", t + 0.5) == 0.0  # keys are throttled apart
    series.refresh_done("a")
    assert series.refresh_delay("a", t + 5.0) == 0.0
