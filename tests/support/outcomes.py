"""Outcome tables shaped as some sources write them."""

from __future__ import annotations

from collections.abc import Iterable

from router.outcomes import OutcomeRecord


def without_responses(records: Iterable[OutcomeRecord]) -> list[OutcomeRecord]:
    """``records`` with scores and costs but no recorded answers, as RouterDC's and
    RouteLLM's converters write them."""
    return [
        r.model_copy(
            update={
                "outcomes": {
                    m: o.model_copy(update={"response": None}) for m, o in r.outcomes.items()
                }
            }
        )
        for r in records
    ]
