"""An option of ``xrouter train``, ``eval`` or ``verl-data`` that names a model the table
does not have: one line naming the option as given and the table's models, the same in all
three. ``eval --strong nope`` said ``record '…' has no outcome for nope``, naming neither
the option nor the models there are."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from router.outcomes import OutcomeRecord, write_outcome_table

MODELS = "cheap, mid, strong"  # as the message lists them: sorted


@pytest.fixture
def table(tmp_path: Path) -> Path:
    records = [
        OutcomeRecord.model_validate(
            {
                "id": f"q{i}",
                "prompt": f"question {i}?",
                "outcomes": {
                    m: {"score": float((i + k) % 2), "cost_usd": 1e-4 * (k + 1)}
                    for k, m in enumerate(("strong", "cheap", "mid"))
                },
            }
        )
        for i in range(60)
    ]
    path = tmp_path / "t.jsonl"
    write_outcome_table(records, path)
    return path


@pytest.mark.parametrize(
    ("command", "args", "said"),
    [
        ("eval", ["--strong", "nope", "--weak", "cheap"], "--strong nope"),
        ("eval", ["--strong", "strong", "--weak", "nope"], "--weak nope"),
        ("train", ["--knn", "5", "--reference-model", "nope"], "--reference-model nope"),
        ("verl-data", ["--reference-model", "nope"], "--reference-model nope"),
        ("train", ["--knn", "5", "--pool", "cheap,nope"], "--pool nope"),
    ],
)
def test_a_model_the_table_lacks_is_named_by_its_option(
    table: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    args: list[str],
    said: str,
) -> None:
    out = tmp_path / "out"
    extra = ["--bootstrap", "0", "--baselines", "none"] if command == "eval" else []
    assert main([command, "--table", str(table), "--out", str(out), *extra, *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].endswith(f"{said}: not a model of the table (models: {MODELS})"), lines[0]
    assert not out.exists()


def test_train_names_a_reference_model_left_out_of_the_pool(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--knn", "5", "--pool", "cheap,mid", "--reference-model", "strong"]
    assert main(["train", "--table", str(table), "--out", str(tmp_path / "o"), *args]) == 2
    err = capsys.readouterr().err
    assert "--reference-model strong: not among the models trained on (cheap, mid)" in err, err
