"""Versioned schema migrations, run at startup, the same code for SQLite and PostgreSQL.

A small explicit runner instead of alembic: the ledger has a handful of tables and must migrate
itself inside ``xrouter serve`` with no separate tool. The ``schema_version`` table holds
one row per applied step; every pending step runs in ONE transaction together with its
version row, so a failed step leaves the database exactly as it was. Both databases have
transactional DDL (SQLite needs the explicit ``BEGIN`` that ``store.py`` installs).

Concurrent starts (several workers) are serialized: PostgreSQL takes a transaction-scoped
advisory lock, SQLite takes the write lock up front (``BEGIN IMMEDIATE``).

Steps are frozen once released: each one carries its own table definitions rather than
reading ``schema.py`` (which describes the *current* schema), otherwise a fresh database
would get new columns from step 1 and then fail on the step that adds them. A test checks
that the migrated database matches ``schema.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.schema import BigIntPK, UTCDateTime

logger = logging.getLogger(__name__)

# Arbitrary constant identifying "the xrouter ledger migration" among advisory locks.
_PG_LOCK_ID = 0x7872_6C65_6467  # "xrledg"

SQLITE_BEGIN_OPTION = "ledger_sqlite_begin"


class MigrationError(RuntimeError):
    """The migration list is inconsistent or a step failed (the transaction was rolled back)."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    upgrade: Callable[[sa.Connection], None]


def _version_table(md: sa.MetaData) -> sa.Table:
    return sa.Table(
        "schema_version",
        md,
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("description", sa.String(255), nullable=False),
        sa.Column("applied_at", UTCDateTime(), nullable=False),
    )


