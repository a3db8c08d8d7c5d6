"""Whether a logged request's chosen model was ever called: the one rule the ledger export
(``gateway.ledger.export_records``, on the ledger's call rows) and ``xrouter convert
ledger`` (``training.datasets.ledger``, on the ``calls`` an export wrote) both apply.

A call that was never made tells nothing about its model: refused by a budget (the
request's ``max_cost_usd`` or its key's budget, for its worst-case cost), skipped while its
circuit breaker was open, or one the request stopped waiting for (cancelled). Whatever
answered the request instead — the policy's next choice, or the model's configured
fallback — is another model's outcome, so such a request is no outcome of the chosen
model: crediting that model with another's score and cost would teach a router that a
model it never saw answer is as good and as cheap as its stand-in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from router.policy import CANCELLED

# The error kinds of a call never made (or not waited for), by why.
BUDGET = "budget"
CIRCUIT_OPEN = "circuit_open"
NOT_CALLED = frozenset({BUDGET, CIRCUIT_OPEN, CANCELLED})


def first_call(downstream: Sequence[Mapping[str, Any]], action: str) -> Mapping[str, Any] | None:
    """The request's first downstream call, when it was the logged action's: a row naming
    ``action``, or a fallback's row naming it as ``fallback_from``."""
    first = downstream[0] if downstream else None
    if first is None or action not in (first["model"], first.get("fallback_from")):
        return None
    return first


def not_called_reason(first: Mapping[str, Any], action: str) -> str | None:
    """Why the first call's row says ``action``'s model was never called (``budget``,
    ``circuit_open``, ``cancelled``), or None when it was called. When the call left it for
    a fallback (which answered, failed too, or was given up on), its ``fallback_reason`` —
    that model's first error — says, whatever the row's own error (then a fallback's); a
    row that does not say why (from before migration 16) counts as a call made, as it
    always did. Otherwise the row's error is the model's own."""
    reason = first.get("fallback_reason")
    if reason is not None:
        return str(reason) if reason in NOT_CALLED else None
    if first["model"] == action and first.get("error_type") in NOT_CALLED:
        return str(first["error_type"])
    return None


def chosen_not_called(calls: Sequence[Mapping[str, Any]], action: str) -> str | None:
    """Why a request's chosen model (``action``) was never called, by its call rows (router
    and downstream, in order, as the ledger and an export keep them), or None."""
    first = first_call([c for c in calls if c.get("role") == "downstream"], action)
    return None if first is None else not_called_reason(first, action)
