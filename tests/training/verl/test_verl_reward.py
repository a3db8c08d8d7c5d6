"""The verl reward function on worked examples: which answer a trajectory returns, what it
spent, and every term of ``router.reward`` on top."""

from __future__ import annotations

import orjson
import pytest

from training.verl.reward import compute_score, final_text, router_tokens, trajectory_score

TRUTH = orjson.dumps(
    {
        "outcomes": {
            "cheap": {"score": 0.0, "cost_usd": 0.0002},
            "dear": {"score": 1.0, "cost_usd": 0.004},
        },
        "reference_cost_usd": None,
    }
).decode()
CALLS = [
    {"id": "call_1", "model": "cheap", "score": 0.0, "cost_usd": 0.0002, "answer_key": "choice:A"},
    {"id": "call_2", "model": "dear", "score": 1.0, "cost_usd": 0.004, "answer_key": "choice:B"},
]


def info(cost_weight: float, **extra: object) -> dict[str, object]:
    reward = {"form": "gated", "K": 1.0, "c_max": 1.0, "cost_scale": 0.001}
    return {"cost_weight": cost_weight, "reward": orjson.dumps(reward).decode(), **extra}


def test_a_selection_earns_the_selected_calls_score_minus_the_cost_of_all_calls() -> None:
    r = compute_score(
        "xrouter", "Done.", TRUTH, info(0.1, xrouter_calls=CALLS, xrouter_selected="call_2")
    )
    # C = 0.0042 USD = 4.2 units; penalty min(0.1 · 4.2, 1) = 0.42; reward 1 · (1 − 0.42)
    assert r["quality"] == 1.0 and r["cost_usd"] == pytest.approx(0.0042)
    assert r["normalized_cost"] == pytest.approx(4.2) and r["penalty"] == pytest.approx(0.42)
    assert r["score"] == pytest.approx(0.58)
    assert r["calls"] == 2.0 and r["selected"] == 1.0 and r["own_answer"] == 0.0
    # The best single call: dear alone, 1 · (1 − 0.4) = 0.6 (cheap earns 0 when wrong).
    assert r["best_single_call_reward"] == pytest.approx(0.6)


def test_the_penalty_is_capped_and_a_wrong_answer_earns_nothing_however_cheap() -> None:
    r = compute_score(
        "xrouter", "", TRUTH, info(10.0, xrouter_calls=CALLS, xrouter_selected="call_2")
    )
    assert r["penalty"] == 1.0 and r["score"] == 0.0
    r = compute_score(
        "xrouter", "", TRUTH, info(0.0, xrouter_calls=CALLS[:1], xrouter_selected="call_1")
    )
    assert r["quality"] == 0.0 and r["score"] == 0.0


def test_the_additive_form_and_a_reference_cost() -> None:
    truth = orjson.loads(TRUTH) | {"reference_cost_usd": 0.004}
    extra = info(0.5, xrouter_calls=CALLS[:1], xrouter_selected="call_1")
    extra["reward"] = orjson.dumps({"form": "additive", "cost_scale": 0.001}).decode()
    r = compute_score("xrouter", "", truth, extra)
    # C̃ = 0.0002 / 0.004 = 0.05; reward 0 − 0.5 · 0.05
    assert r["normalized_cost"] == pytest.approx(0.05) and r["score"] == pytest.approx(-0.025)


def test_which_answer_a_trajectory_returns() -> None:
    assert trajectory_score(CALLS, "call_1", "B") == (0.0, "select")
    assert trajectory_score(CALLS, None, "After checking, the answer is B.") == (1.0, "repeat")
    assert trajectory_score(CALLS, None, "The answer is C.") == (0.0, "own")
    assert trajectory_score([], None, "B") == (0.0, "own")
    # A selection of an id that no call has falls back to the final text.
    assert trajectory_score(CALLS, "call_7", "(B)") == (1.0, "repeat")


def test_final_text_is_what_follows_the_last_tool_response() -> None:
    decoded = (
        'assistant\n<tool_call>\n{"name": "call_cheap", "arguments": {}}\n</tool_call>'
        "user\n<tool_response>\n[tool_call_id: call_1 | model: cheap]\nA\n</tool_response>\n"
        "assistant\nThe answer is B."
    )
    assert final_text(decoded) == "The answer is B."
    assert final_text("assistant\nPlain answer.") == "Plain answer."
    assert final_text('</tool_response>\nassistant\n<tool_call>\n{"name": "x"') == ""


def test_no_calls_no_cost() -> None:
    r = compute_score("xrouter", "B", TRUTH, info(0.3))
    assert r["cost_usd"] == 0.0 and r["score"] == 0.0 and r["own_answer"] == 1.0


def test_the_routers_own_tokens_count_at_its_price() -> None:
    # Turn 1 writes 40 chars (10 tokens) after a 100-token prompt; a 40-char tool response
    # (10 tokens) follows; turn 2 writes 12 chars (3 tokens) after 120 tokens of context.
    own1 = "assistant\n<tool_call>{}</tool_call>user\n"
    tool = "<tool_response>" + "y" * 9 + "</tool_response>"
    own2 = "\nassistant\nB"
    assert (len(own1), len(tool), len(own2)) == (40, 40, 12)
    solution = own1 + tool + own2
    assert router_tokens(solution, 100) == (100 + 120, 10 + 3)
    # Parallel results with only a role header between them (6 chars: 2 tokens of context)
    # are not a router turn.
    assert router_tokens(own1 + tool + "\nuser\n" + tool + own2, 100) == (100 + 132, 13)
    extra = info(0.0, xrouter_calls=CALLS[1:], xrouter_selected="call_2", prompt_tokens=100)
    extra["reward"] = orjson.dumps({"router_price": [1.0, 2.0]}).decode()
    r = compute_score("xrouter", solution, TRUTH, extra)
    assert r["router_cost_usd"] == pytest.approx((220 * 1.0 + 13 * 2.0) / 1e6)
    assert r["cost_usd"] == pytest.approx(0.004 + r["router_cost_usd"])
    # Free by default.
    assert (
        compute_score("xrouter", solution, TRUTH, info(0.0, prompt_tokens=100))["router_cost_usd"]
        == 0.0
    )
