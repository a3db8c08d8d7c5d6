from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from gateway.cli import main as xrouter_main
from pricing import estimate_tokens
from router.outcomes import load_outcome_table
from tests.support.routerbench import rb_row, write_routerbench
from tests.support.services import needs_shared_data
from training.datasets.common import ConversionError, unwrap_literal_text
from training.datasets.convert import convert, load_converted, main
from training.datasets.routeprofile import routeprofile_id

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared" / "data"
PRICES = {
    "small": {"input_price": 0.2, "output_price": 0.4},
    "large": {"input_price": 1.0, "output_price": 3.0},
}


def usd(prompt_tokens: int, completion_tokens: int, model: str) -> float:
    p = PRICES[model]
    return (prompt_tokens * p["input_price"] + completion_tokens * p["output_price"]) / 1e6


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# -- RouterBench -------------------------------------------------------------------------------


def test_routerbench_unwraps_literals_and_drops_incomplete_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A missing cost is written as a missing score is (it was "not a number" for "null").
    rows = [rb_row("t.1"), rb_row("t.2", b=""), rb_row("t.3", a="0.0", b="1.0")]
    rows += [rb_row(f"t.{i}", cost_b=cell) for i, cell in enumerate(["null", "None", "NaN"], 4)]
    path = write_routerbench(tmp_path / "rb.csv", rows)
    with caplog.at_level("INFO"):
        records = load_converted("routerbench", [path])
    assert [r.id for r in records] == ["t.1", "t.3"]
    assert "rb.csv: dropped 4 row(s) with a missing model outcome (missing 'b': 4)" in caplog.text
    r = records[0]
    assert r.prompt == "Which is it?\nA) x\nB) y\nAnswer:"
    assert r.task == "arc"
    assert r.outcomes["m/a"].score == 1.0 and r.outcomes["b"].score == 0.0
    assert r.outcomes["m/a"].cost_usd == pytest.approx(0.0001)
    assert r.outcomes["m/a"].response == "A\n"
    assert r.outcomes["b"].response == "plain text"


def test_routerbench_errors_name_file_and_line(tmp_path: Path) -> None:
    path = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1"), rb_row("t.2", a="maybe")])
    with pytest.raises(ConversionError, match=r"rb\.csv:3: column 'm/a': score 'maybe'"):
        load_converted("routerbench", [path])
    bad = write_routerbench(tmp_path / "neg.csv", [rb_row("t.1", cost_b="-1")])
    with pytest.raises(ConversionError, match=r"neg\.csv:2: .*negative cost"):
        load_converted("routerbench", [bad])
    dup = write_routerbench(tmp_path / "dup.csv", [rb_row("t.1"), rb_row("t.1")])
    with pytest.raises(
        ConversionError, match=r"dup\.csv:3: duplicate id 't\.1' \(first at .*dup\.csv:2\)"
    ):
        load_converted("routerbench", [dup])


def test_routerbench_a_bad_cell_after_a_missing_one_is_an_error(tmp_path: Path) -> None:
    # The row's first model has no score, so the row is dropped; its second model's cost
    # was not read at all, and the row went out with the missing ones.
    path = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1", a="", cost_b="-1")])
    with pytest.raises(ConversionError, match=r"rb\.csv:2: .*negative cost"):
        load_converted("routerbench", [path])


@pytest.mark.parametrize("line", ["p2,1", "p2,1,0,1"])
def test_csv_rows_of_another_width_than_the_header_are_errors(tmp_path: Path, line: str) -> None:
    # A short row was read as missing scores and dropped; a long one lost its extra cell.
    path = tmp_path / "eval.csv"
    path.write_text(f"prompt,small,large\np1,1,0\n{line}\np3,0,1\n")
    prices = write_json(tmp_path / "p.json", PRICES)
    width = len(line.split(","))
    with pytest.raises(
        ConversionError, match=rf"eval\.csv:3: {width} fields where the header has 3"
    ):
        load_converted("routellm", [path], prices)
    bench = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1")])
    with bench.open("a") as fh:
        fh.write("t.2,short\n")
    with pytest.raises(ConversionError, match=r"rb\.csv:3: 2 fields where the header has"):
        load_converted("routerbench", [bench])


