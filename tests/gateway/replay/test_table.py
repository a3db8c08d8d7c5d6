"""The replay index and the packaged demo table it serves by default."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.replay.table import ReplayTable, normalize_prompt
from router.outcomes import OutcomeRecord, OutcomeTableError
from tests.gateway.replay.conftest import demo_table_path
from tests.support.services import needs_shared_data

REPO_ROOT = Path(__file__).resolve().parents[3]
ROUTEPROFILE = REPO_ROOT.parent / "shared" / "data" / "routeprofile"
needs_routeprofile = needs_shared_data("routeprofile", "routing_test_data.json")


def _write(path: Path, records: list[dict[str, object]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def test_default_table_indexes_every_demo_record(demo_records: list[OutcomeRecord]) -> None:
    table = ReplayTable.load_default()
    assert len(table) == len(demo_records) == 600
    expected_models = list(dict.fromkeys(m for r in demo_records for m in r.outcomes))
    assert list(table.models) == expected_models
    assert len(table.models) == 8
    for rec in demo_records[::37]:
        for model, outcome in rec.outcomes.items():
            got = table.lookup(rec.text, model)
            assert got is not None
            assert got.response == outcome.response
            assert (got.prompt_tokens, got.completion_tokens) == (
                outcome.prompt_tokens,
                outcome.completion_tokens,
            )


def test_lookup_collapses_whitespace_and_misses_cleanly(demo_records: list[OutcomeRecord]) -> None:
    table = ReplayTable.load(demo_table_path())
    rec = demo_records[5]
    model = next(iter(rec.outcomes))
    mangled = "\n  " + rec.text.replace(" ", "  \t") + "  \n"
    assert table.lookup(mangled, model) == table.lookup(rec.text, model) is not None
    assert table.lookup(rec.text + " extra", model) is None
    assert table.lookup(rec.text, "no-such-model") is None
    assert not table.has_model("no-such-model")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": rec.text}]},
    ]
    assert table.lookup_messages(messages, model) == table.lookup(rec.text, model)


def test_messages_records_duplicates_and_missing_fields(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "t.jsonl",
        [
            {
                "id": "a",
                "messages": [
                    {"role": "user", "content": "first question"},
                    {"role": "assistant", "content": "ok"},
                    {"role": "user", "content": "What  is\n2+2?"},
                ],
                "outcomes": {
                    "m1": {"score": 1, "response": "4", "prompt_tokens": 9, "completion_tokens": 1},
                    "m2": {"score": 0},  # no response recorded: m2 falls back for this prompt
                },
            },
            {
                "id": "b",
                "prompt": "what is 2+2?",
                "outcomes": {"m1": {"score": 1, "response": "four!"}},
            },
            {
                "id": "dup",
                "prompt": "What is 2+2?",
                "outcomes": {"m1": {"score": 0, "response": "5"}},
            },
        ],
    )
    table = ReplayTable.load(path)
    assert table.models == ("m1", "m2")
    assert len(table) == 2  # the duplicate prompt is dropped: the first record wins
    hit = table.lookup("What is 2+2?", "m1")
    assert hit is not None and hit.response == "4" and hit.prompt_tokens == 9
    assert table.lookup("What is 2+2?", "m2") is None
    # No recorded token counts: estimated from the text.
    est = table.lookup("what is 2+2?", "m1")
    assert est is not None
    assert est.completion_tokens == math.ceil(len("four!") / 4)
    assert est.prompt_tokens == math.ceil(len("what is 2+2?") / 4)


def test_malformed_table_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"id": "a", "prompt": "p", "outcomes": {"m": {"score": 0.5}}}\n\n{"id": "b"}\n'
    )
    with pytest.raises(OutcomeTableError, match=r"bad\.jsonl:3"):
        ReplayTable.load(path)


def test_a_table_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    record = {"id": "a", "prompt": "p", "outcomes": {"m": {"score": 1, "response": "yes"}}}
    path.write_bytes(b"\xef\xbb\xbf" + orjson.dumps(record) + b"\n")
    answer = ReplayTable.load(path).lookup("p", "m")
    assert answer is not None and answer.response == "yes"


def test_normalize_prompt() -> None:
    assert normalize_prompt("  a \n\t b  ") == "a b"


# -- the packaged demo table ---------------------------------------------------------------
def test_demo_table_is_small_and_well_formed(demo_records: list[OutcomeRecord]) -> None:
    path = demo_table_path()
    assert path.stat().st_size < 4_000_000
    ids = [r.id for r in demo_records]
    assert len(set(ids)) == len(ids)
    for rec in demo_records:
        assert rec.task is not None and re.fullmatch(
            rf"rp-{re.escape(rec.task)}-[0-9a-f]{{10}}", rec.id
        )
        assert len(rec.outcomes) == 8
    assert (REPO_ROOT / "router" / "assets" / "DEMO_DATA_LICENSE.md").read_text().count("MIT") >= 2


@needs_routeprofile
def test_demo_table_matches_source_scores_and_prices(demo_records: list[OutcomeRecord]) -> None:
    items = json.loads((ROUTEPROFILE / "routing_test_data.json").read_text())
    prices = json.loads((ROUTEPROFILE / "candidate_models.json").read_text())
    by_prompt = {r.prompt: r for r in demo_records}
    for item in items[::25]:
        rec = by_prompt[item["query"]]
        assert rec.task == item["task_name"]
        for model, res in item["model_performance"].items():
            out = rec.outcomes[model]
            assert out.response == res["response"]
            assert out.score == min(1.0, max(0.0, res["task_performance"]))
            expected = (
                res["prompt_tokens"] * prices[model]["input_price"]
                + res["completion_tokens"] * prices[model]["output_price"]
            ) / 1e6
            assert out.cost_usd == pytest.approx(expected, rel=1e-9, abs=1e-15)


@needs_routeprofile
def test_build_script_reproduces_the_packaged_table(tmp_path: Path) -> None:
    out = tmp_path / "demo.jsonl"
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "build_demo_table.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        cwd=REPO_ROOT,
    )
    assert out.read_bytes() == demo_table_path().read_bytes()
