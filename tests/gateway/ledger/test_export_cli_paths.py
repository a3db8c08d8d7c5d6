"""``xrouter export``'s output paths and ledger URL checked before anything is written: an
``--out`` or ``--cursor`` naming the ledger's own SQLite file (the export replaced the
ledger, a running gateway's database swapped under it), or naming each other (the cursor
written over the export, whose requests were then never exported again), and a ledger URL
whose port no socket takes (a traceback from the driver) — each one line, exit 2."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from gateway.cli import _check_ledger
from gateway.ledger.export_cli import add_export_arguments, run_export
from gateway.ledger.store import ledger_url, open_ledger_engine
from tests.support.paths import unwritable_dir


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
async def ledger(tmp_path: Path) -> Path:
    """A SQLite ledger holding its schema (and so a table the export could replace)."""
    db = tmp_path / "ledger.db"
    engine = await open_ledger_engine(f"sqlite+aiosqlite:///{db}")
    await engine.dispose()
    return db


def _contents(db: Path) -> tuple[bytes, set[str]]:
    """The file's bytes and the tables SQLite reads in it."""
    return db.read_bytes(), _tables(db)


def _tables(db: Path) -> set[str]:
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.parametrize("option", ["--out", "--cursor"])
@pytest.mark.parametrize("suffix", ["", "-wal"])
async def test_an_output_that_is_the_ledger_s_own_file_is_refused(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, suffix: str
) -> None:
    url = f"sqlite+aiosqlite:///{ledger}"
    target = tmp_path / "elsewhere" / ".." / f"{ledger.name}{suffix}"  # the same file, spelt apart
    argv = ["--out", str(tmp_path / "x.jsonl"), option, str(target)]
    before = _contents(ledger)
    assert await run_export(_args(*argv), url) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert f"{option} names the ledger database's own file" in line, line
    assert _contents(ledger) == before and "requests" in before[1]
    assert not (tmp_path / "x.jsonl").exists()


async def test_a_cursor_that_is_the_output_is_refused(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export.jsonl"
    (tmp_path / "link.jsonl").symlink_to(out)
    for cursor in (out, tmp_path / "link.jsonl"):
        argv = ["--out", str(out), "--cursor", str(cursor)]
        assert await run_export(_args(*argv), f"sqlite+aiosqlite:///{ledger}") == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert "--out and --cursor name the same file" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    ("port", "said"), [("99999", "port 99999 is not a port"), ("abc", "port is not a number")]
)
async def test_a_ledger_url_whose_port_is_no_port_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], port: str, said: str
) -> None:
    url = f"postgresql://u:s3cretpw@127.0.0.1:{port}/nope"
    assert await run_export(_args("--out", str(tmp_path / "x.jsonl")), url) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert said in line and "s3cretpw" not in line, line
    # `xrouter serve` checks the ledger the same way before it starts (an OverflowError
    # from the driver was a traceback there too).
    problem, _ = await _check_ledger(url)
    assert problem is not None and said in problem and "s3cretpw" not in problem
    with pytest.raises(ValueError, match=said):
        ledger_url(url)


async def test_time_bounds_take_epoch_seconds_as_the_spend_report_does(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--since 1732850000` was "not an ISO 8601 date or time", which /admin/spend takes.
    out = tmp_path / "x.jsonl"
    argv = ["--out", str(out), "--since", "1732850000", "--until", "2030-01-01"]
    assert await run_export(_args(*argv), f"sqlite+aiosqlite:///{ledger}") == 0
    assert "exported 0 records" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "path", "says"),
    [
        pytest.param(
            "--out",
            "{tmp}/a-dir",
            "--out {tmp}/a-dir is a directory: give the path of a file",
            id="out-a-directory",
        ),
        pytest.param(
            "--cursor",
            "{tmp}/a-dir",
            "--cursor {tmp}/a-dir is a directory: give the path of a file",
            id="cursor-a-directory",
        ),
        pytest.param(
            "--out",
            "{tmp}/a-fifo",
            "--out {tmp}/a-fifo is not a regular file: the export replaces it whole; give the "
            "path of a file",
            id="out-a-fifo",
        ),
        pytest.param(
            "--out",
            "{tmp}/a-file/x.jsonl",
            "--out {tmp}/a-file/x.jsonl: cannot write in {tmp}/a-file: Not a directory",
            id="out-under-a-file",
        ),
        pytest.param(
            "--out",
            "{tmp}/a-file/missing/x.jsonl",
            "--out {tmp}/a-file/missing/x.jsonl: cannot write in {tmp}/a-file: Not a directory",
            id="out-under-a-missing-directory-under-a-file",
        ),
        pytest.param(
            "--out",
            "{unwritable}/missing/x.jsonl",
            "--out {unwritable}/missing/x.jsonl: cannot write in {unwritable}: Permission denied",
            id="out-in-an-unwritable-directory",
        ),
        pytest.param(
            "--cursor",
            "{unwritable}/c",
            "--cursor {unwritable}/c: cannot write in {unwritable}: Permission denied",
            id="cursor-in-an-unwritable-directory",
        ),
    ],
)
async def test_an_output_that_cannot_be_written_is_refused_before_the_ledger_is_read(
    ledger: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    option: str,
    path: str,
    says: str,
) -> None:
    # `--out DIR` read the whole ledger, then failed in a line naming its temporary file
    # (`IsADirectoryError: … '.DIR.1234.tmp' -> 'DIR'`); an unwritable cursor's directory
    # was found only once the export was in place, and the next run repeated the window.
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("x")
    os.mkfifo(tmp_path / "a-fifo")
    names = {"tmp": str(tmp_path)}
    if "{unwritable}" in path:
        names["unwritable"] = str(unwritable_dir(tmp_path))
    target = path.format(**names)
    out = tmp_path / "x.jsonl"
    argv = [option, target] if option == "--out" else ["--out", str(out), option, target]
    # A ledger that cannot be reached (port 9, discard): refused before it is tried.
    for url in (f"sqlite+aiosqlite:///{ledger}", "postgresql+asyncpg://u@127.0.0.1:9/x"):
        assert await run_export(_args(*argv), url) == 2
        captured = capsys.readouterr()
        assert captured.err.splitlines() == [f"error: {says.format(**names)}"]
        assert captured.out == ""
    assert not out.exists()
    made = set(os.listdir(tmp_path)) - {"a-dir", "a-fifo", "a-file", "read-only"}
    assert made == {"ledger.db"}  # no directory made, no temporary file left
    assert not os.listdir(tmp_path / "a-dir")


async def test_missing_directories_of_the_output_and_the_cursor_are_made(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, cursor = tmp_path / "exports" / "day" / "x.jsonl", tmp_path / "state" / "c"
    argv = ["--out", str(out), "--cursor", str(cursor)]
    assert await run_export(_args(*argv), f"sqlite+aiosqlite:///{ledger}") == 0
    assert capsys.readouterr().out.startswith(f"exported 0 records to {out}")
    assert out.is_file() and cursor.is_file()
