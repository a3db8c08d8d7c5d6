"""`xrouter train --cascade`: multi-call plans measured on recorded responses, served through
the orchestration loop exactly as they were measured."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from pricing import ModelPrice
from router.checkpoint import load_checkpoint
from router.features import FeatureExtractor
from router.outcomes import OutcomeRecord, write_outcome_table
from router.plans import CascadePlan
from router.policies.checkpointed import policy_for_checkpoint
from router.policies.planned import PlannedPolicy
from router.policy import Call, Decision, LoopState, RouteContext
from router.pool import ModelPool
from tests.support.outcomes import without_responses
from tests.support.routes import trajectories
from training.compact.cli import main
from training.evaluation.cascade import CascadeRouter
from training.evaluation.loop_router import LoopRouter, pool_for, replay_model

COST = {"cheap-a": 0.0002, "cheap-b": 0.0003, "strong": 0.01}
LETTERS = "ABCD"


def make_table(n: int = 360, seed: int = 0) -> list[OutcomeRecord]:
    """Multiple-choice prompts of two kinds. On "facts" the two cheap models are right 90%
    of the time, so when they agree they are almost surely right; on "riddles" they share
    a wrong answer half the time (agreeing is no sign of being right) and the strong model
    is right 95% of the time on both."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        kind = "facts" if i % 2 else "riddles"
        right = LETTERS[int(rng.integers(4))]
        wrong = LETTERS[(LETTERS.index(right) + 1 + int(rng.integers(3))) % 4]
        if kind == "facts":
            text = f"Which year did event {i} happen? A) 1900 B) 1910 C) 1920 D) 1930"
            cheap = [right if rng.random() < 0.9 else wrong for _ in range(2)]
        else:
            text = f"Riddle {i}: what walks on {i % 7} legs at dusk? A) x B) y C) z D) w"
            shared = rng.random() < 0.5
            cheap = [wrong, wrong] if shared else [right, wrong]
        strong = right if rng.random() < 0.95 else wrong
        answers = {"cheap-a": cheap[0], "cheap-b": cheap[1], "strong": strong}
        records.append(
            OutcomeRecord.model_validate(
                {
                    "id": f"q{i}",
                    "task": kind,
                    "prompt": text,
                    "outcomes": {
                        m: {
                            "score": float(a == right),
                            "cost_usd": COST[m],
                            "response": f"The answer is ({a}).",
                        }
                        for m, a in answers.items()
                    },
                }
            )
        )
    return records


@pytest.fixture(scope="module")
def table() -> list[OutcomeRecord]:
    return make_table()


