"""What an incremental export counts outside its window — the requests that wait for a later
run, the feedback that came late — counts only requests the export itself would hold, by
the same filters: served in ``--since``/``--until``, of ``--key``, answered or with a failed
call, not a cache hit. On SQLite and PostgreSQL, rows written through the ledger writer."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.export_cli import add_export_arguments, run_export
from gateway.ledger.records import LedgerRecord, RequestRecord
from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings

from .factories import make_cache_hit, make_feedback, make_request

Settings = Callable[..., LedgerSettings]
DAY_AGO = (datetime.now(UTC) - timedelta(days=1)).isoformat()


async def export(ledger_url: str, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return await run_export(parser.parse_args(list(argv)), ledger_url)


def ids(path: Path) -> list[str]:
    return sorted(orjson.loads(line)["id"] for line in path.read_bytes().splitlines() if line)


async def submit(engine: AsyncEngine, settings: LedgerSettings, *records: LedgerRecord) -> None:
    writer = LedgerWriter(engine, settings)
    await writer.start()
    for record in records:
        writer.submit(record)
    await writer.close()


def refused(request_id: str) -> RequestRecord:
    """A request a rate limit refused before any model was asked, as the gateway logs it:
    status 429, no calls, no answer. No export holds it."""
    rec = make_request(request_id, status=429, call_costs=(0,))
    rec.calls = []
    return rec


def failed(request_id: str) -> RequestRecord:
    """A request whose chosen model's one call failed: exported, scored 0."""
    rec = make_request(request_id, status=502, call_costs=(0,))
    rec.calls[0].status, rec.calls[0].error_type = "error", "upstream_5xx"
    return rec


def served_long_ago(request_id: str) -> RequestRecord:
    """A request served two days ago (its row written now, as a replayed journal writes
    it): before ``--since DAY_AGO``."""
    return make_request(request_id, created_at=(datetime.now(UTC) - timedelta(days=2)).timestamp())


async def test_the_requests_said_to_wait_are_the_ones_a_later_run_exports(
    engine: AsyncEngine,
    ledger_url: str,
    make_settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The count took every request logged after the window (cache hits aside): a refused
    request, which no export holds, was said to wait for a later run."""
    original = make_request("ok")
    await submit(
        engine,
        make_settings(),
        original,
        make_feedback("ok", 1.0),
        failed("failed"),
        refused("refused"),
        served_long_ago("old"),
        make_feedback("old", 1.0),
        make_cache_hit("hit", original),
    )
    out = tmp_path / "x.jsonl"
    cursor = tmp_path / "c"
    argv = ("--since", DAY_AGO, "--out", str(out), "--cursor", str(cursor))
    capsys.readouterr()
    assert await export(ledger_url, *argv, "--settle-seconds", "86400") == 0
    assert ids(out) == []
    end = cursor.read_text().strip()
    assert f"; 2 requests logged after {end} wait for a later run" in capsys.readouterr().out
    # The later run exports exactly those.
    cursor.unlink()
    await asyncio.sleep(0.05)  # the rows are stamped before the database's clock reads now
    assert await export(ledger_url, *argv, "--settle-seconds", "0") == 0
    assert ids(out) == ["failed", "ok"]


async def test_the_requests_said_to_wait_for_a_scored_window_are_the_ones_it_exports(
    engine: AsyncEngine,
    ledger_url: str,
    make_settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Scores for a refused request, or for one served before ``--since``, made it wait."""
    await submit(
        engine,
        make_settings(),
        make_request("ok"),
        make_feedback("ok", 1.0),
        refused("refused"),
        make_feedback("refused", 0.0),
        served_long_ago("old"),
        make_feedback("old", 1.0),
    )
    out = tmp_path / "x.jsonl"
    cursor = tmp_path / "c"
    argv = ("--scored", "--since", DAY_AGO, "--out", str(out), "--cursor", str(cursor))
    capsys.readouterr()
    assert await export(ledger_url, *argv, "--settle-seconds", "86400") == 0
    assert ids(out) == []
    end = cursor.read_text().split()[-1]  # "scored END"
    assert f"; 1 request first scored after {end} wait for a later run" in (capsys.readouterr().out)
    cursor.unlink()
    await asyncio.sleep(0.05)  # the rows are stamped before the database's clock reads now
    assert await export(ledger_url, *argv, "--settle-seconds", "0") == 0
    assert ids(out) == ["ok"]


@pytest.mark.parametrize("scored", [False, True])
async def test_late_feedback_counts_only_requests_the_export_holds(
    scored: bool,
    engine: AsyncEngine,
    ledger_url: str,
    make_settings: Settings,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Scores after its window for a refused request, or for one served before
    ``--since``, were warned of as feedback no export carries: none of these exports
    would have carried them anyway."""
    # Scored in the first window (for --scored: so that a second score is a re-score).
    first = [make_feedback(rid, 1.0) for rid in ("ok", "refused", "old")] if scored else []
    await submit(
        engine,
        make_settings(),
        make_request("ok"),
        refused("refused"),
        served_long_ago("old"),
        *first,
    )
    out = tmp_path / "x.jsonl"
    mode = ("--scored",) if scored else ()
    argv = (*mode, "--since", DAY_AGO, "--out", str(out), "--cursor", str(tmp_path / "c"))
    await asyncio.sleep(0.05)
    assert await export(ledger_url, *argv, "--settle-seconds", "0") == 0
    assert ids(out) == (["ok"] if scored else [])
    assert "feedback score" not in capsys.readouterr().err
    await submit(
        engine, make_settings(), *(make_feedback(rid, 0.5) for rid in ("ok", "refused", "old"))
    )
    await asyncio.sleep(0.05)
    assert await export(ledger_url, *argv, "--settle-seconds", "0") == 0
    assert ids(out) == []
    err = capsys.readouterr().err
    assert "warning: 1 feedback score reached the ledger in this window" in err, err
    # Without --since, the request served before it is one the export holds.
    plain = (*mode, "--out", str(out), "--cursor", str(tmp_path / "all"))
    assert await export(ledger_url, *plain, "--settle-seconds", "0") == 0
    capsys.readouterr()
    await submit(engine, make_settings(), make_feedback("ok", 0.0), make_feedback("old", 0.0))
    await asyncio.sleep(0.05)
    assert await export(ledger_url, *plain, "--settle-seconds", "0") == 0
    assert "warning: 2 feedback scores reached the ledger in this window" in (
        capsys.readouterr().err
    )
