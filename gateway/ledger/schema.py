"""The ledger's tables (SQLAlchemy Core), identical on SQLite and PostgreSQL.

Money is integer micro-USD (BIGINT) everywhere: sums reconcile to the micro-dollar however
they are grouped. Timestamps are stored in UTC (``UTCDateTime``) so a "day" is the same day
on both databases.

This module describes the *current* schema. The database is brought to it by the versioned
steps in ``migrations.py``; a test checks that a migrated database matches these tables.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

metadata = sa.MetaData()

# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid (autoincrement); BIGINT there
# would be a plain column that is never filled in.
BigIntPK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


class UTCDateTime(sa.TypeDecorator[datetime]):
    """An aware UTC ``datetime`` in and out.

    PostgreSQL stores ``timestamptz``. SQLite has no timezone support and SQLAlchemy would
    silently drop the offset, so values are converted to UTC and stored naive (ISO text that
    sorts and compares correctly); they come back tagged as UTC.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class utc_day(FunctionElement[str]):
    """``YYYY-MM-DD`` of a ``UTCDateTime`` column, computed by the database in UTC."""

    type = sa.String()
    inherit_cache = True
    name = "utc_day"


@compiles(utc_day, "sqlite")
def _utc_day_sqlite(element: utc_day, compiler: SQLCompiler, **kw: Any) -> str:
    # Stored as "YYYY-MM-DD HH:MM:SS.ffffff" in UTC.
    return f"substr({compiler.process(element.clauses, **kw)}, 1, 10)"


@compiles(utc_day, "postgresql")
def _utc_day_postgresql(element: utc_day, compiler: SQLCompiler, **kw: Any) -> str:
    arg = compiler.process(element.clauses, **kw)
    return f"to_char(({arg}) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"


class ledger_now(FunctionElement[datetime]):
    """The database's own clock, as a ``UTCDateTime``: what ``requests.logged_at`` is set
    to, and what an incremental export's upper bound is read from, so that replicas whose
    clocks disagree still stamp rows, and exports bound them, on one clock.

    PostgreSQL: ``now()``, the start of the current transaction (every row a batch inserts
    gets the same stamp, and a row is stamped no later than the start of the transaction
    that commits it). SQLite: the current time, to the millisecond, in the text form
    ``UTCDateTime`` stores (``YYYY-MM-DD HH:MM:SS.ffffff``) so that it compares with bound
    values; a writer evaluates it after taking the write lock (``BEGIN IMMEDIATE``).
    """

    type = UTCDateTime()
    inherit_cache = True
    name = "ledger_now"


@compiles(ledger_now, "sqlite")
def _ledger_now_sqlite(element: ledger_now, compiler: SQLCompiler, **kw: Any) -> str:
    # %f is "SS.SSS"; three more digits give the six that stored values have.
    return "strftime('%Y-%m-%d %H:%M:%f000', 'now')"


