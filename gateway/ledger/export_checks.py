"""What ``xrouter export`` refuses before it reads the ledger, each in one line: an output
whose format its name contradicts, a ledger URL that is none, an ``--out`` or ``--cursor``
that would replace the ledger's own file (or each other) or that cannot be written, and a
SQLite file that holds no ledger (opening it would make one)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sqlite3
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from gateway.ledger.export import ExportFormat
from gateway.ledger.readable import NoLedger, ledger_version
from gateway.writable import cannot_make_files_in


def output_format(out: str, given: ExportFormat | None) -> ExportFormat:
    """The format ``out`` is written in: ``given`` (``--format``), else its extension's."""
    named: ExportFormat = "parquet" if out.endswith(".parquet") else "jsonl"
    fmt: ExportFormat = given or named
    if fmt != named:
        # The readers (train, eval, convert) know a table's format by its extension: a
        # Parquet file named .jsonl would be read as broken JSON lines, and the reverse.
        want = ".parquet" if fmt == "parquet" else ".jsonl"
        raise ValueError(
            f"--format {fmt} writes a {want} file, but --out {out!r} is named as {named}: "
            f"name it with {want}"
        )
    if fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
        # Said before the ledger is read, not as a ModuleNotFoundError after it.
        raise ValueError(
            "writing Parquet needs pyarrow, which the gateway's own install leaves out: "
            "pip install 'xrouter[export]' (or write .jsonl)"
        )
    return fmt


def ledger_url(text: str) -> URL:
    """``--ledger`` (or ``ledger.url``) parsed, or a ValueError that never quotes it (a URL
    may hold a password)."""
    try:
        return make_url(text)
    except sa.exc.ArgumentError:
        # Most often a file path given for a URL (`--ledger xrouter.db`).
        raise ValueError(
            "--ledger (or ledger.url) is not a database URL: give one as the gateway's "
            "ledger.url, e.g. sqlite+aiosqlite:///./xrouter.db or "
            "postgresql+asyncpg://user@host/xrouter"
        ) from None
    except ValueError:  # SQLAlchemy's int() of the port
        raise ValueError("--ledger (or ledger.url): the URL's port is not a number") from None


def same_path(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same path once symlinks and ``..`` are resolved,
    or (both existing) the same inode — a hard link."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_paths_apart(args: argparse.Namespace, db_file: Path | None) -> None:
    """Refuse an ``--out`` or ``--cursor`` that names the ledger's own SQLite file (or its
    journal), or each other. Both are replaced whole when the export is done: the ledger
    would become the export file (a running gateway's database swapped under it), and an
    export written over by the cursor is lost while the cursor moves past its requests."""
    out = Path(args.out)
    cursor = Path(args.cursor) if args.cursor is not None else None
    if cursor is not None and same_path(out, cursor):
        raise ValueError(
            "--out and --cursor name the same file: the cursor would be written over the "
            "export (and its requests never exported again); give the cursor its own file"
        )
    if db_file is None:
        return
    ledger = [db_file, *(Path(f"{db_file}{suffix}") for suffix in ("-wal", "-shm", "-journal"))]
    for option, path in (("--out", out), ("--cursor", cursor)):
        if path is not None and any(same_path(path, f) for f in ledger):
            raise ValueError(
                f"{option} names the ledger database's own file ({db_file}): writing it would "
                "replace the ledger; choose another path"
            )


def no_ledger_in(db_file: Path) -> str | None:
    """Why the SQLite file ``db_file`` holds no ledger (a suffix for the error line: empty
    when there is no file), or None when it may hold one. Said before the ledger engine
    opens the file, which would make a new one, and sets the journal mode (WAL) of another
    application's database. Read-only, and anything inconclusive (a locked database, one
    SQLite cannot read) is left to the export itself, whose errors say so (its engine checks
    the schema again, ``readable.open_ledger_to_read``)."""
    try:
        size = db_file.stat().st_size
    except FileNotFoundError:
        return ""
    except OSError:
        return None
    if db_file.is_dir():
        return " (a directory)"
    if size == 0:
        return " (an empty file)"
    uri = f"{db_file.resolve().as_uri()}?mode=ro"
    engine = sa.create_engine(
        "sqlite://",
        creator=lambda: sqlite3.connect(uri, uri=True, timeout=5),
        poolclass=sa.pool.NullPool,
    )
    try:
        with engine.connect() as conn:
            (tables,) = conn.execute(sa.text("SELECT count(*) FROM sqlite_master")).one()
            if tables == 0:
                return " (an empty SQLite database)"
            ledger_version(conn)
    except NoLedger as exc:
        return f" ({exc})"
    except sa.exc.DBAPIError:
        return None
    finally:
        engine.dispose()
    return None


def check_writable(path: Path, option: str) -> None:
    """Refuse an ``--out`` or ``--cursor`` the export could not put in place, before the
    ledger is read (the whole ledger was read, then the output's temporary file failed to
    take its place, in a line naming that file): a directory, something that is not a
    regular file (the export replaces it whole: ``/dev/null`` would become a file), or a
    path in a directory where no file can be made. A missing directory is made by the
    export, so the directory that must take files is the nearest one that exists."""
    if path.is_dir():
        raise ValueError(f"{option} {path} is a directory: give the path of a file")
    if path.exists() and not path.is_file():
        raise ValueError(
            f"{option} {path} is not a regular file: the export replaces it whole; give the "
            "path of a file"
        )
    parent = path.parent  # "." for a bare name
    while not os.path.lexists(parent) and parent != parent.parent:
        parent = parent.parent
    reason = cannot_make_files_in(parent)
    if reason is not None:
        raise ValueError(f"{option} {path}: cannot write in {parent}: {reason}")
