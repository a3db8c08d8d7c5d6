"""``xrouter convert`` as a user runs it: a real subprocess, refusing an ``--out`` that its
table's readers would read as another format."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.outcomes import load_outcome_table
from tests.support.replay import REPO_ROOT
from tests.support.routerbench import rb_row, write_routerbench


def _convert(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "convert", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


@pytest.mark.parametrize("out", ["x.parquet", "x.csv", "x"])
def test_convert_refuses_an_out_not_named_jsonl(tmp_path: Path, out: str) -> None:
    # It wrote JSON lines under that name, which train and eval then refused ("not a ledger
    # export in Parquet"), as `xrouter export` refuses a name that disagrees with its format.
    src = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1")])
    proc = _convert(tmp_path, "routerbench", str(src), "--out", out)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("error: ") and "name it with .jsonl" in lines[0], lines[0]
    assert not (tmp_path / out).exists()


def test_convert_writes_an_out_named_jsonl(tmp_path: Path) -> None:
    src = write_routerbench(tmp_path / "rb.csv", [rb_row("t.1"), rb_row("t.2")])
    proc = _convert(tmp_path, "routerbench", str(src), "--out", "sub/x.jsonl")
    assert proc.returncode == 0, proc.stderr
    assert [r.id for r in load_outcome_table(tmp_path / "sub" / "x.jsonl")] == ["t.1", "t.2"]


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        # A Markdown file given by mistake: PyYAML's error ran over several lines, quoting
        # the line with a caret under it.
        (
            "PROVENANCE.md",
            "# Provenance\n\nDownloaded from the RouterDC repository\nlicence: research use only\n",
            "YAML error: mapping values are not allowed here at line 4, column 8",
        ),
        (
            "prices.yaml",
            'gpt-4o:\n  input: "0.2\n',
            "YAML error: found unexpected end of stream at line 3",
        ),
        ("prices.json", '{"gpt-4o": {"input": 0.2,\n', "JSON error at line 2, column 1"),
    ],
)
def test_convert_names_a_malformed_prices_file_in_one_line(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    (tmp_path / name).write_text(text, encoding="utf-8")
    src = tmp_path / "train.json"
    src.write_text("[]", encoding="utf-8")
    proc = _convert(tmp_path, "routerdc", str(src), "--prices", name, "--out", "x.jsonl")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"error: {name}: not a valid prices file"), lines[0]
    assert where in lines[0], lines[0]
    assert not (tmp_path / "x.jsonl").exists()
