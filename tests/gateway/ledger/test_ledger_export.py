from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway import accounting
from gateway.hooks import RequestLog
from gateway.ledger import schema
from gateway.ledger.export import export_ledger, read_export
from gateway.ledger.export_cli import add_export_arguments, run_export
from gateway.ledger.export_records import ExportStats
from gateway.ledger.records import RequestRecord, messages_sha256
from gateway.ledger.store import create_ledger_engine
from gateway.ledger.writer import LedgerWriter
from gateway.principal import Principal
from gateway.settings import LedgerSettings
from pricing import load_default_catalog
from router.executors import ProviderExecutor
from router.health import BreakerConfig, CircuitBreakers
from router.loop import Orchestrator
from router.outcomes import OutcomeRecord, OutcomeTableError, load_outcome_table, parse_record
from router.policies.baselines import FixedPolicy
from router.policy import RouteContext
from router.pool import ModelPool, PoolModelConfig
from router.providers.client import DownstreamClient
from tests.gateway.conftest import Upstream

from .factories import make_cache_hit, make_feedback, make_request

T0 = 1_750_000_000.0


def read_lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]


async def load(
    engine: AsyncEngine, settings: LedgerSettings
) -> tuple[dict[str, RequestRecord], dict[str, float]]:
    """12 requests: scored ones (some twice), unscored ones, failed ones, a pass-through."""
    records = {}
    for i in range(10):
        rec = make_request(
            f"e{i:02d}",
            created_at=T0 + i,
            models=("cheap", "strong")[: 1 + i % 2],
            router_cost=3 * i,
        )
        records[rec.request_id] = rec
    passthrough = make_request("e10", created_at=T0 + 10, policy="passthrough", models=("cheap",))
    records["e10"] = passthrough
    failed = make_request("e11", created_at=T0 + 11, status=502)
    records["e11"] = failed
    latest: dict[str, float] = {}
    writer = LedgerWriter(engine, settings)
    await writer.start()
    for rec in records.values():
        writer.submit(rec)
    for i in (0, 1, 2, 3, 4, 5, 10, 11):
        rid = f"e{i:02d}" if i < 10 else f"e{i}"
        writer.submit(make_feedback(rid, 0.1, created_at=T0 + 100 + i))
        latest[rid] = 0.1
        if i % 2:
            writer.submit(make_feedback(rid, 0.9, created_at=T0 + 200 + i))  # later one wins
            latest[rid] = 0.9
    await writer.close()
    return records, latest


