"""The lean RESP client: wire format, pipelining and write-behind order against the real
Redis, and failure handling against loopback servers that misbehave on purpose."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis.asyncio as aredis

from gateway.limits.resp import (
    _INCOMPLETE,
    RespClient,
    RespConnectionError,
    RespError,
    Script,
    _Endpoint,
    pack,
    parse,
)
from tests.support.services import REDIS_URL, need_redis

# -- wire format -------------------------------------------------------------------------------


def test_pack_is_an_array_of_bulk_strings() -> None:
    assert (
        pack(("SET", "k", 12, b"\x00v"))
        == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n$2\r\n\x00v\r\n"
    )


REPLY = b"*5\r\n:42\r\n$5\r\nhello\r\n$-1\r\n-ERR inner\r\n*2\r\n+OK\r\n$0\r\n\r\n"


def test_parse_every_reply_type() -> None:
    value, end = parse(REPLY, 0)
    assert end == len(REPLY)
    assert value[:3] == [42, b"hello", None]
    assert isinstance(value[3], RespError) and str(value[3]) == "ERR inner"
    assert value[4] == ["OK", b""]


def test_parse_reports_incomplete_at_every_split() -> None:
    # Replies arrive in arbitrary TCP chunks: every proper prefix must parse as incomplete.
    for cut in range(len(REPLY)):
        value, end = parse(REPLY[:cut], 0)
        assert (value, end) == (_INCOMPLETE, 0)


def test_url_parsing() -> None:
    ep = _Endpoint.from_url("redis://user:p%40ss@cache.internal:6380/3")
    assert (ep.host, ep.port, ep.db, ep.username, ep.password, ep.tls) == (
        "cache.internal",
        6380,
        3,
        "user",
        "p@ss",
        False,
    )
    assert _Endpoint.from_url("rediss://:secret@h").tls
    assert _Endpoint.from_url("rediss://:secret@h").password == "secret"
    unix = _Endpoint.from_url("unix:///run/redis.sock?db=2")
    assert (unix.path, unix.db, unix.host) == ("/run/redis.sock", 2, None)
    with pytest.raises(ValueError, match="scheme"):
        _Endpoint.from_url("http://localhost:6379")
    with pytest.raises(ValueError, match="integer"):
        _Endpoint.from_url("redis://localhost/notadb")


# -- against the real Redis ----------------------------------------------------------------------


@pytest.fixture
async def client() -> AsyncIterator[RespClient]:
    need_redis()
    c = RespClient(REDIS_URL)
    yield c
    await c.aclose()


@pytest.fixture
def key() -> str:
    return f"xrtest-resp:{uuid.uuid4().hex}"


@pytest.mark.redis
async def test_commands_pipelined_in_one_tick_keep_their_order(
    client: RespClient, key: str
) -> None:
    try:
        replies = await asyncio.gather(*(client.execute("INCR", key) for _ in range(200)))
        assert replies == list(range(1, 201))  # each caller got its own reply, in order
        assert await client.execute("GET", key) == b"200"
        with pytest.raises(RespError, match="WRONGTYPE"):
            await client.execute("LPUSH", key, "x")
        assert await client.execute("PING") == "PONG"  # an error reply doesn't desync the FIFO
    finally:
        await client.execute("DEL", key)


@pytest.mark.redis
async def test_deferred_commands_run_before_later_ones_and_flush_when_idle(
    client: RespClient, key: str
) -> None:
    try:
        await client.send_deferred("SET", key, "1")
        await client.send_deferred("INCRBY", key, "41")
        # A later command on the same connection sees both, without awaiting them.
        assert await client.execute("GET", key) == b"42"
        await client.send_deferred("INCR", key)
        # Nobody else sends anything: the idle timer flushes it within defer_s.
        other = aredis.Redis.from_url(REDIS_URL)
        try:
            for _ in range(100):
                if await other.get(key) == b"43":
                    break
                await asyncio.sleep(0.005)
            assert await other.get(key) == b"43"
        finally:
            await other.aclose()
    finally:
        await client.execute("DEL", key)


@pytest.mark.redis
async def test_deferred_failure_is_reported_not_raised(client: RespClient, key: str) -> None:
    errors: list[Exception] = []
    client.on_deferred_error = errors.append
    try:
        await client.execute("SET", key, "text")
        await client.send_deferred("INCR", key)  # ERR value is not an integer
        assert await client.execute("GET", key) == b"text"
        assert len(errors) == 1 and isinstance(errors[0], RespError)
    finally:
        await client.execute("DEL", key)


@pytest.mark.redis
async def test_deferred_script_survives_a_script_cache_flush(client: RespClient, key: str) -> None:
    script = Script(client, "return redis.call('INCRBY', KEYS[1], ARGV[1])")
    try:
        assert await script([key], ["1"]) == 1
        await client.execute("SCRIPT", "FLUSH")  # as after a Redis restart
        await script.send_deferred([key], ["10"])  # NOSCRIPT: reloaded and sent again
        await client.aclose()  # waits for write-behind work, retries included
        again = RespClient(REDIS_URL)
        try:
            assert await again.execute("GET", key) == b"11"
        finally:
            await again.execute("DEL", key)
            await again.aclose()
    finally:
        await client.aclose()


# -- failures --------------------------------------------------------------------------------


async def _server(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"redis://127.0.0.1:{port}/0"


async def test_a_reply_that_never_comes_fails_fast_and_the_next_command_reconnects() -> None:
    connections = 0

    async def silent_then_pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        first = connections == 1
        while data := await reader.read(4096):
            if not first:
                writer.write(b"+PONG\r\n" * data.count(b"PING"))
        writer.close()

    server, url = await _server(silent_then_pong)
    client = RespClient(url, timeout_s=0.2)
    try:
        started = asyncio.get_running_loop().time()
        with pytest.raises(RespConnectionError, match="timed out"):
            await asyncio.gather(client.execute("PING"), client.execute("PING"))
        assert asyncio.get_running_loop().time() - started < 1.0
        assert await client.execute("PING") == "PONG"
        assert connections == 2
    finally:
        await client.aclose()
        server.close()


async def test_connection_closed_mid_command_fails_outstanding_commands() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)
        writer.close()

    server, url = await _server(hang_up)
    client = RespClient(url)
    try:
        with pytest.raises(RespConnectionError, match="lost"):
            await client.execute("PING")
    finally:
        await client.aclose()
        server.close()


async def test_refused_auth_is_a_connection_error() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4096)
        writer.write(b"-WRONGPASS invalid username-password pair\r\n")
        await writer.drain()
        await reader.read(4096)
        writer.close()

    server, url = await _server(refuse)
    client = RespClient(url.replace("redis://", "redis://:wrong@"))
    try:
        with pytest.raises(RespConnectionError, match="AUTH"):
            await client.execute("PING")
    finally:
        await client.aclose()
        server.close()


async def test_unreachable_server_is_a_connection_error(closed_port: int) -> None:
    client = RespClient(f"redis://127.0.0.1:{closed_port}/0", connect_timeout_s=0.5)
    with pytest.raises(RespConnectionError, match="cannot connect"):
        await client.execute("PING")
    with pytest.raises(RespConnectionError):
        await client.send_deferred("PING")
    await client.aclose()
