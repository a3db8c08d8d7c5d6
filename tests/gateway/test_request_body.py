"""Request bodies: the size limit and content codings (``gateway.request_body``), read by the
function the routes use and end to end through a running gateway."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import socket
import time
import zlib
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from gateway.errors import APIError
from gateway.request_body import inflate_body, read_body
from router.outcomes import OutcomeRecord
from tests.gateway.conftest import Upstream, ledger_rows
from tests.support.gateway import Gateway, gateway_config, start_gateway

MODEL = "mistral-small-24b-instruct-2501-bf16"
LIMIT = 65536  # the module gateway's server.max_body_bytes

DOC = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi " * 500}]}).encode()


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


# -- decoding ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("coding", "encode"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),  # RFC 9110's deflate: the zlib format
        ("deflate", raw_deflate),  # what some clients send as deflate
    ],
)
def test_codings_decode(coding: str, encode: Callable[[bytes], bytes]) -> None:
    assert inflate_body(encode(DOC), coding, LIMIT) == DOC


def test_gzip_members_back_to_back_decode_as_one_body() -> None:
    half = len(DOC) // 2
    assert inflate_body(gzip.compress(DOC[:half]) + gzip.compress(DOC[half:]), "gzip", LIMIT) == DOC


def test_the_limit_holds_for_the_decoded_body() -> None:
    bomb = gzip.compress(b"0" * 10_000_000)  # 10 MB of zeros in about 10 KB
    assert len(bomb) < LIMIT
    with pytest.raises(APIError) as ei:
        inflate_body(bomb, "gzip", LIMIT)
    assert (ei.value.status, ei.value.code) == (413, "request_too_large")
    # Exactly at the limit is taken; a second member past it is not.
    assert inflate_body(gzip.compress(b"x" * LIMIT), "gzip", LIMIT) == b"x" * LIMIT
    with pytest.raises(APIError) as ei:
        inflate_body(gzip.compress(b"x" * LIMIT) + gzip.compress(b"y"), "gzip", LIMIT)
    assert ei.value.status == 413


@pytest.mark.parametrize(
    ("coding", "body"),
    [
        ("gzip", gzip.compress(DOC)[:-9]),  # truncated
        ("gzip", DOC),  # not compressed at all
        ("gzip", gzip.compress(DOC) + b"junk"),
        ("deflate", zlib.compress(DOC) + b"junk"),
        ("deflate", b"\x00\x01\x02"),
    ],
)
def test_corrupt_bodies_are_400(coding: str, body: bytes) -> None:
    with pytest.raises(APIError) as ei:
        inflate_body(body, coding, LIMIT)
    assert (ei.value.status, ei.value.code, ei.value.param) == (
        400,
        "invalid_content_encoding",
        "content-encoding",
    )


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(
    pieces=st.lists(st.binary(max_size=3000), min_size=1, max_size=4),
    coding=st.sampled_from(["gzip", "deflate"]),
    limit=st.integers(min_value=0, max_value=6000),
)
def test_any_body_decodes_to_itself_or_is_over_the_limit(
    pieces: list[bytes], coding: str, limit: int
) -> None:
    """Whatever the bytes (gzip: one member per piece), a body comes back as sent when it
    fits the limit, and is a 413 when it does not; never anything else."""
    body = b"".join(pieces)
    if coding == "gzip":
        packed = b"".join(gzip.compress(p) for p in pieces)
    else:
        packed = zlib.compress(body)
    if len(body) <= limit:
        assert inflate_body(packed, coding, limit) == body
    else:
        with pytest.raises(APIError) as ei:
            inflate_body(packed, coding, limit)
        assert ei.value.status == 413


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(junk=st.binary(max_size=200), coding=st.sampled_from(["gzip", "deflate"]))
def test_arbitrary_bytes_are_a_clean_4xx(junk: bytes, coding: str) -> None:
    """Bytes that are not compressed data are an APIError (400, or 413 for the rare ones
    that inflate past the limit), never zlib's own exception."""
    try:
        inflate_body(junk, coding, 1000)
    except APIError as exc:
        assert exc.status in (400, 413)


# -- reading: the function the routes call, on a Starlette request ----------------------


def request(body: bytes, headers: dict[str, str], chunk: int = 4096) -> Request:
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    return Request(scope, receive)


def run(coro: Coroutine[Any, Any, bytes]) -> bytes:
    return asyncio.run(coro)


