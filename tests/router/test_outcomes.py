"""The outcome-table reader: JSONL, and ledger exports in Parquet."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.outcomes import OutcomeTableError, load_outcome_table


def test_a_file_that_is_not_a_ledger_export_in_parquet_is_refused(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    fake = tmp_path / "table.parquet"
    fake.write_text('{"id": "a", "prompt": "p", "outcomes": {"m": {"score": 1}}}\n')
    with pytest.raises(OutcomeTableError, match=r"table\.parquet: not a ledger export"):
        load_outcome_table(fake)
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["p"]}), str(other))
    with pytest.raises(OutcomeTableError, match=r"other\.parquet: not a ledger export"):
        load_outcome_table(other)


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "prompt": "p", "outcomes": {"m": {"score": 0.5}}}\n{"id": "b"}\n')
    with pytest.raises(OutcomeTableError, match=r"t\.jsonl:2: .*"):
        load_outcome_table(path)
