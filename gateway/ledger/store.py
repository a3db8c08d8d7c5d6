"""Opening the ledger database: one ``AsyncEngine`` for SQLite (embedded default) or
PostgreSQL (``postgresql+asyncpg``), running the same queries.

SQLite is tuned for a single-file, multi-process ledger: WAL (readers never block the
writer), ``synchronous=NORMAL`` (a commit survives a process crash, which is what the
durability contract needs; only an OS crash may lose the last commits) and a busy timeout so
several workers share the file instead of failing with "database is locked".
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from gateway.ledger.migrations import SQLITE_BEGIN_OPTION, migrate
from gateway.ledger.private_files import precreate_private
from gateway.ledger.records import dumps_str

logger = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 5000
# asyncpg's own default is 60 s: a key lookup that opens a connection to a database that
# does not answer would hold its request that long.
POSTGRES_CONNECT_TIMEOUT_S = 10.0


def sqlite_file(url: URL) -> Path | None:
    """The database file of a SQLite URL, None for in-memory databases."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        return None
    return Path(database)


def _uri_mode(url: URL) -> bool:
    """The URL's database is a SQLite URI (``?uri=true``: ``file:ledger.db?mode=ro``), not a
    file name."""
    text = _query_text(url.query.get("uri"))
    return text is not None and text.lower() in _TRUE


# How a URL's query writes a flag that is on or off.
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _query_text(value: str | tuple[str, ...] | None) -> str | None:
    """A URL query parameter's value: the last one, when it is given several times."""
    return value[-1] if isinstance(value, tuple) else value


def _enable_wal(cursor: Any) -> None:
    """Switch the database to WAL once. WAL is persistent, so a database that has it needs no
    lock here; the switch itself needs an exclusive lock for which SQLite does not always
    call the busy handler, so workers starting together retry it briefly. This runs once per
    new connection (on the driver's thread), never on the request path."""
    cursor.execute("PRAGMA journal_mode")
    row = cursor.fetchone()
    if row and str(row[0]).lower() == "wal":
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _install_sqlite_events(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the sqlite3 module: left alone it runs DDL
        # outside any transaction and never emits BEGIN IMMEDIATE.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # busy_timeout first: switching to WAL takes a lock too, and without a timeout
            # a worker starting next to another fails at once with "database is locked".
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            _enable_wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Write transactions ask for IMMEDIATE: taking the write lock at BEGIN lets the busy
        # timeout do its job; upgrading a read snapshot later fails at once under contention.
        mode = conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "DEFERRED")
        if mode not in ("DEFERRED", "IMMEDIATE", "EXCLUSIVE"):
            raise ValueError(f"bad {SQLITE_BEGIN_OPTION}: {mode!r}")
        conn.exec_driver_sql(f"BEGIN {mode}")


# The drivers the ledger runs on, for a URL that names only its database: `postgresql://`
# is how LiteLLM's DATABASE_URL and most tools write one, and SQLAlchemy would load a sync
# driver for it (one that is not installed: an ImportError, or a refusal by its asyncio
# extension) instead of the async one installed with the gateway.
_ASYNC_DRIVERS = {"postgresql": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}


def ledger_url(url: str | URL) -> URL:
    """``url`` parsed, with the ledger's async driver when it names none. A port that is
    not a number, or not one a socket takes, is a ValueError saying so (not the driver's
    OverflowError, a traceback, at the first connection); never with the URL, which may
    hold a password."""
    try:
        u = make_url(url)
    except ValueError:  # SQLAlchemy's int() of the port
        raise ValueError("the ledger URL's port is not a number") from None
    if u.port is not None and not 0 < u.port < 65536:
        raise ValueError(f"the ledger URL's port {u.port} is not a port (1 to 65535)")
    driver = _ASYNC_DRIVERS.get(u.drivername)
    return u.set(drivername=driver) if driver is not None else u


def create_ledger_engine(url: str | URL, **engine_kwargs: Any) -> AsyncEngine:
    """Build the engine without touching the database (no directories, no migrations).

    ``open_ledger_engine`` is what the app calls; this one exists for tools and tests that
    need an engine for a database that is not reachable yet.
    """
    u = ledger_url(url)
    kwargs: dict[str, Any] = {
        # Bound values are prompts, answers and key hashes: keep them out of error messages.
        "hide_parameters": True,
        "json_serializer": dumps_str,
        "json_deserializer": orjson.loads,
    }
    if u.get_backend_name() == "postgresql":
        # A connection that died with the server is detected before use, not on the insert.
        kwargs["pool_pre_ping"] = True
        # The URL's own ?timeout= wins; SQLAlchemy would pass it on as a string, which
        # asyncpg cannot add to a clock.
        timeout = _connect_timeout(u.query.get("timeout"))
        u = u.difference_update_query(["timeout"])
        settings = _postgres_settings(u)
        u = u.difference_update_query(list(settings))
        kwargs["connect_args"] = {
            "async_creator_fn": _asyncpg_connect,
            "timeout": timeout,
            **settings,
        }
    kwargs.update(engine_kwargs)
    engine = create_async_engine(u, **kwargs)
    if u.get_backend_name() == "sqlite":
        _install_sqlite_events(engine)
    return engine


