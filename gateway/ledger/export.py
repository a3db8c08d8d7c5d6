"""Ledger -> outcome table (JSONL or Parquet): logged traffic for off-policy training.

One record per exported request (``gateway.ledger.export_records``: partial feedback, the
logged action and its propensity), selected and paged by ``gateway.ledger.export_windows``
(served-time ranges, logged windows, scored windows). This module writes them: the file
appears atomically when complete, owner-only (0600: it holds prompts) unless it replaces a
file whose mode it then takes, and :func:`read_export` reads either format back.

Parquet is a flat table (one row per record; layout in ``router.export_parquet``, which the
outcome-table reader shares) that analytics tools read directly; :func:`read_export` turns
either format back into ``OutcomeRecord``s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from pathlib import Path
from typing import Any, Literal

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.export_records import ExportStats
from gateway.ledger.export_windows import iter_export_records
from gateway.ledger.private_files import create_private
from gateway.ledger.spend import TimeBound
from router.export_parquet import flatten, parquet_schema, read_parquet_records
from router.outcomes import OutcomeRecord

logger = logging.getLogger(__name__)

ExportFormat = Literal["jsonl", "parquet"]


class _JsonlSink:
    def __init__(self, path: Path) -> None:
        self._fh = create_private(path)

    def write(self, records: list[dict[str, Any]]) -> None:
        self._fh.write(b"".join(orjson.dumps(r) + b"\n" for r in records))

    def close(self) -> None:
        # Twice when the output cannot be put in place: the second (discarding) call must
        # not hide the first error behind "flush of closed file".
        if self._fh.closed:
            return
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()


class _ParquetSink:
    def __init__(self, path: Path) -> None:
        import pyarrow.parquet as pq

        self._schema = parquet_schema()
        # Made 0600 first: Arrow truncates the file it is given and keeps its mode.
        create_private(path).close()
        try:
            self._writer = pq.ParquetWriter(str(path), self._schema, compression="zstd")
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    def write(self, records: list[dict[str, Any]]) -> None:
        import pyarrow as pa

        table = pa.Table.from_pylist([flatten(r) for r in records], schema=self._schema)
        self._writer.write_table(table)

    def close(self) -> None:
        self._writer.close()


async def export_ledger(
    engine: AsyncEngine,
    out_path: str | os.PathLike[str],
    fmt: ExportFormat = "jsonl",
    since: TimeBound = None,
    until: TimeBound = None,
    key_id: str | None = None,
    include_unscored: bool = False,
    stats: ExportStats | None = None,
    *,
    logged_since: TimeBound = None,
    logged_until: TimeBound = None,
    scored: bool = False,
) -> int:
    """Write the outcome table of the logged traffic; return the number of records.

    Requests without feedback are skipped unless ``include_unscored`` (their outcome then
    has no ``score`` and the record says ``"scored": false``; they must be scored before
    they load as an outcome table); ``stats`` counts them. ``since``/``until`` bound when
    requests were served, ``logged_since``/``logged_until`` when their rows reached the
    database — or, with ``scored``, when they were first scored (see
    :func:`iter_export_records`). The file appears atomically when complete.
    """
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"unknown export format {fmt!r}")
    out = Path(out_path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    await asyncio.to_thread(out.parent.mkdir, parents=True, exist_ok=True)
    sink: _JsonlSink | _ParquetSink
    if fmt == "parquet":
        sink = await asyncio.to_thread(_ParquetSink, tmp)
    else:
        sink = await asyncio.to_thread(_JsonlSink, tmp)
    n = no_prompt = 0
    try:
        async for chunk in iter_export_records(
            engine,
            since,
            until,
            key_id,
            include_unscored,
            stats=stats,
            logged_since=logged_since,
            logged_until=logged_until,
            scored=scored,
        ):
            await asyncio.to_thread(sink.write, chunk)
            n += len(chunk)
            no_prompt += sum(1 for r in chunk if r.get("content_logged") != "full")
        await asyncio.to_thread(sink.close)
        await asyncio.to_thread(_keep_mode, out, tmp)
        await asyncio.to_thread(os.replace, tmp, out)
    except BaseException:
        await asyncio.to_thread(_discard, sink, tmp)
        raise
    logger.info("exported %d ledger records to %s", n, out)
    if no_prompt:
        # Said now, not when ``xrouter train`` refuses the table: the traffic behind it must
        # be collected again, and the sooner the gateway logs content, the less is lost.
        logger.warning(
            "%d of the %d records exported to %s carry no prompt text (the gateway logged "
            "it with ledger.log_content none or hash): a router that reads the prompt cannot "
            "learn from them; set ledger.log_content: full (env "
            "XROUTER_LEDGER__LOG_CONTENT=full) and collect traffic again",
            no_prompt,
            n,
            out,
        )
    return n


def _keep_mode(out: Path, tmp: Path) -> None:
    """An export replacing a file gets that file's mode: whoever made it readable by a group
    (or by others) chose so. A new one stays 0600 (it holds prompts)."""
    try:
        mode = stat.S_IMODE(os.stat(out).st_mode)
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)


def _discard(sink: _JsonlSink | _ParquetSink, tmp: Path) -> None:
    try:
        sink.close()
    finally:
        tmp.unlink(missing_ok=True)


def read_export(path: str | os.PathLike[str], skip_unscored: bool = True) -> list[OutcomeRecord]:
    """Load an export (``.parquet`` or JSONL) as outcome records. Blocking; for offline
    tools and training, not the request path."""
    p = Path(path)
    if p.suffix == ".parquet":
        rows = read_parquet_records(p)
    else:
        rows = [orjson.loads(line) for line in p.read_bytes().splitlines() if line.strip()]
    return [
        OutcomeRecord.model_validate(r)
        for r in rows
        if not (skip_unscored and r.get("scored") is False)
    ]
