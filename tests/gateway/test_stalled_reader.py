"""A client that stops reading a stream without closing its connection (a frozen client, a
raw socket that never calls recv) while the upstream sends a long answer fast: once the
socket buffers are full every write waits, and before the fix the stream waited with it for
ever — past ``server.request_timeout_s``, holding its upstream call, with no ledger row.
Now a write still waiting at the request's deadline ends the stream: the connection is
closed and the request booked as a 499 ``client_stalled``, with the call and what it read."""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import apis
from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.replay import start_replay_upstream, stop_replay_upstream

MODEL = "llama-3.2-3b-instruct"
PROMPT = "Say one word, many times."
TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose requests time out after TIMEOUT_S, in front of an upstream that
    streams an answer far larger than any socket buffer as fast as it can."""
    tmp = tmp_path_factory.mktemp("stalled")
    answer = "word " * 400_000
    record = {"id": "long", "prompt": PROMPT,
              "outcomes": {MODEL: {"score": 1.0, "cost_usd": 0.05, "prompt_tokens": 10,
                                   "completion_tokens": 400_000, "response": answer}}}  # fmt: skip
    table = tmp / "table.jsonl"
    table.write_text(json.dumps(record) + "\n")
    proc, base_url = start_replay_upstream(tmp, "--table", str(table))
    cfg = gateway_config(tmp, base_url, server={"request_timeout_s": TIMEOUT_S})
    # A Messages request's max_tokens is capped at the model's output limit: one that
    # lets the answer outgrow the socket buffers.
    cfg["pool"] = [{**m, "max_output_tokens": 10**6} for m in cfg["pool"] if m["name"] == MODEL]
    cfg["router"] = {**cfg["router"], "default_policy": f"fixed:{MODEL}"}
    gw = start_gateway(tmp, cfg)
    yield gw
    gw.stop()
    stop_replay_upstream(proc)


def body_for(path: str, user: str) -> dict[str, Any]:
    return apis.body_for(path, MODEL, PROMPT, user, max_tokens=10**6)


def stalled_client(gw: Gateway, path: str, user: str) -> socket.socket:
    """Sends the request, then never reads (a small receive buffer fills at once)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])))
    payload = json.dumps(body_for(path, user)).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n").encode()  # fmt: skip
    s.sendall(head + payload)
    return s


def row_for(gw: Gateway, user: str, wait_s: float) -> tuple[Any, ...] | None:
    return apis.ledger_row(
        gw,
        "SELECT r.status, r.error_type, c.error_type, c.completion_tokens, c.cost_micros "
        "FROM requests r JOIN calls c ON c.request_id = r.request_id WHERE r.end_user = ?",
        user,
        wait_s,
    )


def drained(s: socket.socket, wait_s: float) -> bool:
    """Whether the server closed the connection: everything it sent read, then EOF."""
    s.settimeout(wait_s)
    try:
        while s.recv(1 << 20):
            pass
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("path", apis.MODEL_APIS)
def test_a_client_that_stops_reading_is_cut_at_the_request_timeout_and_booked(
    gateway: Gateway, path: str
) -> None:
    user = f"stalled-{secrets.token_hex(4)}"
    sock = stalled_client(gateway, path, user)
    try:
        # Booked once the deadline has passed (before the fix: never, while the socket
        # stayed open). Generous: the deadline is TIMEOUT_S after the request started.
        row = row_for(gateway, user, wait_s=TIMEOUT_S + 15)
        assert row is not None, "a stalled reader's request was never booked"
        status, error_type, call_error, completion_tokens, cost_micros = row
        assert (status, error_type) == (499, "client_stalled"), row
        # The call, closed early, is booked for what was read of it (as a call cut by a
        # client's hang-up mid-stream is: not finished, its usage estimated).
        assert call_error == "connection"
        assert completion_tokens > 0 and cost_micros > 0
        # And the connection was closed, not left open with nothing more to come.
        assert drained(sock, wait_s=10)
    finally:
        sock.close()


def test_a_reader_that_keeps_up_is_answered_whole(gateway: Gateway) -> None:
    # A short answer read as it comes: the deadline's timer leaves writes that do not wait
    # alone, and the stream ends with its usage chunk and [DONE], booked 200.
    user = f"reader-{secrets.token_hex(4)}"
    body = {**body_for("/v1/chat/completions", user), "messages": [
        {"role": "user", "content": "Name three primary colours."}]}  # fmt: skip
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    row = row_for(gateway, user, wait_s=10)
    assert row is not None and row[:2] == (200, None)