@compiles(ledger_now, "postgresql")
def _ledger_now_postgresql(element: ledger_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "now()"


requests = sa.Table(
    "requests",
    metadata,
    sa.Column("request_id", sa.String(64), primary_key=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("key_id", sa.String(64), nullable=True),
    sa.Column("policy", sa.String(64), nullable=False),
    sa.Column("requested_model", sa.String(255), nullable=False),
    sa.Column("final_model", sa.String(255), nullable=True),
    sa.Column("status", sa.Integer(), nullable=False),
    sa.Column("error_type", sa.String(128), nullable=True),
    sa.Column("total_cost_micros", sa.BigInteger(), nullable=False),
    sa.Column("router_cost_micros", sa.BigInteger(), nullable=False),
    sa.Column("downstream_cost_micros", sa.BigInteger(), nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
    sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
    sa.Column("latency_ms", sa.Float(), nullable=False),
    sa.Column("overhead_ms", sa.Float(), nullable=False),
    sa.Column("cost_weight", sa.Float(), nullable=True),
    sa.Column("decision", sa.JSON(none_as_null=True), nullable=True),
    sa.Column("content", sa.JSON(none_as_null=True), nullable=True),
    sa.Column("stream", sa.Boolean(), nullable=False),
    # The API shape the request came in: "chat" (/v1/chat/completions), "responses"
    # (/v1/responses) or "messages" (/v1/messages), the last two translated to a chat
    # request. The server default keeps an older release's inserts valid after a rollback.
    sa.Column("api", sa.String(16), nullable=False, server_default="chat"),
    # Set when the answer came from the answer cache: the request whose answer (and cost)
    # it reused. This request made no call and no routing decision.
    sa.Column("cached_from", sa.String(64), nullable=True),
    # The caller's own end user, as the request named them (OpenAI's ``user``, else its
    # ``safety_identifier``; Anthropic's ``metadata.user_id``): spend per end user without
    # a key per user.
    sa.Column("end_user", sa.String(255), nullable=True),
    # When the row reached the database (``ledger_now``, set by the inserter), which is
    # later than ``created_at`` by the flush interval, or by hours for rows replayed from a
    # journal after a crash or an outage: an incremental export pages by it, so late rows
    # are not missed. NULL for rows written before migration 11 (or by an older release
    # after a rollback): they count as logged at their ``created_at``.
    sa.Column("logged_at", UTCDateTime(), nullable=True),
    sa.Index("ix_requests_created_at", "created_at"),
    sa.Index("ix_requests_key_id_created_at", "key_id", "created_at"),
    # Partial: most requests name no end user, and they should not pay for the index.
    sa.Index(
        "ix_requests_end_user_created_at",
        "end_user",
        "created_at",
        sqlite_where=sa.text("end_user IS NOT NULL"),
        postgresql_where=sa.text("end_user IS NOT NULL"),
    ),
    # The cache hits of a request, for the export to carry their feedback to it; partial,
    # as few requests are cache hits.
    sa.Index(
        "ix_requests_cached_from",
        "cached_from",
        sqlite_where=sa.text("cached_from IS NOT NULL"),
        postgresql_where=sa.text("cached_from IS NOT NULL"),
    ),
    # The requests whose content the retention task has still to clear (migration 17);
    # partial, so that it holds only those: the task never reads the rows it cleared.
    sa.Index(
        "ix_requests_content_created_at",
        "created_at",
        sqlite_where=sa.text("content IS NOT NULL"),
        postgresql_where=sa.text("content IS NOT NULL"),
    ),
    # An incremental export's keyset order; partial, as rows from before the column have
    # none (an export reads those by ``created_at``).
    sa.Index(
        "ix_requests_logged_at",
        "logged_at",
        "request_id",
        sqlite_where=sa.text("logged_at IS NOT NULL"),
        postgresql_where=sa.text("logged_at IS NOT NULL"),
    ),
)

calls = sa.Table(
    "calls",
    metadata,
    sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
    sa.Column("request_id", sa.String(64), nullable=False),
    # Position of the call within its request: with request_id it makes a replayed call
    # collide with itself instead of being stored twice.
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("turn", sa.Integer(), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("error_type", sa.String(128), nullable=True),
    sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
    sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
    sa.Column("reasoning_tokens", sa.BigInteger(), nullable=False),
    sa.Column("cost_micros", sa.BigInteger(), nullable=False),
    sa.Column("latency_ms", sa.Float(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("fallback_from", sa.String(255), nullable=True),
    # Which of the model's deployments served the call (pool ``deployments:``), if several.
    sa.Column("deployment", sa.String(64), nullable=True),
    # Why a fallback answered the call (with ``fallback_from``): the first error of the model
    # asked for, ``circuit_open`` when it was never called. NULL: no fallback, or a row from
    # before migration 16, which does not say.
    sa.Column("fallback_reason", sa.String(128), nullable=True),
    sa.UniqueConstraint("request_id", "seq", name="uq_calls_request_id_seq"),
    sa.Index("ix_calls_request_id", "request_id"),
)

feedback = sa.Table(
    "feedback",
    metadata,
    sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
    # The record's own id, so a replayed feedback record is stored once.
    sa.Column("feedback_id", sa.String(64), nullable=False),
    sa.Column("request_id", sa.String(64), nullable=False),
    sa.Column("score", sa.Float(), nullable=False),
    sa.Column("source", sa.String(64), nullable=False),
    sa.Column("comment", sa.Text(), nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    # When the row reached the database (``ledger_now``, as ``requests.logged_at``): feedback
    # is written late too, and `xrouter export` says how much of it came after the window
    # its request was exported in. NULL before migration 13: logged at its ``created_at``.
    sa.Column("logged_at", UTCDateTime(), nullable=True),
    # The logged reward of the score and each of its terms (router.reward), at the request's
    # cost (router tokens included) and cost weight. NULL before migration 15.
    sa.Column("reward", sa.Float(), nullable=True),
    sa.Column("cost_usd", sa.Float(), nullable=True),
    sa.Column("cost_weight", sa.Float(), nullable=True),
    sa.Column("normalized_cost", sa.Float(), nullable=True),
    sa.Column("penalty", sa.Float(), nullable=True),
    sa.UniqueConstraint("feedback_id", name="uq_feedback_feedback_id"),
    sa.Index("ix_feedback_request_id", "request_id"),
    sa.Index(
        "ix_feedback_logged_at",
        "logged_at",
        sqlite_where=sa.text("logged_at IS NOT NULL"),
        postgresql_where=sa.text("logged_at IS NOT NULL"),
    ),
)

# A request's tags (``xrouter.tags``): what the caller files it under (a feature, a team, an
# experiment), for spend per tag. One row per tag; the pair is unique, so a replay adds none.
request_tags = sa.Table(
    "request_tags",
    metadata,
    sa.Column("request_id", sa.String(64), primary_key=True),
    sa.Column("tag", sa.String(64), primary_key=True),
    sa.Index("ix_request_tags_tag", "tag"),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("key_id", sa.String(32), primary_key=True),
    sa.Column("key_hash", sa.String(64), nullable=False),
    sa.Column("alias", sa.String(255), nullable=False),
    sa.Column("budget_micros", sa.BigInteger(), nullable=True),
    sa.Column("budget_period", sa.String(16), nullable=True),
    sa.Column("rpm", sa.Integer(), nullable=True),
    sa.Column("tpm", sa.Integer(), nullable=True),
    # Requests of the key answered at once (migration 14); NULL: no bound.
    sa.Column("max_parallel", sa.Integer(), nullable=True),
    sa.Column("allowed_models", sa.JSON(none_as_null=True), nullable=True),
    sa.Column("allowed_policies", sa.JSON(none_as_null=True), nullable=True),
    sa.Column("metadata", sa.JSON(), nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("revoked_at", UTCDateTime(), nullable=True),
    # After this the key is refused (401 key_expired); NULL: it never expires.
    sa.Column("expires_at", UTCDateTime(), nullable=True),
    # The key's routing defaults ({"default_policy", "cost_weight", "max_cost_usd"}): what
    # its requests get when they do not say; NULL: the gateway's.
    sa.Column("routing", sa.JSON(none_as_null=True), nullable=True),
    sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    # Unique among live keys (migration 12): a revoked key keeps its alias in the history,
    # and a new key may take it, as a deleted key's alias is free again in LiteLLM.
    sa.Index(
        "uq_api_keys_live_alias",
        "alias",
        unique=True,
        sqlite_where=sa.text("revoked_at IS NULL"),
        postgresql_where=sa.text("revoked_at IS NULL"),
    ),
)

# Router checkpoints deployed at run time (``xrouter deploy``), newest last: every worker and
# replica polls the newest row, so a deploy reaches all of them and survives restarts.
router_deployments = sa.Table(
    "router_deployments",
    metadata,
    sa.Column("id", BigIntPK, primary_key=True, autoincrement=True),
    sa.Column("checkpoint", sa.String(1024), nullable=False),
    sa.Column("version", sa.String(64), nullable=True),
    # The config's router.checkpoint when it was deployed: a config changed since then wins.
    sa.Column("config_checkpoint", sa.String(1024), nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
)

LEDGER_TABLES = ("requests", "calls", "feedback", "api_keys", "router_deployments")


def insert_ignore(dialect_name: str, table: sa.Table) -> sa.Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` for the dialects the ledger supports."""
    if dialect_name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    if dialect_name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()
    raise NotImplementedError(f"the ledger supports sqlite and postgresql, not {dialect_name}")


class TextFitter:
    """Makes the text values of a table's rows storable the same way on both databases:
    NUL characters (which PostgreSQL's text types refuse, while SQLite keeps them) become
    U+FFFD, and values longer than their ``VARCHAR(n)`` are cut to ``n`` (PostgreSQL refuses
    them, SQLite does not check). Without this, one request naming a model with a NUL in it
    would make the database refuse its ledger row."""

    def __init__(self, table: sa.Table) -> None:
        self.limits: dict[str, int | None] = {
            c.name: c.type.length for c in table.columns if isinstance(c.type, sa.String)
        }

    def fit(self, rows: list[dict[str, Any]]) -> None:
        limits = self.limits
        for row in rows:
            for name, limit in limits.items():
                value = row.get(name)
                if not isinstance(value, str):
                    continue
                if "\x00" in value:
                    value = value.replace("\x00", "\ufffd")
                if limit is not None and len(value) > limit:
                    value = value[:limit]
                row[name] = value
