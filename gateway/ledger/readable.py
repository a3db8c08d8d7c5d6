"""Opening a ledger only to read it (``xrouter export``): without running the migrations,
and refusing, in one line, a database that holds no xrouter ledger or a ledger older than
this release reads.

Migrating is ``xrouter serve``'s (``open_ledger_engine``). A command that reads and migrated
too made a ledger in any database it was pointed at (an empty PostgreSQL database got the
ledger's tables, another application's SQLite file gained them beside its own), and a newer
xrouter upgraded the ledger of an older gateway that was still writing it.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.migrations import latest_version
from gateway.ledger.store import create_ledger_engine, ledger_url, sqlite_file

# Every ledger has had them since its first migration: a `schema_version` table alone may
# be another application's (it is a common name).
_BASELINE_TABLES = ("requests", "calls", "feedback", "api_keys")


class UnreadableLedger(Exception):
    """The database holds no ledger this release reads; the message is the line to print."""


class NoLedger(UnreadableLedger):
    """The database holds no xrouter ledger; the message says why, after "no ledger
    database at WHERE"."""


def ledger_version(conn: sa.Connection) -> int:
    """The schema version of the xrouter ledger ``conn``'s database holds; NoLedger when it
    holds none — no ``schema_version`` table (xrouter's, with a version row), or not the
    first migration's tables. Reads only."""
    insp = sa.inspect(conn)
    if not insp.has_table("schema_version"):
        raise NoLedger("it holds no xrouter ledger: no schema_version table")
    if "version" not in {c["name"] for c in insp.get_columns("schema_version")}:
        raise NoLedger("it holds no xrouter ledger: its schema_version table is not xrouter's")
    version = conn.execute(sa.text("SELECT max(version) FROM schema_version")).scalar()
    if version is None:
        raise NoLedger("it holds no xrouter ledger: its schema_version table is empty")
    if not isinstance(version, int):
        raise NoLedger("it holds no xrouter ledger: its schema_version table is not xrouter's")
    missing = [t for t in _BASELINE_TABLES if not insp.has_table(t)]
    if missing:
        raise NoLedger(f"it holds no xrouter ledger: no {missing[0]} table")
    return version


def where(url: URL) -> str:
    """The database as the refusals name it: a SQLite ledger's file, else its URL without
    the password."""
    path = sqlite_file(url)
    return str(path) if path is not None else url.render_as_string(hide_password=True)


async def open_ledger_to_read(url: str | URL) -> tuple[AsyncEngine, int]:
    """An engine on the ledger at ``url`` and its schema version, checked before anything
    is read: UnreadableLedger when the database holds no ledger, or one older than this
    release's schema (its queries name columns a later migration added). A newer one is
    returned (the steps are additive: its tables hold every column this release reads); the
    caller says so (``migrations.newer_schema``). Nothing is created or migrated; on SQLite
    only the journal mode is set, to the WAL a ledger already has. The caller disposes the
    engine."""
    u = ledger_url(url)
    engine = create_ledger_engine(u)
    try:
        async with engine.connect() as conn:
            try:
                version = await conn.run_sync(ledger_version)
            except NoLedger as exc:
                raise NoLedger(f"no ledger database at {where(u)} ({exc})") from None
        needed = latest_version()
        if version < needed:
            raise UnreadableLedger(
                f"the ledger at {where(u)} is at schema version {version}, older than this "
                f"xrouter reads ({needed}): upgrade the gateway that writes it to this "
                "release (xrouter serve migrates its ledger as it starts), or use the "
                "xrouter release that gateway runs"
            )
    except BaseException:
        await engine.dispose()
        raise
    return engine, version
