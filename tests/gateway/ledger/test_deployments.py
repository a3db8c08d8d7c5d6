"""Router deployments in the ledger database: what every worker follows."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.deployments import DeploymentRepository


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
