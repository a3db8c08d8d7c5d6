"""`xrouter train` (training.compact.cli): argument parsing, a short real run, clean errors."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest

from router.checkpoint import load_checkpoint
from router.outcomes import OutcomeRecord, write_outcome_table
from training.compact.cli import add_train_arguments, config_from_args, main


def test_arguments_map_onto_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(
        ["--table", "t.jsonl", "--out", "o", "--steps", "7", "--group-size", "4", "--lambda-min", "0.1",
         "--lambda-max", "5", "--reward", "additive", "--hidden", "32,16", "--offpolicy", "--estimator", "dr",
         "--K", "2", "--c-max", "0.5"]
    )  # fmt: skip
    cfg = config_from_args(args)
    assert (cfg.steps, cfg.group_size, cfg.lambda_min, cfg.lambda_max) == (7, 4, 0.1, 5.0)
    assert cfg.reward_form == "additive" and cfg.hidden == (32, 16)
    reward = cfg.reward_config()
    assert (reward.form, reward.K, reward.c_max) == ("additive", 2.0, 0.5)
    assert cfg.offpolicy and cfg.estimator == "dr"


def test_a_gated_reward_that_pays_wrong_above_right_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    with caplog.at_level("WARNING"):
        config_from_args(parser.parse_args(["--table", "t", "--out", "o"]))
        assert "right answer earns less than a wrong one" not in caplog.text  # K = c_max
        config_from_args(parser.parse_args(["--table", "t", "--out", "o", "--K", "0.5"]))
    assert "--K 0.5 is below --c-max 1" in caplog.text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--estimator", "dr"], "--estimator applies to --offpolicy training only"),
        (["--ips-clip", "5", "--offpolicy-entropy", "0.1"], "--ips-clip, --offpolicy-entropy"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be 0 (never) or positive"),
    ],
)
def test_options_that_would_not_shape_the_run_are_refused(extra: list[str], message: str) -> None:
    # Recorded in the run's config, they would claim a part in a run they had none in (or,
    # for a negative interval, save a checkpoint at every step).
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--table", "t.jsonl", "--out", "o", *extra])
    with pytest.raises(ValueError, match=re.escape(message)):
        config_from_args(args)


@pytest.mark.parametrize("threads", ["0", "-2"])
def test_threads_below_one_are_refused_by_the_arguments(
    threads: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was accepted, trained with one thread (torch takes no fewer) and recorded as given.
    parser = argparse.ArgumentParser(prog="xrouter train")
    add_train_arguments(parser)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--table", "t.jsonl", "--out", "o", "--threads", threads])
    assert exc.value.code == 2
    assert (
        f"argument --threads: expected a positive integer, got {threads}" in capsys.readouterr().err
    )
    assert parser.parse_args(["--table", "t", "--out", "o", "--threads", "3"]).threads == 3


def test_a_knn_run_records_only_the_config_it_used(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]], tmp_path: Path
) -> None:
    # Its config.json recorded --steps, --lr and the rest of the network's settings, which a
    # kNN never reads, as if they had shaped it.
    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:120], table)
    out = tmp_path / "run"
    assert main(["--table", str(table), "--out", str(out), "--knn", "3,15", "--steps", "7",
                 "--lr", "0.5", "--split-seed", "3", "--cost-scale", "0.01",
                 "--no-progress"]) == 0  # fmt: skip
    written = json.loads((out / "config.json").read_text())
    stored = load_checkpoint(out / "checkpoint").metadata.training
    for training in (written, stored):
        config = training["config"]
        assert not {"steps", "lr", "hidden", "threads", "seed", "estimator"} & set(config)
        assert {"steps", "lr", "hidden", "threads", "seed", "estimator"} <= set(
            training["config_not_used"]
        )
        assert (config["split_seed"], config["cost_scale"]) == (3, 0.01)
        assert config["offpolicy"] is False and config["fractions"] == [0.6, 0.2, 0.2]


def test_train_writes_a_loadable_checkpoint(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:120], table)
    out = tmp_path / "run"
    code = main(["--table", str(table), "--out", str(out), "--steps", "20", "--eval-every", "10",
                 "--cost-scale", "0.01", "--val-lambdas", "0,1", "--no-progress", "--name", "tiny"])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["checkpoint"] == str(out / "checkpoint") and set(summary["validation"]) == {
        "0",
        "1",
    }
    ckpt = load_checkpoint(out / "checkpoint")
    assert ckpt.metadata.name == "tiny" and ckpt.metadata.training["command"].startswith(
        "python -m training.compact.cli"
    )
    assert (
        ckpt.metadata.training["table"]["records"] == 120
        and len(ckpt.metadata.training["table"]["sha256"]) == 64
    )
    assert (out / "summary.json").is_file() and (out / "config.json").is_file()
    # The network uses every setting: all are recorded.
    assert ckpt.metadata.training["config"]["steps"] == 20
    assert "config_not_used" not in ckpt.metadata.training


def test_a_run_directory_is_not_reused_without_overwrite(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:120], table)
    out = tmp_path / "run"
    base = ["--table", str(table), "--out", str(out), "--steps", "4", "--eval-every", "2",
            "--cost-scale", "0.01", "--no-progress"]  # fmt: skip
    args = [*base, "--checkpoint-every", "2"]
    assert main([*args, "--name", "first"]) == 0
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step_000002",
        "step_000004",
    ]
    capsys.readouterr()
    # A second run into it is refused, and the first run's checkpoint is left as it was.
    assert main([*args, "--name", "second"]) == 2
    err = capsys.readouterr().err
    assert "already holds a training run" in err and "--overwrite" in err, err
    assert load_checkpoint(out / "checkpoint").metadata.name == "first"
    # An --overwrite run that fails (a typo in its pool, for a network or a kNN; a kNN of no
    # neighbours is refused with the arguments, before the directory is claimed) replaces
    # nothing: the first run is as it was, and nothing of the failed one is left.
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    for bad in (["--pool", "cheap,typo-model"], ["--knn", "5", "--pool", "cheap,typo-model"]):
        assert main([*args, "--name", "broken", "--overwrite", *bad]) == 2
        assert capsys.readouterr().err.startswith("error: --pool typo-model: not a model")
        assert load_checkpoint(out / "checkpoint").metadata.name == "first"
        assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    # With --overwrite the old outputs (its step checkpoints too) move to previous/, the
    # checkpoint to go back to; the feature cache stays.
    cached = sorted(p.name for p in (out / "cache").iterdir())
    assert cached
    first = _tree(out)
    assert main([*base, "--checkpoint-every", "3", "--name", "second", "--overwrite"]) == 0
    assert load_checkpoint(out / "checkpoint").metadata.name == "second"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000003"]
    assert sorted(p.name for p in (out / "cache").iterdir()) == cached
    assert _tree(out / "previous") == first
    assert load_checkpoint(out / "previous" / "checkpoint").metadata.name == "first"
    # A third run replaces previous/ with the second; nothing else is left beside them.
    second = {k: v for k, v in _tree(out).items() if not k.startswith("previous/")}
    assert main([*base, "--name", "third", "--overwrite"]) == 0
    assert _tree(out / "previous") == second
    assert sorted(p.name for p in out.iterdir()) == [
        "cache", "checkpoint", "config.json", "metrics.jsonl", "previous", "summary.json",
    ]  # fmt: skip
    # A run that fails in a new directory leaves none of its outputs behind.
    fresh = tmp_path / "fresh"
    assert (
        main(
            ["--table", str(table), "--out", str(fresh), "--knn", "5", "--pool", "cheap,typo-model"]
        )
        == 2
    )
    assert not any((fresh / name).exists() for name in ("checkpoint", "config.json"))
    # An empty directory, or one holding only a cache, is free to use.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--table", str(table), "--out", str(empty), "--steps", "2", "--cost-scale",
                 "0.01", "--no-progress"]) == 0  # fmt: skip


def test_errors_are_reported_not_raised(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--table", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "cannot read" in capsys.readouterr().err
    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:60], table)
    assert (
        main(["--table", str(table), "--out", str(tmp_path / "o"), "--offpolicy", "--no-progress"])
        == 2
    )
    assert "no logged records" in capsys.readouterr().err
    assert (
        main(
            [
                "--table",
                str(table),
                "--out",
                str(tmp_path / "o"),
                "--pool",
                "cheap,nope",
                "--no-progress",
            ]
        )
        == 2
    )
    assert "--pool nope: not a model of the table (models: " in capsys.readouterr().err
    # A run that failed before it had anything to keep leaves no empty --out behind.
    assert not (tmp_path / "o").exists()
    # Logged traffic (an export) without --offpolicy: the hint is --offpolicy, not --pool,
    # and it comes before a warning per model that would say "pass --pool".
    _, logged = tables
    export = tmp_path / "export.jsonl"
    write_outcome_table(logged[:60], export)
    for mode in ([], ["--knn", "5"]):
        assert main(["--table", str(export), "--out", str(tmp_path / "o"), "--no-progress",
                     *mode]) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert "60 of the 60 records are logged traffic" in err, err
        assert "train on them with --offpolicy" in err and "pass --pool" not in err, err
    # So is an export of one model's traffic, which holds that model's outcome on every
    # record but only on the prompts sent to it.
    one = tmp_path / "one.jsonl"
    action = logged[0].logged.action  # type: ignore[union-attr]
    write_outcome_table([r for r in logged if r.logged.action == action][:30], one)  # type: ignore[union-attr]
    assert main(["--table", str(one), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "train on them with --offpolicy" in capsys.readouterr().err
    # A run directory that cannot be made (here: under a file) is one line, not a traceback.
    # It said "xrouter train: [Errno 20] Not a directory: '…'".
    assert main(["--table", str(table), "--out", str(table / "run"), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"error: {table / 'run'}: not a directory\n"
    # --out naming a file is said to be one (it was a bare "[Errno 17] File exists"), and
    # the file is left alone.
    before = table.read_bytes()
    assert main(["--table", str(table), "--out", str(table), "--no-progress"]) == 2
    assert f"{table} is a file, not a run directory" in capsys.readouterr().err
    assert table.read_bytes() == before
    # So is a --cache-dir naming a file, before any feature is computed.
    out = tmp_path / "o2"
    assert main(["--table", str(table), "--out", str(out), "--cache-dir", str(table)]) == 2
    assert f"--cache-dir {table} is a file, not a directory" in capsys.readouterr().err
    assert table.read_bytes() == before and not out.exists()


def _without_content(record: OutcomeRecord, how: str = "none") -> OutcomeRecord:
    """The record as `xrouter export` writes a request whose content was not logged."""
    data = record.model_dump(exclude_none=True)
    data.update(prompt="[content not logged]", content_logged=how)
    return OutcomeRecord.model_validate(data)


def test_logged_traffic_without_prompts_is_refused_or_dropped(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, logged = tables
    table = tmp_path / "blind.jsonl"
    write_outcome_table([_without_content(r) for r in logged], table)
    args = ["--table", str(table), "--offpolicy", "--knn", "5", "--no-progress"]
    # Every prompt a placeholder: a prompt-reading router would learn one constant choice.
    assert main([*args, "--out", str(tmp_path / "o1")]) == 2
    assert "ledger.log_content: full" in capsys.readouterr().err
    assert not (tmp_path / "o1" / "checkpoint").exists()
    # Some prompts logged (content logging switched on later): the others are left out.
    blind = {r.id for r in logged[::3]}
    mixed = [_without_content(r, "hash") if r.id in blind else r for r in logged]
    write_outcome_table(mixed, table)
    with caplog.at_level("WARNING"):
        assert main([*args, "--out", str(tmp_path / "o2")]) == 0
    assert f"dropped {len(blind)} records whose prompt was not logged" in caplog.text
    assert (tmp_path / "o2" / "checkpoint").exists()


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--lr", "0", "--lr must be positive, got 0.0"),
        ("--clip-eps", "0", "--clip-eps must be positive, got 0.0"),
        ("--weight-decay", "-1", "--weight-decay must be non-negative, got -1.0"),
        # One check a field: a bad --dropout was said as "--lambda-zero-prob must be in ...".
        ("--dropout", "1", "--dropout must be in [0, 1), got 1.0"),
        ("--lambda-zero-prob", "2", "--lambda-zero-prob must be in [0, 1], got 2.0"),
        ("--advantage-std-floor", "-1", "--advantage-std-floor must be non-negative"),
        # Refused with the arguments (argparse exits), as a list that is not of widths.
        ("--hidden", "64,0", "argument --hidden: expected comma-separated positive integers"),
        ("--entropy", "-0.1", "entropy bonuses must be non-negative"),
        ("--explore", "1.5", "--explore must be in [0, 1], got 1.5"),
        ("--c-max", "-1", "K and c_max must be non-negative"),
        # Gated with K = 0: a right answer never earns more than a wrong one.
        ("--K", "0", "K must be positive for the gated reward"),
        # Not finite: NaN passes every range check, inf overflows the λ grid or the weights.
        ("--lambda-max", "inf", "--lambda-max must be finite"),
        ("--K", "nan", "--K must be finite"),
        ("--lr", "inf", "--lr must be finite"),
        # The config names its fields; the message names the flags typed (it said ips_clip).
        ("--eval-every", "0", "--eval-every must be positive"),
        # Empty: it read as not given, and validated at the default cost weights unsaid.
        ("--val-lambdas", "", "argument --val-lambdas: expected comma-separated non-negative"),
    ],
)
def test_nonsense_training_settings_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, needle: str
) -> None:
    table = tmp_path / "t.jsonl"
    table.write_text(
        '{"id": "a", "prompt": "q", "outcomes": {"m": {"score": 1, "cost_usd": 0.1}}}\n'
    )
    code: int | str | None
    try:
        code = main(["--table", str(table), "--out", str(tmp_path / "r"), flag, value])
    except SystemExit as exc:  # refused with the arguments
        code = exc.code
    assert code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("value", ["1e-310", "0", "nan", "1e308"])
def test_a_cost_scale_that_cannot_give_finite_rewards_is_a_bad_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # 1e-310 (subnormal) trained on infinite normalized costs (numpy's overflow warning, the
    # λ range fallen back to its default) and 1e308 ended in an OverflowError traceback.
    table = tmp_path / "t.jsonl"
    table.write_text(
        '{"id": "a", "prompt": "q", "outcomes": {"m": {"score": 1, "cost_usd": 0.1}}}\n'
    )
    with pytest.raises(SystemExit) as exc:
        main(["--table", str(table), "--out", str(tmp_path / "r"), f"--cost-scale={value}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --cost-scale: must be between 1e-12 and 1e+12" in err, err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flag", ["--knn", "--cascade"])
def test_an_empty_list_of_neighbour_counts_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    # It used to read as the flag not given, and trained a policy network instead.
    with pytest.raises(SystemExit) as exc:
        main(["--table", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "r"), flag, ""])
    assert exc.value.code == 2
    assert "expected comma-separated positive integers" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_repeated_pool_model_is_refused(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:60], table)
    args = ["--table", str(table), "--out", str(tmp_path / "o"), "--no-progress"]
    assert main([*args, "--pool", "cheap,poet,cheap", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "pool model(s) given more than once: cheap" in err and "Traceback" not in err


def test_a_pool_of_one_model_is_refused(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One action: every policy picks it. Training ran, and wrote a checkpoint that routes
    # nowhere with validation figures that read like a router's.
    full, logged = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:60], table)
    out = tmp_path / "o"
    args = ["--out", str(out), "--no-progress", "--steps", "2"]
    assert main(["--table", str(table), *args, "--pool", "cheap"]) == 2
    err = capsys.readouterr().err
    assert "--pool names one model: 'cheap'; a router chooses between at least two" in err
    # A research table where one model alone has every record's outcome.
    only = tmp_path / "only.jsonl"
    write_outcome_table(
        [r.model_copy(update={"outcomes": {"cheap": r.outcomes["cheap"]}}) for r in full[:60]],
        only,
    )
    assert main(["--table", str(only), *args]) == 2
    assert "one model only has an outcome on every record" in capsys.readouterr().err
    # Logged traffic that always chose one model, learned from off-policy.
    action = logged[0].logged.action  # type: ignore[union-attr]
    one = tmp_path / "one.jsonl"
    write_outcome_table([r for r in logged if r.logged.action == action][:30], one)  # type: ignore[union-attr]
    for mode in ([], ["--knn", "5"]):
        assert main(["--table", str(one), *args, "--offpolicy", *mode]) == 2
        assert "the logged records chose one model only" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_an_empty_table_is_said_to_be_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    table = tmp_path / "empty.jsonl"
    table.write_text(content)
    assert main(["--table", str(table), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the outcome table is empty" in err and "log_content" not in err


def test_a_model_left_out_of_the_default_pool_is_named(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    full, _ = tables
    rows = [r.model_copy(deep=True) for r in full[:120]]
    del rows[7].outcomes["poet"]  # one research record lacks one model's outcome
    table = tmp_path / "gap.jsonl"
    write_outcome_table(rows, table)
    with caplog.at_level("WARNING"):
        code = main(["--table", str(table), "--out", str(tmp_path / "o"), "--steps", "2",
                     "--eval-every", "1", "--no-progress"])  # fmt: skip
    assert code == 0
    assert (
        f"model 'poet' left out of the pool: no outcome for it on 1 of the 120 records "
        f"(the first: record {rows[7].id!r})" in caplog.text
    )
    # Named in the pool, it is kept and that record dropped, by name.
    with caplog.at_level("WARNING"):
        code = main(["--table", str(table), "--out", str(tmp_path / "o2"), "--steps", "2",
                     "--eval-every", "1", "--pool", "cheap,poet", "--no-progress"])  # fmt: skip
    assert code == 0
    assert f"record {rows[7].id!r} has none for 'poet'" in caplog.text


def test_a_reference_model_normalizes_cost_and_must_be_priced_on_every_record(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:120], table)
    base = ["--table", str(table), "--steps", "4", "--eval-every", "2", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "ok"), "--reference-model", "math-pro"]) == 0
    reward = load_checkpoint(tmp_path / "ok" / "checkpoint").metadata.reward
    assert (reward["cost_normalization"], reward["reference_model"]) == ("reference", "math-pro")
    capsys.readouterr()
    # One prompt where the reference was free: C / 0 is undefined there, and normalizing
    # that prompt alone by --cost-scale (as the reward did) mixes two units in one table.
    free = [r.model_copy(deep=True) for r in full[:120]]
    free[7].outcomes["math-pro"].cost_usd = 0.0
    write_outcome_table(free, table)
    assert main([*base, "--out", str(tmp_path / "free"), "--reference-model", "math-pro"]) == 2
    err = capsys.readouterr().err
    assert "reference model 'math-pro' has no positive cost on 1 of 120 records" in err, err
    assert "'s7'" in err and "Traceback" not in err
    assert not (tmp_path / "free" / "checkpoint").exists()
    # A reference whose outcomes record tokens but no cost is priced first, as every model
    # is (it was refused as having no cost).
    tokens_only = [r.model_copy(deep=True) for r in full[:120]]
    for r in tokens_only:
        r.outcomes["math-pro"] = r.outcomes["math-pro"].model_copy(
            update={"cost_usd": None, "prompt_tokens": 500, "completion_tokens": 200}
        )
    write_outcome_table(tokens_only, table)
    prices = tmp_path / "prices.yaml"
    prices.write_text("math-pro: {input: 10, output: 25}\n")
    args = [*base, "--out", str(tmp_path / "priced"), "--reference-model", "math-pro"]
    assert main([*args, "--prices", str(prices)]) == 0, capsys.readouterr().err


# -- a run ended from outside, and what such a run left behind ----------------------------


def _tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes, the feature cache left out."""
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and p.relative_to(path).parts[0] != "cache"
    }


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_an_overwrite_run_killed_by_sigterm_puts_the_earlier_run_back(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]], tmp_path: Path
) -> None:
    # `timeout 8 xrouter train ... --overwrite`: SIGTERM killed the process on the spot,
    # leaving the earlier run hidden in .replaced-<pid> and the run directory broken.
    # (Imported here: this part of the file is appended to, its imports are left as they are.)
    import os
    import signal
    import subprocess
    import sys
    import time

    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:120], table)
    out = tmp_path / "run"
    base = ["--table", str(table), "--out", str(out), "--cost-scale", "0.01", "--no-progress"]
    assert main([*base, "--steps", "2", "--eval-every", "1", "--name", "first"]) == 0
    before = _tree(out)
    repo = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "train", *base, "--steps", "10000000",
         "--eval-every", "1000000", "--name", "second", "--overwrite"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )  # fmt: skip
    try:
        aside = out / f".replaced-{proc.pid}"
        deadline = time.monotonic() + 120
        while not aside.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert aside.exists(), "the run never set the earlier one aside"
        time.sleep(1.0)  # into the run proper
        assert proc.poll() is None, proc.communicate()[1]
        # While it runs, the earlier checkpoint stays where a gateway may serve it from.
        assert load_checkpoint(out / "checkpoint").metadata.name == "first"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr, stderr
    assert not list(out.glob(".replaced-*"))
    assert _tree(out) == before
    assert load_checkpoint(out / "checkpoint").metadata.name == "first"


