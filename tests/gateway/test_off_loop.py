"""A large request is read off the event loop (``gateway.off_loop``): its parsing,
validation and routing ran on the loop for a time in proportion to its messages — 0.4–0.7 s
for 20,000 one-line messages — holding every other request and stream on the worker. The
gateway here is the real app under uvicorn, in a thread of this process so that the thread
each step ran in can be read off its log records; the replay upstream answers."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import uvicorn
import yaml
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.off_loop import OFF_LOOP_BYTES
from gateway.settings import load_settings
from tests.gateway.conftest import Upstream
from tests.support.gateway import gateway_config

LOOP_THREAD = "gateway-loop"
MODEL = "qwen2.5-7b-instruct"


@pytest.fixture(scope="module")
def server(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("off-loop")
    cfg_path = tmp / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(gateway_config(tmp, upstream.base_url)))
    app = create_app(load_settings(str(cfg_path), env={}), registry=CollectorRegistry())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, name=LOOP_THREAD, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    else:
        pytest.fail("the gateway did not become ready")
    yield url
    srv.should_exit = True
    thread.join(30)


def _turns(n: int) -> list[Any]:
    """``n`` short turns, user first and last."""
    return [{"role": "assistant" if i % 2 else "user", "content": f"turn {i}"} for i in range(n)]


def _read_in(caplog: pytest.LogCaptureFixture) -> str:
    """The thread the chat request was validated in: the one that logged the unknown field
    the request carries (a DEBUG line of the validation itself)."""
    [record] = [r for r in caplog.records if "tolerating unknown request fields" in r.message]
    return str(record.threadName)


@pytest.mark.parametrize(("turns", "off_loop"), [(5, False), (3_001, True)])
def test_a_large_chat_request_is_read_off_the_event_loop(
    server: str, caplog: pytest.LogCaptureFixture, turns: int, off_loop: bool
) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.chat_request")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    messages = _turns(turns)
    size = len(str(messages))
    assert (size >= OFF_LOOP_BYTES) is off_loop  # the two cases are on either side
    resp = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        extra_body={"an_unknown_field": 1},
    )
    assert resp.choices[0].message.content
    thread = _read_in(caplog)
    assert (thread != LOOP_THREAD) is off_loop, thread


def test_a_large_request_refused_off_the_loop_is_the_same_400(server: str) -> None:
    """An error raised in the worker thread is answered as one raised on the loop."""
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    for turns, at in ((9, 6), (3_001, 2_000)):
        body = _turns(turns)
        body[at] = {"role": "system", "content": [image]}  # images are the user's alone
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=body)
        assert caught.value.status_code == 400
        assert caught.value.param == f"messages[{at}].content[0].type", caught.value.body


def test_large_responses_and_messages_requests_are_answered(server: str) -> None:
    """The Responses and Messages APIs' translations run in the worker thread for a large
    body, and the chat request they became is read there too."""
    items = _turns(3_001)
    oai = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    r = oai.responses.create(model=MODEL, input=items)
    assert r.status == "completed" and r.output_text
    claude = anthropic.Anthropic(base_url=server, api_key="unused", max_retries=0)
    m = claude.messages.create(model=MODEL, max_tokens=64, messages=items)
    assert m.content and m.usage.input_tokens > 3_000
    count = claude.messages.count_tokens(model=MODEL, messages=items)
    assert count.input_tokens > 3_000
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=MODEL,
            max_tokens=64,
            messages=[*items[:-1], {"role": "user", "content": []}],
        )
    assert "messages" in str(caught.value.body)


def test_the_openapi_document_is_built_off_the_event_loop(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Building the document takes ~200 ms of schema generation, once per worker: it ran
    on the loop, in the first ``GET /openapi.json``."""
    caplog.set_level(logging.DEBUG, logger="gateway.openapi")
    first = httpx.get(f"{server}/openapi.json", timeout=30)
    again = httpx.get(f"{server}/openapi.json", timeout=30)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() and "/v1/chat/completions" in first.json()["paths"]
    [built] = [r for r in caplog.records if "built the OpenAPI document" in r.message]
    assert built.threadName != LOOP_THREAD
