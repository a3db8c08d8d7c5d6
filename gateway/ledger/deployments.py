"""Router deployments, database side: ``xrouter deploy`` records the checkpoint here.

The ledger database is the one store every worker and replica of a gateway shares (SQLite
for one host, PostgreSQL for several), so a deployment is a row: the worker that takes
``POST /admin/reload {"checkpoint": ...}`` validates and swaps, then records it; the others
poll the newest row and load the same checkpoint; a restarted process starts on it.

Of deploys that overlap (each loading its checkpoint while another records one), the first
recorded wins and the others are refused (``record_replacing``): a deploy is answered as
done only if its checkpoint is the one every worker follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from gateway.ledger.migrations import SQLITE_BEGIN_OPTION
from gateway.ledger.schema import TextFitter, router_deployments

# Arbitrary constant identifying "recording a router deployment" among PostgreSQL's advisory
# locks (the migration's is another).
_PG_LOCK_ID = 0x7872_6465_706C  # "xrdepl"


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


class DeploymentSuperseded(Exception):
    """Another deployment was recorded after the one a deploy set out to replace: the
    deploy changed nothing, and ``newer`` is what every worker follows."""

    def __init__(self, newer: Deployment) -> None:
        super().__init__(
            f"deployment {newer.id} ({newer.checkpoint}, version {newer.version}) was recorded "
            "while this deploy was loading"
        )
        self.newer = newer


class DeploymentRepository:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._fit = TextFitter(router_deployments)

    async def record(
        self, checkpoint: str, version: str | None, config_checkpoint: str | None
    ) -> Deployment:
        row = self._row(checkpoint, version, config_checkpoint)
        async with self.engine.begin() as conn:
            return await self._insert(conn, row)

    async def record_replacing(
        self,
        newest_id: int | None,
        checkpoint: str,
        version: str | None,
        config_checkpoint: str | None,
    ) -> Deployment:
        """Record a deployment only if the newest one is still ``newest_id`` (None: there
        was none), the one read when the deploy began; else raise ``DeploymentSuperseded``
        naming the newer one, and record nothing. The read and the write are one critical
        section across workers and replicas: SQLite takes its write lock at BEGIN, and
        PostgreSQL a transaction-scoped advisory lock (under READ COMMITTED two inserts
        would each see no newer row)."""
        row = self._row(checkpoint, version, config_checkpoint)
        engine = self.engine.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        async with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_ID)))
            newest = await self._latest(conn)
            if newest is not None and newest.id != newest_id:
                raise DeploymentSuperseded(newest)
            return await self._insert(conn, row)

    def _row(
        self, checkpoint: str, version: str | None, config_checkpoint: str | None
    ) -> dict[str, object]:
        row: dict[str, object] = {
            "checkpoint": checkpoint,
            "version": version,
            "config_checkpoint": config_checkpoint,
            "created_at": datetime.now(UTC),
        }
        self._fit.fit([row])
        return row

    async def _insert(self, conn: AsyncConnection, row: dict[str, object]) -> Deployment:
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
        async with self.engine.connect() as conn:
            return await self._latest(conn)

    @staticmethod
    async def _latest(conn: AsyncConnection) -> Deployment | None:
        query = sa.select(router_deployments).order_by(router_deployments.c.id.desc()).limit(1)
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
