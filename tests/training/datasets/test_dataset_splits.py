from __future__ import annotations

import hashlib
import random

import pytest

from router.outcomes import OutcomeRecord
from training.datasets.splits import canonical_split, hash_unit, split_of, split_records


def records(n: int) -> list[OutcomeRecord]:
    return [
        OutcomeRecord.model_validate(
            {"id": f"q-{i}", "prompt": "p", "outcomes": {"m": {"score": 1}}}
        )
        for i in range(n)
    ]


def test_hash_unit_is_sha256_of_seed_and_id() -> None:
    # The split of a record must never change between runs, machines or releases: pin the
    # definition (sha256 of "<seed>:<id>", first 8 bytes big-endian, scaled to [0, 1)).
    digest = hashlib.sha256(b"3:arc-challenge.test.1108").digest()
    assert hash_unit("arc-challenge.test.1108", 3) == int.from_bytes(digest[:8], "big") / 2**64
    assert 0.0 <= hash_unit("x") < 1.0


def test_splits_are_deterministic_disjoint_and_order_free() -> None:
    recs = records(3000)
    a = split_records(recs, (0.6, 0.2, 0.2), seed=0)
    shuffled = recs[:]
    random.Random(1).shuffle(shuffled)
    b = split_records(shuffled, (0.6, 0.2, 0.2), seed=0)
    for name in ("train", "validation", "test"):
        assert {r.id for r in a.get(name)} == {r.id for r in b.get(name)}
    ids = [{r.id for r in part} for part in (a.train, a.validation, a.test)]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert set.union(*ids) == {r.id for r in recs}
    assert len(a.get("all")) == 3000
    # Fractions hold up to sampling noise (sd ~ 0.009 for 3000 records).
    assert abs(len(a.train) / 3000 - 0.6) < 0.03
    assert abs(len(a.test) / 3000 - 0.2) < 0.03


def test_a_record_keeps_its_split_when_the_table_grows() -> None:
    small = split_records(records(100), seed=5)
    large = split_records(records(1000), seed=5)
    assert {r.id for r in small.test} <= {r.id for r in large.test}


def test_seed_changes_the_split() -> None:
    recs = records(500)
    assert {r.id for r in split_records(recs, seed=0).test} != {
        r.id for r in split_records(recs, seed=1).test
    }


def test_edge_fractions_and_errors() -> None:
    assert split_of("anything", (1.0, 0.0, 0.0)) == "train"
    assert split_of("anything", (0.0, 0.0, 1.0)) == "test"
    nan, inf = float("nan"), float("inf")
    for bad in ((0.5, 0.5), (0.6, 0.3, 0.3), (1.2, -0.1, -0.1), (nan, 0.5, 0.5), (inf, -inf, 1)):
        with pytest.raises(ValueError):
            split_of("x", bad)
    assert canonical_split("val") == "validation"
    with pytest.raises(ValueError):
        canonical_split("holdout")


def test_records_of_one_group_share_a_split_and_others_keep_theirs() -> None:
    ungrouped = records(600)
    grouped = [
        r.model_copy(update={"group": f"prompt-{i % 7}"}) if i % 2 else r
        for i, r in enumerate(ungrouped)
    ]
    for seed in range(3):
        parts = split_records(grouped, seed=seed)
        where = {r.id: name for name in ("train", "validation", "test") for r in parts.get(name)}
        for g in range(7):
            members = {where[r.id] for r in grouped if r.group == f"prompt-{g}"}
            assert members == {split_of(f"prompt-{g}", seed=seed)}
        # A record without a group is placed by its id, as before groups existed.
        for r in grouped:
            if r.group is None:
                assert where[r.id] == split_of(r.id, seed=seed)


def test_a_group_is_a_non_empty_string() -> None:
    with pytest.raises(ValueError, match="group"):
        OutcomeRecord.model_validate(
            {"id": "a", "group": "", "prompt": "p", "outcomes": {"m": {"score": 1}}}
        )
    r = OutcomeRecord.model_validate(
        {"id": "a", "group": "g", "prompt": "p", "outcomes": {"m": {"score": 1}}}
    )
    assert (r.split_key, r.model_copy(update={"group": None}).split_key) == ("g", "a")
