"""Which W3C Trace Context values are forwarded upstream, by the spec's parsing rules."""

from __future__ import annotations

import asyncio

from router.providers.trace_context import MAX_TRACESTATE, bind, forwarded_headers, parse, unbind

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_traceparent_and_its_tracestate_are_kept_as_sent() -> None:
    assert parse(VALID, None) == {"traceparent": VALID}
    assert parse(f" {VALID} ", "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7") == {
        "traceparent": VALID,
        "tracestate": "congo=t61rcWkgMzE, rojo=00f067aa0ba902b7",
    }
    # A later version may carry more fields: the first four are checked, the rest kept.
    future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds"
    assert parse(future, None) == {"traceparent": future}


def test_malformed_traceparents_are_dropped_with_their_tracestate() -> None:
    for bad in (
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero parent id
        f"{VALID}-extra",  # version 00 has exactly four fields
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx-evil: 1",
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-\x00",  # control character
    ):
        assert parse(bad, "congo=t61rcWkgMzE") is None, bad
    assert parse(None, "congo=t61rcWkgMzE") is None


def test_an_oversized_or_unprintable_tracestate_is_dropped_alone() -> None:
    assert parse(VALID, "a=" + "x" * MAX_TRACESTATE) == {"traceparent": VALID}
    assert parse(VALID, "a=b\nc=d") == {"traceparent": VALID}
    assert parse(VALID, "  ") == {"traceparent": VALID}


async def test_the_context_is_the_request_s_and_its_tasks_only() -> None:
    assert forwarded_headers() is None
    token = bind({"traceparent": VALID})
    try:
        # A task the request starts (a cascade's parallel calls) inherits it.
        assert await asyncio.create_task(_seen()) == {"traceparent": VALID}
    finally:
        unbind(token)
    assert forwarded_headers() is None


async def _seen() -> dict[str, str] | None:
    headers = forwarded_headers()
    return None if headers is None else dict(headers)