@pytest.fixture(scope="module")
def built(table: list[OutcomeRecord], tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cascade")
    path = tmp / "table.jsonl"
    write_outcome_table(table, path)
    code = main(["--table", str(path), "--out", str(tmp / "run"), "--cascade", "5,40,1000",
                 "--cost-scale", "0.01", "--val-lambdas", "0,0.5", "--name", "mc",
                 "--report-test"])  # fmt: skip
    assert code == 0
    return tmp / "run"


def test_builds_a_cascade_checkpoint_with_k_picked_on_validation(built: Path) -> None:
    ckpt = load_checkpoint(built / "checkpoint")
    arch = ckpt.architecture
    assert arch.kind == "cascade" and ckpt.metadata.training["mode"] == "cascade"
    plans = {CascadePlan(p.order, p.k, p.quorum) for p in arch.plans}
    # Every single model, and the cheap pair escalating to the strong model on disagreement.
    assert {CascadePlan((m,), 1) for m in COST} <= plans
    assert CascadePlan(("cheap-a", "cheap-b", "strong"), 2) in plans
    tried = ckpt.metadata.training["neighbours_tried"]
    assert set(map(int, tried)) == {5, 40, arch.n_examples}
    assert arch.neighbours == int(max(tried, key=lambda k: tried[k]))
    assert ckpt.weights["plan_scores"].shape == (arch.n_examples, len(arch.plans))
    summary = json.loads((built / "summary.json").read_text())
    assert summary["neighbours"] == arch.neighbours
    # --report-test: the held-out part, replayed with the plan each prompt is served.
    test = ckpt.metadata.metrics["test"]
    assert set(test) == {"0", "0.5"} and summary["test"] == test
    assert test["0"]["score"] > 0.85
    assert test["0.5"]["cost_usd"] < test["0"]["cost_usd"]
    assert ckpt.metadata.metrics["test_mean_reward"] == pytest.approx(
        np.mean([m["reward"] for m in test.values()])
    )


def test_records_only_the_config_it_used(built: Path) -> None:
    # The network's settings (steps, learning rate, ...) shape no cascade.
    config = json.loads((built / "config.json").read_text())
    assert not {"steps", "lr", "ppo_epochs", "seed", "ips_clip"} & set(config["config"])
    assert {"steps", "lr", "ppo_epochs", "seed", "ips_clip"} <= set(config["config_not_used"])
    assert config["config"]["cost_scale"] == 0.01 and config["config"]["report_test"] is True


def test_the_served_plan_follows_the_prompt_and_the_cost_weight(
    built: Path, table: list[OutcomeRecord]
) -> None:
    ckpt = load_checkpoint(built / "checkpoint")
    policy = policy_for_checkpoint(ckpt, pool_for(table))
    assert isinstance(policy, PlannedPolicy)
    fresh = make_table(200, seed=7)  # prompts the checkpoint has not seen
    x = policy.extractor.extract_batch([r.chat_messages() for r in fresh])
    plans = policy.route_batch(x, 0.05)
    pair = CascadePlan(("cheap-a", "cheap-b", "strong"), 2)
    facts = [p for p, r in zip(plans, fresh, strict=True) if r.task == "facts"]
    riddles = [p for p, r in zip(plans, fresh, strict=True) if r.task == "riddles"]
    # Where cheap answers that agree are right, ask them first; where agreeing means
    # nothing, the strong model directly.
    assert sum(p == pair for p in facts) > 0.7 * len(facts)
    assert sum(p == CascadePlan(("strong",), 1) for p in riddles) > 0.7 * len(riddles)
    # When cost dominates, one cheap call.
    assert all(len(p.order) == 1 and p.order[0] != "strong" for p in policy.route_batch(x, 50))


@pytest.mark.parametrize("lam", [0.0, 0.05, 50.0])
def test_served_through_the_loop_exactly_as_measured(
    built: Path, table: list[OutcomeRecord], lam: float
) -> None:
    """The gateway's loop (replaying the recorded responses) makes the calls and returns the
    answer that replaying the chosen plan offline gives, prompt by prompt."""
    ckpt = load_checkpoint(built / "checkpoint")
    records = table[:80]
    served = trajectories(
        LoopRouter("served", lambda pool: policy_for_checkpoint(ckpt, pool)).route(records, lam)
    )
    policy = policy_for_checkpoint(ckpt, pool_for(records))
    assert isinstance(policy, PlannedPolicy)
    x = FeatureExtractor.load().extract_batch([r.chat_messages() for r in records])
    for record, plan, got in zip(records, policy.route_batch(x, lam), served, strict=True):
        want = CascadeRouter(plan.order, plan.k, plan.quorum).trajectory(record)
        assert got.models_called == want.models_called
        assert (got.final_model, got.score) == (want.final_model, want.score)
        assert got.cost_usd == pytest.approx(want.cost_usd)
    assert any(len(r.models_called) > 1 for r in served) or lam > 1


def test_cascade_needs_recorded_responses_and_full_information(
    table: list[OutcomeRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = without_responses(table[:60])
    path = tmp_path / "bare.jsonl"
    write_outcome_table(bare, path)
    argv = ["--table", str(path), "--out", str(tmp_path / "o"), "--cascade", "5"]
    assert main(argv) == 2
    assert "recorded response" in capsys.readouterr().err
    assert main([*argv, "--knn", "5"]) == 2
    assert "one" in capsys.readouterr().err


def test_max_cheap_shapes_the_plans_and_is_refused_elsewhere(
    table: list[OutcomeRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "table.jsonl"
    write_outcome_table(table[:120], path)
    argv = ["--table", str(path), "--cost-scale", "0.01", "--no-progress", "--max-cheap", "1"]
    # One cheap model at most: no plan calls the two cheap ones to compare their answers.
    assert main([*argv, "--out", str(tmp_path / "run"), "--cascade", "5"]) == 0
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint")
    assert ckpt.metadata.training["max_cheap"] == 1
    orders = [p.order for p in ckpt.architecture.plans]
    assert orders and not any({"cheap-a", "cheap-b"} <= set(o) for o in orders), orders
    # It shapes only a cascade's plans: elsewhere it would be silently ignored.
    for mode in ([], ["--knn", "5"]):
        assert main([*argv, "--out", str(tmp_path / "other"), "--steps", "1", *mode]) == 2
        err = capsys.readouterr().err
        assert "--max-cheap applies to --cascade checkpoints only" in err, err
    assert not (tmp_path / "other").exists()


def test_plans_use_only_allowed_and_configured_models(
    built: Path, table: list[OutcomeRecord]
) -> None:
    ckpt = load_checkpoint(built / "checkpoint")
    fresh = make_table(60, seed=3)
    # A configured pool without cheap-b: its plans are masked.
    pool = pool_for(fresh).subset(["cheap-a", "strong"])
    policy = policy_for_checkpoint(ckpt, pool)
    assert isinstance(policy, PlannedPolicy)
    x = policy.extractor.extract_batch([r.chat_messages() for r in fresh])
    for lam in (0.0, 0.05, 50.0):
        assert all(set(p.order) <= {"cheap-a", "strong"} for p in policy.route_batch(x, lam))
    # A request's allow-list narrows it further.
    assert {p.order for p in policy.route_batch(x, 0.0, allowed=["strong"])} == {("strong",)}
    with pytest.raises(ValueError):
        policy.plan_mask(["cheap-b"])  # configured out: nothing to run


async def test_a_model_added_since_training_answers_only_requests_that_allow_nothing_else(
    built: Path, table: list[OutcomeRecord]
) -> None:
    ckpt = load_checkpoint(built / "checkpoint")
    known = pool_for(table)
    newcomer = replay_model("newcomer", ModelPrice(input=Decimal("0.01"), output=Decimal("0.01")))
    pool = ModelPool([*known, newcomer])
    policy = policy_for_checkpoint(ckpt, pool)
    assert isinstance(policy, PlannedPolicy) and policy.untrained == ["newcomer"]
    x = policy.extractor.extract_batch([r.chat_messages() for r in table[:40]])
    for lam in (0.0, 50.0):
        assert all("newcomer" not in p.order for p in policy.route_batch(x, lam))

    async def first_call(allowed: list[str]) -> tuple[str, Decision]:
        state = LoopState(decision=Decision("compact", 0.5))
        ctx = RouteContext(
            request_id="r", messages=table[0].chat_messages(), pool=pool.subset(allowed),
            cost_weight=0.5,
        )  # fmt: skip
        step = await policy.step(ctx, state)
        assert isinstance(step, Call)
        return step.calls[0].model, state.decision

    # With one model it knows allowed, that one's plan runs; the newcomer is never planned.
    model, decision = await first_call(["newcomer", "strong"])
    assert model == "strong"
    # Only models it was not trained on: it cannot rank them, so the cheapest answers.
    model, decision = await first_call(["newcomer"])
    assert model == "newcomer" and decision.propensities == [1.0]