async def test_jsonl_export_round_trips_through_the_outcome_table_parser(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    records, latest = await load(engine, make_settings(log_content="full"))
    out = tmp_path / "out" / "ledger.jsonl"
    n = await export_ledger(engine, out, "jsonl")
    scored_ok = [rid for rid in latest if records[rid].status == 200]
    assert n == len(scored_ok) == 7  # e11 failed; e06-e09 have no feedback

    parsed = [parse_record(line) for line in read_lines(out)]
    assert [p.id for p in parsed] == sorted(scored_ok)
    for p in parsed:
        rec = records[p.id]
        assert p.messages == rec.messages  # content was logged in full
        (action, outcome) = next(iter(p.outcomes.items()))
        assert outcome.score == latest[p.id]
        extra = outcome.model_extra or {}
        assert extra["cost_micros"] == rec.total_cost_micros
        assert round(outcome.cost_usd * 1_000_000) == rec.total_cost_micros  # type: ignore[operator]
        assert outcome.response == rec.response_text
        assert (outcome.prompt_tokens, outcome.completion_tokens) == (
            rec.prompt_tokens,
            rec.completion_tokens,
        )
        assert extra["model"] == rec.final_model
        assert p.logged is not None and p.logged.action == action
        if rec.decision is None:  # pass-through: the model was named, nothing was chosen
            assert (action, p.logged.propensity) == (rec.final_model, 1.0)
        else:
            assert action == rec.decision["actions"][0]
            assert p.logged.propensity == rec.decision["propensity"]
        assert p.logged.cost_weight == rec.cost_weight
        assert p.logged.policy == rec.policy
        calls = (p.model_extra or {})["calls"]
        assert [c["cost_micros"] for c in calls] == [c.cost_micros for c in rec.calls]
        assert [f["score"] for f in (p.model_extra or {})["feedback"]][-1] == latest[p.id]

    # Unscored requests on request, marked so they can't be mistaken for training data.
    everything = tmp_path / "all.jsonl"
    assert await export_ledger(engine, everything, "jsonl", include_unscored=True) == 11
    assert len(read_export(everything)) == 7
    with pytest.raises(ValueError):
        read_export(everything, skip_unscored=False)  # an outcome without a score is invalid
    # The training side's reader says why, and what to do.
    with pytest.raises(OutcomeTableError, match=r"is unscored .*--include-unscored"):
        load_outcome_table(everything)


async def test_parquet_export_holds_the_same_records(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    pytest.importorskip("pyarrow")
    await load(engine, make_settings(log_content="full"))
    jsonl, parquet = tmp_path / "a.jsonl", tmp_path / "a.parquet"
    assert await export_ledger(engine, jsonl, "jsonl") == 7
    assert await export_ledger(engine, parquet, "parquet") == 7
    from_jsonl = read_export(jsonl)
    from_parquet = read_export(parquet)
    assert [r.model_dump() for r in from_parquet] == [r.model_dump() for r in from_jsonl]
    # The training side reads the Parquet export as it reads the JSONL one: the outcome
    # table reader (xrouter train / eval) and the ledger converter (xrouter convert ledger).
    from router.outcomes import load_outcome_table
    from training.datasets.ledger import convert_ledger

    expected = [r.model_dump() for r in from_jsonl]
    assert [r.model_dump() for r in load_outcome_table(parquet)] == expected
    assert [r.model_dump() for r in convert_ledger([parquet])] == [
        r.model_dump() for r in convert_ledger([jsonl])
    ]


async def test_parquet_export_keeps_the_logged_reward_terms(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    # The feedback struct named only score, source, comment, created_at and request_id:
    # pyarrow dropped the reward terms the JSONL export writes with each score.
    pytest.importorskip("pyarrow")
    from router.export_parquet import read_parquet_records

    writer = LedgerWriter(engine, make_settings(log_content="full"))
    await writer.start()
    writer.submit(make_request("r1", created_at=T0, models=("cheap",)))
    writer.submit(make_request("r2", created_at=T0 + 1, models=("cheap",)))
    terms = {"reward": 0.8, "cost_usd": 0.01, "cost_weight": 0.5, "normalized_cost": 0.1,
             "penalty": 0.05}  # fmt: skip
    writer.submit(make_feedback("r1", 0.9, created_at=T0 + 10, **terms))
    writer.submit(make_feedback("r2", 1.0, created_at=T0 + 11))  # logged without a reward
    await writer.close()
    jsonl, parquet = tmp_path / "a.jsonl", tmp_path / "a.parquet"
    assert await export_ledger(engine, jsonl, "jsonl") == 2
    assert await export_ledger(engine, parquet, "parquet") == 2
    import json

    from_jsonl = [json.loads(line)["feedback"] for line in jsonl.read_text().splitlines()]
    from_parquet = [r["feedback"] for r in read_parquet_records(parquet)]
    assert from_parquet == from_jsonl
    assert {k: from_parquet[0][0][k] for k in terms} == terms
    assert "reward" not in from_parquet[1][0]


async def test_without_logged_content_the_prompt_is_a_hash_note(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    records, _ = await load(engine, make_settings(log_content="hash"))
    out = tmp_path / "h.jsonl"
    await export_ledger(engine, out, "jsonl", since=T0 + 1, until=T0 + 4)
    parsed: list[OutcomeRecord] = [parse_record(line) for line in read_lines(out)]
    assert [p.id for p in parsed] == ["e01", "e02", "e03"]
    for p in parsed:
        sha = (p.model_extra or {})["prompt_sha256"]
        assert sha == messages_sha256(records[p.id].messages or [])
        assert p.group == sha  # as a full export groups it: the same prompt, the same split
        assert p.messages is None and p.prompt is not None and sha in p.prompt
        assert next(iter(p.outcomes.values())).response is None


async def test_repeats_of_a_prompt_share_a_group_and_so_a_split(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    """Traffic repeats prompts under distinct request ids: the export groups them by the
    prompt's hash, so a split never puts one repeat in train and another in test."""
    from training.datasets.splits import split_records

    same = [{"role": "user", "content": "the same question"}]
    asked = {
        f"r{i:02d}": same if i % 3 == 0 else [{"role": "user", "content": f"q{i}"}]
        for i in range(30)
    }
    writer = LedgerWriter(engine, make_settings(log_content="full"))
    await writer.start()
    for i, (rid, messages) in enumerate(asked.items()):
        writer.submit(make_request(rid, created_at=T0 + i, messages=messages))
        writer.submit(make_feedback(rid, 1.0, created_at=T0 + 100 + i))
    await writer.close()
    out = tmp_path / "full.jsonl"
    assert await export_ledger(engine, out, "jsonl") == 30
    full = read_export(out)
    assert {r.id: r.group for r in full} == {
        rid: messages_sha256(messages) for rid, messages in asked.items()
    }
    repeats = {r.id for r in full if r.group == messages_sha256(same)}
    assert len(repeats) == 10
    for seed in range(5):
        parts = split_records(full, seed=seed)
        holding = [
            name
            for name in ("train", "validation", "test")
            if repeats & {r.id for r in parts.get(name)}
        ]
        assert len(holding) == 1, (seed, holding)
    # Split by id alone, the ten repeats would straddle the parts.
    by_id = split_records([r.model_copy(update={"group": None}) for r in full], seed=0)
    assert sum(bool(repeats & {r.id for r in by_id.get(n)}) for n in ("train", "test")) == 2

    if importlib.util.find_spec("pyarrow") is not None:
        parquet = tmp_path / "full.parquet"
        await export_ledger(engine, parquet, "parquet")
        assert [r.group for r in read_export(parquet)] == [r.group for r in full]


async def test_cli_export(
    engine: AsyncEngine,
    make_settings: Callable[..., LedgerSettings],
    ledger_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await load(engine, make_settings())
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    out = tmp_path / "cli.jsonl"
    args = parser.parse_args(
        ["--out", str(out), "--since", "2025-06-15T15:06:43+00:00", "--key", "key_test0001"]
    )
    assert await run_export(args, ledger_url) == 0
    # e06-e09 have no feedback: the user is told they were left out, and how to get them.
    assert capsys.readouterr().out.strip() == (
        f"exported 4 records to {out}; skipped 4 successful requests without feedback "
        "(score them with POST /v1/feedback, or export them unscored with --include-unscored)"
    )
    ids = [parse_record(line).id for line in read_lines(out)]
    assert ids == ["e03", "e04", "e05", "e10"]  # e00-e02 are before --since
    everything = parser.parse_args(["--out", str(out), "--include-unscored"])
    assert await run_export(everything, ledger_url) == 0
    assert capsys.readouterr().out.strip() == f"exported 11 records to {out}"

    bad = parser.parse_args(["--out", str(out), "--until", "yesterday"])
    assert await run_export(bad, ledger_url) == 2
    assert capsys.readouterr().err.startswith("error: --until: 'yesterday' is not")
    # An unreachable database, a URL that is none, an unwritable output: one line, exit 2.
    unwritable = parser.parse_args(["--out", str(out / "under-a-file.jsonl")])
    assert await run_export(unwritable, ledger_url) == 2
    assert capsys.readouterr().err == (
        f"error: --out {out}/under-a-file.jsonl: cannot write in {out}: Not a directory\n"
    )
    anywhere = parser.parse_args(["--out", str(out)])
    assert await run_export(anywhere, "postgresql+asyncpg://postgres@127.0.0.1:9/x") == 2
    err = capsys.readouterr().err
    assert "error: export failed: Error: cannot reach the database: ConnectionRefusedError" in err
    assert await run_export(anywhere, "not a url") == 2
    assert "error:" in capsys.readouterr().err


async def test_a_request_without_a_known_propensity_is_left_out_and_counted(
    engine: AsyncEngine,
    make_settings: Callable[..., LedgerSettings],
    ledger_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The llm router sampling at temperature > 0 logs null propensities: its requests are
    no off-policy data, so they are not exported as if chosen with probability 1."""
    sampled = {
        "policy": "llm",
        "cost_weight": 0.5,
        "actions": ["cheap", "select:cheap"],
        "propensities": [None, None],
        "propensity": None,
    }
    unknown = make_request("u1", created_at=T0, models=("cheap",), decision=sampled)
    known = make_request("u2", created_at=T0 + 1, models=("cheap",))
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    for rec in (unknown, known):
        writer.submit(rec)
        writer.submit(make_feedback(rec.request_id, 1.0, created_at=T0 + 10))
    await writer.close()
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    out = tmp_path / "ledger.jsonl"
    assert await run_export(parser.parse_args(["--out", str(out)]), ledger_url) == 0
    assert capsys.readouterr().out.strip() == (
        f"exported 1 records to {out}; skipped 1 requests whose policy logged no usable "
        "propensity (as the llm router sampling at temperature > 0): no off-policy data"
    )
    (only,) = [parse_record(line) for line in read_lines(out)]
    assert only.id == "u2" and only.logged is not None and only.logged.propensity > 0


def cache_hit(request_id: str, of: RequestRecord, created_at: float) -> RequestRecord:
    return make_cache_hit(request_id, of, created_at=created_at)


async def test_feedback_on_a_cache_hit_scores_the_request_whose_answer_it_reused(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    original = make_request("o1", created_at=T0, models=("cheap",))
    hits = [cache_hit("h1", original, T0 + 1), cache_hit("h2", original, T0 + 2)]
    hits[1].key_id = "key_other0001"
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    for rec in (original, *hits):
        writer.submit(rec)
    writer.submit(make_feedback("h2", 0.2, created_at=T0 + 20))
    writer.submit(make_feedback("h1", 0.8, created_at=T0 + 10))
    await writer.close()
    formats: tuple[tuple[Literal["jsonl", "parquet"], Path], ...] = (
        ("jsonl", tmp_path / "x.jsonl"),
        ("parquet", tmp_path / "x.parquet"),
    )
    for fmt, out in formats:
        assert await export_ledger(engine, out, fmt) == 1  # the hits made no decision
        (exported,) = read_export(out)
        assert exported.id == "o1" and exported.outcomes["cheap"].score == 0.2  # the latest
        given = exported.model_dump()["feedback"]
        assert [(f["request_id"], f["score"]) for f in given] == [("h1", 0.8), ("h2", 0.2)]
    # A key's export: that key's feedback only (h2 came from another key, through a cache
    # shared by every key).
    out = tmp_path / "key.jsonl"
    assert await export_ledger(engine, out, "jsonl", key_id=original.key_id) == 1
    (exported,) = read_export(out)
    assert [f["request_id"] for f in exported.model_dump()["feedback"]] == ["h1"]
    assert exported.outcomes["cheap"].score == 0.8


async def test_a_multi_call_request_lists_its_calls_so_learners_can_skip_it(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    plan = ("cheap", "mid", "strong")
    decision = {
        "policy": "compact",
        "cost_weight": 0.5,
        "feature_version": "v1",
        "actions": list(plan),
        "propensities": [1.0, 1.0, 1.0],
        "propensity": 1.0,
        "distribution": None,
        "explored": False,
        "checkpoint": "0123456789ab",
    }
    cascade = make_request("m1", created_at=T0, models=plan, decision=decision)
    single = make_request("m2", created_at=T0 + 1, models=("cheap",))
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    for rec in (cascade, single):
        writer.submit(rec)
        writer.submit(make_feedback(rec.request_id, 1.0, created_at=T0 + 10))
    await writer.close()
    out = tmp_path / "ledger.jsonl"
    assert await export_ledger(engine, out, "jsonl") == 2
    by_id = {p.id: p for p in (parse_record(line) for line in read_lines(out))}
    multi, one = by_id["m1"].logged, by_id["m2"].logged
    assert multi is not None and one is not None
    assert multi.actions == list(plan) and multi.multi_call
    assert multi.checkpoint == "0123456789ab" and one.checkpoint is None
    # The outcome is the whole trajectory's: every call's cost.
    assert by_id["m1"].outcomes["cheap"].cost_micros == cascade.total_cost_micros  # type: ignore[attr-defined]
    assert one.actions is None and not one.multi_call
    # Parquet keeps it too.
    pq = tmp_path / "ledger.parquet"
    assert await export_ledger(engine, pq, "parquet") == 2
    back = {r.id: r.logged for r in read_export(pq)}
    assert back["m1"] is not None and back["m1"].actions == list(plan) and back["m1"].multi_call
    assert back["m1"].checkpoint == "0123456789ab"
    assert back["m2"] is not None and not back["m2"].multi_call


async def test_calls_say_which_deployment_served_them(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    """``calls.deployment`` (migration 9): which of a model's deployments (pool
    ``deployments:``) answered, for models that have several."""
    pytest.importorskip("pyarrow")
    rec = make_request("d1", created_at=T0, models=("cheap", "strong"), router_cost=5)
    rec.calls[2].deployment = "strong-eu"
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    writer.submit(rec)
    writer.submit(make_feedback("d1", 1.0, created_at=T0 + 10))
    await writer.close()
    formats: tuple[tuple[Literal["jsonl", "parquet"], Path], ...] = (
        ("jsonl", tmp_path / "x.jsonl"),
        ("parquet", tmp_path / "x.parquet"),
    )
    for fmt, out in formats:
        assert await export_ledger(engine, out, fmt) == 1
        (got,) = read_export(out)
        calls = got.model_dump()["calls"]
        assert [(c["role"], c["deployment"]) for c in calls] == [
            ("router", None),
            ("downstream", None),
            ("downstream", "strong-eu"),
        ], fmt


def failing(rec: RequestRecord, model: str, error_type: str, status: str = "error") -> None:
    """Mark ``rec``'s call to ``model`` failed, as the gateway logs one."""
    call = next(c for c in rec.calls if c.model == model)
    call.status, call.error_type = status, error_type


async def test_a_chosen_model_that_failed_is_exported_as_its_failure(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    # Explored "weak" (p = 0.2) failed and "strong" answered in its place (a failover,
    # forced, p = 1): the record is weak's failure, not a trajectory learners skip, or weak's
    # outcomes would hold only its successes.
    failover = {
        "policy": "compact",
        "cost_weight": 0.5,
        "actions": ["weak", "strong"],
        "propensities": [0.2, 1.0],
        "propensity": 0.2,
    }
    answered = make_request(
        "f1", created_at=T0, models=("weak", "strong"), call_costs=(40, 900), decision=failover
    )
    failing(answered, "weak", "upstream_5xx")
    # Every model failed: no answer, no feedback, still the chosen model's outcome.
    lost = make_request("f2", created_at=T0 + 1, models=("weak",), call_costs=(0,), status=502)
    lost.decision = {**failover, "actions": ["weak"], "propensities": [0.5], "propensity": 0.5}
    failing(lost, "weak", "timeout")
    # Calls never made say nothing about their model: refused by a budget, circuit open.
    refused = make_request("f3", created_at=T0 + 2, models=("weak",), call_costs=(0,), status=429)
    failing(refused, "weak", "budget", status="refused")
    skipped = make_request("f4", created_at=T0 + 3, models=("weak",), call_costs=(0,), status=503)
    failing(skipped, "weak", "circuit_open")
    # Nor a call the request stopped waiting for: its client left before the answer.
    left = make_request("f6", created_at=T0 + 5, models=("weak",), call_costs=(0,), status=499)
    failing(left, "weak", "cancelled")
    # Weak's configured fallback answered within the one call: the row names "strong",
    # fallen back from "weak". Still weak's failure, not strong's success credited to weak.
    fell_back = make_request(
        "f5", created_at=T0 + 4, models=("strong",), call_costs=(700,), decision=dict(failover)
    )
    fell_back.decision = {**failover, "actions": ["weak"], "propensities": [0.4], "propensity": 0.4}
    fell_back.calls[0].fallback_from = "weak"
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    for rec in (answered, lost, refused, skipped, fell_back, left):
        writer.submit(rec)
    writer.submit(make_feedback("f1", 1.0, created_at=T0 + 10))  # strong's answer was good
    await writer.close()

    for fmt in ("jsonl", "parquet"):
        out = tmp_path / f"ledger.{fmt}"
        assert await export_ledger(engine, out, fmt) == 3
        by_id = {r.id: r for r in read_export(out)}
        assert sorted(by_id) == ["f1", "f2", "f5"]
        for rid, p, cost in (("f1", 0.2, 40), ("f2", 0.5, 0), ("f5", 0.4, 0)):
            got = by_id[rid]
            assert list(got.outcomes) == ["weak"], fmt
            outcome = got.outcomes["weak"]
            extra = outcome.model_extra or {}
            assert (outcome.score, extra["failed"], extra["cost_micros"]) == (0.0, True, cost)
            assert got.logged is not None and not got.logged.multi_call
            assert (got.logged.action, got.logged.propensity) == ("weak", p)


async def test_a_model_its_circuit_kept_away_is_not_exported_as_failed(
    engine: AsyncEngine,
    make_settings: Callable[..., LedgerSettings],
    tmp_path: Path,
    upstream: Upstream,
) -> None:
    """A half-open circuit with its probe out refuses every other call to its model, which
    its configured fallback answers: the row said only "fallen back from", as after a call
    that failed, and the export made each such request a score-0 failure of the model that
    was never called — teaching the router against a model as it recovers. Nor is it that
    model's success: the fallback's answer is no outcome of it, so the request is left out."""
    chosen, fallback = "gemma-2-9b-it", "llama-3.3-70b-instruct"
    pool = ModelPool.from_configs(
        [
            PoolModelConfig(
                name=m,
                model=f"openai/{m}",
                api_base=upstream.base_url,
                timeout_s=5,
                max_retries=0,
                fallbacks=[fallback] if m == chosen else [],
            )
            for m in (chosen, fallback)
        ],
        load_default_catalog(),
    )
    clock = [0.0]
    breakers = CircuitBreakers(BreakerConfig(failures=1, cooldown_s=30), clock=lambda: clock[0])
    client = DownstreamClient(pool, breakers=breakers)
    writer = LedgerWriter(engine, make_settings())
    await writer.start()

    async def serve(request_id: str) -> None:
        """Route one request to ``chosen`` and book it as the gateway does."""
        messages = [{"role": "user", "content": f"hello from {request_id}"}]
        ctx = RouteContext(request_id=request_id, messages=messages, pool=pool, cost_weight=0.5)
        rlog = RequestLog(request_id, time.time(), Principal(), time.perf_counter())
        rlog.requested_model, rlog.policy, rlog.status = chosen, f"fixed:{chosen}", 200
        result = await Orchestrator(ProviderExecutor(client)).run(FixedPolicy(chosen), ctx)
        assert result.final_model == fallback
        writer.submit(accounting.build_record(rlog, result, result.state))
        writer.submit(make_feedback(request_id, 1.0))  # the fallback's answer was good

    try:
        # Called, it fails: its circuit opens and the fallback answers. Its failure.
        upstream.fault(chosen, "status=500", count=1)
        await serve("called")
        # The cooldown is over and another request's probe is out: this one is kept away.
        clock[0] += 30
        assert breakers.allow(chosen)
        await serve("kept-away")
        assert upstream.stats()["requests"] == {chosen: 1, fallback: 2}
    finally:
        await writer.close()
        await client.aclose()

    async with engine.connect() as conn:
        # Each call row says why it fell back.
        rows = await conn.execute(
            sa.select(schema.calls.c.request_id, schema.calls.c.fallback_reason)
        )
        reasons = dict(rows.tuples().all())
    assert reasons == {"called": "upstream_5xx", "kept-away": "circuit_open"}
    for fmt in ("jsonl", "parquet"):
        out = tmp_path / f"ledger.{fmt}"
        stats = ExportStats()
        assert await export_ledger(engine, out, fmt, stats=stats) == 1
        by_id = {r.id: r for r in read_export(out)}
        failed = by_id["called"].outcomes[chosen]
        assert (failed.score, (failed.model_extra or {}).get("error_type")) == (0.0, "fell_back")
        assert [c["fallback_reason"] for c in by_id["called"].model_dump()["calls"]] == [
            "upstream_5xx"
        ], fmt
        assert "kept-away" not in by_id and stats.not_called_skipped == 1, fmt


async def test_a_failed_request_whose_chosen_model_was_never_called_is_left_out_and_counted(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    """The rows a failed request leaves once its call went on to weak's fallback (as
    tests/gateway/ledger/test_ledger_export_fallbacks.py sees the gateway write them): a
    reason of a call never made leaves the request out, counted, whatever the row's own
    error (a fallback's); a reason of a call made keeps it weak's failure."""
    decision = {"policy": "compact", "actions": ["weak"], "propensities": [0.5], "propensity": 0.5}

    def failed(
        rid: str, status: int, model: str, error_type: str, reason: str | None
    ) -> RequestRecord:
        rec = make_request(rid, created_at=T0, models=(model,), call_costs=(0,), status=status)
        rec.decision = dict(decision)
        failing(rec, model, error_type)
        rec.calls[-1].fallback_from = "weak" if model != "weak" else None
        rec.calls[-1].fallback_reason = reason
        return rec

    records = [
        # Every fallback failed too: the row names weak, with the last fallback's error.
        failed("kept-away", 502, "weak", "upstream_4xx", "circuit_open"),
        failed("called", 502, "weak", "upstream_4xx", "upstream_5xx"),
        # Given up on while the fallback had the request: the row names the fallback.
        failed("kept-away-left", 499, "strong", "cancelled", "circuit_open"),
        failed("called-left", 499, "strong", "timeout", "upstream_5xx"),
        # Given up on between the fallback's attempts, after weak was called and failed.
        failed("called-left-between", 499, "weak", "cancelled", "upstream_5xx"),
        # A row that does not say (no fallback, or before migration 16): its own error.
        failed("unsaid", 502, "weak", "upstream_5xx", None),
    ]
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    for rec in records:
        writer.submit(rec)
    await writer.close()

    stats = ExportStats()
    out = tmp_path / "ledger.jsonl"
    assert await export_ledger(engine, out, stats=stats) == 4
    by_id = {r.id: r for r in read_export(out)}
    assert sorted(by_id) == ["called", "called-left", "called-left-between", "unsaid"]
    for got in by_id.values():
        assert (got.outcomes["weak"].score, (got.outcomes["weak"].model_extra or {})["failed"]) == (
            0.0,
            True,
        )
    assert (stats.failures, stats.not_called_skipped) == (4, 2)


async def test_a_database_that_holds_another_schema_is_one_line_not_a_traceback(
    ledger_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --ledger pointed at the wrong database (someone else's `requests` table, no ledger
    # schema_version): the export refuses it, and the user reads why (it was a migration
    # that failed to adopt it; `test_export_reads_only` has more such databases).
    (tmp_path / "db").mkdir(exist_ok=True)  # where the SQLite ledger_url points
    foreign = create_ledger_engine(ledger_url)
    try:
        async with foreign.begin() as conn:
            await conn.execute(sa.text("CREATE TABLE requests (x INTEGER)"))
    finally:
        await foreign.dispose()
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    out = tmp_path / "ledger.jsonl"
    assert await run_export(parser.parse_args(["--out", str(out)]), ledger_url) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    where = ledger_url.removeprefix("sqlite+aiosqlite:///")
    assert line == (
        f"error: no ledger database at {where} (it holds no xrouter ledger: no "
        "schema_version table)"
    )
    assert not out.exists()


async def test_a_file_path_given_for_the_ledger_url_says_what_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--ledger xrouter.db` said "Could not parse SQLAlchemy URL from given URL string".
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    out = tmp_path / "ledger.jsonl"
    assert await run_export(parser.parse_args(["--out", str(out)]), "xrouter.db") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "is not a database URL" in line and "sqlite+aiosqlite:///./xrouter.db" in line
    assert not out.exists()


async def test_a_stream_the_client_hung_up_on_is_not_its_models_failure(
    engine: AsyncEngine, make_settings: Callable[..., LedgerSettings], tmp_path: Path
) -> None:
    # A client that stops reading (a chat UI's "stop generating") leaves a 499 row whose
    # call, cut before its usage, is logged as a `connection` error: the model did not fail,
    # and exporting it as a score-0 failure would teach the router that models users
    # interrupt are unreliable.
    decision = {"policy": "compact", "actions": ["weak"], "propensities": [0.5], "propensity": 0.5}
    hung_up = make_request("c1", created_at=T0, models=("weak",), status=499, decision=decision)
    failing(hung_up, "weak", "connection")
    # The upstream cutting the stream is the model's failure (502), as is a chosen model
    # that failed before the client left while its fallback streamed.
    cut = make_request("c2", created_at=T0 + 1, models=("weak",), status=502, decision=decision)
    failing(cut, "weak", "connection")
    failover = {**decision, "actions": ["weak", "strong"], "propensities": [0.5, 1.0]}
    failed_first = make_request(
        "c3", created_at=T0 + 2, models=("weak", "strong"), status=499, decision=failover
    )
    failing(failed_first, "weak", "upstream_5xx")
    failing(failed_first, "strong", "connection")
    # Weak failed and its configured fallback streamed in the same call until the hang-up.
    fell_back = make_request("c4", created_at=T0 + 3, models=("strong",), status=499)
    fell_back.decision = decision
    fell_back.calls[0].fallback_from = "weak"
    failing(fell_back, "strong", "connection")
    writer = LedgerWriter(engine, make_settings())
    await writer.start()
    for rec in (hung_up, cut, failed_first, fell_back):
        writer.submit(rec)
    await writer.close()
    out = tmp_path / "ledger.jsonl"
    assert await export_ledger(engine, out, "jsonl") == 3
    by_id = {r.id: r for r in read_export(out)}
    assert sorted(by_id) == ["c2", "c3", "c4"]
    assert (by_id["c3"].outcomes["weak"].model_extra or {})["error_type"] == "upstream_5xx"
    assert (by_id["c4"].outcomes["weak"].model_extra or {})["error_type"] == "fell_back"


async def test_a_url_without_its_async_driver_is_the_ledgers_database(
    engine: AsyncEngine,
    make_settings: Callable[..., LedgerSettings],
    ledger_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # `postgresql://…` is how LiteLLM's DATABASE_URL and most tools write a database URL;
    # SQLAlchemy would pick a sync driver that is not installed and fail with an ImportError
    # traceback. The ledger runs on its async drivers, whatever the URL leaves unsaid.
    await load(engine, make_settings())
    plain = ledger_url.replace("+asyncpg", "").replace("+aiosqlite", "")
    assert plain != ledger_url
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    out = tmp_path / "plain.jsonl"
    assert await run_export(parser.parse_args(["--out", str(out)]), plain) == 0
    assert capsys.readouterr().out.startswith(f"exported 7 records to {out}")
    # A database the ledger does not run on: one line, not a traceback.
    assert await run_export(parser.parse_args(["--out", str(out)]), "mysql://u@127.0.0.1/x") == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ")
