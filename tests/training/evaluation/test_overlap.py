"""`xrouter eval` says when a checkpoint is evaluated on prompts it was trained on."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from router.outcomes import load_outcome_table, write_outcome_table
from training.compact.cli import main as train_main
from training.datasets.splits import split_of
from training.evaluation.cli import main as eval_main
from training.evaluation.overlap import (
    SEEN_FILE,
    ids_fingerprint,
    read_seen_prompts,
    seen_by_hash,
    seen_in_training,
    seen_keys,
    seen_prompt_hashes,
    write_seen_prompts,
)


def test_counts_the_training_and_validation_prompts_of_the_same_table(table_factory) -> None:
    records = table_factory(200, seed=3)
    meta = {"table": {"sha256": "abc"}, "config": {"split_seed": 0, "fractions": [0.6, 0.2, 0.2]}}
    # Its own test split: nothing seen.
    own_test = [r for r in records if split_of(r.id, (0.6, 0.2, 0.2), 0) == "test"]
    assert seen_in_training(meta, own_test, "abc") == 0
    # Another seed's test split overlaps its training and validation parts (about 80%).
    other_test = [r for r in records if split_of(r.id, (0.6, 0.2, 0.2), 1) == "test"]
    expected = sum(split_of(r.id, (0.6, 0.2, 0.2), 0) != "test" for r in other_test)
    assert seen_in_training(meta, other_test, "abc") == expected > 0
    # Another table, or a checkpoint that did not record its table: nothing to go by.
    assert seen_in_training(meta, other_test, "def") is None
    assert seen_in_training({"config": meta["config"]}, other_test, "abc") is None
    assert seen_in_training({}, other_test, "abc") is None


def test_the_same_records_in_another_file_are_the_same_table(table_factory) -> None:
    records = table_factory(200, seed=3)
    digest = ids_fingerprint(records)
    assert ids_fingerprint(list(reversed(records))) == digest
    assert ids_fingerprint(records[1:]) != digest
    meta = {"table": {"sha256": "abc", "ids_sha256": digest}, "config": {"split_seed": 0}}
    other_test = [r for r in records if split_of(r.id, (0.6, 0.2, 0.2), 1) == "test"]
    expected = sum(split_of(r.id, (0.6, 0.2, 0.2), 0) != "test" for r in other_test)
    # Another file's bytes, the same ids: recognized by them.
    assert seen_in_training(meta, other_test, "def", digest) == expected > 0
    assert seen_in_training(meta, other_test, "def", ids_fingerprint(records[1:])) is None
    # A checkpoint from before the fingerprint: the file's hash alone decides.
    old = {"table": {"sha256": "abc"}, "config": {"split_seed": 0}}
    assert seen_in_training(old, other_test, "def", digest) is None


@pytest.fixture
def trained(tmp_path: Path, table_factory) -> tuple[Path, Path]:
    table = tmp_path / "table.jsonl"
    write_outcome_table(table_factory(150, seed=4), table)
    out = tmp_path / "run"
    argv = ["--table", str(table), "--out", str(out), "--steps", "10", "--eval-every", "5"]
    assert train_main([*argv, "--val-lambdas", "0,1", "--no-progress"]) == 0
    return table, out / "checkpoint"


def test_eval_notes_a_checkpoint_evaluated_on_its_own_training_prompts(
    trained: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, ckpt = trained
    base = ["--table", str(table), "--policy", f"compact:{ckpt}", "--baselines", "none"]
    base += ["--lambdas", "0,1", "--bootstrap", "0"]
    assert eval_main([*base, "--out", str(tmp_path / "same")]) == 0
    assert "were in its training or validation part" not in capsys.readouterr().out

    assert eval_main([*base, "--split-seed", "1", "--out", str(tmp_path / "other")]) == 0
    out = capsys.readouterr().out
    assert "were in its training or validation part" in out and "split seed 0" in out
    report = (tmp_path / "other" / "report.md").read_text()
    assert "optimistic; evaluate with the seed and fractions it was trained with" in report

    # The same records written again (another order, so other bytes): the same table.
    copy = tmp_path / "copy.jsonl"
    write_outcome_table(reversed(load_outcome_table(table)), copy)
    assert copy.read_bytes() != table.read_bytes()
    argv = [*base[2:], "--table", str(copy), "--split-seed", "1", "--out", str(tmp_path / "c")]
    assert eval_main(argv) == 0
    assert "were in its training or validation part" in capsys.readouterr().out
    meta = json.loads((ckpt / "checkpoint.json").read_text())
    assert meta["training"]["table"]["ids_sha256"] == ids_fingerprint(load_outcome_table(table))


@pytest.mark.parametrize("name", ["demo", "demo-rl"])
def test_the_packaged_checkpoints_know_their_training_prompts_in_any_file(
    tmp_path: Path, name: str
) -> None:
    """The demo table converted again (RouteProfile's file through ``xrouter convert``, the
    README's example) is the packaged checkpoints' training table under another name: an
    eval on it must say which prompts they were trained on."""
    from router.checkpoint import load_checkpoint, packaged_checkpoint_path

    records = load_outcome_table(Path(__file__).parents[3] / "router/assets/demo_outcomes.jsonl")
    copy = tmp_path / "again.jsonl"
    write_outcome_table(list(reversed(records)), copy)  # another file, another order
    again = load_outcome_table(copy)
    training = load_checkpoint(packaged_checkpoint_path(name)).metadata.training
    seen = seen_in_training(training, again, "not-the-same-file", ids_fingerprint(again))
    split = training["config"]["split_seed"]
    expected = sum(split_of(r.id, seed=split) in ("train", "validation") for r in again)
    assert seen == expected == 354 + 135


def test_a_grouped_record_was_seen_when_its_group_was(table_factory) -> None:
    # Ledger exports group repeats of a prompt: the training run split them by the group,
    # so whether the checkpoint saw a record depends on the group's part, not the id's.
    records = [
        r.model_copy(update={"group": f"g{i % 20}"})
        for i, r in enumerate(table_factory(200, seed=3))
    ]
    table = {"sha256": "abc", "split_by": "group"}
    meta = {"table": table, "config": {"split_seed": 0, "fractions": [0.6, 0.2, 0.2]}}
    own_test = [r for r in records if split_of(r.split_key, (0.6, 0.2, 0.2), 0) == "test"]
    assert own_test and seen_in_training(meta, own_test, "abc") == 0
    assert seen_in_training(meta, records, "abc") == len(records) - len(own_test)
    # A checkpoint from before groups (no split_by) split the same records by id.
    old = {**meta, "table": {"sha256": "abc"}}
    by_id = sum(split_of(r.id, (0.6, 0.2, 0.2), 0) != "test" for r in own_test)
    assert seen_in_training(old, own_test, "abc") == by_id > 0


def test_kept_prompt_hashes_find_the_seen_records_in_any_table(
    tmp_path: Path, table_factory
) -> None:
    records = table_factory(120, seed=5)
    seen_part, unseen = records[:70], records[70:]
    # Repeats are kept once.
    write_seen_prompts(tmp_path, seen_prompt_hashes([r.split_key for r in seen_part] * 2))
    hashes = read_seen_prompts(tmp_path)
    assert hashes is not None and len(hashes) == 70
    assert (tmp_path / SEEN_FILE).stat().st_size == 70 * 8
    assert seen_by_hash(hashes, records) == 70
    assert seen_by_hash(hashes, unseen) == 0
    assert seen_by_hash(hashes, list(reversed(records[50:90]))) == 20
    assert seen_by_hash(hashes[:0], records) == 0
    # No file, or one that is not ours: nothing to go by.
    assert read_seen_prompts(tmp_path / "absent") is None
    (tmp_path / SEEN_FILE).write_bytes(b"1234567")
    assert read_seen_prompts(tmp_path) is None


def test_eval_notes_a_later_export_that_holds_the_checkpoints_training_prompts(
    trained: tuple[Path, Path], tmp_path: Path, table_factory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A later table is another file with other ids' fingerprint, but it holds the prompts
    the checkpoint was trained on: evaluated with another split seed, most of them land in
    the evaluated part, and the eval must say so (it said nothing)."""
    table, ckpt = trained
    trained_on = load_outcome_table(table)
    hashes = read_seen_prompts(ckpt)
    fitted = [r for r in trained_on if split_of(r.split_key, seed=0) != "test"]
    # Each prompt's split key and its text.
    assert hashes is not None and len(hashes) == 2 * len(fitted)
    later = tmp_path / "later.jsonl"
    write_outcome_table([*trained_on, *table_factory(100, seed=9)], later)
    base = ["--table", str(later), "--policy", f"compact:{ckpt}", "--baselines", "none"]
    base += ["--lambdas", "0,1", "--bootstrap", "0"]
    # The seed it was trained with: its training prompts are outside the test split.
    assert eval_main([*base, "--out", str(tmp_path / "same-seed")]) == 0
    assert "were among its training or validation prompts" not in capsys.readouterr().out
    assert eval_main([*base, "--split-seed", "1", "--out", str(tmp_path / "other")]) == 0
    evaluated = [r for r in load_outcome_table(later) if split_of(r.split_key, seed=1) == "test"]
    expected = sum(r.id in {f.id for f in fitted} for r in evaluated)
    assert expected > 0
    note = (
        f"{expected} of the {len(evaluated)} evaluated prompts were among its training or "
        "validation prompts"
    )
    assert note in capsys.readouterr().out
    assert note in (tmp_path / "other" / "report.md").read_text()


def test_kept_prompt_texts_find_the_same_prompts_under_other_keys(table_factory) -> None:
    """An export keys its records by the prompt's hash (the group), the table its traffic
    was drawn from by record id: the keys never match, the texts do."""
    records = table_factory(60, seed=6)
    exported = [
        r.model_copy(
            update={
                "id": f"req-{i}",
                "group": f"sha-{i}",
                "prompt": None,
                # A chat client's conversation, its whitespace not the table's.
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "  " + r.text.replace(" ", "\n", 1) + " "},
                ],
            }
        )
        for i, r in enumerate(records[:25])
    ]
    hashes = seen_prompt_hashes(k for r in exported for k in seen_keys(r))
    assert seen_by_hash(hashes, records) == 25
    assert seen_by_hash(hashes, records[25:]) == 0
    # A prompt the gateway did not log is a placeholder, the same for many requests: only
    # its key can tell it.
    blind = [
        r.model_copy(update={"prompt": "[content not logged]", "content_logged": "none"})
        for r in records[30:40]
    ]
    unlogged = seen_prompt_hashes(k for r in blind for k in seen_keys(r))
    assert len(unlogged) == 10
    other = [r.model_copy(update={"id": f"x{i}"}) for i, r in enumerate(blind)]
    assert seen_by_hash(unlogged, other) == 0
    # A checkpoint from before the texts kept the split keys alone: checked by them.
    old = seen_prompt_hashes(r.split_key for r in exported)
    assert seen_by_hash(old, records) == 0
    assert seen_by_hash(old, exported) == 25


