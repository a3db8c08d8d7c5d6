"""A request whose chosen model was never called — a budget refused it, its open circuit kept
the call away — is no outcome of that model, whatever answered in its place: the export
leaves it out, counted by why, and ``xrouter convert ledger`` skips one an older export
wrote."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.export import export_ledger, read_export
from gateway.ledger.export_cli import add_export_arguments, run_export
from gateway.ledger.export_records import ExportStats
from gateway.ledger.records import RequestRecord
from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings
from training.datasets.ledger import convert_ledger

from .factories import make_feedback, make_request

T0 = 1_750_000_000.0
CHOSEN, NEXT = "mistral-small-24b-instruct-2501-bf16", "gemma-2-9b-it"


def capped(rid: str, created_at: float) -> RequestRecord:
    """The rows the gateway writes when the request's ``max_cost_usd`` refuses the compact
    policy's explored choice for its worst case and the policy's next choice answers: the
    refused call (status ``refused``, ``budget``, no cost), then the answer; both in the
    decision, the first at its propensity, the forced second at 1."""
    rec = make_request(rid, created_at=created_at, models=(CHOSEN, NEXT), call_costs=(0, 56))
    rec.calls[0].status, rec.calls[0].error_type = "refused", "budget"
    rec.decision = {
        "policy": "compact",
        "cost_weight": 0.5,
        "actions": [CHOSEN, NEXT],
        "propensities": [0.825, 1.0],
        "propensity": 0.825,
    }
    return rec


def kept_away(rid: str, created_at: float) -> RequestRecord:
    """The row of a call its open circuit kept away from the chosen model and whose
    configured fallback answered: it names the fallback, fallen back from the chosen one."""
    rec = make_request(rid, created_at=created_at, models=(NEXT,), call_costs=(70,))
    rec.calls[0].fallback_from, rec.calls[0].fallback_reason = CHOSEN, "circuit_open"
    rec.decision = {"policy": "compact", "actions": [CHOSEN], "propensities": [0.4]}
    rec.decision["propensity"] = 0.4
    return rec


async def write(engine: AsyncEngine, settings: LedgerSettings) -> None:
    answered = make_request("answered", created_at=T0, models=(CHOSEN,))
    writer = LedgerWriter(engine, settings)
    await writer.start()
    for rec in (answered, capped("capped", T0 + 1), kept_away("kept-away", T0 + 2)):
        writer.submit(rec)
        writer.submit(make_feedback(rec.request_id, 1.0, created_at=T0 + 10))
    await writer.close()


async def test_a_chosen_model_a_budget_refused_is_left_out_not_credited_with_the_answer(
    engine: AsyncEngine,
    make_settings: Callable[..., LedgerSettings],
    ledger_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It was exported as the refused model's outcome with the next choice's score and cost
    (and, two actions logged, skipped by train and eval as a cascade): 10-14% of an
    exploring gateway's records under a cap, always the capped ones."""
    await write(engine, make_settings())
    for fmt in ("jsonl", "parquet"):
        if fmt == "parquet":
            pytest.importorskip("pyarrow")
        stats = ExportStats()
        out = tmp_path / f"ledger.{fmt}"
        assert await export_ledger(engine, out, fmt, stats=stats) == 1
        assert [r.id for r in read_export(out)] == ["answered"], fmt
        assert (stats.budget_refused_skipped, stats.not_called_skipped) == (1, 1), fmt
        assert stats.unscored_skipped == stats.failures == 0

    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    out = tmp_path / "cli.jsonl"
    capsys.readouterr()
    assert await run_export(parser.parse_args(["--out", str(out)]), ledger_url) == 0
    summary = capsys.readouterr().out
    assert (
        "skipped 1 requests whose chosen model was refused by a budget (max_cost_usd, the "
        "key's) before it was called" in summary
    )
    assert "skipped 1 requests whose chosen model was never called" in summary


def test_convert_ledger_skips_a_never_called_model_an_older_export_wrote(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An export written before the rule holds such records: ``xrouter convert ledger``
    applies the export's rule to the calls each record carries."""
    calls = [
        {"role": "downstream", "model": CHOSEN, "status": "refused", "error_type": "budget"},
        {"role": "downstream", "model": NEXT, "status": "ok", "error_type": None},
    ]
    old = {
        "id": "capped",
        "prompt": "hi",
        "outcomes": {CHOSEN: {"score": 1.0, "cost_usd": 5.6e-05, "model": NEXT}},
        "logged": {"action": CHOSEN, "propensity": 0.825, "actions": [CHOSEN, NEXT]},
        "calls": calls,
    }
    fine = {
        "id": "answered",
        "prompt": "hi",
        "outcomes": {NEXT: {"score": 1.0, "cost_usd": 5.6e-05, "model": NEXT}},
        "logged": {"action": NEXT, "propensity": 0.5},
        "calls": calls[1:],
    }
    path = tmp_path / "old.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (old, fine)))
    with caplog.at_level(logging.WARNING, logger="training.datasets.ledger"):
        assert [r.id for r in convert_ledger([path])] == ["answered"]
    assert "skipped 1 records whose chosen model was never called" in caplog.text
