"""Router deployments, database side: ``xrouter deploy`` records the checkpoint here.

The ledger database is the one store every worker and replica of a gateway shares (SQLite
for one host, PostgreSQL for several), so a deployment is a row: the worker that takes
``POST /admin/reload {"checkpoint": ...}`` validates and swaps, then records it; the others
poll the newest row and load the same checkpoint; a restarted process starts on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.schema import TextFitter, router_deployments


@dataclass(frozen=True, slots=True)
class Deployment:
    id: int
    checkpoint: str
    version: str | None
    # The config's router.checkpoint at deploy time (None: the packaged default).
    config_checkpoint: str | None
    created_at: datetime

    def applies_to(self, config_checkpoint: str | None) -> bool:
        """Last writer wins: the deployment holds until the config's own checkpoint is
        changed (an edited config file is a newer decision than the deploy)."""
        return self.config_checkpoint == config_checkpoint

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "checkpoint": self.checkpoint,
            "version": self.version,
            "created_at": self.created_at.isoformat(),
        }


class DeploymentRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._fit = TextFitter(router_deployments)

    async def record(
        self, checkpoint: str, version: str | None, config_checkpoint: str | None
    ) -> Deployment:
        row = {
            "checkpoint": checkpoint,
            "version": version,
            "config_checkpoint": config_checkpoint,
            "created_at": datetime.now(UTC),
        }
        self._fit.fit([row])
        async with self.engine.begin() as conn:
            result = await conn.execute(router_deployments.insert().values(**row))
            (new_id,) = result.inserted_primary_key or (None,)
        assert new_id is not None
        # As stored (fitted), so this worker compares what the others will read.
        return Deployment(
            id=int(new_id),
            checkpoint=str(row["checkpoint"]),
            version=row["version"],  # type: ignore[arg-type]
            config_checkpoint=row["config_checkpoint"],  # type: ignore[arg-type]
            created_at=row["created_at"],  # type: ignore[arg-type]
        )

    async def latest(self) -> Deployment | None:
        query = sa.select(router_deployments).order_by(router_deployments.c.id.desc()).limit(1)
        async with self.engine.connect() as conn:
            row = (await conn.execute(query)).first()
        if row is None:
            return None
        m = row._mapping
        return Deployment(
            id=int(m["id"]),
            checkpoint=m["checkpoint"],
            version=m["version"],
            config_checkpoint=m["config_checkpoint"],
            created_at=m["created_at"],
        )
