"""Every option of every ``xrouter`` subcommand whose value goes through a custom argparse
``type``: a bad value is one line naming the option and what it takes. argparse prints
``invalid <the function's __name__> value`` when a type raises ``ValueError`` — which named
private helpers (``argument --knn: invalid _neighbour_counts value: 'abc'``) — and lets any
exception but ``ArgumentTypeError``, ``TypeError`` and ``ValueError`` out as a traceback."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import build_parser
from tests.support.replay import REPO_ROOT

# argparse's own types, whose names (``invalid int value``) say what they take.
BUILTIN_TYPES: set[object] = {int, float, str, Path}
# Needed by the subcommand for argparse to get as far as the option (the values are not read).
REQUIRED = {
    "train": ["--table", "t.jsonl", "--out", "o"],
    "eval": ["--table", "t.jsonl", "--out", "o"],
    "verl-data": ["--table", "t.jsonl", "--out", "o"],
}
BAD_VALUES = [
    "abc", "", ",", "a,b", "1,,x", "-1", "0", "-0.5", "1.5", "nan", "inf", "-inf", "1e400",
    "1/2/3", "1,2,3", "9" * 30, "9" * 5000, "\x00", " ",
]  # fmt: skip


def custom_typed_options() -> list[tuple[str, str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (command, action.option_strings[0] if action.option_strings else action.dest)
        for command, p in sub.choices.items()
        for action in p._actions
        if action.type is not None and action.type not in BUILTIN_TYPES
    ]


def test_the_walk_finds_every_custom_type() -> None:
    # Those known when this test was written: the walk must not quietly find none.
    assert {
        ("train", "--knn"),
        ("train", "--cascade"),
        ("train", "--hidden"),
        ("train", "--val-lambdas"),
        ("train", "--threads"),
        ("train", "--cost-scale"),
        ("eval", "--lambdas"),
        ("eval", "--split-fractions"),
        ("eval", "--cost-scale"),
        ("verl-data", "--lambdas"),
        ("verl-data", "--router-price"),
        ("replay-upstream", "--port"),
        ("serve", "--log-level"),
    } <= set(custom_typed_options())


@pytest.mark.parametrize(("command", "option"), custom_typed_options())
def test_a_bad_value_is_one_line_naming_the_option_and_what_it_takes(
    command: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    refused = []
    for bad in BAD_VALUES:
        try:
            parser.parse_args([command, *REQUIRED.get(command, []), f"{option}={bad}"])
        except SystemExit as exc:
            assert exc.code == 2, (option, bad)
            last = capsys.readouterr().err.strip().splitlines()[-1]
            assert last.startswith(f"xrouter {command}: error: argument {option}: "), last
            # Said by the type (ArgumentTypeError) or by choices, not as "invalid X value".
            assert not re.search(r"invalid \S+ value", last), last
            refused.append(bad)
        capsys.readouterr()
    # Whatever the option takes, plain text is not it. (A type that raised anything else
    # would have come out of parse_args as that exception: argparse does not catch it.)
    assert "abc" in refused, (command, option)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--knn", "abc"], "argument --knn: expected comma-separated positive integers"),
        (["--knn", "0,50"], "argument --knn: expected comma-separated positive integers"),
        (["--hidden", "abc"], "argument --hidden: expected comma-separated positive integers"),
        (["--val-lambdas", "a,b"], "argument --val-lambdas: expected comma-separated non-negat"),
        (["--val-lambdas", "nan"], "argument --val-lambdas: expected comma-separated non-negat"),
    ],
)
def test_train_says_what_an_option_takes(args: list[str], said: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "train", "--table", "t.jsonl", "--out", "o", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("xrouter train: error: ") and said in last, proc.stderr
    assert f"got {args[1]!r}" in last, last
    assert "Traceback" not in proc.stderr
