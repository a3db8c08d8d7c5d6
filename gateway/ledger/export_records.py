"""One logged request -> one outcome-table record, with *partial feedback*.

Only the action the policy took has an outcome (its latest feedback score, its cost and
tokens), and ``logged`` says which action it was and with which probability
(``propensity``), which is what off-policy estimators need. Every record parses with
``router.outcomes.parse_record``.

A request whose chosen model *failed* (an error, a timeout, a refusal of the input; not a
stream its client hung up on, nor a model its open circuit kept the call away from) is
exported too, answered or not: its outcome is that call's, with score 0 and
``"failed": true``, whatever a fallback then answered. Leaving such
requests out (or folding them into the fallback's trajectory, which single-model learners
skip) would show each model's outcomes without its failures, and off-policy estimates
would overrate unreliable models.

The outcome is keyed by the logged action (the decision's first action, falling back to the
model that answered; which action, its propensity and its failure are
``gateway.ledger.export_action``'s). A request whose chosen model was never called — a budget refused it
(``max_cost_usd``, a key budget), its open circuit kept the call away, the request stopped
waiting — is left out, counted by why, whatever answered in its place: nothing in it is that
model's outcome (``router.logged_calls``, the rule ``xrouter convert ledger`` applies too).
A request that made several calls (a cascade's plan, a router calling several models) also
lists them in ``logged.actions``: its outcome is the trajectory's, and the single-model
off-policy learners and estimators skip it. Requests answered from the
answer cache (``requests.cached_from``) are not exported (``gateway.ledger.export_windows``
leaves them out; ``gateway.ledger.export_feedback`` gives their feedback to the request
whose answer they reused): no decision, no cost.

A record's ``group`` is its prompt's hash (the conversation's, as ``log_content: hash``
stores it), so the repeats of one prompt are split together: a gateway's traffic repeats
prompts under distinct request ids, and a repeat on each side of the split would score a
router on prompts it was trained on. A request whose content was not logged has no group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.ledger.export_action import (
    decision_propensity,
    first_call_failure,
    logged_action,
    logged_fields,
)
from gateway.ledger.records import messages_sha256
from pricing import micros_to_usd
from router.export_parquet import REWARD_TERMS
from router.logged_calls import BUDGET, first_call, not_called_reason


@dataclass
class ExportStats:
    """What an export wrote and what it left out."""

    records: int = 0
    # Successful requests without feedback, skipped unless ``include_unscored``.
    unscored_skipped: int = 0
    # Records of a chosen model's failed call (score 0; counted in ``records`` too).
    failures: int = 0
    # Requests whose policy could not say how likely its choice was (the ``llm`` router
    # sampling at temperature > 0): without a propensity they are no off-policy data.
    unknown_propensity: int = 0
    # Requests whose chosen model a budget (the request's ``max_cost_usd``, its key's)
    # refused before it was called, whatever answered instead: nothing about that model.
    budget_refused_skipped: int = 0
    # Requests whose chosen model was otherwise never called (its open circuit kept the call
    # away) or not waited for (the client left, the request was cancelled), whatever its
    # fallbacks or the policy's next choice then did: nothing about that model either.
    not_called_skipped: int = 0


_CALL_FIELDS = (
    "turn",
    "role",
    "model",
    "status",
    "error_type",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cost_micros",
    "latency_ms",
    "attempts",
    "fallback_from",
    # Which of the model's deployments (pool ``deployments:``) served the call, if several.
    "deployment",
    # Why a fallback answered it (the first error of the model asked for; null before
    # migration 16).
    "fallback_reason",
)


def build_record(
    row: dict[str, Any],
    call_rows: Sequence[dict[str, Any]],
    feedback_rows: Sequence[dict[str, Any]],
    include_unscored: bool = False,
    stats: ExportStats | None = None,
) -> dict[str, Any] | None:
    """The outcome-table record of one logged request (``feedback_rows`` oldest first), or
    None when it has no feedback and unscored records are not wanted, when its policy's
    propensity is unknown, or when it is a failed request whose chosen model did not fail
    (nothing to learn about that model). ``stats`` counts the records left out, by why."""
    decision = row["decision"] if isinstance(row["decision"], dict) else None
    content = row["content"] if isinstance(row["content"], dict) else None
    final_model: str | None = row["final_model"]
    action = logged_action(decision, final_model or "")
    downstream = [c for c in call_rows if c["role"] == "downstream"]
    first = first_call(downstream, action) if action else None
    not_called = not_called_reason(first, action) if first is not None else None
    if not_called is not None:
        # The chosen model was never called (see router.logged_calls): whatever answered in
        # its place — the policy's next choice after a budget refused it, its configured
        # fallback while its circuit was open — is another model's outcome, and filed under
        # the chosen action it would credit that model with a score and cost it never had
        # (and, with two actions logged, pass for a cascade's trajectory). Left out, counted
        # by why, as a failed request whose chosen model was never called always was.
        if stats is not None:
            if not_called == BUDGET:
                stats.budget_refused_skipped += 1
            else:
                stats.not_called_skipped += 1
        return None
    failed = first_call_failure(first, downstream, action, int(row["status"]))
    if failed is not None:
        score: float | None = 0.0
    elif final_model is None or not 200 <= int(row["status"]) < 300:
        return None
    else:
        score = feedback_rows[-1]["score"] if feedback_rows else None
        if score is None and not include_unscored:
            if stats is not None:
                stats.unscored_skipped += 1
            return None
    # A failure's record is its first decision's: the steps after it (a failover) were
    # forced by the failure, not chosen.
    propensity = decision_propensity(decision, first_only=failed is not None)
    if propensity is None:
        if stats is not None:
            stats.unknown_propensity += 1
        return None

    record: dict[str, Any] = {"id": row["request_id"], **_prompt_fields(content)}
    response = None
    if content is not None and record["content_logged"] == "full":
        response = content.get("response")

    outcome: dict[str, Any] = {}
    if score is not None:
        outcome["score"] = float(score)
    # The chosen model's failure is its call alone, not what a fallback bought after it;
    # an answered request's outcome is the whole request's.
    source = failed if failed is not None else {**row, "cost_micros": row["total_cost_micros"]}
    cost = int(source["cost_micros"])
    outcome.update(
        cost_usd=micros_to_usd(cost),
        cost_micros=cost,
        prompt_tokens=int(source["prompt_tokens"]),
        completion_tokens=int(source["completion_tokens"]),
        latency_ms=float(source["latency_ms"]),
        model=action if failed is not None else final_model,
    )
    if failed is not None:
        outcome.update(failed=True, error_type=failed["error_type"])
    elif response is not None:
        outcome["response"] = response
    record["outcomes"] = {action: outcome}
    if score is None:
        record["scored"] = False  # needs a score (e.g. a judge) before training

    record["logged"] = logged_fields(row, decision, action, propensity, failed is not None)
    record["created_at"] = row["created_at"].isoformat()
    if row.get("logged_at") is not None:
        # When the row reached the database (absent for rows from before migration 11).
        record["logged_at"] = row["logged_at"].isoformat()
    record.update(
        key_id=row["key_id"],
        policy=row["policy"],
        requested_model=row["requested_model"],
        router_cost_micros=int(row["router_cost_micros"]),
        downstream_cost_micros=int(row["downstream_cost_micros"]),
        calls=[{f: c[f] for f in _CALL_FIELDS} for c in call_rows],
        feedback=[
            {
                "score": float(f["score"]),
                "source": f["source"],
                "comment": f["comment"],
                "created_at": f["created_at"].isoformat(),
                "request_id": f["request_id"],
                # The reward the gateway logged with the score, every term (absent for
                # feedback from before it did).
                **_reward_terms(f),
            }
            for f in feedback_rows
        ],
    )
    return record


def _reward_terms(row: dict[str, Any]) -> dict[str, float]:
    if row.get("reward") is None:
        return {}
    return {t: float(row[t]) for t in REWARD_TERMS if row.get(t) is not None}


def _prompt_fields(content: dict[str, Any] | None) -> dict[str, Any]:
    """The record's prompt as the ledger kept it: the messages (``log_content: full``), a
    placeholder naming the prompt's hash (``hash``), or a bare placeholder (``none``); and
    its split group, the prompt's hash, the same in either of the first two modes."""
    if content is not None and content.get("messages"):
        messages = content["messages"]
        return {
            "messages": messages,
            "group": messages_sha256(messages),
            "content_logged": "full",
        }
    if content is not None and content.get("prompt_sha256"):
        digest = content["prompt_sha256"]
        return {
            "prompt": f"[content not logged; prompt_sha256={digest}]",
            "prompt_sha256": digest,
            "group": digest,
            "content_logged": "hash",
        }
    return {"prompt": "[content not logged]", "content_logged": "none"}
