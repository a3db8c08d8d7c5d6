"""``xrouter train``, ``eval`` and ``verl-data`` given a table they cannot read: one line,
``error: cannot read TABLE: no such file`` (or what else is wrong with the path), the same
in all three. It was the OS's text with its errno (``error: [Errno 2] No such file or directory:
'missing.jsonl'``), and a missing ``.parquet`` was "not a ledger export in Parquet"."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main

COMMANDS = ["train", "eval", "verl-data"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_table_that_is_not_there_or_not_a_file_is_one_line(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "a-directory.parquet").mkdir()
    (tmp_path / "a-file").write_text("")
    for table, problem in (
        (tmp_path / "missing.jsonl", "no such file"),
        (tmp_path / "missing.parquet", "no such file"),
        (tmp_path / "a-directory", "a directory, not a file"),
        (tmp_path / "a-directory.parquet", "a directory, not a file"),
        (tmp_path / "a-file" / "t.jsonl", "no such file (a part of its path is not a directory)"),
    ):
        out = tmp_path / "out"
        assert main([command, "--table", str(table), "--out", str(out)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0] == f"error: cannot read {table}: {problem}", lines[0]
        assert "Errno" not in lines[0]
        assert not out.exists()


def test_a_table_with_a_bad_line_is_one_line_naming_it_once_alike_in_the_three(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # train and verl-data said "cannot read T: T:1: …", the path twice.
    table = tmp_path / "bad.jsonl"
    table.write_text('{"id": "a"}\n')
    said = set()
    for command in COMMANDS:
        assert main([command, "--table", str(table), "--out", str(tmp_path / "out")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].count(str(table)) == 1, lines[0]
        said.add(lines[0])
    assert said == {f"error: {table}:1: outcomes: Field required"}


def test_every_refusal_of_the_three_is_an_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # train and verl-data began theirs "xrouter train:", "xrouter verl-data:" or nothing at
    # all, where eval, convert and export say "error:".
    table = tmp_path / "t.jsonl"
    table.write_text('{"id": "a"}\n')
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        ["train", "--table", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")],
        ["verl-data", "--table", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")],
        ["train", "--table", str(table), "--out", str(tmp_path / "o"), "--cache-dir", str(a_file)],
        ["verl-data", "--table", str(table), "--out", str(a_file)],
        ["eval", "--table", str(table), "--out", str(a_file)],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, lines)
