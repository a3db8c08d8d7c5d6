"""The outcome-table reader: JSONL, and ledger exports in Parquet."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pricing.money import MAX_USD
from router.outcomes import OutcomeTableError, load_outcome_table, parse_record, validate_record


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


# Bug: a table saved with a UTF-8 byte order mark was "not valid JSON" at line 1 for
# `xrouter train` and `xrouter eval` (and the replay upstream: tests/gateway/replay), though
# the converters read such files.
def test_a_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    line = '{"id": "a", "prompt": "p", "outcomes": {"m": {"score": 0.5}}}\n'
    bom = b"\xef\xbb\xbf"
    path = tmp_path / "t.jsonl"
    path.write_bytes(bom + line.encode())
    [record] = load_outcome_table(path)
    assert record.id == "a" and record.outcomes["m"].score == 0.5
    # Two such files put together (`cat`): the second's mark starts a line.
    path.write_bytes(bom + line.encode() + bom + line.replace('"a"', '"b"').encode())
    assert [r.id for r in load_outcome_table(path)] == ["a", "b"]
    assert parse_record("\ufeff" + line).id == "a"
    with pytest.raises(OutcomeTableError, match="not valid JSON"):
        parse_record(bom + bom[:2] + line.encode())  # a broken mark is still refused


def test_a_repeated_id_is_refused_naming_both_lines(tmp_path: Path) -> None:
    # Counted twice, the prompt would weigh double in training and evaluation.
    line = '{"id": "a", "prompt": "p", "outcomes": {"m": {"score": 0.5}}}\n'
    path = tmp_path / "t.jsonl"
    path.write_text(line + '{"id": "b", "prompt": "q", "outcomes": {"m": {"score": 1}}}\n' + line)
    with pytest.raises(
        OutcomeTableError, match=r"t\.jsonl:3: duplicate id 'a' \(first at .*t\.jsonl:1\)"
    ):
        load_outcome_table(path)


@pytest.mark.parametrize("field", ["score", "cost_usd", "latency_ms"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_non_finite_outcome_number_is_refused(field: str, value: float) -> None:
    # orjson writes inf and NaN as null: written out, the value would be silently lost.
    outcome = {"score": 0.5, field: value}
    with pytest.raises(OutcomeTableError, match=rf"outcomes\.m\.{field}"):
        validate_record({"id": "a", "prompt": "p", "outcomes": {"m": outcome}})


@pytest.mark.parametrize("cost_weight", [-0.5, 1e7, math.inf, math.nan])
def test_a_logged_cost_weight_the_gateway_would_refuse_is_refused_at_its_line(
    tmp_path: Path, cost_weight: float
) -> None:
    """A negative, huge or non-finite λ used to pass and fail late in `xrouter eval`, with
    no line to point at; it is bounded as the gateway bounds a request's (0 to 1e6)."""

    def record(rid: str, value: float) -> dict[str, object]:
        return {
            "id": rid,
            "prompt": "p",
            "outcomes": {"m": {"score": 1, "cost_usd": 0.1}},
            "logged": {"action": "m", "propensity": 0.5, "cost_weight": value},
        }

    with pytest.raises(OutcomeTableError, match=r"t\.jsonl: row 2: logged\.cost_weight"):
        validate_record(record("b", cost_weight), "t.jsonl: row 2")
    if math.isfinite(cost_weight):  # JSON has no inf or NaN
        path = tmp_path / "t.jsonl"
        lines = [json.dumps(record("a", 1e6)), json.dumps(record("b", cost_weight))]
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(OutcomeTableError, match=r"t\.jsonl:2: logged\.cost_weight"):
            load_outcome_table(path)
    for bound in (0.0, 1e6):
        logged = validate_record(record("a", bound)).logged
        assert logged is not None and logged.cost_weight == bound


def test_a_cost_no_prompt_ever_had_is_refused_at_its_line(tmp_path: Path) -> None:
    """A finite cost past MAX_USD (1e308: a sentinel, a unit slip) passed, and overflowed
    in evaluation's cost normalization, a numpy error with no line to point at."""

    def line(rid: str, cost: float) -> str:
        return json.dumps(
            {"id": rid, "prompt": "p", "outcomes": {"m": {"score": 1, "cost_usd": cost}}}
        )

    path = tmp_path / "t.jsonl"
    path.write_text(line("a", MAX_USD) + "\n" + line("b", 1e308) + "\n")
    with pytest.raises(
        OutcomeTableError,
        match=r"t\.jsonl:2: outcomes\.m\.cost_usd: Input should be less than or equal to 1000000000000",
    ):
        load_outcome_table(path)
    assert validate_record(json.loads(line("a", MAX_USD))).outcomes["m"].cost_usd == MAX_USD