@pytest.mark.parametrize("size", [1_000, 400_000])  # decoded inline, and in a worker thread
def test_read_body_decodes_small_and_large_bodies(size: int) -> None:
    body = random.Random(0).randbytes(size)  # does not compress: a large compressed body
    packed = gzip.compress(body)
    got = run(read_body(request(packed, {"content-encoding": "gzip"}), 10 * size))
    assert got == body


def test_read_body_takes_identity_and_refuses_other_codings() -> None:
    assert run(read_body(request(DOC, {"content-encoding": "identity"}), LIMIT)) == DOC
    assert run(read_body(request(DOC, {}), LIMIT)) == DOC
    for coding in ("br", "zstd", "gzip, gzip", "compress"):
        with pytest.raises(APIError) as ei:
            run(read_body(request(DOC, {"content-encoding": coding}), LIMIT))
        err = ei.value
        assert (err.status, err.code) == (415, "unsupported_content_encoding")
        assert err.headers["accept-encoding"] == "gzip, deflate"


def test_read_body_refuses_an_announced_length_past_the_limit_before_reading() -> None:
    req = request(b"", {"content-length": str(LIMIT + 1)})
    with pytest.raises(APIError) as ei:
        run(read_body(req, LIMIT))
    assert ei.value.status == 413


# -- end to end ------------------------------------------------------------------------------


def test_gzip_chat_request_is_answered_and_logged(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    record = next(r for r in demo_table if MODEL in r.outcomes and r.prompt)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": record.prompt}]})
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=gzip.compress(body.encode()),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == record.outcomes[MODEL].response
    (status, _, cost), calls = ledger_rows(gateway, r.json()["xrouter"]["request_id"])
    assert status == 200 and cost > 0 and calls[0][0] == MODEL


def test_gzip_bomb_is_413_and_unknown_coding_415(gateway: Gateway) -> None:
    bomb = gzip.compress(b" " * 20_000_000)
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=bomb,
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=DOC,
        headers={"content-type": "application/json", "content-encoding": "br"},
    )
    assert r.status_code == 415 and r.headers["accept-encoding"] == "gzip, deflate"
    err = r.json()["error"]
    assert (err["type"], err["code"], err["param"]) == (
        "invalid_request_error",
        "unsupported_content_encoding",
        "content-encoding",
    )
    assert r.headers["x-request-id"]


def test_messages_api_refuses_an_unknown_coding_in_anthropics_shape(gateway: Gateway) -> None:
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(
        f"{gateway.base_url}/messages",
        content=json.dumps(body).encode(),
        headers={"content-type": "application/json", "content-encoding": "zstd"},
    )
    assert r.status_code == 415
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["code"] == "unsupported_content_encoding"
    r = httpx.post(
        f"{gateway.base_url}/messages",
        content=gzip.compress(json.dumps(body).encode()),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message"


@pytest.fixture(scope="module")
def impatient(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway that waits 1 s for a body, with one place for a model request."""
    tmp = tmp_path_factory.mktemp("impatient")
    server = {"body_timeout_s": 1.0, "max_in_flight": 1}
    gw = start_gateway(tmp, gateway_config(tmp, upstream.base_url, server=server))
    yield gw
    gw.stop()


def _trickle_head(port: int, length: int) -> socket.socket:
    """A connection that sent a chat request's head and the first byte of its body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: " + str(length).encode() + b"\r\n\r\n{"
    )
    return sock


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_frees_its_place(
    impatient: Gateway,
) -> None:
    # A client trickling its body would hold the worker's only max_in_flight place for as
    # long as it liked, and every other model request would be shed.
    port = int(impatient.base_url.rsplit(":", 1)[1].split("/")[0])
    with _trickle_head(port, 400) as sock:
        # The answer may come in several segments (head, then body); the connection is
        # closed after it, so read to the end.
        chunks = []
        while chunk := sock.recv(65536):  # blocks until the gateway answers
            chunks.append(chunk)
        answer = b"".join(chunks).decode()
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 408") and "connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"
    r = httpx.post(
        f"{impatient.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def test_a_client_that_leaves_during_its_body_is_no_error(impatient: Gateway) -> None:
    port = int(impatient.base_url.rsplit(":", 1)[1].split("/")[0])
    for _ in range(3):
        _trickle_head(port, 400).close()
    time.sleep(0.5)
    assert "unhandled error" not in impatient.log() and "Traceback" not in impatient.log()
    r = httpx.post(
        f"{impatient.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
