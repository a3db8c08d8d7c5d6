"""``xrouter checkpoints``: the registry on the command line, on checkpoints that
``xrouter train`` really wrote."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli import main
from router.checkpoint import load_checkpoint, save_checkpoint
from router.outcomes import write_outcome_table
from tests.support.replay import REPO_ROOT
from tests.training.compact.conftest import make_tables


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("registry")
    full, _ = make_tables(n=120)
    table = tmp / "topics.jsonl"
    write_outcome_table(full, table)
    for name, k in (("first", "5"), ("second", "10")):
        argv = ["train", "--table", str(table), "--out", str(tmp / "runs" / name), "--knn", k,
                "--name", name]  # fmt: skip
        assert main(argv) == 0
    return tmp / "runs"


def test_lists_runs_newest_first_with_how_they_were_trained(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["checkpoints", str(runs), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in rows] == ["second", "first"]
    for row in rows:
        meta = load_checkpoint(row["path"]).metadata
        assert (row["kind"], row["mode"], row["models"]) == ("knn", "knn", 3)
        assert row["table"].endswith("topics.jsonl") and len(row["table_sha256"]) == 64
        assert row["validation_mean_reward"] == meta.metrics["validation_mean_reward"]
        assert row["split_seed"] == 0
    assert main(["checkpoints", str(runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("created (UTC)") and "second" in lines[1] and "first" in lines[2]


def test_show_prints_the_metadata_and_the_version(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = runs / "first" / "checkpoint"
    capsys.readouterr()
    assert main(["checkpoints", "--show", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    ckpt = load_checkpoint(path)
    assert shown["version"] == ckpt.version and shown["name"] == "first"
    assert shown["architecture"]["kind"] == "knn" and shown["pool"] == ckpt.pool


def test_bad_paths_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["checkpoints", str(tmp_path / "missing")]) == 2
    assert "no such path" in caplog.text
    assert main(["checkpoints", "--show", str(tmp_path)]) == 2
    assert main(["checkpoints", str(tmp_path)]) == 0  # empty: said on stderr, not an error
    assert "no checkpoints" in capsys.readouterr().err
    # --show and --packaged name what they print: a PATH besides would be ignored unsaid.
    caplog.clear()
    assert main(["checkpoints", "--packaged", str(tmp_path)]) == 2
    assert "--packaged takes no PATH arguments" in caplog.text
    assert main(["checkpoints", "--show", "packaged:demo", str(tmp_path)]) == 2
    assert "--show takes no PATH arguments" in caplog.text
    assert capsys.readouterr().out == ""


def test_a_file_named_is_listed_only_if_it_names_a_checkpoint(
    runs: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A plain file was "no checkpoints under afile (looked 3 directories down)", exit 0, as
    # an empty directory is; a path that does not exist is refused, and so is it now.
    afile = tmp_path / "afile"
    afile.write_text("not a checkpoint\n")
    capsys.readouterr()
    assert main(["checkpoints", str(afile)]) == 2
    assert f"{afile}: a file, not a directory" in caplog.text
    assert capsys.readouterr() == ("", "")
    # The files that do name a checkpoint are listed: a one-file checkpoint, and a
    # checkpoint directory's checkpoint.json (as deploy and eval take it).
    ckpt = load_checkpoint(runs / "first" / "checkpoint")
    one = save_checkpoint(tmp_path / "one.safetensors", ckpt.metadata, ckpt.weights)
    meta = runs / "second" / "checkpoint" / "checkpoint.json"
    assert main(["checkpoints", str(one.path), str(meta), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["path"] for r in rows} == {str(one.path), str(meta.parent)}, rows


def test_packaged_checkpoints_are_listed_and_named_as_deploy_takes_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    capsys.readouterr()
    assert main(["checkpoints", "--packaged", "--json"]) == 0
    rows = {
        json.loads(line)["path"]: json.loads(line) for line in capsys.readouterr().out.splitlines()
    }
    assert set(rows) == {"packaged:demo", "packaged:demo-rl"}
    assert (rows["packaged:demo"]["kind"], rows["packaged:demo-rl"]["kind"]) == ("knn", "mlp")
    # The names work wherever a checkpoint path does.
    assert main(["checkpoints", "--show", "packaged:demo"]) == 0
    assert (
        json.loads(capsys.readouterr().out)["version"] == load_checkpoint("packaged:demo").version
    )
    assert main(["checkpoints", "packaged:nope"]) == 2


def test_a_run_directory_lists_its_step_checkpoints_and_names_its_final_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full, _ = make_tables(n=120)
    table = tmp_path / "topics.jsonl"
    write_outcome_table(full, table)
    run = tmp_path / "net"
    argv = ["train", "--table", str(table), "--out", str(run), "--steps", "20",
            "--eval-every", "10", "--checkpoint-every", "10", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["checkpoints", str(run), "--steps", "--json"]) == 0
    paths = {json.loads(line)["path"] for line in capsys.readouterr().out.splitlines()}
    assert str(run / "checkpoint") in paths and len(paths) == 3, paths  # + steps 10 and 20
    # Where one checkpoint is meant, the run directory names its final one.
    assert main(["checkpoints", "--show", str(run)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == load_checkpoint(run / "checkpoint").version


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    # `xrouter checkpoints --show X | head`: a BrokenPipeError traceback before. `true`
    # reads nothing and is gone long before the CLI has imported enough to print.
    proc = subprocess.run(
        f"{shlex.quote(sys.executable)} -m gateway.cli checkpoints --show packaged:demo | true",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_a_thin_off_policy_validation_reward_is_flagged(
    tmp_path: Path, runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An off-policy run's validation reward resting on a handful of logged records was
    listed as a plain figure beside sound ones; its summary.json and metadata did not say
    how few records it rested on."""
    _, logged = make_tables(n=120)
    table = tmp_path / "logged.jsonl"
    write_outcome_table(logged, table)
    out = tmp_path / "runs" / "thin"
    argv = ["train", "--table", str(table), "--out", str(out), "--offpolicy", "--knn", "3",
            "--val-lambdas", "0,1", "--name", "thin"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    counts = {lam: row["supporting_records"] for lam, row in summary["validation"].items()}
    support = summary["validation_support"]
    fewest = min(counts.values())
    assert support["supporting_records"] == counts
    assert support["min_supporting_records"] == fewest < 30
    assert support["thin"] is True and support["thin_below"] == 30
    meta = load_checkpoint(out / "checkpoint").metadata
    assert meta.metrics["validation_support"] == support
    capsys.readouterr()
    assert main(["checkpoints", str(tmp_path / "runs"), str(runs)]) == 0
    lines = capsys.readouterr().out.splitlines()
    [line] = [x for x in lines if " thin " in x]
    reward = meta.metrics["validation_mean_reward"]
    assert f"{reward:.4f} (thin: {fewest} record{'' if fewest == 1 else 's'})" in line
    # Runs on full outcomes (and checkpoints from before the count) are listed as before.
    assert not any("(thin" in x for x in lines if " thin " not in x)
    assert main(["checkpoints", str(tmp_path / "runs"), "--json"]) == 0
    [row] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (row["validation_min_supporting_records"], row["validation_thin"]) == (fewest, True)
    assert main(["checkpoints", "--show", str(out / "checkpoint")]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["metrics"]["validation_support"]["supporting_records"] == counts


def test_an_off_policy_validation_reward_above_the_reward_ceiling_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A doubly robust validation estimate adds corrections weighted by 1/propensity: the
    right answers of records logged with a small propensity blew it up past what any router
    can earn (1 under the additive reward, K under the gated), and it was listed as a plain,
    best-looking figure."""
    _, logged = make_tables(n=120)
    # The logging policy claims it rarely chose what turned out right.
    for record in logged:
        assert record.logged is not None
        [outcome] = record.outcomes.values()
        if outcome.score == 1:
            record.logged.propensity = 0.02
    table = tmp_path / "logged.jsonl"
    write_outcome_table(logged, table)
    out = tmp_path / "runs" / "blown"
    argv = ["train", "--table", str(table), "--out", str(out), "--offpolicy", "--knn", "3",
            "--estimator", "dr", "--ips-clip", "100", "--val-lambdas", "0,1",
            "--reward", "gated", "--K", "1"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    over = [lam for lam, row in summary["validation"].items() if row["reward"] > 1]
    assert over, summary["validation"]  # the estimate this test is about
    support = summary["validation_support"]
    assert (support["ceiling"], support["above_ceiling"]) == (1.0, over)
    assert "above what any router can earn (1)" in caplog.text
    capsys.readouterr()
    assert main(["checkpoints", str(out)]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if str(out) in x]
    assert "above the reward's ceiling 1)" in line
    assert main(["checkpoints", str(out), "--json"]) == 0
    [row] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (row["validation_above_ceiling"], row["validation_ceiling"]) == (over, 1.0)
