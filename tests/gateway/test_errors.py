"""The last line of defence: an exception nobody expected still gets the OpenAI-shaped 500,
is logged once, and leaves the client's keep-alive connection open (a real uvicorn server on
loopback, driven by httpx)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from gateway.errors import install_error_handlers


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"ok": True}

    # Two real SQLAlchemy failures: a query the code built wrong (a bug, whatever state
    # the database is in) and a database that is not there (an outage).
    @app.get("/bad-query")
    async def bad_query() -> None:
        # The subquery correlates both tables away: "returned no FROM clauses".
        t, u = sa.table("t", sa.column("x")), sa.table("u", sa.column("y"))
        inner = sa.select(u.c.y).where(u.c.y == t.c.x).exists()
        with sa.create_engine("sqlite://").connect() as conn:
            conn.execute(sa.select(t.c.x).select_from(t.join(u, u.c.y == t.c.x)).where(inner))

    @app.get("/db-down")
    async def db_down() -> None:
        engine = sa.create_engine("sqlite:////nonexistent-dir/ledger.db")
        with engine.connect():
            pass

    @app.get("/stream-boom")
    async def stream_boom() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b"data: 1\n\n"
            raise RuntimeError("a bug mid-stream")

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(_app(), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


def _local_port(r: httpx.Response) -> int:
    stream = r.extensions["network_stream"]
    return int(stream.get_extra_info("socket").getsockname()[1])


def test_unexpected_error_is_one_500_and_keeps_the_connection(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    with httpx.Client(base_url=server, timeout=10) as c:
        r = c.get("/boom")
        assert r.status_code == 500
        assert r.json() == {
            "error": {
                "message": "internal error",
                "type": "server_error",
                "param": None,
                "code": "internal_error",
            }
        }
        port = _local_port(r)
        again = c.get("/ok")
        assert again.status_code == 200 and _local_port(again) == port  # same connection
    tracebacks = [rec for rec in caplog.records if rec.exc_info]
    assert len(tracebacks) == 1 and "a bug" in str(tracebacks[0].exc_info[1])  # type: ignore[index]


def test_an_error_after_the_response_started_still_ends_it(server: str) -> None:
    # Nothing can be answered once the status line is out: the stream is cut, the server
    # goes on serving.
    with httpx.Client(base_url=server, timeout=10) as c:
        with pytest.raises(httpx.HTTPError), c.stream("GET", "/stream-boom") as r:
            assert r.status_code == 200
            r.read()
        assert c.get("/ok").status_code == 200


def test_a_query_built_wrong_is_a_500_not_an_outage(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A database that does not answer is a 503 the client may retry; a statement the
    # gateway built wrong fails on every retry and must show up as the bug it is.
    caplog.set_level(logging.WARNING)
    with httpx.Client(base_url=server, timeout=10) as c:
        bug = c.get("/bad-query")
        assert bug.status_code == 500, bug.text
        assert bug.json()["error"]["code"] == "internal_error"
        down = c.get("/db-down")
        assert down.status_code == 503, down.text
        assert down.json()["error"]["code"] == "database_unavailable"
    # The gateway's own log (asyncio's reports of other tests' clients collected here, such
    # as an httpx client closed after its loop, are not this test's).
    tracebacks = [rec for rec in caplog.records if rec.exc_info and rec.name.startswith("gateway")]
    assert len(tracebacks) == 1
    assert isinstance(tracebacks[0].exc_info[1], sa.exc.InvalidRequestError)  # type: ignore[index]
