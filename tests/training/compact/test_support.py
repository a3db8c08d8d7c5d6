"""How many logged records an off-policy validation reward rests on."""

from __future__ import annotations

from typing import Any

from training.compact.support import THIN_SUPPORT, validation_support


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
