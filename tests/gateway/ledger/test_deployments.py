"""Router deployments in the ledger database: what every worker follows."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.deployments import Deployment, DeploymentRepository, DeploymentSuperseded
from gateway.ledger.store import open_ledger_engine


async def test_the_newest_deployment_is_the_one_followed(engine: AsyncEngine) -> None:
    repo = DeploymentRepository(engine)
    assert await repo.latest() is None
    first = await repo.record("/ckpt/a", "v1", None)
    second = await repo.record("packaged:demo-rl", None, "/etc/xrouter/ckpt")
    assert second.id > first.id
    latest = await repo.latest()
    assert latest == second
    assert (latest.checkpoint, latest.version, latest.config_checkpoint) == (
        "packaged:demo-rl",
        None,
        "/etc/xrouter/ckpt",
    )
    assert latest.created_at.tzinfo is not None and latest.created_at >= first.created_at
    # Another repository over the same database (another worker) sees the same row.
    assert await DeploymentRepository(engine).latest() == second


async def test_a_deployment_holds_until_the_configs_checkpoint_changes(
    engine: AsyncEngine,
) -> None:
    d = await DeploymentRepository(engine).record("/ckpt/new", "v2", None)
    assert d.applies_to(None)
    assert not d.applies_to("/ckpt/edited-in-the-config")
    assert d.to_dict()["checkpoint"] == "/ckpt/new"


async def test_long_paths_are_stored_on_both_databases(engine: AsyncEngine) -> None:
    repo = DeploymentRepository(engine)
    d = await repo.record("/" + "x" * 2000, "v", "\x00odd")
    latest = await repo.latest()
    assert latest == d and len(latest.checkpoint) == 1024


async def test_a_deployment_is_recorded_only_over_the_one_its_deploy_found(
    engine: AsyncEngine,
) -> None:
    repo = DeploymentRepository(engine)
    first = await repo.record_replacing(None, "/ckpt/a", "v1", None)
    second = await repo.record_replacing(first.id, "/ckpt/b", "v2", None)
    # A deploy that began when `first` was the newest, and loaded while `second` was
    # recorded: refused, naming `second`, and nothing recorded.
    with pytest.raises(DeploymentSuperseded) as exc:
        await repo.record_replacing(first.id, "/ckpt/c", "v3", None)
    assert exc.value.newer == second
    assert "deployment 2 (/ckpt/b, version v2) was recorded" in str(exc.value)
    with pytest.raises(DeploymentSuperseded):
        await repo.record_replacing(None, "/ckpt/c", "v3", None)
    assert await repo.latest() == second


async def test_of_deploys_that_race_from_several_processes_exactly_one_is_recorded(
    ledger_url: str, engine: AsyncEngine
) -> None:
    # One engine per worker or replica (connections of their own). On PostgreSQL each
    # insert saw no newer row under READ COMMITTED without the lock.
    engines = [await open_ledger_engine(ledger_url) for _ in range(4)]
    try:
        newest: int | None = None
        for _ in range(10):
            results = await asyncio.gather(
                *(
                    DeploymentRepository(e).record_replacing(newest, f"/ckpt/{i}", None, None)
                    for i, e in enumerate(engines)
                ),
                return_exceptions=True,
            )
            won = [r for r in results if isinstance(r, Deployment)]
            assert len(won) == 1, results
            assert all(
                isinstance(r, DeploymentSuperseded) and r.newer == won[0]
                for r in results
                if r is not won[0]
            ), results
            newest = won[0].id
        assert (await DeploymentRepository(engine).latest()) == won[0]
    finally:
        for e in engines:
            await e.dispose()
