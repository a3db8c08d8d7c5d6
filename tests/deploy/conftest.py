"""A scratch PostgreSQL database for the deployment tests that run the gateway on it."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import asyncpg
import pytest

from tests.gateway.ledger.factories import PG_HOST, PG_PORT, pg_admin


@pytest.fixture
def pg_database() -> Iterator[str]:
    name = f"xrouter_deploy_{secrets.token_hex(4)}"
    asyncio.run(pg_admin(f'CREATE DATABASE "{name}"'))
    yield name
    asyncio.run(pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def requests_in(database: str) -> int:
    """Rows in the ledger's ``requests`` table."""

    async def count() -> int:
        conn = await asyncpg.connect(
            f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{database}", timeout=5
        )
        try:
            return int(await conn.fetchval("SELECT count(*) FROM requests"))
        finally:
            await conn.close()

    return asyncio.run(count())
