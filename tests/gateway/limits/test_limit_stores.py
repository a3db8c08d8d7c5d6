"""The shared limit-store suite: every test runs against the in-memory and the Redis store."""

from __future__ import annotations

import asyncio
import random
import tracemalloc
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest

from gateway.limits import KeyLimits, LimitStore, period_window
from gateway.limits.memory import MemoryLimitStore

StoreFactory = Callable[..., Awaitable[LimitStore]]  # the make_store fixture (conftest.py)

T0 = datetime(2025, 3, 12, 10, 0, tzinfo=UTC).timestamp()


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


# -- budgets ---------------------------------------------------------------------------------


async def test_concurrent_reservations_never_overcommit(store: LimitStore) -> None:
    worst = 1_000
    budget = 10 * worst
    overrun = worst + worst // 2  # one call costs more than its hold: still fully recorded
    key = KeyLimits("conc", budget_micros=budget, budget_period="daily")
    rng = random.Random(7)
    settled: list[int] = []
    rejected: list[str | None] = []

    async def request(i: int) -> None:
        for _ in range(3):  # a rejected request retries a little later, as a client would
            result = await store.reserve(key, None, worst, f"req-{i}", now=T0)
            if result.ok:
                await asyncio.sleep(rng.random() / 500)
                actual = overrun if i == 0 else rng.randint(worst // 2, worst)
                await store.settle(key, f"req-{i}", worst, actual, now=T0)
                settled.append(actual)
                return
            rejected.append(result.limit)
            await asyncio.sleep(rng.random() / 200)

    await asyncio.gather(*(request(i) for i in range(100)))

    state = await store.spent(key, now=T0)
    assert state.spent == sum(settled)
    assert state.reserved == 0
    assert sum(settled) <= budget + worst
    # Only the single overrun can push spend past the budget, and only by its excess.
    assert sum(settled) <= budget + (overrun - worst)
    assert len(settled) >= 10  # ten worst cases always fit
    assert rejected and set(rejected) == {"budget"}
    assert state.remaining == max(0, budget - sum(settled))


async def test_reserve_reports_remaining_and_holds(store: LimitStore) -> None:
    key = KeyLimits("hold", budget_micros=1_000, budget_period="monthly")
    first = await store.reserve(key, None, 700, "a", now=T0)
    assert first.ok and first.remaining_micros == 300 and first.limit is None
    assert first.resets_at == utc(2025, 4, 1)
    second = await store.reserve(key, None, 301, "b", now=T0)
    assert not second.ok and second.limit == "budget" and second.remaining_micros == 300
    # Refused only for "a"'s hold: 301 fits the unspent 1,000 (a 429 to retry shortly, not
    # "budget exhausted" until the period resets). 1,001 would not fit even then.
    assert second.held_only
    assert not (await store.reserve(key, None, 1_001, "c", now=T0)).held_only
    state = await store.spent(key, now=T0)
    assert (state.spent, state.reserved, state.remaining) == (0, 700, 300)

    await store.release(key, "a", 700, now=T0)
    state = await store.spent(key, now=T0)
    assert (state.spent, state.reserved, state.remaining) == (0, 0, 1_000)


async def test_settle_records_actual_even_above_the_hold(store: LimitStore) -> None:
    key = KeyLimits("over", budget_micros=100, budget_period="total")
    assert (await store.reserve(key, None, 50, "r", now=T0)).ok
    await store.settle(key, "r", 50, 80, now=T0)
    state = await store.spent(key, now=T0)
    assert (state.spent, state.reserved, state.remaining) == (80, 0, 20)
    refused = await store.reserve(key, None, 21, "s", now=T0)
    assert not refused.ok and not refused.held_only  # spent, not held: it is exhausted


async def test_one_request_holds_and_settles_in_parts(store: LimitStore) -> None:
    key = KeyLimits("parts", budget_micros=10_000, budget_period="daily")
    assert (await store.reserve(key, None, 100, "req", now=T0)).ok
    assert (await store.reserve(key, None, 50, "req", now=T0)).ok
    assert (await store.spent(key, now=T0)).reserved == 150
    await store.settle(key, "req", 100, 70, now=T0)
    assert (await store.spent(key, now=T0)).reserved == 50
    await store.settle(key, "req", 50, 40, now=T0)
    # settling again releases nothing more: the hold is gone
    await store.settle(key, "req", 50, 0, now=T0)
    state = await store.spent(key, now=T0)
    assert (state.spent, state.reserved) == (110, 0)


async def test_per_request_cap_counts_holds_and_spend(store: LimitStore) -> None:
    key = KeyLimits("cap", budget_micros=1_000_000, budget_period="daily")
    ok = await store.reserve(key, 100, 60, "req-1", now=T0)
    assert ok.ok and ok.request_remaining_micros == 40 and ok.remaining_micros == 999_940
    over = await store.reserve(key, 100, 50, "req-1", now=T0)
    assert not over.ok and over.limit == "request_budget" and over.request_remaining_micros == 40
    # another request has its own cap
    assert (await store.reserve(key, 100, 100, "req-2", now=T0)).ok
    # what the first call really cost frees the rest of its hold for the next call
    await store.settle(key, "req-1", 60, 30, now=T0)
    nxt = await store.reserve(key, 100, 70, "req-1", now=T0)
    assert nxt.ok and nxt.request_remaining_micros == 0
    assert not (await store.reserve(key, 100, 1, "req-1", now=T0)).ok


async def test_per_request_cap_without_a_key(store: LimitStore) -> None:
    assert (await store.reserve(None, None, 10**9, "free", now=T0)).ok  # nothing to enforce
    first = await store.reserve(None, 100, 60, "anon", now=T0)
    assert first.ok and first.remaining_micros is None and first.request_remaining_micros == 40
    assert (await store.reserve(None, 100, 50, "anon", now=T0)).limit == "request_budget"
    await store.settle(None, "anon", 60, 30, now=T0)
    assert (await store.reserve(None, 100, 70, "anon", now=T0)).ok
    assert (await store.reserve(None, 100, 71, "anon", now=T0)).limit == "request_budget"
    assert (await store.reserve(None, 100, 100, "other-anon", now=T0)).ok


@pytest.mark.parametrize(
    ("period", "last", "first_of_next"),
    [
        ("daily", utc(2025, 1, 31, 23, 59, 59), utc(2025, 2, 1)),
        ("weekly", utc(2025, 2, 9, 23, 59, 59), utc(2025, 2, 10)),  # Sunday -> Monday
        ("monthly", utc(2024, 2, 29, 23, 59, 59), utc(2024, 3, 1)),
        ("total", utc(2025, 1, 31, 23, 59, 59), None),
    ],
)
async def test_budget_period_rollover(
    store: LimitStore, period: str, last: float, first_of_next: float | None
) -> None:
    key = KeyLimits(f"period-{period}", budget_micros=500, budget_period=period)  # type: ignore[arg-type]
    assert (await store.reserve(key, None, 500, "spend-all", now=last - 3600)).ok
    await store.settle(key, "spend-all", 500, 500, now=last - 3600)
    exhausted = await store.reserve(key, None, 1, "late", now=last)
    assert not exhausted.ok and exhausted.remaining_micros == 0
    state = await store.spent(key, now=last)
    assert (state.spent, state.remaining, state.resets_at) == (500, 0, first_of_next)

    later = first_of_next if first_of_next is not None else last + 400 * 86_400
    fresh = await store.reserve(key, None, 500, "next", now=later)
    if first_of_next is None:
        assert not fresh.ok  # a lifetime budget never resets
        assert (await store.spent(key, now=later)).spent == 500
    else:
        assert fresh.ok and fresh.remaining_micros == 0
        state = await store.spent(key, now=later)
        assert (state.spent, state.reserved, state.period_start) == (0, 500, first_of_next)


async def test_abandoned_hold_expires_after_ttl(make_store: StoreFactory) -> None:
    store = await make_store(hold_ttl_s=30.0)
    key = KeyLimits("ttl", budget_micros=100, budget_period="daily")
    assert (await store.reserve(key, None, 100, "dead-worker", now=T0)).ok
    blocked = await store.reserve(key, None, 1, "live", now=T0 + 29.9)
    assert not blocked.ok and blocked.limit == "budget"
    assert (await store.spent(key, now=T0 + 29.9)).reserved == 100

    assert (await store.reserve(key, None, 1, "live", now=T0 + 30.0)).ok
    assert (await store.spent(key, now=T0 + 30.0)).reserved == 1
    # A late settle of the swept hold must not release it twice, but its cost counts.
    await store.settle(key, "dead-worker", 100, 80, now=T0 + 31)
    state = await store.spent(key, now=T0 + 31)
    assert (state.spent, state.reserved, state.remaining) == (80, 1, 19)


async def test_a_mass_expiry_frees_holds_256_a_call_earliest_deadline_first(
    make_store: StoreFactory,
) -> None:
    """A mass failure leaves many holds to expire together. Each call frees at most 256 of
    them (the Redis scripts' LIMIT; the in-process store popped them all at once, tens of
    ms on the event loop), earliest deadline first and ties by reservation id, so both
    stores hold back exactly the same amounts meanwhile."""
    store = await make_store(hold_ttl_s=60.0)  # longer than the reserves take: none expires
    key = KeyLimits("mass", budget_micros=10**9, budget_period="total")
    # 300 deadlines 1/8 s apart (exact in binary on both stores), three holds on each: the
    # 256th hold in deadline order is the first of a tie of three.
    holds = [(T0 + step / 8, f"{tag}{step:03d}") for step in range(300) for tag in "zyx"]
    ordered = sorted(holds)  # by deadline, then id: the order they must be freed in
    amount = {rid: 1_000 + i for i, (_, rid) in enumerate(ordered)}  # which went: by sums
    random.Random(7).shuffle(holds)  # reserved in an order unrelated to their deadlines
    for at, rid in holds:
        assert (await store.reserve(key, None, amount[rid], rid, now=at)).ok
    after = T0 + 300 / 8 + 60  # every deadline passed

    def held_from(rank: int) -> int:
        return sum(amount[rid] for _, rid in ordered[rank:])

    assert ordered[255][1] == "x085" and ordered[256][1] == "y085"
    assert (await store.spent(key, now=after)).reserved == held_from(256)
    # Each call sweeps up to 256 more before it runs. The last hold is still there on the
    # second call: releasing it frees its amount.
    last = ordered[-1][1]
    await store.release(key, last, amount[last], now=after)
    assert (await store.spent(key, now=after)).reserved == held_from(768) - amount[last]
    # x085 went in the first sweep: releasing it now frees nothing twice.
    await store.release(key, "x085", amount["x085"], now=after)
    state = await store.spent(key, now=after)
    assert (state.reserved, state.remaining) == (0, 10**9)


async def test_reserving_again_extends_the_hold(make_store: StoreFactory) -> None:
    store = await make_store(hold_ttl_s=30.0)
    key = KeyLimits("extend", budget_micros=1_000, budget_period="total")
    assert (await store.reserve(key, None, 100, "long", now=T0)).ok
    assert (await store.reserve(key, None, 100, "long", now=T0 + 20)).ok
    # the first part would have expired at T0+30, but the request is still alive
    assert (await store.spent(key, now=T0 + 35)).reserved == 200
    assert (await store.spent(key, now=T0 + 50)).reserved == 0


async def test_settled_holds_leave_no_memory_behind_in_the_memory_store() -> None:
    """Each settled hold left an entry in the key's expiry heap until its deadline (11
    minutes by default): 17.6 MB after 100,000 calls, whatever was still in flight."""
    store = MemoryLimitStore()
    key = KeyLimits("busy", budget_micros=10**12, budget_period="total")
    tracemalloc.start()
    try:
        for i in range(200):  # warm up: the dicts and heaps reach their working size
            assert (await store.reserve(key, None, 100, f"w{i}", now=T0)).ok
            await store.settle(key, f"w{i}", 100, 90, now=T0)
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            assert (await store.reserve(key, None, 100, f"r{i}", now=T0 + i / 1000)).ok
            await store.settle(key, f"r{i}", 100, 90, now=T0 + i / 1000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Before: ~3.5 MB for the 20,000 dead heap entries.
    assert grown < 200_000, grown
    state = await store.spent(key, now=T0 + 21)
    assert (state.spent, state.reserved) == (90 * 20_200, 0)


async def test_spend_is_tracked_without_a_budget(store: LimitStore) -> None:
    key = KeyLimits("unbudgeted")
    result = await store.reserve(key, None, 10**12, "big", now=T0)
    assert result.ok and result.remaining_micros is None and result.resets_at is None
    await store.settle(key, "big", 10**12, 123_456_789_012_345, now=T0)
    state = await store.spent(key, now=T0)
    assert (state.spent, state.reserved, state.remaining) == (123_456_789_012_345, 0, None)


async def test_restored_spend_is_raised_never_lowered(store: LimitStore) -> None:
    # What a restart (or a Redis that lost its data) does with the ledger's figure: the
    # counter takes the larger of the two, and admission sees it at once.
    key = KeyLimits("restored", budget_micros=1_000, budget_period="daily")
    today = period_window("daily", T0)
    assert await store.restore_spent(key, today, 700, now=T0) == 700
    state = await store.spent(key, now=T0)
    assert (state.spent, state.remaining) == (700, 300)
    refused = await store.reserve(key, None, 301, "too-big", now=T0)
    assert not refused.ok and refused.remaining_micros == 300
    assert await store.restore_spent(key, today, 650, now=T0) == 700  # the ledger lags
    assert (await store.reserve(key, None, 200, "r", now=T0)).ok
    await store.settle(key, "r", 200, 250, now=T0)
    assert await store.restore_spent(key, today, 900, now=T0) == 950
    assert (await store.spent(key, now=T0)).spent == 950
    # A restore names its period: the next day's counter is untouched by today's.
    tomorrow = T0 + 86_400
    assert (await store.spent(key, now=tomorrow)).spent == 0
    with pytest.raises(ValueError):
        await store.restore_spent(key, today, -1, now=T0)


async def test_restored_lifetime_spend_survives_every_period(store: LimitStore) -> None:
    key = KeyLimits("restored-total", budget_micros=500)
    assert await store.restore_spent(key, period_window(None, T0), 500, now=T0) == 500
    later = T0 + 400 * 86_400
    assert not (await store.reserve(key, None, 1, "r", now=later)).ok


async def test_the_restored_marker(store: LimitStore) -> None:
    assert not await store.spend_restored()  # a new store knows nothing the ledger does
    await store.mark_spend_restored()
    assert await store.spend_restored()


async def test_negative_amounts_rejected(store: LimitStore) -> None:
    key = KeyLimits("neg", budget_micros=10)
    with pytest.raises(ValueError):
        await store.reserve(key, None, -1, "r", now=T0)
    with pytest.raises(ValueError):
        await store.settle(key, "r", 0, -5, now=T0)
    with pytest.raises(ValueError):
        await store.check_rate(key, -1, now=T0)


# -- rate limits -----------------------------------------------------------------------------


async def test_rpm_sliding_window(store: LimitStore) -> None:
    key = KeyLimits("rpm", rpm=3)
    remaining = []
    for i in range(3):
        result = await store.check_rate(key, 0, now=T0 + i)
        assert result.allowed
        remaining.append(result.remaining_requests)
    assert remaining == [2, 1, 0]

    rejected = await store.check_rate(key, 0, now=T0 + 3)
    assert not rejected.allowed and rejected.limit == "rpm"
    assert rejected.remaining_requests == 0
    assert rejected.retry_after_s == pytest.approx(57.0)  # the entry at T0 leaves at T0+60
    assert rejected.reset_requests_s == pytest.approx(59.0)  # the window is empty at T0+62
    headers = rejected.headers()
    assert headers["retry-after"] == "57" and headers["retry-after-ms"] == "57000"
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "59s"
    assert "x-ratelimit-limit-tokens" not in headers

    assert not (await store.check_rate(key, 0, now=T0 + 59.999)).allowed
    at_reset = await store.check_rate(key, 0, now=T0 + 60)
    assert at_reset.allowed and at_reset.remaining_requests == 0
    assert not (await store.check_rate(key, 0, now=T0 + 60.5)).allowed
    later = await store.check_rate(key, 0, now=T0 + 200)
    assert later.allowed and later.remaining_requests == 2 and later.reset_requests_s == 60.0


async def test_tpm_window_and_corrections(store: LimitStore) -> None:
    key = KeyLimits("tpm", rpm=10, tpm=1_000)
    first = await store.check_rate(key, 600, now=T0)
    assert first.allowed and first.remaining_tokens == 400 and first.remaining_requests == 9

    rejected = await store.check_rate(key, 600, now=T0 + 1)
    assert not rejected.allowed and rejected.limit == "tpm"
    assert rejected.retry_after_s == pytest.approx(59.0)
    # a rejected request is counted in neither window
    assert rejected.remaining_requests == 9 and rejected.remaining_tokens == 400

    await store.add_tokens(key, -300, now=T0 + 2)  # the call used 300, not 600
    refunded = await store.check_rate(key, 600, now=T0 + 3)
    assert refunded.allowed and refunded.remaining_tokens == 100

    await store.add_tokens(key, 200, now=T0 + 4)  # this call used more than estimated
    over = await store.check_rate(key, 1, now=T0 + 5)
    assert not over.allowed and over.remaining_tokens == 0
    # T0's 600 leaves at T0+60, leaving -300 + 600 + 200 = 500 in the window
    after = await store.check_rate(key, 500, now=T0 + 60)
    assert after.allowed and after.remaining_tokens == 0

    never = await store.check_rate(key, 1_001, now=T0 + 500)
    assert not never.allowed and never.limit == "tpm" and never.retry_after_s is None
    assert "retry-after" not in never.headers()
    assert never.headers()["x-should-retry"] == "false"  # waiting cannot help


async def test_a_correction_leaves_the_tpm_window_with_the_estimate_it_corrects(
    store: LimitStore,
) -> None:
    # A long request: admitted at T0 with an estimate of 900, finished at T0+50 having used
    # 100. The refund is booked at T0, so at T0+60 both leave together; booked at T0+50 it
    # would stay ten seconds longer and let 800 tokens in that the window never freed.
    key = KeyLimits("refund", tpm=1_000)
    assert (await store.check_rate(key, 900, now=T0)).allowed
    await store.add_tokens(key, -800, now=T0 + 50, at=T0)
    mid = await store.check_rate(key, 900, now=T0 + 51)
    assert mid.allowed and mid.remaining_tokens == 0  # 100 used + 900 estimated
    # T0's entries (900 - 800) have left; T0+51's 900 is all that counts.
    late = await store.check_rate(key, 100, now=T0 + 61)
    assert late.allowed and late.remaining_tokens == 0
    assert not (await store.check_rate(key, 1, now=T0 + 62)).allowed
    # A correction for an estimate that has left the window already is dropped.
    await store.add_tokens(key, -900, now=T0 + 200, at=T0 + 100)
    full = await store.check_rate(key, 1_000, now=T0 + 201)
    assert full.allowed and full.remaining_tokens == 0
    assert not (await store.check_rate(key, 1, now=T0 + 202)).allowed


async def test_tpm_retry_after_waits_for_an_estimate_and_its_refund_together(
    store: LimitStore,
) -> None:
    # A (T0) estimated 900 and used 100: its -800 is booked at T0. B (T0+10) holds 800. C
    # wants 500 of the 1,000: 400 must leave. A's entries leave together at T0+60 and free
    # 100 net, so C fits when B leaves, at T0+70. Counting A's estimate without its refund
    # said T0+60, and a client that waited that long was refused again.
    key = KeyLimits("refund-wait", tpm=1_000)
    assert (await store.check_rate(key, 900, now=T0)).allowed
    await store.add_tokens(key, -800, now=T0 + 1, at=T0)
    assert (await store.check_rate(key, 800, now=T0 + 10)).allowed
    refused = await store.check_rate(key, 500, now=T0 + 20)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(50.0)
    assert not (await store.check_rate(key, 500, now=T0 + 69.5)).allowed
    assert (await store.check_rate(key, 500, now=T0 + 70.001)).allowed


async def test_counted_in_both_windows_or_neither(store: LimitStore) -> None:
    key = KeyLimits("both", rpm=2, tpm=100)
    assert (await store.check_rate(key, 150, now=T0)).limit == "tpm"
    assert (await store.check_rate(key, 50, now=T0)).allowed
    assert (await store.check_rate(key, 50, now=T0)).allowed
    third = await store.check_rate(key, 0, now=T0 + 1)
    assert not third.allowed and third.limit == "rpm"
    # both limits exceeded: retry when both have room again
    both = await store.check_rate(key, 60, now=T0 + 1)
    assert both.limit == "rpm" and both.retry_after_s == pytest.approx(59.0)


async def test_no_rate_limits_means_no_headers(store: LimitStore) -> None:
    result = await store.check_rate(KeyLimits("free"), 10**9, now=T0)
    assert result.allowed and result.headers() == {}


async def test_concurrent_rate_checks_are_exact(store: LimitStore) -> None:
    key = KeyLimits("burst", rpm=25, tpm=10_000)
    results = await asyncio.gather(*(store.check_rate(key, 100, now=T0) for _ in range(80)))
    assert sum(r.allowed for r in results) == 25
    assert {r.limit for r in results if not r.allowed} == {"rpm"}


# -- parallel requests -----------------------------------------------------------------------


async def test_parallel_slots_admit_up_to_the_limit_and_free_on_release(
    store: LimitStore,
) -> None:
    key = KeyLimits("par", max_parallel=2)
    assert (await store.acquire_slot(key, "r1", now=T0)).ok
    second = await store.acquire_slot(key, "r2", now=T0)
    assert second.ok and second.in_flight == 2
    third = await store.acquire_slot(key, "r3", now=T0)
    assert not third.ok and third.in_flight == 2
    # Asking again for a slot it holds is no second slot.
    assert (await store.acquire_slot(key, "r1", now=T0)).in_flight == 2
    await store.release_slot(key, "r1")
    await store.release_slot(key, "r1")  # twice: nothing more is freed
    assert (await store.acquire_slot(key, "r3", now=T0)).ok
    assert not (await store.acquire_slot(key, "r4", now=T0)).ok
    # Another key has slots of its own; a key without a bound always gets one.
    assert (await store.acquire_slot(KeyLimits("other", max_parallel=1), "r1", now=T0)).ok
    assert (await store.acquire_slot(KeyLimits("unbounded"), "r9", now=T0)).ok


async def test_concurrent_slot_requests_are_exact(store: LimitStore) -> None:
    key = KeyLimits("crowd", max_parallel=5)
    results = await asyncio.gather(*(store.acquire_slot(key, f"r{i}", now=T0) for i in range(40)))
    assert sum(r.ok for r in results) == 5


async def test_a_slot_never_released_expires(make_store: StoreFactory) -> None:
    # A worker that died mid-request: its slot frees itself after hold_ttl_s.
    store = await make_store(hold_ttl_s=30)
    key = KeyLimits("dead", max_parallel=1)
    assert (await store.acquire_slot(key, "lost", now=T0)).ok
    assert not (await store.acquire_slot(key, "next", now=T0 + 29)).ok
    assert (await store.acquire_slot(key, "next", now=T0 + 31)).ok
