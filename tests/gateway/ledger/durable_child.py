"""Child process for the kill -9 test: submit records durably, say so, then wait to be killed.

    python -m tests.gateway.ledger.durable_child URL SPILL_DIR N MODE

MODE ``db_up``: the first half is committed by an explicit flush, the second half is only
acknowledged (the periodic flush is an hour away). MODE ``db_down``: URL is unreachable, so
everything lives in the journal only.
"""

from __future__ import annotations

import asyncio
import sys

from gateway.ledger.store import create_ledger_engine, open_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.settings import LedgerSettings
from tests.gateway.ledger.factories import make_feedback, make_request


async def main(url: str, spill_dir: str, n: int, mode: str) -> None:
    engine = await open_ledger_engine(url) if mode == "db_up" else create_ledger_engine(url)
    settings = LedgerSettings(
        url=url, spill_dir=spill_dir, flush_interval_ms=3_600_000, flush_rows=100_000
    )
    writer = LedgerWriter(engine, settings)
    await writer.start()
    half = n // 2
    await asyncio.gather(*(writer.submit_durable(make_request(f"k{i:04d}")) for i in range(half)))
    if mode == "db_up":
        await writer.flush()
    await asyncio.gather(
        *(writer.submit_durable(make_request(f"k{i:04d}")) for i in range(half, n)),
        writer.submit_durable(make_feedback("k0000", 0.9)),
    )
    print(f"ACKED {n}", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
