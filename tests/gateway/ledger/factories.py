"""Builders shared by the ledger tests: records whose costs add up, a metrics sink that
remembers what it was told, and small database helpers."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.records import CallRecord, FeedbackRecord, RequestRecord

PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_ADMIN_DSN = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/postgres"


def pg_url(database: str) -> str:
    return f"postgresql+asyncpg://postgres@{PG_HOST}:{PG_PORT}/{database}"


async def pg_admin(*statements: str, database: str = "postgres") -> None:
    conn = await asyncpg.connect(f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{database}", timeout=5)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


def make_request(
    request_id: str,
    *,
    created_at: float | None = None,
    key_id: str | None = "key_test0001",
    policy: str = "compact",
    models: tuple[str, ...] = ("model-a",),
    router_cost: int = 0,
    call_costs: tuple[int, ...] | None = None,
    status: int = 200,
    decision: dict[str, Any] | None = None,
    messages: list[Any] | None = None,
    response_text: str | None = "an answer",
    rng: random.Random | None = None,
) -> RequestRecord:
    """A request whose total is exactly the sum of its calls (router call first when it has
    a router cost), like the gateway writes them."""
    rng = rng or random.Random(request_id)
    costs = call_costs or tuple(rng.randint(0, 50_000) for _ in models)
    calls: list[CallRecord] = []
    if router_cost:
        calls.append(
            CallRecord(
                request_id,
                0,
                "router",
                "xrouter-router",
                "ok",
                None,
                rng.randint(10, 500),
                rng.randint(1, 50),
                0,
                0,
                router_cost,
                12.5,
            )
        )
    for turn, (model, cost) in enumerate(zip(models, costs, strict=True), start=1):
        calls.append(
            CallRecord(
                request_id,
                turn,
                "downstream",
                model,
                "ok",
                None,
                rng.randint(10, 2000),
                rng.randint(1, 800),
                rng.randint(0, 5),
                rng.randint(0, 3),
                cost,
                rng.uniform(50, 900),
            )
        )
    downstream = sum(costs)
    if decision is None and policy != "passthrough":
        p = rng.choice([0.25, 0.5, 0.8, 1.0])
        decision = {
            "policy": policy,
            "cost_weight": 0.5,
            "feature_version": "v1",
            "actions": [models[-1]],
            "propensities": [p],
            "propensity": p,
            "distribution": {models[-1]: p},
            "explored": False,
        }
    return RequestRecord(
        request_id=request_id,
        created_at=time.time() if created_at is None else created_at,
        key_id=key_id,
        policy=policy,
        requested_model="xrouter" if policy != "passthrough" else models[-1],
        final_model=models[-1] if status == 200 else None,
        status=status,
        error_type=None if status == 200 else "upstream_error",
        total_cost_micros=router_cost + downstream,
        router_cost_micros=router_cost,
        downstream_cost_micros=downstream,
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        completion_tokens=sum(c.completion_tokens for c in calls),
        latency_ms=rng.uniform(100, 2000),
        overhead_ms=rng.uniform(0.1, 3.0),
        cost_weight=0.5,
        decision=decision,
        messages=messages
        if messages is not None
        else [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"question {request_id}"},
        ],
        response_text=response_text,
        stream=False,
        calls=calls,
    )


def make_cache_hit(
    request_id: str,
    of: RequestRecord,
    *,
    created_at: float | None = None,
    key_id: str | None = "key_test0001",
) -> RequestRecord:
    """A request answered from the answer cache with ``of``'s answer, as the gateway logs
    it: no calls, no decision, no cost, and the request whose answer it reused."""
    hit = make_request(
        request_id, created_at=created_at, key_id=key_id, models=(of.final_model or "",)
    )
    hit.cached_from, hit.calls, hit.decision = of.request_id, [], None
    hit.total_cost_micros = hit.router_cost_micros = hit.downstream_cost_micros = 0
    return hit


def make_feedback(
    request_id: str,
    score: float,
    created_at: float | None = None,
    *,
    reward: float | None = None,
    cost_usd: float | None = None,
    cost_weight: float | None = None,
    normalized_cost: float | None = None,
    penalty: float | None = None,
) -> FeedbackRecord:
    """A feedback score, with the logged reward's terms when it was logged with one."""
    return FeedbackRecord(
        request_id=request_id,
        score=score,
        source="user",
        comment=None,
        created_at=time.time() if created_at is None else created_at,
        reward=reward,
        cost_usd=cost_usd,
        cost_weight=cost_weight,
        normalized_cost=normalized_cost,
        penalty=penalty,
    )


@dataclass
class RecordingSink:
    """A LedgerMetricsSink that remembers every call (stands in for the Prometheus one)."""

    depths: list[int] = field(default_factory=list)
    spills: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    flushed_total: int = 0

    def queue_depth(self, n: int) -> None:
        self.depths.append(n)

    def spilled(self, n: int, reason: str) -> None:
        self.spills[reason] += n

    def write_error(self, kind: str) -> None:
        self.errors[kind] += 1

    def flushed(self, n: int) -> None:
        self.flushed_total += n


async def count(engine: AsyncEngine, table: str) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar_one())


async def request_ids(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(sa.text("SELECT request_id FROM requests ORDER BY request_id"))
        return [r[0] for r in rows]
