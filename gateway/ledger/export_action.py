"""What the deployed router did in one logged request, as its export record credits it: the
logged action (the decision's first action, else the model that answered), the probability
the policy gave it (``propensity``, what off-policy estimators weigh by), whether that
action's own call failed — and so is the record's outcome, score 0, whatever a fallback
then answered — and the record's ``logged`` fields. ``gateway.ledger.export_records``
builds the record around them.

A failure is the action's first downstream call ending in an error, or that call handed to
a configured fallback (whose row then names it in ``fallback_from``): the failure's own
share of a fallback's call is nothing. A streamed call cut because its client hung up is no
failure of the model. A failure's propensity is its first decision's: the steps after it (a
failover) were forced by the failure, not chosen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def logged_action(decision: dict[str, Any] | None, final_model: str) -> str:
    """The action the record's outcome is keyed by: the decision's first action, falling
    back to the model that answered."""
    actions = (decision or {}).get("actions") or []
    if actions and isinstance(actions[0], str) and actions[0]:
        return str(actions[0])
    return final_model


def decision_propensity(decision: dict[str, Any] | None, first_only: bool = False) -> float | None:
    """The probability the policy gave its whole action sequence (or, ``first_only``, its
    first action); 1.0 for a request that named its model (no decision was made). None when
    unknown or invalid."""
    if not decision:
        return 1.0
    props = decision.get("propensities")
    p = decision.get("propensity")
    if first_only and props:
        p = props[0]
    elif p is None:
        # An unknown propensity (null: a sampling LLM router) makes the whole one unknown.
        if not props or any(q is None for q in props):
            return None
        p = math.prod(float(q) for q in props)
    if p is None:
        return None
    p = float(p)
    if not math.isfinite(p) or p <= 0.0:
        return None
    return min(p, 1.0)  # a product of floats can overshoot 1 by an ulp


# The status of a request whose client went away before its answer was complete.
_CLIENT_CLOSED = 499


def first_call_failure(
    first: Mapping[str, Any] | None, downstream: Sequence[dict[str, Any]], action: str, status: int
) -> dict[str, Any] | None:
    """The first downstream call, when it was the logged action's and it failed: its row,
    or, when a configured fallback answered in its place (the row then names the fallback,
    with ``fallback_from``), the failure's own share of it, which is nothing. ``first`` is a
    call made (``export_records.build_record`` leaves out a request whose chosen model was
    not)."""
    if first is None:
        return None
    if first["model"] != action:
        return {
            "cost_micros": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "latency_ms": 0.0,
            "error_type": "fell_back",
        }
    if status == _CLIENT_CLOSED and first is downstream[-1] and first["error_type"] == "connection":
        # The client hung up on the stream it was reading (a chat UI's "stop generating"):
        # the call is logged as cut before its usage, but the model did not fail.
        return None
    if first["status"] != "error":
        return None
    return dict(first)


def logged_fields(
    row: dict[str, Any],
    decision: dict[str, Any] | None,
    action: str,
    propensity: float,
    failed: bool,
) -> dict[str, Any]:
    """What the deployed router did: the action, its propensity, the cost weight and policy,
    the checkpoint that decided, and a multi-call trajectory's actions."""
    logged: dict[str, Any] = {
        "action": action,
        "propensity": propensity,
        "cost_weight": row["cost_weight"],
        "policy": row["policy"],
    }
    checkpoint = (decision or {}).get("checkpoint")
    if checkpoint:
        logged["checkpoint"] = str(checkpoint)  # which deployed router decided
    actions = (decision or {}).get("actions") or []
    if len(actions) > 1 and not failed:
        # A multi-call trajectory (a cascade's plan): its outcome is not ``action``'s
        # alone, and off-policy learners over single models must know to skip it.
        logged["actions"] = [str(a) for a in actions]
    return logged
