"""The reward of a router trajectory on verl: ``router.reward`` (the one reward module) on
the answer the trajectory returns and the money it spent.

verl loads ``compute_score`` by path (``reward.custom_reward_function.path`` and ``.name``)
and calls it with the decoded response, the row's ``reward_model.ground_truth`` (each
model's recorded score and cost, from ``training.verl.data``) and ``extra_info`` (the row's
cost weight and reward settings, plus the calls ``training.verl.tools`` recorded). Every
term goes back as its own key, which verl logs per step.

Which answer the trajectory returns, as the gateway's loop decides it:

1. ``select_response`` chose a call: that call's recorded score;
2. the router wrote a final answer after calling models: the best score among the calls
   whose normalized answer (``router.answers.normalize_answer``) it repeats — a rewrite
   that keeps a model's answer earns that answer's score;
3. anything else — an answer of its own with nothing recorded to grade it against —
   scores 0. Outcome tables record downstream models only, so a router trained on them
   learns to answer through models; the cost of the calls is charged either way.

The cost is every call's recorded cost plus the router's own tokens at the router's price
(``xrouter verl-data --router-price``; free by default, as a self-hosted router is in the
gateway): each turn reads the whole context so far and writes its text. Token counts are
estimated from text (``pricing.estimate_tokens``) — the reward function sees decoded text,
not token ids — which is exact enough for a term that is small next to downstream calls.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from pricing import estimate_tokens
from router.answers import normalize_answer
from router.reward import RewardConfig, compute_reward

# Kept in step with training.verl.tools, which this module must not import: verl loads the
# reward function in processes that need no tool classes.
CALLS = "xrouter_calls"
SELECTED = "xrouter_selected"

_TOOL_CALL = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.S)
_TOOL_RESPONSE = re.compile(r"<tool_response>.*?</tool_response>", re.S)
_ROLE_HEADER = re.compile(r"^\s*(assistant|user|tool)\s*\n")


def final_text(solution_str: str) -> str:
    """The router's last words: what follows the last tool response in the decoded
    trajectory (Hermes format, special tokens skipped), without tool calls or role
    headers."""
    tail = solution_str.rsplit("</tool_response>", 1)[-1]
    tail = _TOOL_CALL.sub("", tail)
    while (m := _ROLE_HEADER.match(tail)) is not None:
        tail = tail[m.end() :]
    return tail.strip()


def router_tokens(solution_str: str, prompt_tokens: int) -> tuple[int, int]:
    """(input, output) tokens of the router's turns: the trajectory alternates the router's
    text with tool responses; each router turn reads everything before it."""
    context, read, written = prompt_tokens, 0, 0
    pos = 0
    for m in [*_TOOL_RESPONSE.finditer(solution_str), None]:
        own = solution_str[pos : m.start() if m else len(solution_str)]
        if _ROLE_HEADER.sub("", own).strip():  # a turn (not only the header between results)
            read += context
            written += estimate_tokens(own)
        context += estimate_tokens(own)
        if m is not None:
            context += estimate_tokens(m.group(0))
            pos = m.end()
    return read, written


def _json(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str | bytes) else value


def trajectory_score(
    calls: list[dict[str, Any]], selected: str | None, solution_str: str
) -> tuple[float, str]:
    """(score, how it was decided: select | repeat | own)."""
    if selected is not None:
        for c in calls:
            if c["id"] == selected:
                return float(c["score"]), "select"
    key = normalize_answer(final_text(solution_str))
    matches = [float(c["score"]) for c in calls if key and c.get("answer_key") == key]
    if matches:
        return max(matches), "repeat"
    return 0.0, "own"


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str | dict[str, Any],
    extra_info: dict[str, Any] | None = None,
    **_: Any,
) -> dict[str, float]:
    info = extra_info or {}
    truth = _json(ground_truth) or {}
    reward_settings = dict(_json(info.get("reward")) or {})
    price_in, price_out = (float(p) for p in reward_settings.pop("router_price", (0.0, 0.0)))
    reward_cfg = RewardConfig(**reward_settings)
    calls = [c for c in (info.get(CALLS) or []) if isinstance(c, dict)]
    selected = info.get(SELECTED)
    score, how = trajectory_score(
        calls, selected if isinstance(selected, str) else None, solution_str
    )
    cost = sum(float(c.get("cost_usd") or 0.0) for c in calls)
    router_cost = 0.0
    if price_in or price_out:
        read, written = router_tokens(solution_str, int(info.get("prompt_tokens") or 0))
        router_cost = (read * price_in + written * price_out) / 1e6
    cost += router_cost
    terms = compute_reward(
        score,
        cost,
        float(info.get("cost_weight") or 0.0),
        reward_cfg,
        truth.get("reference_cost_usd"),
    )
    # What the best single call would have earned: the trajectory's regret, for monitoring.
    best = max(
        (
            compute_reward(
                float(o["score"]),
                float(o["cost_usd"]),
                terms.cost_weight,
                reward_cfg,
                truth.get("reference_cost_usd"),
            ).reward
            for o in (truth.get("outcomes") or {}).values()
        ),
        default=terms.reward,
    )
    return {
        "score": terms.reward,
        "quality": terms.score,
        "cost_usd": terms.cost_usd,
        "router_cost_usd": router_cost,
        "normalized_cost": terms.normalized_cost,
        "penalty": terms.penalty,
        "cost_weight": terms.cost_weight,
        "calls": float(len(calls)),
        "selected": 1.0 if how == "select" else 0.0,
        "own_answer": 1.0 if how == "own" else 0.0,
        "best_single_call_reward": best,
    }
