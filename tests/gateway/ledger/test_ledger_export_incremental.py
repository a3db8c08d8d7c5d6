"""Incremental exports by the time rows reached the database (``requests.logged_at``), on
SQLite and PostgreSQL: rows written late — replayed from a journal after the database came
back — are in the next window although ``--since`` (by when requests were served) passes
over them; rows stamped in the same instant are each exported once; a write still in flight
when a window closes lands in the next one; and the command line's contract."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger import schema
from gateway.ledger.export import export_ledger
from gateway.ledger.export_bounds import count_late_feedback, safe_logged_until
from gateway.ledger.export_cli import add_export_arguments, run_export
from gateway.ledger.export_windows import iter_export_records
from gateway.ledger.inserter import BatchInserter
from gateway.ledger.records import LedgerRecord, build_rows
from gateway.ledger.store import create_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings

from .factories import make_cache_hit, make_feedback, make_request

REPO_ROOT = Path(__file__).resolve().parents[3]
Settings = Callable[..., LedgerSettings]


def export_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return parser.parse_args(list(argv))


async def export(ledger_url: str, *argv: str) -> int:
    """``xrouter export ARGV`` against ``ledger_url``; its exit code."""
    return await run_export(export_args(*argv), ledger_url)


def ids(path: Path) -> list[str]:
    return [orjson.loads(line)["id"] for line in path.read_bytes().splitlines() if line.strip()]


def records(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


async def submit(engine: AsyncEngine, settings: LedgerSettings, *records: LedgerRecord) -> None:
    """These records through the ledger writer."""
    writer = LedgerWriter(engine, settings)
    await writer.start()
    for record in records:
        writer.submit(record)
    await writer.close()


async def write(engine: AsyncEngine, settings: LedgerSettings, *request_ids: str) -> None:
    """Requests with feedback, through the ledger writer, in one transaction."""
    scored = [(make_request(rid), make_feedback(rid, 1.0)) for rid in request_ids]
    await submit(engine, settings, *(record for pair in scored for record in pair))


async def test_a_row_written_late_is_missed_by_since_but_not_by_the_cursor(
    backend: str,
    engine: AsyncEngine,
    ledger_url: str,
    make_settings: Settings,
    spill_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await write(engine, make_settings(), "on0", "on1", "on2")
    # Two requests served now by a worker that had lost the database: acknowledged from its
    # journal, they reach the database only when a successor replays it.
    down_url = (
        f"sqlite+aiosqlite:///{tmp_path}/nowhere/x.db"
        if backend == "sqlite"
        else ledger_url.rsplit("/", 1)[0] + "/xrouter_test_does_not_exist"
    )
    down = create_ledger_engine(down_url)
    stranded = LedgerWriter(
        down, LedgerSettings(url=down_url, spill_dir=str(spill_dir), flush_interval_ms=60_000)
    )
    await stranded.start()
    for rid in ("late0", "late1"):
        await stranded.submit_durable(make_request(rid))
        stranded.submit(make_feedback(rid, 1.0))
    await stranded.close()
    await down.dispose()

    # The first run of both pipelines: by when requests were served, and by the cursor.
    run1 = datetime.now(UTC)
    served1 = tmp_path / "served-1.jsonl"
    assert await export(ledger_url, "--out", str(served1), "--until", run1.isoformat()) == 0
    cursor = tmp_path / "state" / "cursor"
    logged1 = tmp_path / "logged-1.jsonl"
    capsys.readouterr()
    argv = ("--cursor", str(cursor), "--settle-seconds", "0")
    assert await export(ledger_url, "--out", str(logged1), *argv) == 0
    end1 = datetime.fromisoformat(cursor.read_text().strip())
    assert capsys.readouterr().out.splitlines() == [
        f"exported 3 records to {logged1}",
        f"rows logged from the beginning until {end1.isoformat()}; "
        f"cursor {cursor} now at {end1.isoformat()}",
    ]
    assert ids(served1) == ids(logged1) == ["on0", "on1", "on2"]

    # The database is back: a successor adopts the journal and writes the late rows, with
    # the times they were served, which are before the first runs.
    successor = LedgerWriter(engine, make_settings())
    await successor.start()
    assert successor.adopted_at_start >= 1  # journal segments
    await successor.flush()
    await successor.close()

    served2 = tmp_path / "served-2.jsonl"
    assert await export(ledger_url, "--out", str(served2), "--since", run1.isoformat()) == 0
    assert ids(served2) == []  # lost to the served-time pipeline
    logged2 = tmp_path / "logged-2.jsonl"
    capsys.readouterr()
    assert await export(ledger_url, "--out", str(logged2), *argv) == 0
    end2 = datetime.fromisoformat(cursor.read_text().strip())
    assert end2 > end1
    assert capsys.readouterr().out.splitlines()[1] == (
        f"rows logged from {end1.isoformat()} until {end2.isoformat()}; "
        f"cursor {cursor} now at {end2.isoformat()}"
    )
    late = records(logged2)
    assert [r["id"] for r in late] == ["late0", "late1"]
    for r in late:
        created, logged = (datetime.fromisoformat(str(r[k])) for k in ("created_at", "logged_at"))
        assert created < run1 <= end1 <= logged < end2
    # Nothing twice: the next window is empty.
    logged3 = tmp_path / "logged-3.jsonl"
    assert await export(ledger_url, "--out", str(logged3), *argv) == 0
    assert ids(logged3) == []


async def test_feedback_after_its_requests_window_is_said_to_be_in_no_export(
    engine: AsyncEngine,
    ledger_url: str,
    make_settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await submit(
        engine,
        make_settings(),
        make_request("quiet"),
        make_request("scored"),
        make_feedback("scored", 1.0),
    )
    argv = ("--cursor", str(tmp_path / "cursor"), "--settle-seconds", "0")
    first = tmp_path / "1.jsonl"
    assert await export(ledger_url, "--out", str(first), *argv) == 0
    assert ids(first) == ["scored"]  # the other one has no feedback yet: skipped
    end1 = datetime.fromisoformat((tmp_path / "cursor").read_text().strip())
    assert "feedback score" not in capsys.readouterr().err
    # Scores for both arrive after their window closed; a new request comes with its own.
    await submit(
        engine,
        make_settings(),
        make_feedback("quiet", 0.5),
        make_feedback("scored", 0.0),
        make_request("new"),
        make_feedback("new", 1.0),
    )
    second = tmp_path / "2.jsonl"
    assert await export(ledger_url, "--out", str(second), *argv) == 0
    assert ids(second) == ["new"]
    err = capsys.readouterr().err
    assert "warning: 2 feedback scores reached the ledger in this window for requests of " in err
    assert "earlier windows: no export carries them" in err and "--settle-seconds (now 0)" in err
    # Counted for the key an export is scoped to.
    window = (end1, datetime.fromisoformat((tmp_path / "cursor").read_text().strip()))
    assert await count_late_feedback(engine, *window, key_id="key_test0001") == 2
    assert await count_late_feedback(engine, *window, key_id="key_nobody") == 0
    # Said only for a window that has any.
    third = tmp_path / "3.jsonl"
    assert await export(ledger_url, "--out", str(third), *argv) == 0
    assert "feedback score" not in capsys.readouterr().err


async def test_scored_windows_export_each_request_once_when_it_is_first_scored(
    engine: AsyncEngine,
    ledger_url: str,
    make_settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def scores(path: Path) -> dict[str, float]:
        return {str(r["id"]): r["feedback"][-1]["score"] for r in records(path)}  # type: ignore[index]

    original = make_request("original")
    hit = make_cache_hit("hit", original)
    await submit(
        engine,
        make_settings(),
        make_request("later"),
        make_request("now"),
        make_feedback("now", 1.0),
        original,
        hit,
    )
    cursor = tmp_path / "cursor"
    argv = ("--scored", "--cursor", str(cursor), "--settle-seconds", "0")
    first = tmp_path / "1.jsonl"
    assert await export(ledger_url, "--out", str(first), *argv) == 0
    assert scores(first) == {"now": 1.0}
    assert cursor.read_text().startswith("scored ")
    out = capsys.readouterr().out
    assert "requests first scored from the beginning until" in out, out
    # Scores come later: for a request of the first window's time, for a cache hit (which
    # scores the answer it reused), and a second one for a request exported already.
    await submit(
        engine,
        make_settings(),
        make_feedback("later", 0.5),
        make_feedback("hit", 0.25),
        make_feedback("now", 0.0),
    )
    second = tmp_path / "2.jsonl"
    assert await export(ledger_url, "--out", str(second), *argv) == 0
    assert scores(second) == {"later": 0.5, "original": 0.25}
    err = capsys.readouterr().err
    assert "warning: 1 feedback score reached the ledger in this window for requests first " in err
    assert "scored in earlier windows: no export carries these re-scores" in err
    third = tmp_path / "3.jsonl"
    assert await export(ledger_url, "--out", str(third), *argv) == 0
    assert ids(third) == [] and "feedback score" not in capsys.readouterr().err
    # A cursor says which kind of window it pages; the two kinds do not mix.
    assert await export(ledger_url, "--out", str(third), "--cursor", str(cursor)) == 2
    assert "was written by an export with --scored; this one is without it" in (
        capsys.readouterr().err
    )
    for bad in (("--scored",), (*argv, "--include-unscored")):
        assert await export(ledger_url, "--out", str(third), *bad) == 2
    err = capsys.readouterr().err
    assert "--scored pages incremental windows" in err and "scored requests only" in err


async def test_a_keys_scored_windows_count_that_keys_feedback_only(
    engine: AsyncEngine, ledger_url: str, make_settings: Settings, tmp_path: Path
) -> None:
    # With a global answer cache another key's request can reuse this key's answer and
    # score it first: that key's feedback is not in this key's export, so it must not
    # decide this key's window either.
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    original = make_request("mine", key_id="key_a")
    hit = make_cache_hit("theirs", original, key_id="key_b")
    writer.submit(original)
    writer.submit(hit)
    writer.submit(make_feedback("theirs", 0.0))
    await writer.flush()
    argv = ("--scored", "--key", "key_a", "--cursor", str(tmp_path / "c"), "--settle-seconds", "0")
    first = tmp_path / "1.jsonl"
    assert await export(ledger_url, "--out", str(first), *argv) == 0
    assert ids(first) == []
    writer.submit(make_feedback("mine", 1.0))
    await writer.close()
    second = tmp_path / "2.jsonl"
    assert await export(ledger_url, "--out", str(second), *argv) == 0
    assert [(r["id"], r["feedback"][-1]["score"]) for r in records(second)] == [("mine", 1.0)]  # type: ignore[index]


async def test_a_scored_window_pages_each_request_once_however_often_it_was_scored(
    engine: AsyncEngine, make_settings: Settings
) -> None:
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    for i in range(7):
        writer.submit(make_request(f"s{i}"))
    # Feedback in several batches (so in several logged instants), some requests twice.
    for batch in (("s0", "s1", "s2"), ("s1", "s3", "s4", "s0"), ("s5", "s6", "s3")):
        for rid in batch:
            writer.submit(make_feedback(rid, 0.5))
        await writer.flush()
    await writer.close()
    end = datetime.now(UTC) + timedelta(days=1)
    got: list[str] = []
    async for chunk in iter_export_records(engine, logged_until=end, scored=True, chunk_size=2):
        got.extend(str(r["id"]) for r in chunk)
    assert sorted(got) == [f"s{i}" for i in range(7)]
    # In the order they were first scored: the first batch's before the others'.
    assert set(got[:3]) == {"s0", "s1", "s2"}


async def test_rows_stamped_in_the_same_instant_are_each_exported_once(
    backend: str, engine: AsyncEngine, make_settings: Settings, tmp_path: Path
) -> None:
    rids = [f"b{i}" for i in range(7)]
    await write(engine, make_settings(), *rids)  # one batch, one transaction
    async with engine.connect() as conn:
        stamps = list((await conn.execute(sa.select(schema.requests.c.logged_at))).scalars())
    assert all(s is not None for s in stamps)
    if backend == "postgresql":
        assert len(set(stamps)) == 1  # the transaction's start: the whole batch shares it
    first = min(stamps)
    paged = [
        rec["id"]
        async for chunk in iter_export_records(engine, chunk_size=2, logged_since=first)
        for rec in chunk
    ]
    assert sorted(paged) == rids
    # A window that ends at the stamp holds none of them; the one from it holds them all.
    out = tmp_path / "x.jsonl"
    assert await export_ledger(engine, out, logged_until=first) == 0
    assert await export_ledger(engine, out, logged_since=first) == 7


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_a_write_in_flight_when_a_window_closes_is_in_the_next_one(
    engine: AsyncEngine, ledger_url: str, tmp_path: Path
) -> None:
    """PostgreSQL stamps a row when its transaction starts; the row is seen when it
    commits. (A SQLite writer stamps after taking the write lock, so its window of this is
    its own transaction's few milliseconds.)"""
    blocker_row = build_rows([make_request("slow")], "none")[0]
    async with engine.connect() as hold:
        held = await hold.begin()
        # Another transaction holds the key, uncommitted: the writer's insert of it waits.
        await hold.execute(schema.requests.insert(), blocker_row)
        inserter = BatchInserter(engine, "none", timeout_s=30)
        writing = asyncio.create_task(
            inserter.insert([make_request("slow"), make_feedback("slow", 1.0)])
        )
        await asyncio.sleep(0.3)
        assert not writing.done()
        # Both windows close while the write is in flight: one at the database's clock,
        # one a settle time behind it (3 s: the write began less than that ago, on a
        # loaded machine too).
        for name, settle in (("now", "0"), ("settled", "3")):
            argv = ("--cursor", str(tmp_path / name), "--settle-seconds", settle)
            assert await export(ledger_url, "--out", str(tmp_path / "x"), *argv) == 0
            assert ids(tmp_path / "x") == []
        await held.rollback()
    assert await writing == []
    async with engine.connect() as conn:
        stamp = (await conn.execute(sa.select(schema.requests.c.logged_at))).scalar_one()
    now = datetime.fromisoformat((tmp_path / "now").read_text().strip())
    settled = datetime.fromisoformat((tmp_path / "settled").read_text().strip())
    assert settled <= stamp < now  # stamped before the unsettled window's end

    # The window that ended at the clock passed over the row: the next one misses it.
    argv = ("--cursor", str(tmp_path / "now"), "--settle-seconds", "0")
    assert await export(ledger_url, "--out", str(tmp_path / "a"), *argv) == 0
    assert ids(tmp_path / "a") == []
    # The settled one did not, once the clock is a settle time past the row.
    await asyncio.sleep((stamp - await safe_logged_until(engine, 3.0)).total_seconds() + 0.05)
    argv = ("--cursor", str(tmp_path / "settled"), "--settle-seconds", "3")
    assert await export(ledger_url, "--out", str(tmp_path / "b"), *argv) == 0
    assert ids(tmp_path / "b") == ["slow"]


async def test_the_command_line_contract(
    engine: AsyncEngine,
    make_settings: Settings,
    ledger_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await write(engine, make_settings(), "c0", "c1")
    out, cursor = tmp_path / "out.jsonl", tmp_path / "cursor"
    # Refused before anything is read or written: one line each, exit 2.
    for argv, says in (
        (("--cursor", str(cursor), "--logged-since", "2025-01-01"), "not both"),
        (("--logged-since", "yesterday"), "--logged-since: 'yesterday' is not an ISO-8601"),
        (("--logged-until", "2025-13-01"), "--logged-until: '2025-13-01' is not an ISO-8601"),
        # Out of the years a datetime holds: said as the option's, before the ledger is read
        # (it was "export failed: ValueError: time out of range" after).
        (("--since", "0001-01-01T00:00:00+05:00"), "--since: '0001-01-01T00:00:00+05:00' is"),
        (("--until", "1e20"), "--until: '1e20' is not"),
        (("--logged-since", "2025-01-01", "--settle-seconds", "-1"), "--settle-seconds"),
        (("--logged-since", "2025-01-01", "--settle-seconds", "nan"), "--settle-seconds"),
    ):
        assert await export(ledger_url, "--out", str(out), *argv) == 2, argv
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith("error: ") and says in line, (argv, line)
    cursor.write_text("not a time\n")
    assert await export(ledger_url, "--out", str(out), "--cursor", str(cursor)) == 2
    assert "holds no ISO 8601 time" in capsys.readouterr().err
    assert not out.exists() and cursor.read_text() == "not a time\n"

    # Explicit bounds: the window says where to continue. An end closer to the database's
    # clock than the settle time is honoured, with a warning.
    db_now = await safe_logged_until(engine, 0)
    ahead = (db_now + timedelta(hours=1)).isoformat()
    argv = ("--logged-since", "2025-01-01T00:00:00Z", "--logged-until", ahead)
    assert await export(ledger_url, "--out", str(out), *argv) == 0
    got = capsys.readouterr()
    assert got.out.splitlines() == [
        f"exported 2 records to {out}",
        f"rows logged from 2025-01-01T00:00:00+00:00 until {ahead}; "
        f"continue with --logged-since {ahead}",
    ]
    assert got.err.startswith("warning: --logged-until is less than 60 s behind")
    # The default end stays the settle time behind the clock: rows just written wait.
    assert await export(ledger_url, "--out", str(out), "--logged-since", "2025-01-01") == 0
    assert ids(out) == [] and capsys.readouterr().err == ""
    # The logged window combines with --since/--until and --key.
    argv = ("--logged-until", ahead, "--key", "nobody")
    assert await export(ledger_url, "--out", str(out), *argv) == 0
    assert ids(out) == []
    argv = ("--logged-until", ahead, "--until", "2025-01-01")
    assert await export(ledger_url, "--out", str(out), *argv) == 0
    assert ids(out) == []
    capsys.readouterr()

    # A cursor ahead of the window's end (a clock that went back) is not moved back.
    cursor.write_text(ahead + "\n")
    assert await export(ledger_url, "--out", str(out), "--cursor", str(cursor)) == 0
    assert ids(out) == [] and cursor.read_text().strip() == ahead
    assert "(none: the window ends before it starts)" in capsys.readouterr().out

    # The installed command: `xrouter export --cursor` from a shell, first run.
    cursor.unlink()
    proc = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "export",
            "--ledger",
            ledger_url,
            "--out",
            str(out),
            "--cursor",
            str(cursor),
            "--settle-seconds",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"exported 2 records to {out}"
    assert ids(out) == ["c0", "c1"] and cursor.read_text().strip() in proc.stdout
    helped = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gateway.cli", "export", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert helped.returncode == 0, helped.stderr
    for option in ("--logged-since", "--logged-until", "--cursor", "--settle-seconds"):
        assert option in helped.stdout


async def test_a_window_carries_the_feedback_its_requests_had_when_it_closed(
    engine: AsyncEngine, ledger_url: str, make_settings: Settings, tmp_path: Path
) -> None:
    """A score given after the window closed was exported with it anyway (read when the
    export ran), and then counted by the next window as carried by no export; the same
    window exported twice could differ."""
    paid = make_request("r")
    await submit(engine, make_settings(), paid, make_feedback("r", 1.0))
    await asyncio.sleep(0.05)
    end = datetime.now(UTC)
    await asyncio.sleep(0.05)
    hit = make_cache_hit("hit", paid)
    # Re-scored after the window, on the request and on a cache hit of its answer.
    await submit(engine, make_settings(), hit, make_feedback("r", 0.0), make_feedback("hit", 0.0))
    window = [c async for c in iter_export_records(engine, logged_until=end)]
    ((record,),) = window
    assert record["id"] == "r" and record["outcomes"]
    assert [f["score"] for f in record["feedback"]] == [1.0]
    assert await count_late_feedback(engine, end, datetime.now(UTC)) == 2
    # Without a window's end, every score counts (the latest wins).
    ((everything,),) = [c async for c in iter_export_records(engine)]
    assert [f["score"] for f in everything["feedback"]] == [1.0, 0.0, 0.0]


async def test_an_export_of_unsettled_traffic_says_how_many_requests_wait_for_a_later_run(
    engine: AsyncEngine,
    make_settings: Settings,
    ledger_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Fresh traffic under a day's settle time: 0 records, and the summary said only the
    window, so the user could not tell why. It counts the requests logged after the window
    (cache hits aside, as the export leaves them out), once they are the next run's."""
    await write(engine, make_settings(), "r1", "r2", "r3")
    original = make_request("r4")
    await submit(engine, make_settings(), original, make_cache_hit("hit", original))
    cursor = tmp_path / "export.cursor"
    out = tmp_path / "x.jsonl"
    argv = ("--cursor", str(cursor), "--settle-seconds", "86400", "--out", str(out))
    capsys.readouterr()
    assert await export(ledger_url, *argv) == 0
    summary = capsys.readouterr().out
    assert ids(out) == []
    end = cursor.read_text().strip()
    assert f"; 4 requests logged after {end} wait for a later run (--settle-seconds 86400)" in (
        summary
    )
    # By an explicit end, it names that; a key's export counts that key's requests only.
    until = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    argv = ("--logged-since", until, "--logged-until", until, "--key", "key_test0001")
    assert await export(ledger_url, *argv, "--out", str(out)) == 0
    assert "wait for a later run (--logged-until)" in capsys.readouterr().out
    assert await export(ledger_url, *argv[:-1], "key_other", "--out", str(out)) == 0
    assert "wait for a later run" not in capsys.readouterr().out
    # Once settled, none is left waiting.
    now = ("--cursor", str(tmp_path / "now.cursor"), "--settle-seconds", "0")
    await asyncio.sleep(0.05)
    assert await export(ledger_url, *now, "--out", str(out)) == 0
    assert sorted(ids(out)) == ["r1", "r2", "r3"]  # r4 has no feedback
    assert "wait for a later run" not in capsys.readouterr().out


async def test_a_scored_export_says_how_many_requests_first_scored_after_it_wait(
    engine: AsyncEngine,
    make_settings: Settings,
    ledger_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A --scored window said which window it covered but not the requests past its end: a
    run right after scores came in (under the settle time) wrote 0 records and did not say
    why. It counts the requests first scored after the window, each once (scored twice, or
    through a cache hit of its answer), and not one scored before it and again since."""
    await write(engine, make_settings(), "early")
    await asyncio.sleep(0.05)
    end = (await safe_logged_until(engine, 0)).isoformat()
    await asyncio.sleep(0.05)
    original = make_request("r4")
    await submit(
        engine,
        make_settings(),
        make_feedback("early", 0.0),  # a re-score: "early" was first scored in the window
        make_request("r1"),
        make_feedback("r1", 1.0),
        make_feedback("r1", 0.5),
        make_request("r2"),
        make_feedback("r2", 1.0),
        make_request("r3"),  # unscored: no window holds it yet
        original,
        make_cache_hit("hit", original),
        make_feedback("hit", 1.0),  # scores r4's answer
    )
    out = tmp_path / "x.jsonl"
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    argv = ("--scored", "--logged-since", since, "--logged-until", end, "--out", str(out))
    capsys.readouterr()
    assert await export(ledger_url, *argv) == 0
    assert ids(out) == ["early"]
    assert f"; 3 requests first scored after {end} wait for a later run (--logged-until)" in (
        capsys.readouterr().out
    )
    # A key's export counts the requests its own feedback scored.
    assert await export(ledger_url, *argv, "--key", "key_other") == 0
    assert "wait for a later run" not in capsys.readouterr().out
    # Under a day's settle time every scored request waits, and none once settled.
    cursor = ("--scored", "--cursor", str(tmp_path / "c"), "--settle-seconds")
    assert await export(ledger_url, *cursor, "86400", "--out", str(out)) == 0
    summary = capsys.readouterr().out
    assert ids(out) == [] and "; 4 requests first scored after " in summary, summary
    assert "wait for a later run (--settle-seconds 86400)" in summary
    now = ("--scored", "--cursor", str(tmp_path / "now"), "--settle-seconds", "0")
    await asyncio.sleep(0.05)
    assert await export(ledger_url, *now, "--out", str(out)) == 0
    assert sorted(ids(out)) == ["early", "r1", "r2", "r4"]
    assert "wait for a later run" not in capsys.readouterr().out