def test_an_earlier_run_left_aside_by_a_dead_process_is_put_back_or_removed(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A run killed outright (SIGKILL, a crash) can still leave .replaced-<pid>: the next run
    # in that directory deals with it instead of leaving it there for ever.
    import os

    full, _ = tables
    table = tmp_path / "table.jsonl"
    write_outcome_table(full[:120], table)
    out = tmp_path / "run"
    base = ["--table", str(table), "--out", str(out), "--steps", "2", "--eval-every", "1",
            "--cost-scale", "0.01", "--no-progress"]  # fmt: skip
    assert main([*base, "--name", "first"]) == 0
    before = _tree(out)
    dead = _dead_pid()
    # The dead run had set the earlier one aside and written part of its own outputs, no
    # checkpoint: the earlier run is put back, the partial outputs go.
    aside = out / f".replaced-{dead}"
    aside.mkdir()
    for name in ("checkpoint", "config.json", "metrics.jsonl", "summary.json"):
        (out / name).rename(aside / name)
    (out / "config.json").write_text("{}\n")
    (out / "checkpoints").mkdir()
    capsys.readouterr()
    assert main([*base, "--name", "second"]) == 2  # no --overwrite: the earlier run is there
    assert "already holds a training run" in capsys.readouterr().err
    assert not aside.exists() and not (out / "checkpoints").exists()
    assert _tree(out) == before
    # The dead run had set the earlier run aside — its checkpoint copied, the original
    # left in place — and died before its own was written: the copy goes, the rest is put
    # back.
    aside.mkdir()
    shutil.copytree(out / "checkpoint", aside / "checkpoint")
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        (out / name).rename(aside / name)
    (out / "config.json").write_text("{}\n")
    (out / "checkpoints").mkdir()
    assert main([*base, "--name", "second"]) == 2
    assert not aside.exists() and not (out / "checkpoints").exists()
    assert _tree(out) == before
    # The dead run had finished (another checkpoint is in place) but not kept the earlier
    # run as previous/: it is kept so now, the finished run stays.
    aside.mkdir()
    (aside / "checkpoint").mkdir()
    (aside / "checkpoint" / "weights").write_text("old")
    assert main([*base, "--name", "second"]) == 2
    assert not aside.exists()
    assert _tree(out) == {**before, "previous/checkpoint/weights": b"old"}
    # A directory whose process still runs is another run in progress: left alone.
    live = out / f".replaced-{os.getppid()}"
    live.mkdir()
    assert main([*base, "--name", "second"]) == 2
    assert live.is_dir()


def test_an_offpolicy_run_on_thin_support_says_its_estimates_overrate_it(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A demo gateway's traffic: SNIPS reported 0.887 for a router that scored 0.565 on the
    same validation prompts, its estimate resting on 5 records — and nothing said so."""
    _, logged = tables
    table = tmp_path / "logged.jsonl"
    write_outcome_table(logged[:150], table)
    args = ["--table", str(table), "--offpolicy", "--steps", "4", "--eval-every", "2",
            "--cost-scale", "0.01", "--no-progress"]  # fmt: skip
    with caplog.at_level("WARNING", logger="training.compact.cli"):
        assert main([*args, "--out", str(tmp_path / "o")]) == 0
    warned = [r.getMessage() for r in caplog.records if "rest on few records" in r.getMessage()]
    assert len(warned) == 1 and "--estimator dr" in warned[0], caplog.text
    # A DR run is warned too, but not told to use what it uses.
    caplog.clear()
    with caplog.at_level("WARNING", logger="training.compact.cli"):
        assert main([*args, "--estimator", "dr", "--out", str(tmp_path / "d")]) == 0
    warned = [r.getMessage() for r in caplog.records if "rest on few records" in r.getMessage()]
    assert len(warned) == 1 and "--estimator dr" not in warned[0], caplog.text
    # A full-information table needs no such warning.
    full, _ = tables
    write_outcome_table(full[:150], table)
    caplog.clear()
    with caplog.at_level("WARNING", logger="training.compact.cli"):
        assert main(["--table", str(table), "--steps", "4", "--eval-every", "2",
                     "--cost-scale", "0.01", "--no-progress", "--out", str(tmp_path / "f")]) == 0  # fmt: skip
    assert "rest on few records" not in caplog.text


def test_an_offpolicy_pool_that_leaves_out_logged_models_says_what_it_costs(
    tables: tuple[list[OutcomeRecord], list[OutcomeRecord]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Records logged for a model outside --pool are left out, which biases IPS and DR:
    the run says so (it said nothing)."""
    _, logged = tables
    table = tmp_path / "logged.jsonl"
    write_outcome_table(logged[:150], table)
    chosen = sorted({r.logged.action for r in logged[:150] if r.logged is not None})
    assert len(chosen) > 2
    args = ["--table", str(table), "--offpolicy", "--steps", "2", "--eval-every", "1",
            "--cost-scale", "0.01", "--no-progress", "--pool", ",".join(chosen[:-1])]  # fmt: skip
    with caplog.at_level("WARNING", logger="training.compact.run"):
        assert main([*args, "--out", str(tmp_path / "o")]) == 0
    assert f"chose a model outside --pool ({chosen[-1]}) and are not learned from" in caplog.text
    assert "the split counts below still include them" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="training.compact.run"):
        assert main([*args[:-1], ",".join(chosen), "--out", str(tmp_path / "all")]) == 0
    assert "outside --pool" not in caplog.text