def _v1_baseline(conn: sa.Connection) -> None:
    """requests, calls, feedback, api_keys as released in 0.1 (frozen)."""
    md = sa.MetaData()
    sa.Table(
        "requests",
        md,
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("key_id", sa.String(64)),
        sa.Column("policy", sa.String(64), nullable=False),
        sa.Column("requested_model", sa.String(255), nullable=False),
        sa.Column("final_model", sa.String(255)),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("error_type", sa.String(128)),
        sa.Column("total_cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("router_cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("downstream_cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("overhead_ms", sa.Float(), nullable=False),
        sa.Column("cost_weight", sa.Float()),
        sa.Column("decision", sa.JSON()),
        sa.Column("content", sa.JSON()),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Index("ix_requests_created_at", "created_at"),
        sa.Index("ix_requests_key_id_created_at", "key_id", "created_at"),
    )
    sa.Table(
        "calls",
        md,
        sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("model", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error_type", sa.String(128)),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("reasoning_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("fallback_from", sa.String(255)),
        sa.UniqueConstraint("request_id", "seq", name="uq_calls_request_id_seq"),
        sa.Index("ix_calls_request_id", "request_id"),
    )
    sa.Table(
        "feedback",
        md,
        sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
        sa.Column("feedback_id", sa.String(64), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("source", sa.String(64), nullable=False),
        sa.Column("comment", sa.Text()),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("feedback_id", name="uq_feedback_feedback_id"),
        sa.Index("ix_feedback_request_id", "request_id"),
    )
    sa.Table(
        "api_keys",
        md,
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("alias", sa.String(255), nullable=False),
        sa.Column("budget_micros", sa.BigInteger()),
        sa.Column("budget_period", sa.String(16)),
        sa.Column("rpm", sa.Integer()),
        sa.Column("tpm", sa.Integer()),
        sa.Column("allowed_models", sa.JSON()),
        sa.Column("allowed_policies", sa.JSON()),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime()),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
        sa.UniqueConstraint("alias", name="uq_api_keys_alias"),
    )
    # checkfirst=False: a table that exists without a version row means someone else's
    # schema is here, and failing loudly beats adopting it.
    md.create_all(conn, checkfirst=False)


def _v2_router_deployments(conn: sa.Connection) -> None:
    """router_deployments: checkpoints deployed at run time, shared by workers (frozen)."""
    md = sa.MetaData()
    sa.Table(
        "router_deployments",
        md,
        sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
        sa.Column("checkpoint", sa.String(1024), nullable=False),
        sa.Column("version", sa.String(64)),
        sa.Column("config_checkpoint", sa.String(1024)),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    md.create_all(conn, checkfirst=False)


def _v3_request_api(conn: sa.Connection) -> None:
    """requests.api: the API shape a request came in (frozen). Existing rows were chat."""
    conn.execute(sa.text("ALTER TABLE requests ADD COLUMN api VARCHAR(16) DEFAULT 'chat' NOT NULL"))


def _v4_request_cached_from(conn: sa.Connection) -> None:
    """requests.cached_from: the request whose cached answer served this one (frozen)."""
    conn.execute(sa.text("ALTER TABLE requests ADD COLUMN cached_from VARCHAR(64)"))


def _v5_key_expires_at(conn: sa.Connection) -> None:
    """api_keys.expires_at: when a key stops working, NULL for never (frozen)."""
    column_type = UTCDateTime().compile(dialect=conn.dialect)
    conn.execute(sa.text(f"ALTER TABLE api_keys ADD COLUMN expires_at {column_type}"))


def _v6_request_end_user(conn: sa.Connection) -> None:
    """requests.end_user: the caller's end user, for spend per end user (frozen)."""
    conn.execute(sa.text("ALTER TABLE requests ADD COLUMN end_user VARCHAR(255)"))
    conn.execute(
        sa.text(
            "CREATE INDEX ix_requests_end_user_created_at ON requests (end_user, created_at) "
            "WHERE end_user IS NOT NULL"
        )
    )


def _v7_key_routing(conn: sa.Connection) -> None:
    """api_keys.routing: a key's routing defaults, NULL for the gateway's (frozen)."""
    column_type = sa.JSON().compile(dialect=conn.dialect)
    conn.execute(sa.text(f"ALTER TABLE api_keys ADD COLUMN routing {column_type}"))


def _v8_request_tags(conn: sa.Connection) -> None:
    """request_tags: the tags a request was filed under (frozen)."""
    md = sa.MetaData()
    sa.Table(
        "request_tags",
        md,
        sa.Column("request_id", sa.String(64), primary_key=True),
        sa.Column("tag", sa.String(64), primary_key=True),
        sa.Index("ix_request_tags_tag", "tag"),
    )
    md.create_all(conn, checkfirst=False)


def _v9_call_deployment(conn: sa.Connection) -> None:
    """calls.deployment: which deployment of a model served the call (frozen)."""
    conn.execute(sa.text("ALTER TABLE calls ADD COLUMN deployment VARCHAR(64)"))


def _v10_request_cached_from_index(conn: sa.Connection) -> None:
    """ix_requests_cached_from: a request's cache hits, by the request (frozen)."""
    conn.execute(
        sa.text(
            "CREATE INDEX ix_requests_cached_from ON requests (cached_from) "
            "WHERE cached_from IS NOT NULL"
        )
    )


def _v11_request_logged_at(conn: sa.Connection) -> None:
    """requests.logged_at: when a row reached the database, for incremental exports that
    do not miss rows written late (frozen). Existing rows keep NULL (a backfill would
    rewrite the whole table at startup): they count as logged at their created_at."""
    column_type = UTCDateTime().compile(dialect=conn.dialect)
    conn.execute(sa.text(f"ALTER TABLE requests ADD COLUMN logged_at {column_type}"))
    conn.execute(
        sa.text(
            "CREATE INDEX ix_requests_logged_at ON requests (logged_at, request_id) "
            "WHERE logged_at IS NOT NULL"
        )
    )


def _v12_key_alias_among_live_keys(conn: sa.Connection) -> None:
    """api_keys.alias unique among live keys only: a revoked key keeps its alias, and the
    alias may be given to a new key (frozen). A partial unique index replaces the table's
    unique constraint; SQLite cannot drop a table constraint, so there the table is rebuilt
    as it stands at this version and its rows copied."""
    live_alias = (
        "CREATE UNIQUE INDEX uq_api_keys_live_alias ON api_keys (alias) WHERE revoked_at IS NULL"
    )
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("ALTER TABLE api_keys DROP CONSTRAINT uq_api_keys_alias"))
        conn.execute(sa.text(live_alias))
        return
    md = sa.MetaData()
    rebuilt = sa.Table(
        "api_keys_v12",
        md,
        sa.Column("key_id", sa.String(32), primary_key=True),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("alias", sa.String(255), nullable=False),
        sa.Column("budget_micros", sa.BigInteger()),
        sa.Column("budget_period", sa.String(16)),
        sa.Column("rpm", sa.Integer()),
        sa.Column("tpm", sa.Integer()),
        sa.Column("allowed_models", sa.JSON()),
        sa.Column("allowed_policies", sa.JSON()),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime()),
        sa.Column("expires_at", UTCDateTime()),
        sa.Column("routing", sa.JSON()),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    rebuilt.create(conn, checkfirst=False)
    columns = ", ".join(c.name for c in rebuilt.columns)
    conn.execute(sa.text(f"INSERT INTO api_keys_v12 ({columns}) SELECT {columns} FROM api_keys"))
    conn.execute(sa.text("DROP TABLE api_keys"))
    conn.execute(sa.text("ALTER TABLE api_keys_v12 RENAME TO api_keys"))
    conn.execute(sa.text(live_alias))


def _v14_key_max_parallel(conn: sa.Connection) -> None:
    """api_keys.max_parallel: the key's requests answered at once, NULL for no bound
    (frozen)."""
    conn.execute(sa.text("ALTER TABLE api_keys ADD COLUMN max_parallel INTEGER"))


def _v13_feedback_logged_at(conn: sa.Connection) -> None:
    """feedback.logged_at: when a feedback row reached the database (frozen). Existing rows
    keep NULL: they count as logged at their created_at."""
    column_type = UTCDateTime().compile(dialect=conn.dialect)
    conn.execute(sa.text(f"ALTER TABLE feedback ADD COLUMN logged_at {column_type}"))
    conn.execute(
        sa.text(
            "CREATE INDEX ix_feedback_logged_at ON feedback (logged_at) WHERE logged_at IS NOT NULL"
        )
    )


def _v15_feedback_reward(conn: sa.Connection) -> None:
    """feedback.reward and its terms (cost_usd, cost_weight, normalized_cost, penalty):
    the logged reward of each score (frozen). Existing rows keep NULL."""
    column_type = sa.Float().compile(dialect=conn.dialect)
    for column in ("reward", "cost_usd", "cost_weight", "normalized_cost", "penalty"):
        conn.execute(sa.text(f"ALTER TABLE feedback ADD COLUMN {column} {column_type}"))


def _v16_call_fallback_reason(conn: sa.Connection) -> None:
    """calls.fallback_reason: why a fallback answered the call, the first error of the model
    asked for (frozen). Existing rows keep NULL: the reason is not known."""
    conn.execute(sa.text("ALTER TABLE calls ADD COLUMN fallback_reason VARCHAR(128)"))


def _v17_request_content_index(conn: sa.Connection) -> None:
    """ix_requests_content_created_at: the requests that still hold content, by age, for the
    retention task's ``drop_content`` (frozen). Partial: a request whose content is cleared
    (or was never logged, ``log_content: none``) leaves it, so the task reads only what it
    clears instead of every old row each run."""
    conn.execute(
        sa.text(
            "CREATE INDEX ix_requests_content_created_at ON requests (created_at) "
            "WHERE content IS NOT NULL"
        )
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "baseline: requests, calls, feedback, api_keys", _v1_baseline),
    Migration(2, "router_deployments", _v2_router_deployments),
    Migration(3, "requests.api", _v3_request_api),
    Migration(4, "requests.cached_from", _v4_request_cached_from),
    Migration(5, "api_keys.expires_at", _v5_key_expires_at),
    Migration(6, "requests.end_user", _v6_request_end_user),
    Migration(7, "api_keys.routing", _v7_key_routing),
    Migration(8, "request_tags", _v8_request_tags),
    Migration(9, "calls.deployment", _v9_call_deployment),
    Migration(10, "ix_requests_cached_from", _v10_request_cached_from_index),
    Migration(11, "requests.logged_at", _v11_request_logged_at),
    Migration(12, "api_keys.alias unique among live keys", _v12_key_alias_among_live_keys),
    Migration(13, "feedback.logged_at", _v13_feedback_logged_at),
    Migration(14, "api_keys.max_parallel", _v14_key_max_parallel),
    Migration(15, "feedback.reward and its terms", _v15_feedback_reward),
    Migration(16, "calls.fallback_reason", _v16_call_fallback_reason),
    Migration(17, "ix_requests_content_created_at", _v17_request_content_index),
)


def latest_version(migrations: Sequence[Migration] = MIGRATIONS) -> int:
    return max((m.version for m in migrations), default=0)


def newer_schema(current: int, known: int) -> str:
    """What is said of a ledger a newer release migrated (this one was rolled back, or runs
    beside it): its steps are additive, so it is served, and read, as this release knows it."""
    return f"ledger schema is at version {current}, newer than this release knows ({known})"


def _check_order(migrations: Sequence[Migration]) -> None:
    versions = [m.version for m in migrations]
    if versions != sorted(set(versions)) or (versions and versions[0] < 1):
        raise MigrationError(f"migration versions must be unique, ascending and >= 1: {versions}")


def _migrate_sync(conn: sa.Connection, migrations: Sequence[Migration]) -> int:
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_LOCK_ID)))
    version_table = _version_table(sa.MetaData())
    version_table.create(conn, checkfirst=True)
    current = conn.execute(sa.select(sa.func.max(version_table.c.version))).scalar() or 0
    known = latest_version(migrations)
    if current > known:
        # A newer release migrated this database and we were rolled back. Steps are
        # additive, so keep serving but say so.
        logger.warning("%s", newer_schema(int(current), known))
        return int(current)
    for step in migrations:
        if step.version <= current:
            continue
        logger.info("ledger migration %d: %s", step.version, step.description)
        try:
            step.upgrade(conn)
        except Exception as exc:
            # The driver's own message: SQLAlchemy's repeats the whole DDL statement, which
            # buries the reason in the one line `serve` and `export` print.
            cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) and exc.orig else exc
            raise MigrationError(
                f"ledger migration {step.version} ({step.description}) failed: "
                f"{type(cause).__name__}: {cause}"
            ) from exc
        conn.execute(
            version_table.insert().values(
                version=step.version, description=step.description, applied_at=datetime.now(UTC)
            )
        )
        current = step.version
    return int(current)


async def migrate(engine: AsyncEngine, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Apply every pending step in one transaction; return the schema version.

    Idempotent: on an up-to-date database it only reads ``schema_version``.
    """
    _check_order(migrations)
    async with engine.connect() as conn:
        await conn.execution_options(**{SQLITE_BEGIN_OPTION: "IMMEDIATE"})
        async with conn.begin():
            return await conn.run_sync(_migrate_sync, migrations)


async def current_version(engine: AsyncEngine) -> int:
    """The applied schema version, 0 for an empty database."""

    def _read(conn: sa.Connection) -> int:
        if not sa.inspect(conn).has_table("schema_version"):
            return 0
        table = _version_table(sa.MetaData())
        return int(conn.execute(sa.select(sa.func.max(table.c.version))).scalar() or 0)

    async with engine.connect() as conn:
        return await conn.run_sync(_read)
