"""Circuit breakers: closed → open after consecutive upstream failures → half-open probe after
the cooldown → closed on success or open again on failure."""

from __future__ import annotations

import asyncio

import pytest

from router.health import BreakerConfig, CircuitBreakers


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breakers(failures: int = 3, cooldown_s: float = 10.0) -> tuple[CircuitBreakers, Clock, list]:
    clock, changes = Clock(), []
    b = CircuitBreakers(
        BreakerConfig(failures, cooldown_s),
        clock=clock,
        on_change=lambda m, s: changes.append((m, s)),
    )
    return b, clock, changes


def test_opens_after_consecutive_failures_and_a_success_resets_the_count() -> None:
    b, _, changes = breakers()
    for _ in range(2):
        b.record_failure("m", "timeout")
    b.record_success("m")  # the run is broken: counting starts again
    for _ in range(2):
        b.record_failure("m", "upstream_5xx")
    assert b.state("m") == "closed" and b.allow("m") and changes == []
    b.record_failure("m", "connection")
    assert b.state("m") == "open" and not b.allow("m")
    assert changes == [("m", "open")] and b.open_models() == ["m"]
    assert b.available(["m", "other"]) == ["other"]


def test_client_errors_do_not_count() -> None:
    b, _, _ = breakers(failures=1)
    for kind in ("bad_request", "upstream_4xx", "not_found", "bad_response", "circuit_open"):
        b.record_failure("m", kind)
    assert b.state("m") == "closed"
    b.record_failure("m", "rate_limited")  # a 429 does: the provider is saturated
    assert b.state("m") == "open"


def test_one_probe_after_the_cooldown_closes_or_reopens() -> None:
    b, clock, changes = breakers(failures=1, cooldown_s=10)
    b.record_failure("m", "timeout")
    clock.now += 9.9
    assert not b.allow("m")
    clock.now += 0.1
    assert b.state("m") == "half_open" and b.available(["m"]) == ["m"]
    assert b.allow("m")  # the probe
    assert not b.allow("m")  # only one at a time
    b.record_failure("m", "timeout")  # the probe failed: a full cooldown again
    assert b.state("m") == "open"
    clock.now += 10
    assert b.allow("m")
    b.record_success("m")
    assert b.state("m") == "closed" and b.allow("m") and b.allow("m")
    assert changes == [
        ("m", "open"),
        ("m", "probing"),
        ("m", "open"),
        ("m", "probing"),
        ("m", "closed"),
    ]


def test_a_probe_that_never_reports_is_replaced_after_a_cooldown() -> None:
    b, clock, _ = breakers(failures=1, cooldown_s=5)
    b.record_failure("m", "timeout")
    clock.now += 5
    assert b.allow("m")  # a probe that is then cancelled: no success, no failure
    clock.now += 4.9
    assert not b.allow("m")
    clock.now += 0.1
    assert b.allow("m")


def test_zero_failures_turns_breaking_off_and_configs_are_validated() -> None:
    b, _, _ = breakers(failures=0)
    for _ in range(100):
        b.record_failure("m", "timeout")
    assert b.allow("m") and b.state("m") == "closed"
    with pytest.raises(ValueError):
        BreakerConfig(failures=-1)
    with pytest.raises(ValueError):
        BreakerConfig(cooldown_s=0)


def test_turning_breaking_off_closes_the_circuits_already_open() -> None:
    # A reload to failures: 0 let calls through (allow) while policies were still kept off
    # the model (available) until its cooldown ended.
    b, _, _ = breakers(failures=1)
    b.record_failure("m", "timeout")
    assert b.state("m") == "open" and b.available(["m"]) == []
    b.config = BreakerConfig(failures=0, cooldown_s=10.0)
    assert b.state("m") == "closed" and b.available(["m"]) == ["m"]
    assert not b.keeps_away("m") and b.allow("m") and b.open_models() == []


def test_an_opening_another_process_saw_is_adopted_with_its_timing() -> None:
    b, clock, changes = breakers(failures=3, cooldown_s=10.0)
    assert b.adopt_open("m", 4.0)
    assert b.state("m") == "open" and changes == [("m", "open")]
    clock.now += 5.9
    assert b.state("m") == "open"
    clock.now += 0.2  # the opener's cooldown ends 6 s after the report, not 10
    assert b.state("m") == "half_open" and b.allow("m")  # this process probes for itself
    b.record_success("m")
    assert b.state("m") == "closed" and changes[-1] == ("m", "closed")


def test_adopting_leaves_own_circuits_and_stale_reports_alone() -> None:
    b, clock, changes = breakers(failures=1, cooldown_s=10.0)
    b.record_failure("m", "timeout")  # opened here
    clock.now += 3
    assert not b.adopt_open("m", 0.0)  # keeps its own timing
    clock.now += 7
    assert b.state("m") == "half_open"
    assert not b.adopt_open("x", 10.0)  # as old as the cooldown: already over
    assert b.state("x") == "closed" and changes == [("m", "open")]
    off, _, _ = breakers(failures=0)
    assert not off.adopt_open("m", 0.0) and off.state("m") == "closed"


def test_a_failed_probe_reports_the_reopening() -> None:
    b, clock, changes = breakers(failures=1, cooldown_s=10.0)
    b.record_failure("m", "timeout")
    clock.now += 10
    assert b.allow("m")
    b.record_failure("m", "timeout")
    assert b.state("m") == "open" and changes == [("m", "open"), ("m", "probing"), ("m", "open")]


