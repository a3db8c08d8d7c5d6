"""How much of the validation logs an off-policy run's validation reward rests on.

An off-policy estimate of a greedy router's value rests on the validation records logged
with the action the router takes; with a handful of them it says more about the
propensities it was fitted to than about the router, and the run's validation reward (the
figure `xrouter checkpoints` lists, which selected the checkpoint) comes out high. The
count is kept with that figure. No torch here: ``xrouter train``'s argument handling reads
it before the trainer is imported.
"""

from __future__ import annotations

from typing import Any

# Fewer validation records than this logged with the chosen actions, and an off-policy
# estimate (SNIPS above all) says more about the propensities it was fitted to than about
# the router: on 72 validation prompts of a demo gateway's traffic, SNIPS reported 0.887
# for a router that scored 0.565 (5 supporting records); DR reported 0.652 for one that
# scored 0.650.
THIN_SUPPORT = 30


def reward_ceiling(form: str, K: float) -> float:
    """The most any router can earn on a prompt: a right answer for free, K under the gated
    reward s·(K − min(λ·C̃, c_max)) and 1 under the additive s − λ·C̃."""
    return K if form == "gated" else 1.0


def validation_support(
    validation: dict[str, dict[str, Any]], ceiling: float | None = None
) -> dict[str, Any] | None:
    """How many validation records the off-policy validation estimates rest on (those
    logged with the action the router takes), per λ and at the fewest, and whether that is
    thin (under ``THIN_SUPPORT``, as the console warns): kept in the run's summary and the
    checkpoint's metrics, so the figure is not read later without it. None for a run on
    full outcomes, whose validation reward rests on every record.

    With the reward's ``ceiling``, also the λ whose estimate is above it
    (``above_ceiling``): no router earns that, so the estimate is noise (IPS and DR add
    corrections weighted by 1/propensity, which a few rarely logged records blow up even
    with many records behind the estimate), whatever the count says."""
    counts = {
        lam: int(row["supporting_records"])
        for lam, row in validation.items()
        if "supporting_records" in row
    }
    if not counts:
        return None
    fewest = min(counts.values())
    support: dict[str, Any] = {
        "supporting_records": counts,
        "min_supporting_records": fewest,
        "thin": fewest < THIN_SUPPORT,
        "thin_below": THIN_SUPPORT,
    }
    if ceiling is not None:
        # A hair of float slack: SNIPS of a router right on every supporting record is
        # exactly K, computed as a weighted mean.
        support["ceiling"] = ceiling
        support["above_ceiling"] = [
            lam
            for lam, row in validation.items()
            if lam in counts and float(row.get("reward", float("-inf"))) > ceiling + 1e-9
        ]
    return support