# What a URL's query may set (SQLAlchemy passes each of its parameters to asyncpg.connect
# as a keyword), and how its text is read: as given, or as the number or flag asyncpg wants.
def _flag(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(text)


def _seconds(text: str) -> float:
    seconds = float(text)
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(text)
    return seconds


_URL_SETTINGS: dict[str, Callable[[str], Any]] = {
    **dict.fromkeys(
        (
            "ssl",
            "passfile",
            "service",
            "servicefile",
            "target_session_attrs",
            "krbsrvname",
            "gsslib",
        ),
        str,
    ),
    **dict.fromkeys(
        (
            "statement_cache_size",
            "max_cached_statement_lifetime",
            "max_cacheable_statement_size",
            "prepared_statement_cache_size",
        ),  # the last is SQLAlchemy's own
        int,
    ),
    "command_timeout": _seconds,
    "direct_tls": _flag,
}


def _postgres_settings(u: URL) -> dict[str, Any]:
    """The URL's query parameters as asyncpg's keywords, read as it wants them; a ValueError
    naming any it does not take, or whose value it cannot use. Passed on as they were, each
    was a TypeError from inside the first connection (``?sslmode=require``, libpq's
    spelling, is common; ``?statement_cache_size=0`` was the text "0"), a traceback where
    ``serve`` and ``export`` say ``cannot start:``."""
    unknown = sorted(set(u.query) - set(_URL_SETTINGS))
    if unknown:
        hint = " (libpq's sslmode is asyncpg's ssl: ?ssl=require)" if "sslmode" in unknown else ""
        raise ValueError(
            f"the ledger URL's query sets {', '.join(unknown)}, which asyncpg does not take"
            f"{hint}; it takes timeout, {', '.join(sorted(_URL_SETTINGS))}"
        )
    out: dict[str, Any] = {}
    for name, value in u.query.items():
        text = value[-1] if isinstance(value, tuple) else value
        try:
            out[name] = _URL_SETTINGS[name](text)
        except ValueError:
            raise ValueError(f"the ledger URL's {name} cannot be {text!r}") from None
    return out


def _connect_timeout(value: str | tuple[str, ...] | None) -> float:
    text = _query_text(value)
    if text is None:
        return POSTGRES_CONNECT_TIMEOUT_S
    try:
        return _seconds(text)
    except ValueError:
        raise ValueError(
            f"the ledger URL's timeout must be a positive number of seconds, got {text!r}"
        ) from None


async def _asyncpg_connect(*args: Any, **kwargs: Any) -> Any:
    """``asyncpg.connect``, with a server it cannot reach raised as asyncpg's connection
    error. asyncpg lets the socket's OSError through (refused, unreachable, timed out) and
    SQLAlchemy wraps only the driver's errors, so a database that is down surfaced as a
    bare ConnectionRefusedError — a 500 where every other outage is a DBAPIError the
    gateway answers as one (a key taken as last read, a 503 ``database_unavailable``)."""
    import asyncpg

    try:
        return await asyncpg.connect(*args, **kwargs)
    except OSError as exc:  # TimeoutError, ConnectionRefusedError, socket.gaierror
        raise asyncpg.exceptions.ConnectionFailureError(
            f"cannot reach the database: {type(exc).__name__}: {exc}"
        ) from exc


async def open_ledger_engine(url: str | URL, *, run_migrations: bool = True) -> AsyncEngine:
    """Open the ledger at ``url`` and bring its schema up to date.

    For SQLite the parent directory is created. The caller owns the engine and must
    ``await engine.dispose()`` at shutdown.
    """
    u = ledger_url(url)
    path = sqlite_file(u)
    if path is not None:
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        if not _uri_mode(u):
            # Made 0600 before SQLite opens it (SQLite would make it 0644 under the usual
            # umask, and its -wal and -shm files with the same mode): the ledger holds
            # prompts and key hashes. One that exists keeps the mode it has.
            await asyncio.to_thread(precreate_private, path)
    engine = create_ledger_engine(u)
    if run_migrations:
        try:
            version = await migrate(engine)
        except BaseException:
            await engine.dispose()
            raise
        logger.info(
            "ledger ready at %s (schema version %d)",
            u.render_as_string(hide_password=True),
            version,
        )
    return engine


def refused_data(exc: BaseException) -> bool:
    """The database (or its driver) refused the *values*, not the connection: retrying
    them will fail again. SQLAlchemy's own DataError/IntegrityError, a bind that failed, or a
    driver error whose SQLSTATE is class 22 (data exception) or 23 (integrity violation) —
    the asyncpg dialect wraps some of those as a generic DBAPIError."""
    if isinstance(exc, sa_exc.IntegrityError | sa_exc.DataError):
        return True
    if isinstance(exc, sa_exc.StatementError) and not isinstance(exc, sa_exc.DBAPIError):
        return True  # bind processing failed (e.g. a value the column can't take)
    if isinstance(exc, sa_exc.DBAPIError):
        for inner in (exc.orig, getattr(exc.orig, "__cause__", None)):
            state = getattr(inner, "sqlstate", None)
            if isinstance(state, str) and state[:2] in ("22", "23"):
                return True
    return isinstance(exc, TypeError | ValueError)


def describe_error(exc: BaseException, limit: int = 300) -> str:
    """A short, parameter-free description for logs: SQLAlchemy's own message repeats the
    statement and (unless hidden) the bound values, i.e. prompts and answers."""
    inner = exc.orig if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None else exc
    text = " ".join(str(inner).split())
    return f"{type(inner).__name__}: {text[:limit]}"