def test_a_probe_answered_with_a_client_error_closes_the_circuit() -> None:
    """A 4xx says nothing against the upstream; answering the probe, it says the upstream is
    up. Ignored, it held the probe slot: the model stayed out for another full cooldown."""
    b, clock, changes = breakers(failures=1, cooldown_s=10)
    b.record_failure("m", "timeout")
    clock.now += 10
    assert b.allow("m")  # the probe
    b.record_failure("m", "upstream_4xx")
    assert b.state("m") == "closed" and b.allow("m")
    assert changes == [("m", "open"), ("m", "probing"), ("m", "closed")]
    # Outside a probe a client error still changes nothing: an open circuit stays open.
    b.record_failure("m", "timeout")
    b.record_failure("m", "upstream_4xx")
    assert b.state("m") == "open" and not b.allow("m")


def test_a_model_that_left_the_pool_is_no_longer_open() -> None:
    b, _, changes = breakers(failures=1)
    b.record_failure("gone", "timeout")
    b.record_failure("kept", "timeout")
    b.forget(["kept", "new"])
    assert b.open_models() == ["kept"] and b.state("gone") == "closed"
    # Reported closed, so its metric (and an alert on it) stops saying it is open.
    assert changes[-1] == ("gone", "closed")


def test_the_end_of_a_cooldown_is_reported_once_when_refreshed() -> None:
    """Driven by hand (no event loop), ``refresh`` reports what the timers would: a circuit
    whose cooldown ran out with no probe out is half-open, and no longer keeps calls away."""
    b, clock, changes = breakers(failures=1, cooldown_s=10.0)
    b.record_failure("m", "timeout")
    clock.now += 9.9
    b.refresh()
    assert b.keeps_away("m") and changes == [("m", "open")]
    clock.now += 0.1
    b.refresh()
    b.refresh()  # only changes are reported
    assert b.state("m") == "half_open" and not b.keeps_away("m")
    assert changes == [("m", "open"), ("m", "half_open")]
    assert b.allow("m") and b.keeps_away("m")  # the probe is out: the rest are kept away
    clock.now += 10  # and is presumed lost
    b.refresh()
    assert not b.keeps_away("m") and changes[-2:] == [("m", "probing"), ("m", "half_open")]


async def test_a_cooldown_that_runs_out_with_no_call_is_reported() -> None:
    """A model that gets no traffic after its cooldown: nothing looks at its circuit, yet
    its end is reported (so xrouter_circuit_open stops saying the model is kept away), as
    is that of a probe that never reported. The opening's report alone said "open" for
    as long as the model got no call."""
    changes: list[tuple[str, str]] = []
    # A cooldown of 1 s, looked at 0.1 s in: a loaded machine's stall stays well short of it.
    b = CircuitBreakers(BreakerConfig(1, 1.0), on_change=lambda m, s: changes.append((m, s)))
    b.record_failure("m", "timeout")
    await asyncio.sleep(0.1)
    assert changes == [("m", "open")] and b.keeps_away("m")
    await asyncio.sleep(1.0)
    assert changes == [("m", "open"), ("m", "half_open")] and not b.keeps_away("m")
    assert b.allow("m")  # a probe that is then cancelled: no success, no failure
    await asyncio.sleep(1.1)
    assert changes[-2:] == [("m", "probing"), ("m", "half_open")]
    b.record_failure("m", "timeout")  # a failed probe: kept away for a full cooldown again
    b.record_success("m")  # and closed before it ends: nothing more to report
    await asyncio.sleep(1.1)
    assert changes[-2:] == [("m", "open"), ("m", "closed")]


def test_a_closing_another_process_saw_closes_circuits_opened_before_it() -> None:
    b, clock, changes = breakers(failures=1, cooldown_s=10.0)
    assert b.adopt_open("adopted", 2.0)
    b.record_failure("own", "timeout")
    clock.now += 10  # half-open in both: each would probe for itself
    b.record_failure("newer", "timeout")
    clock.now += 0.2
    # Another process's probe answered 0.5 s ago: the circuits opened before that close,
    # the one opened since (news newer than the closing) stays open.
    closed = [m for m in ("adopted", "own", "newer") if b.adopt_closed(m, 0.5)]
    assert closed == ["adopted", "own"] and b.open_models() == ["newer"]
    assert changes[-2:] == [("adopted", "closed"), ("own", "closed")]
    assert b.adopt_closed("newer", 0.1) and b.state("newer") == "closed"
    assert not b.adopt_closed("never", 0.0) and b.state("never") == "closed"


class TickingClock(Clock):
    """Moves on by ``step`` at each reading, as a real clock does between two reads."""

    def __init__(self, step: float) -> None:
        super().__init__()
        self.step = step

    def __call__(self) -> float:
        now = self.now
        self.now += self.step
        return now


async def test_a_cooldown_that_ends_between_two_reads_of_the_clock_is_still_reported() -> None:
    """The look at the end of a cooldown (a timer fires it, a little early on uvloop's
    ms clock) read the clock twice: "not yet" at the first read, "passed" at the second,
    and the circuit was neither re-armed nor reported — xrouter_circuit_open said 1 for a
    model nobody was keeping away (a multi-worker test caught it, about 1 run in 10 under
    load)."""
    clock, changes = TickingClock(step=0.0), []
    b = CircuitBreakers(
        BreakerConfig(1, 10.0), clock=clock, on_change=lambda m, s: changes.append((m, s))
    )
    b.record_failure("m", "timeout")  # opened at 1000: its timer is 10 real seconds away
    clock.now, clock.step = 1010.0 - 0.0005, 0.001  # the deadline falls after the 1st read
    b.refresh(["m"])
    await asyncio.sleep(0.05)
    assert changes == [("m", "open"), ("m", "half_open")]
    assert not b.keeps_away("m")