def test_routerbench_refuses_a_model_without_its_cost_column(tmp_path: Path) -> None:
    # Dropping `b|total_cost` used to drop model b from the table without a word.
    src = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1"), rb_row("t.2")])
    rows = list(csv.DictReader(src.open(newline="", encoding="utf-8")))
    header = [c for c in rows[0] if c != "b|total_cost"]
    with (tmp_path / "nocost.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(ConversionError, match=r"nocost\.csv:1: model 'b' has no cost column"):
        load_converted("routerbench", [tmp_path / "nocost.csv"])
    # Without its response column either, the bare 0/1 column is still recognized.
    header = [c for c in header if c != "b|model_response"]
    with (tmp_path / "bare.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(
        ConversionError, match=r"bare\.csv:1: column 'b' holds 0/1 scores but there is no"
    ):
        load_converted("routerbench", [tmp_path / "bare.csv"])
    assert (
        main(["routerbench", str(tmp_path / "bare.csv"), "--out", str(tmp_path / "t.jsonl")]) == 2
    )
    assert not (tmp_path / "t.jsonl").exists()


def test_routerbench_files_of_different_models_are_refused_together(tmp_path: Path) -> None:
    # Converted together, they made a table of two pools without a word: eval refused it
    # later (a record without a model's outcome) and train narrowed its pool unsaid.
    full = write_routerbench(tmp_path / "full.csv", [rb_row("t.1"), rb_row("t.2")])
    rows = list(csv.DictReader(full.open(newline="", encoding="utf-8")))
    header = [c for c in rows[0] if not c.startswith("b")]
    with (tmp_path / "fewer.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        w.writeheader()
        w.writerows({**r, "sample_id": f"u.{i}"} for i, r in enumerate(rows))
    with pytest.raises(
        ConversionError,
        match=r"fewer\.csv:1: its models differ from .*full\.csv's \(it lacks 'b'\)",
    ):
        load_converted("routerbench", [full, tmp_path / "fewer.csv"])
    out = tmp_path / "t.jsonl"
    assert main(["routerbench", str(full), str(tmp_path / "fewer.csv"), "--out", str(out)]) == 2
    assert not out.exists()
    assert len(load_converted("routerbench", [tmp_path / "fewer.csv"])) == 2  # alone, fine


def test_routerbench_model_names_may_hold_a_bar(tmp_path: Path) -> None:
    # `org|model` (with `org|model|total_cost`) used to be left out of the table unsaid.
    src = tmp_path / "rb.csv"
    src.write_text(
        "sample_id,prompt,org|m,org|m|total_cost,org|m|model_response,b,b|total_cost\n"
        "t.1,q1,1,0.1,yes,0,0.01\n"
        "t.2,q2,0,0.1,no,1,0.01\n",
        encoding="utf-8",
    )
    records = load_converted("routerbench", [src])
    assert [list(r.outcomes) for r in records] == [["org|m", "b"], ["org|m", "b"]]
    assert records[0].outcomes["org|m"].cost_usd == 0.1
    assert records[1].outcomes["org|m"].response == "no"
    # A bar-named score column with no cost column is refused like any other.
    bare = tmp_path / "bare.csv"
    bare.write_text("sample_id,prompt,org|x,b,b|total_cost\nt.1,q1,1,0,0.01\n", encoding="utf-8")
    with pytest.raises(ConversionError, match=r"bare\.csv:1: column 'org\|x' holds 0/1 scores"):
        load_converted("routerbench", [bare])


def test_routerbench_a_stray_cell_does_not_hide_a_model_without_costs(tmp_path: Path) -> None:
    # A score column without its cost column, one of whose cells is not a score, used to
    # be skipped as "not a model" (and the model left out) instead of refused.
    src = tmp_path / "rb.csv"
    src.write_text(
        "sample_id,prompt,a,a|total_cost,b,notes\n"
        "t.1,q1,1,0.1,1,free text\n"
        "t.2,q2,0,0.1,N/A,yes\n"
        "t.3,q3,1,0.1,0,more text\n",
        encoding="utf-8",
    )
    with pytest.raises(
        ConversionError,
        match=r"rb\.csv:1: column 'b' holds 0/1 scores \(all but 'N/A' at line 3\) but there "
        r"is no 'b\|total_cost' column",
    ):
        load_converted("routerbench", [src])
    # A text column (`notes`: mostly not scores) is still not a model.
    src.write_text(
        "sample_id,prompt,a,a|total_cost,notes\n"
        "t.1,q1,1,0.1,free text\n"
        "t.2,q2,0,0.1,yes\n"
        "t.3,q3,1,0.1,more text\n",
        encoding="utf-8",
    )
    assert len(load_converted("routerbench", [src])) == 3


@pytest.mark.parametrize("cost", ["inf", "-inf", "1e999"])
def test_routerbench_refuses_a_non_finite_cost(tmp_path: Path, cost: str) -> None:
    # Written out, orjson would turn it into "cost_usd": null.
    src = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1"), rb_row("t.2", cost_b=cost)])
    with pytest.raises(ConversionError, match=r"rb\.csv:3: column 'b\|total_cost': .*not a finite"):
        load_converted("routerbench", [src])


def test_routerbench_refuses_a_cost_no_prompt_ever_had(tmp_path: Path) -> None:
    # 1e308 is finite: it was converted, and overflowed in `xrouter eval`.
    src = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1"), rb_row("t.2", cost_b="1e308")])
    with pytest.raises(ConversionError, match=r"rb\.csv:3: outcomes\.b\.cost_usd: .*less than"):
        load_converted("routerbench", [src])


def test_unwrap_literal_text() -> None:
    assert unwrap_literal_text("['a \"b\"\\nc']") == 'a "b"\nc'
    assert unwrap_literal_text("['first', 'last']") == "last"
    assert unwrap_literal_text("[1, 2]") == "[1, 2]"
    assert unwrap_literal_text("[not a literal") == "[not a literal"


@needs_shared_data("routerbench_zs")
def test_routerbench_real_file() -> None:
    records = load_converted("routerbench", [SHARED / "routerbench_zs" / "mbpp_train.csv"])
    assert len(records) == 299
    assert all(len(r.outcomes) == 11 for r in records)
    assert not any(r.prompt and r.prompt.startswith("['") for r in records)
    gpt4 = [r.outcomes["gpt-4-1106-preview"] for r in records]
    assert all(o.cost_usd and o.cost_usd > 0 and o.response for o in gpt4)


# -- RouterDC ----------------------------------------------------------------------------------


def test_routerdc_estimates_costs_and_says_so(tmp_path: Path) -> None:
    question = "What is 2 + 2? Explain." * 3
    data = write_json(
        tmp_path / "dc.json",
        [{"question": question, "scores": {"small": 1, "large": 0.5}, "cluster_id": 3}],
    )
    prices = write_json(tmp_path / "prices.json", PRICES)
    [r] = load_converted("routerdc", [data], prices, completion_tokens=100)
    pt = math.ceil(len(question) / 4)
    assert r.task == "cluster-3" and r.prompt == question and r.id.startswith("dc-")
    small = r.outcomes["small"]
    assert (small.prompt_tokens, small.completion_tokens) == (pt, 100)
    assert small.cost_usd == pytest.approx(usd(pt, 100, "small"))
    assert small.model_extra == {"cost_estimated": True}
    assert r.outcomes["large"].score == 0.5


def test_routerdc_needs_prices_for_every_model(tmp_path: Path) -> None:
    data = write_json(tmp_path / "dc.json", [{"question": "q", "scores": {"small": 1, "other": 0}}])
    with pytest.raises(ConversionError, match="no price for model\\(s\\) other"):
        load_converted("routerdc", [data], write_json(tmp_path / "p.json", PRICES))
    with pytest.raises(ConversionError, match="pass a price table"):
        load_converted("routerdc", [data])
    bad = write_json(tmp_path / "bad.json", [{"question": "q", "scores": {"small": 2}}])
    with pytest.raises(ConversionError, match=r"bad\.json: item 0: scores\.small.*outside"):
        load_converted("routerdc", [bad], write_json(tmp_path / "p2.json", PRICES))


def test_routerdc_keeps_a_repeated_question_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Its id is a hash of the question: the repeat is the same prompt, kept once (the first).
    items = [
        {"question": "What is 2+2?", "scores": {"small": 1, "large": 1}},
        {"question": "What is 3+3?", "scores": {"small": 0, "large": 1}},
        {"question": "What is 2+2?", "scores": {"small": 0, "large": 0}},
    ]
    data = write_json(tmp_path / "dc.json", items)
    with caplog.at_level("INFO"):
        records = load_converted("routerdc", [data], write_json(tmp_path / "p.json", PRICES))
    assert [r.prompt for r in records] == ["What is 2+2?", "What is 3+3?"]
    assert records[0].outcomes["small"].score == 1
    assert "dropped 1 repeated question(s)" in caplog.text


def test_routerdc_drops_and_counts_items_missing_a_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An item without one model's score used to become a record without that model's
    outcome: a table `xrouter eval` refuses and `xrouter train` narrows (dropping the model
    for every prompt). It is dropped and counted, as the CSV converters drop a row with a
    missing score."""
    items = [
        {"question": "q1", "scores": {"small": 1, "large": 1}},
        {"question": "q2", "scores": {"small": 0}},
        {"question": "q3", "scores": {"small": 0, "large": None}},  # null: missing
        {"question": "q4", "scores": {"large": 1, "small": 1}},
        {"question": "q5", "scores": {"small": 1, "large": 0}},
    ]
    data = write_json(tmp_path / "dc.json", items)
    prices = write_json(tmp_path / "p.json", PRICES)
    with caplog.at_level("INFO"):
        records = load_converted("routerdc", [data], prices)
    assert [r.prompt for r in records] == ["q1", "q4", "q5"]
    assert all(set(r.outcomes) == {"small", "large"} for r in records)
    assert "dc.json: dropped 2 item(s) with a missing model outcome (missing 'large': 2)" in (
        caplog.text
    )
    # A model only some items score is an error naming it, not a model left out.
    items.append({"question": "q6", "scores": {"small": 1, "large": 0, "other": 1}})
    extra = write_json(tmp_path / "extra.json", items)
    with pytest.raises(
        ConversionError, match=r"extra\.json: item 5: model 'other' has an outcome in only 1 of 6"
    ):
        load_converted("routerdc", [extra], prices)


@needs_shared_data("llmrouter_dcrouter")
@pytest.mark.parametrize("fmt", ["routerdc", "routeprofile"])
def test_json_nested_too_deeply_is_one_line(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    prices = write_json(tmp_path / "p.json", PRICES)
    with pytest.raises(ConversionError, match=r"deep\.json: JSON nested too deeply"):
        load_converted(fmt, [path], prices)


def test_routerdc_real_rows(tmp_path: Path) -> None:
    items = json.loads((SHARED / "llmrouter_dcrouter" / "train.json").read_text())[:25]
    data = write_json(tmp_path / "dc.json", items)
    records = load_converted("routerdc", [data], SHARED / "llmrouter_dcrouter" / "default_llm.json")
    assert len(records) == 25
    assert all(len(r.outcomes) == 9 for r in records)
    assert len({r.id for r in records}) == 25


# -- RouteLLM ----------------------------------------------------------------------------------


def test_routellm_detects_model_columns(tmp_path: Path) -> None:
    path = tmp_path / "eval.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["idx", "prompt", "small", "large", "category", "notes"])
        w.writerow(["1", "What is love?", "True", "False", "philosophy", "free text"])
        w.writerow(["2", "Add 2 and 3", "0", "1", "math", "x"])
        w.writerow(["3", "Skipped", "", "1", "math", "y"])
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "models:\n  small: {input: 0.2, output: 0.4}\n  large: {input: 1.0, output: 3.0}\n"
    )
    records = load_converted("routellm", [path], prices, completion_tokens=50)
    assert [r.id for r in records] == ["1", "2"]
    assert [r.task for r in records] == ["philosophy", "math"]
    assert set(records[0].outcomes) == {"small", "large"}
    assert records[0].outcomes["small"].score == 1.0 and records[1].outcomes["small"].score == 0.0
    pt = estimate_tokens("What is love?")
    assert records[0].outcomes["large"].cost_usd == pytest.approx(usd(pt, 50, "large"))


def test_routellm_keeps_a_repeated_prompt_once(tmp_path: Path) -> None:
    """RouteLLM's MMLU files (no id column) repeat about a hundred questions, within a
    subject and across subjects (clinical_knowledge and college_medicine): converting them
    failed on the first repeat with "duplicate id". A prompt is one prompt: kept once."""
    header = "prompt,mistralai/Mixtral-8x7B-Instruct-v0.1,gpt-4-1106-preview\n"
    q1 = '"Which cells in the blood do not have a nucleus?\nA. Lymphocyte\nAnswer:"'
    q2 = '"The coronal suture joins the\nA. frontal and parietal bones.\nAnswer:"'
    a = tmp_path / "mmlu_clinical_knowledge.csv"
    a.write_text(f"{header}{q1},True,True\n{q2},False,True\n{q1},True,True\n", encoding="utf-8")
    b = tmp_path / "mmlu_college_medicine.csv"
    b.write_text(f"{header}{q2},False,True\n", encoding="utf-8")
    prices = write_json(
        tmp_path / "p.json",
        {
            "mistralai/Mixtral-8x7B-Instruct-v0.1": {"input_price": 0.6, "output_price": 0.6},
            "gpt-4-1106-preview": {"input_price": 10.0, "output_price": 30.0},
        },
    )
    records = load_converted("routellm", [a, b], prices)
    assert [r.prompt.split("?")[0] for r in records if r.prompt] == [
        "Which cells in the blood do not have a nucleus",
        "The coronal suture joins the\nA. frontal and parietal bones.\nAnswer:",
    ]
    assert len({r.id for r in records}) == 2
    # An id the source gives is the source's word: repeated, it is still an error.
    c = tmp_path / "ids.csv"
    c.write_text("id,prompt,small\n7,q,1\n7,q again,0\n", encoding="utf-8")
    with pytest.raises(ConversionError, match=r"ids\.csv:3: duplicate id '7'"):
        load_converted("routellm", [c], write_json(tmp_path / "p2.json", PRICES))


def test_routellm_refuses_a_numeric_column_outside_0_1(tmp_path: Path) -> None:
    # A model scored 0..10 would otherwise be skipped as "not a correctness column".
    path = tmp_path / "eval.csv"
    path.write_text("prompt,small,large,notes\nq1,1,7,free text\nq2,0,10,x\n")
    prices = write_json(tmp_path / "p.json", PRICES)
    with pytest.raises(ConversionError, match=r"eval\.csv:2: column 'large' holds numbers outside"):
        load_converted("routellm", [path], prices)


def test_routellm_refuses_a_stray_cell_in_a_model_column(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One 'N/A' in gpt-4's column used to drop gpt-4 from the table without a word: it is
    an error at its line, as a bad cell in a RouterBench model column is."""
    path = tmp_path / "eval.csv"
    path.write_text("prompt,gpt-4,mixtral\nq1,1,0\nq2,0,1\nq3,N/A,1\nq4,1,1\n")
    prices = write_json(
        tmp_path / "p.json",
        {m: {"input_price": 1.0, "output_price": 2.0} for m in ("gpt-4", "mixtral")},
    )
    with pytest.raises(
        ConversionError, match=r"eval\.csv:4: column 'gpt-4': score 'N/A' is not a number"
    ):
        load_converted("routellm", [path], prices)
    # Half scores, half not: a model's column all the same when the price table names it.
    path.write_text("prompt,gpt-4,mixtral\nq1,1,0\nq2,error,1\n")
    with pytest.raises(ConversionError, match=r"eval\.csv:3: column 'gpt-4': score 'error'"):
        load_converted("routellm", [path], prices)
    # Text columns are still skipped; a missing score (empty, null) drops its row.
    path.write_text("prompt,gpt-4,mixtral,notes\nq1,1,0,yes\nq2,null,1,free text\nq3,0,,x\n")
    with caplog.at_level("INFO"):
        records = load_converted("routellm", [path], prices)
    assert [r.prompt for r in records] == ["q1"]
    assert set(records[0].outcomes) == {"gpt-4", "mixtral"}
    assert (
        "eval.csv: dropped 2 row(s) with a missing model outcome (missing 'gpt-4': 1, "
        "'mixtral': 1)" in caplog.text
    )


def test_routellm_without_prompt_column(tmp_path: Path) -> None:
    path = tmp_path / "eval.csv"
    path.write_text("text,small\nhello,1\n")
    with pytest.raises(ConversionError, match=r"eval\.csv:1: no prompt column"):
        load_converted("routellm", [path], write_json(tmp_path / "p.json", PRICES))


# -- RouteProfile ------------------------------------------------------------------------------


def test_routeprofile_literal_and_object_performance(tmp_path: Path) -> None:
    perf = {
        "small": {
            "response": "A",
            "prompt_tokens": 10,
            "completion_tokens": 2,
            "success": True,
            "task_performance": 1.3,
        },
        "large": {
            "response": "B",
            "prompt_tokens": 12,
            "completion_tokens": 4,
            "success": False,
            "task_performance": None,
        },
    }
    data = write_json(
        tmp_path / "rp.json",
        [
            {"task_name": "mmlu", "query": "q1", "model_performance": perf},
            {"task_name": "gsm8k", "query": "q2", "model_performance": repr(perf)},
        ],
    )
    records = load_converted("routeprofile", [data], write_json(tmp_path / "p.json", PRICES))
    assert [r.id for r in records] == [
        routeprofile_id("mmlu", "q1"),
        routeprofile_id("gsm8k", "q2"),
    ]
    for r in records:
        assert r.outcomes["small"].score == 1.0  # clipped
        assert r.outcomes["large"].score == 0.0  # a failed call with no score
        assert r.outcomes["large"].cost_usd == pytest.approx(usd(12, 4, "large"))
        assert r.outcomes["small"].model_extra == {"success": True}
    # No score for a call that did not fail is missing (the item dropped), not a 0.
    unscored = {**perf, "large": {**perf["large"], "success": True}}
    path = write_json(tmp_path / "rp2.json", [
        {"task_name": "mmlu", "query": "q1", "model_performance": perf},
        {"task_name": "mmlu", "query": "q2", "model_performance": unscored},
        {"task_name": "mmlu", "query": "q3", "model_performance": perf},
    ])  # fmt: skip
    kept = load_converted("routeprofile", [path], write_json(tmp_path / "p.json", PRICES))
    assert [r.id for r in kept] == [routeprofile_id("mmlu", q) for q in ("q1", "q3")]


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_routeprofile_refuses_a_non_finite_score(tmp_path: Path, value: float) -> None:
    # Clipped, NaN would become 0 and Infinity 1: made-up scores.
    perf = {"small": {"prompt_tokens": 1, "completion_tokens": 2, "task_performance": value}}
    data = write_json(
        tmp_path / "rp.json", [{"task_name": "t", "query": "q", "model_performance": perf}]
    )
    with pytest.raises(ConversionError, match=r"item 0: model_performance\.small: .*not a finite"):
        load_converted("routeprofile", [data], write_json(tmp_path / "p.json", PRICES))


@pytest.mark.parametrize(
    ("perf", "match"),
    [
        ("{[1]: 2}", "not a Python literal"),  # an unhashable key
        ("{'small': {}, 1: {}}", "keys must be model names"),
    ],
)
def test_routeprofile_malformed_performance_is_one_line(
    tmp_path: Path, perf: str, match: str
) -> None:
    data = write_json(
        tmp_path / "rp.json", [{"task_name": "t", "query": "q", "model_performance": perf}]
    )
    with pytest.raises(ConversionError, match=rf"item 0: model_performance.*{match}"):
        load_converted("routeprofile", [data], write_json(tmp_path / "p.json", PRICES))


def test_routeprofile_bad_tokens(tmp_path: Path) -> None:
    perf = {"small": {"prompt_tokens": -1, "completion_tokens": 2, "task_performance": 1}}
    data = write_json(
        tmp_path / "rp.json", [{"task_name": "t", "query": "q", "model_performance": perf}]
    )
    with pytest.raises(ConversionError, match=r"item 0: model_performance\.small: prompt_tokens"):
        load_converted("routeprofile", [data], write_json(tmp_path / "p.json", PRICES))


def rp_perf(*models: str) -> dict[str, dict[str, object]]:
    return {
        m: {"response": "A", "prompt_tokens": 10, "completion_tokens": 2, "task_performance": 1}
        for m in models
    }


def test_routeprofile_drops_and_counts_items_missing_a_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Kept, such an item made a table `xrouter eval` refuses and `xrouter train` narrows.
    items: list[dict[str, object]] = [
        {"task_name": "t", "query": "q1", "model_performance": rp_perf("small", "large")},
        {"task_name": "t", "query": "q2", "model_performance": rp_perf("small")},
        {"task_name": "t", "query": "q3", "model_performance": repr(rp_perf("large", "small"))},
    ]
    data = write_json(tmp_path / "rp.json", items)
    prices = write_json(tmp_path / "p.json", PRICES)
    with caplog.at_level("INFO"):
        records = load_converted("routeprofile", [data], prices)
    assert [r.prompt for r in records] == ["q1", "q3"]
    assert all(set(r.outcomes) == {"small", "large"} for r in records)
    assert "rp.json: dropped 1 item(s) with a missing model outcome (missing 'large': 1)" in (
        caplog.text
    )
    items[1]["model_performance"] = rp_perf("small", "large", "other")
    extra = write_json(tmp_path / "extra.json", items)
    with pytest.raises(
        ConversionError, match=r"extra\.json: item 1: model 'other' has an outcome in only 1 of 3"
    ):
        load_converted("routeprofile", [extra], prices)


def test_routeprofile_keeps_a_repeated_query_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Its id hashes the task and query: the repeat used to be a "duplicate id" error.
    perf = rp_perf("small", "large")
    items = [
        {"task_name": "t", "query": "q1", "model_performance": perf},
        {"task_name": "t", "query": "q2", "model_performance": perf},
        {"task_name": "t", "query": "q1", "model_performance": rp_perf("large", "small")},
        {"task_name": "u", "query": "q1", "model_performance": perf},  # another task's
    ]
    data = write_json(tmp_path / "rp.json", items)
    with caplog.at_level("INFO"):
        records = load_converted("routeprofile", [data], write_json(tmp_path / "p.json", PRICES))
    assert [(r.task, r.prompt) for r in records] == [("t", "q1"), ("t", "q2"), ("u", "q1")]
    assert list(records[0].outcomes) == ["small", "large"]  # the first occurrence's
    assert "rp.json: dropped 1 repeated prompt(s) (kept the first occurrence)" in caplog.text


@needs_shared_data("routeprofile")
def test_routeprofile_real_rows(tmp_path: Path) -> None:
    items = json.loads((SHARED / "routeprofile" / "routing_test_data.json").read_text())[::50]
    data = write_json(tmp_path / "rp.json", items)
    records = load_converted(
        "routeprofile", [data], SHARED / "routeprofile" / "candidate_models.json"
    )
    assert len(records) == 12 and len({r.task for r in records}) == 12
    for r in records:
        assert len(r.outcomes) == 8
        assert all(0.0 <= o.score <= 1.0 and o.cost_usd is not None for o in r.outcomes.values())


# -- ledger export -----------------------------------------------------------------------------


def ledger_line(rid: str, **outcome: object) -> str:
    return json.dumps(
        {
            "id": rid,
            "messages": [{"role": "user", "content": "hello"}],
            "outcomes": {"small": {"score": 1.0, **outcome}},
            "logged": {
                "action": "small",
                "propensity": 0.25,
                "cost_weight": 0.1,
                "policy": "compact",
            },
        }
    )


def test_ledger_validates_and_fills_costs(tmp_path: Path) -> None:
    path = tmp_path / "export.jsonl"
    path.write_text(
        ledger_line("a", cost_usd=0.01)
        + "\n\n"
        + ledger_line("b", prompt_tokens=100, completion_tokens=10)
        + "\n"
    )
    records = load_converted("ledger", [path], write_json(tmp_path / "p.json", PRICES))
    assert [r.id for r in records] == ["a", "b"]
    assert records[1].outcomes["small"].cost_usd == pytest.approx(usd(100, 10, "small"))
    assert records[0].logged is not None and records[0].logged.propensity == 0.25
    assert records[1].text == "hello"


def test_ledger_errors(tmp_path: Path) -> None:
    no_cost = tmp_path / "a.jsonl"
    no_cost.write_text(ledger_line("a") + "\n")
    with pytest.raises(ConversionError, match=r"a\.jsonl:1: outcomes\.small has no cost_usd"):
        load_converted("ledger", [no_cost])
    unlogged = tmp_path / "b.jsonl"
    unlogged.write_text(
        ledger_line("a", cost_usd=0.1)
        + "\n"
        + json.dumps({"id": "b", "prompt": "p", "outcomes": {"x": {"score": 1}}})
        + "\n"
    )
    with pytest.raises(ConversionError, match=r"b\.jsonl:2: no `logged`"):
        load_converted("ledger", [unlogged])
    broken = tmp_path / "c.jsonl"
    broken.write_text(ledger_line("a", cost_usd=0.1) + "\n{oops\n")
    with pytest.raises(ConversionError, match=r"c\.jsonl:2: not valid JSON"):
        load_converted("ledger", [broken])
    # 0, and a probability so small its importance weight (past 1e12) would overflow the
    # trainer's float32 into non-finite weights.
    for value in ("0", "1e-46"):
        bad_prop = tmp_path / "d.jsonl"
        bad_prop.write_text(ledger_line("a", cost_usd=0.1).replace("0.25", value) + "\n")
        with pytest.raises(ConversionError, match=r"d\.jsonl:1: logged\.propensity"):
            load_converted("ledger", [bad_prop])


def test_ledger_refuses_a_cost_weight_the_gateway_would_refuse(tmp_path: Path) -> None:
    # A negative λ used to pass here and fail late in `xrouter eval`, with no line.
    for value in ("-0.5", "1e7"):
        path = tmp_path / "e.jsonl"
        bad = ledger_line("b", cost_usd=0.1).replace(
            '"cost_weight": 0.1', f'"cost_weight": {value}'
        )
        path.write_text(ledger_line("a", cost_usd=0.1) + "\n" + bad + "\n")
        with pytest.raises(ConversionError, match=r"e\.jsonl:2: logged\.cost_weight"):
            load_converted("ledger", [path])


# -- entry points ------------------------------------------------------------------------------


def test_convert_writes_a_table_and_cli_reports_errors(tmp_path: Path, capsys) -> None:
    src = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1"), rb_row("t.2")])
    out = tmp_path / "out" / "table.jsonl"
    assert convert("routerbench", [src], out) == 2
    assert [r.id for r in load_outcome_table(out)] == ["t.1", "t.2"]
    assert main(["routerbench", str(src), "--out", str(tmp_path / "t2.jsonl")]) == 0
    assert "wrote 2 records" in capsys.readouterr().out
    assert (
        main(["routerdc", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x.jsonl")]) == 2
    )
    assert "no such file" in capsys.readouterr().err
    # A directory is said to be one (it was "no such file").
    assert main(["routerdc", str(tmp_path), "--out", str(tmp_path / "x.jsonl")]) == 2
    assert f"{tmp_path}: a directory, not a file" in capsys.readouterr().err
    # There, but not a file of records (it was "no such file" too).
    assert main(["ledger", "/dev/null", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "/dev/null: not a regular file" in capsys.readouterr().err
    with pytest.raises(ConversionError, match="unknown format"):
        load_converted("nope", [src])


def test_xrouter_convert_is_the_same_command(tmp_path: Path, capsys) -> None:
    src = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1"), rb_row("t.2"), rb_row("t.3")])
    out = tmp_path / "t.jsonl"
    assert xrouter_main(["convert", "routerbench", str(src), "--out", str(out)]) == 0
    assert "wrote 3 records" in capsys.readouterr().out
    assert [r.id for r in load_outcome_table(out)] == ["t.1", "t.2", "t.3"]
    bad = ["convert", "routerdc", str(tmp_path / "missing.json"), "--out", str(out)]
    assert xrouter_main(bad) == 2
    assert "no such file" in capsys.readouterr().err


def test_unreadable_inputs_and_price_tables_are_one_line_errors(tmp_path: Path, capsys) -> None:
    binary = tmp_path / "bin.dat"
    binary.write_bytes(b"\xff\xfe\x00\x01\x89PNG")
    questions = write_json(tmp_path / "dc.json", [{"question": "q", "scores": {"small": 1}}])
    prices = write_json(tmp_path / "p.json", PRICES)
    out = ["--out", str(tmp_path / "t.jsonl")]
    cases = [
        # A price table that is missing, a directory, or not text.
        (["routerdc", str(questions), "--prices", str(tmp_path / "nope.json")], "nope.json: cannot read the price table"),
        (["routerdc", str(questions), "--prices", str(tmp_path)], "cannot read the price table"),
        (["routerdc", str(questions), "--prices", str(binary)], "bin.dat: cannot read the price table"),
        # Inputs that are not UTF-8 text.
        (["routerbench", str(binary)], "bin.dat: cannot read"),
        (["routellm", str(binary), "--prices", str(prices)], "bin.dat: cannot read"),
        (["routerdc", str(binary), "--prices", str(prices)], "bin.dat: cannot read"),
        # An output that cannot be written.
        (["routerdc", str(questions), "--prices", str(prices), "--out", str(tmp_path)], "Is a directory"),
    ]  # fmt: skip
    for argv, needle in cases:
        assert main([*out, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and needle in err and "Traceback" not in err, argv
    with pytest.raises(ConversionError, match="cannot read the price table"):
        load_converted("routerdc", [questions], tmp_path / "nope.json")


def test_a_bad_price_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    """pydantic's multi-line error text (with a documentation link) used to spill over the
    CLI's one-line error; both price-table layouts now name the field and the problem."""
    questions = write_json(tmp_path / "dc.json", [{"question": "q", "scores": {"small": 1}}])
    negative = write_json(tmp_path / "neg.json", {"small": {"input_price": -1, "output_price": 1}})
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("models:\n  small: {input: 1}\n", encoding="utf-8")
    cases = [
        (negative, "neg.json: bad price for 'small': input: Input should be greater than or equal to 0"),
        (catalog, "catalog.yaml: bad price for 'small': output: Field required"),
    ]  # fmt: skip
    for prices, needle in cases:
        argv = ["routerdc", str(questions), "--prices", str(prices)]
        assert main([*argv, "--out", str(tmp_path / "t.jsonl")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.endswith(f"/{needle}\n"), err
        assert err.count("\n") == 1, err


def test_a_byte_order_mark_is_skipped(tmp_path: Path) -> None:
    """Files saved by Excel or a Windows tool start with a UTF-8 byte order mark: read as
    part of the first column's name it made `sample_id` (or `prompt`) "missing", and a
    JSON file "not valid JSON"."""
    bom = "\ufeff"

    def with_bom(path: Path) -> Path:
        path.write_text(bom + path.read_text(encoding="utf-8"), encoding="utf-8")
        return path

    prices = with_bom(write_json(tmp_path / "p.json", PRICES))
    rb = with_bom(write_routerbench(tmp_path / "rb.csv", [rb_row("t.1"), rb_row("t.2")]))
    assert [r.id for r in load_converted("routerbench", [rb])] == ["t.1", "t.2"]
    rl = tmp_path / "rl.csv"
    rl.write_text(f"{bom}prompt,small,large\nq1,1,0\nq2,0,1\n", encoding="utf-8")
    assert [r.prompt for r in load_converted("routellm", [rl], prices)] == ["q1", "q2"]
    rl.write_text(f"{bom}small,prompt,large\n1,q1,0\n", encoding="utf-8")  # a model first
    [r] = load_converted("routellm", [rl], prices)
    assert set(r.outcomes) == {"small", "large"}
    dc = with_bom(write_json(tmp_path / "dc.json", [{"question": "q", "scores": {"small": 1}}]))
    assert len(load_converted("routerdc", [dc], prices)) == 1
    rp = with_bom(
        write_json(
            tmp_path / "rp.json",
            [{"task_name": "t", "query": "q", "model_performance": rp_perf("small")}],
        )
    )
    assert len(load_converted("routeprofile", [rp], prices)) == 1
    ledger = tmp_path / "export.jsonl"
    ledger.write_text(bom + ledger_line("a", cost_usd=0.01) + "\n", encoding="utf-8")
    assert [r.id for r in load_converted("ledger", [ledger])] == ["a"]
