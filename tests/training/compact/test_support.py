"""How many logged records an off-policy validation reward rests on."""

from __future__ import annotations

from typing import Any

from training.compact.support import THIN_SUPPORT, reward_ceiling, validation_support


def test_the_fewest_supporting_records_decide_whether_the_estimate_is_thin() -> None:
    rows: dict[str, dict[str, Any]] = {
        "0": {"reward": 0.8, "supporting_records": 4},
        "1": {"supporting_records": 40},
    }
    assert validation_support(rows) == {
        "supporting_records": {"0": 4, "1": 40},
        "min_supporting_records": 4,
        "thin": True,
        "thin_below": THIN_SUPPORT,
    }
    ample = validation_support({"0": {"supporting_records": THIN_SUPPORT}})
    assert ample is not None and ample["thin"] is False
    # A run on full outcomes: every validation record counts, nothing to keep.
    assert validation_support({"0": {"reward": 0.6}}) is None


def test_an_estimate_above_the_reward_ceiling_is_named() -> None:
    """No router earns more than a right answer for free (K gated, 1 additive): an
    off-policy estimate above that is noise however many records it rests on."""
    assert reward_ceiling("gated", 1.5) == 1.5
    assert reward_ceiling("additive", 1.5) == 1.0
    rows: dict[str, dict[str, Any]] = {
        "0": {"reward": 1.97, "supporting_records": 40},
        "0.5": {"reward": 1.0, "supporting_records": 40},  # exactly K: every answer right
        "1": {"reward": 0.4, "supporting_records": 40},
    }
    support = validation_support(rows, ceiling=1.0)
    assert support is not None
    assert (support["thin"], support["ceiling"], support["above_ceiling"]) == (False, 1.0, ["0"])
    # Without a ceiling (a caller that does not know the reward) nothing is said of it.
    plain = validation_support(rows)
    assert plain is not None and "above_ceiling" not in plain
