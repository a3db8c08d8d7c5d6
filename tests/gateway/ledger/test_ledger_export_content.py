"""An export of traffic logged without its prompt text says so when it is written, not only
when ``xrouter train`` refuses the table later."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.ledger.export_cli import add_export_arguments, run_export
from gateway.ledger.store import open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings

from .factories import make_feedback, make_request

T0 = 1_750_000_000.0


async def write(settings: LedgerSettings, prefix: str, n: int) -> None:
    engine = await open_ledger_engine(settings.url)
    writer = LedgerWriter(engine, settings)
    await writer.start()
    for i in range(n):
        rec = make_request(f"{prefix}{i}", created_at=T0 + i)
        writer.submit(rec)
        writer.submit(make_feedback(rec.request_id, 1.0, created_at=T0 + 10 + i))
    await writer.close()
    await engine.dispose()


async def export(ledger_url: str, out: Path) -> None:
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    assert await run_export(parser.parse_args(["--out", str(out)]), ledger_url) == 0


def no_prompt_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "carry no prompt text" in r.getMessage()
    ]


@pytest.mark.parametrize("mode", ["none", "hash"])
async def test_an_export_without_prompt_text_warns_once_with_the_count(
    make_settings: Callable[..., LedgerSettings],
    ledger_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    await write(make_settings(log_content=mode), "blind", 3)
    await write(make_settings(log_content="full"), "seen", 2)
    out = tmp_path / "traffic.jsonl"
    with caplog.at_level(logging.WARNING):
        await export(ledger_url, out)
    (warning,) = no_prompt_warnings(caplog)
    assert warning.startswith(f"3 of the 5 records exported to {out} carry no prompt text")
    assert "ledger.log_content: full" in warning
    assert "XROUTER_LEDGER__LOG_CONTENT=full" in warning


async def test_an_export_with_every_prompt_says_nothing_of_it(
    make_settings: Callable[..., LedgerSettings],
    ledger_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await write(make_settings(log_content="full"), "seen", 2)
    with caplog.at_level(logging.WARNING):
        await export(ledger_url, tmp_path / "traffic.jsonl")
    assert no_prompt_warnings(caplog) == []
