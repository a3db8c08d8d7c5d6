"""A gateway whose ledger database is down *and* whose disk takes no more writes (a full
or read-only volume) still answers, but holds the rows in memory, where a kill -9 would
lose them: /readyz says so until the journal or the database takes them. The database is
the session's PostgreSQL behind a loopback proxy the test cuts; the disk is the gateway
process's own file-size limit (RLIMIT_FSIZE 0: every write that grows a file fails with
EFBIG, as on a full disk; Python ignores SIGXFSZ), set and lifted from outside."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.conftest import Upstream
from tests.support.gateway import gateway_config, start_gateway
from tests.support.tcp_proxy import ThreadedTcpProxy

from .conftest import run_in_thread
from .factories import pg_url

pytestmark = pytest.mark.postgres

MODEL = "gemma-2-9b-it"


def until(check: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_rows_held_in_memory_make_the_gateway_not_ready(
    upstream: Upstream, proxied_pg: tuple[ThreadedTcpProxy, str], pg_database: str, tmp_path: Path
) -> None:
    proxy, url = proxied_pg
    cfg = gateway_config(tmp_path, upstream.base_url, ledger={"url": url})
    gw = start_gateway(tmp_path, cfg)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    try:
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)

        def ask() -> str:
            messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
            return client.chat.completions.create(model=MODEL, messages=messages).id

        def ready() -> tuple[int, dict[str, bool]]:
            r = httpx.get(f"{gw.url}/readyz")
            return r.status_code, r.json()["checks"]

        ids = [ask()]
        assert ready()[0] == 200
        proxy.cut()
        resource.prlimit(gw.proc.pid, resource.RLIMIT_FSIZE, (0, hard))
        ids += [ask() for _ in range(3)]  # answered all the same
        assert until(lambda: ready()[0] == 503)
        assert ready()[1]["ledger"] is False and ready()[1]["runtime"] is True
        # The disk takes writes again (the database is still down): the rows are spilled
        # to the journal, and the gateway is ready again.
        resource.prlimit(gw.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
        assert until(lambda: ready()[0] == 200)
        assert any((tmp_path / "spill").glob("*.jsonl"))
        proxy.restore()
        ids.append(ask())

        async def count() -> int:
            conn = await asyncpg.connect(pg_url(pg_database).replace("+asyncpg", ""))
            try:
                return int(await conn.fetchval("SELECT count(*) FROM requests"))
            finally:
                await conn.close()

        # The database is back: the journal is replayed into it, every answered request's
        # row with it.
        assert until(lambda: run_in_thread(count) == len(ids) == 5, timeout_s=60)
    finally:
        if gw.proc.poll() is None:
            resource.prlimit(gw.proc.pid, resource.RLIMIT_FSIZE, (hard, hard))
        gw.stop()