def test_eval_notes_a_table_whose_prompts_a_traffic_trained_checkpoint_saw(
    tmp_path: Path, table_factory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reviewer's case: a checkpoint trained on an export of traffic drawn from a
    research table (split by the prompt's hash) evaluated on that table's test split (split
    by record id). Its training prompts in that split must be noted (they were not)."""
    source = table_factory(150, seed=4)
    exported = [
        r.model_copy(
            update={
                "id": f"req-{i}",
                "group": hashlib.sha256(r.text.encode()).hexdigest(),
                "prompt": None,
                "messages": [{"role": "user", "content": r.text}],
            }
        )
        for i, r in enumerate(source)
    ]
    export = tmp_path / "export.jsonl"
    write_outcome_table(exported, export)
    out = tmp_path / "run"
    argv = ["--table", str(export), "--out", str(out), "--steps", "10", "--eval-every", "5"]
    assert train_main([*argv, "--val-lambdas", "0,1", "--no-progress"]) == 0
    table = tmp_path / "source.jsonl"
    write_outcome_table(source, table)
    base = ["--table", str(table), "--policy", str(out), "--baselines", "none"]
    base += ["--lambdas", "0,1", "--bootstrap", "0", "--out", str(tmp_path / "e")]
    assert eval_main(base) == 0
    fitted = {r.text for r in exported if split_of(r.split_key, seed=0) != "test"}
    evaluated = [r for r in source if split_of(r.id, seed=0) == "test"]
    expected = sum(r.text in fitted for r in evaluated)
    assert expected > 0
    note = (
        f"{expected} of the {len(evaluated)} evaluated prompts were among its training or "
        "validation prompts"
    )
    assert note in capsys.readouterr().out
    assert note in (tmp_path / "e" / "report.md").read_text()
