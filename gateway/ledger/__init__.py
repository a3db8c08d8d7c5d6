"""The cost ledger: requests, calls, feedback and API keys in SQLite or PostgreSQL.

``open_ledger_engine`` opens (and migrates) the database, ``readable.open_ledger_to_read`` one
only to read it (no migration); ``LedgerWriter`` stores records off
the request path without ever losing one; ``KeyRepository`` manages API keys; ``spend``
reports and ``export`` turns the ledger into an outcome table for training.
"""

from gateway.ledger.export import export_ledger, read_export
from gateway.ledger.export_cli import add_export_arguments, run_export
from gateway.ledger.keys import (
    DuplicateAliasError,
    KeyInfo,
    KeyNotFoundError,
    KeyRepository,
    KeyRepositoryError,
    hash_secret,
)
from gateway.ledger.migrations import current_version, migrate
from gateway.ledger.records import CallRecord, FeedbackRecord, LedgerRecord, RequestRecord
from gateway.ledger.spend import get_request, spend_report, totals
from gateway.ledger.store import create_ledger_engine, open_ledger_engine
from gateway.ledger.writer import LedgerMetricsSink, LedgerUnavailableError, LedgerWriter

__all__ = [
    "CallRecord",
    "DuplicateAliasError",
    "FeedbackRecord",
    "KeyInfo",
    "KeyNotFoundError",
    "KeyRepository",
    "KeyRepositoryError",
    "LedgerMetricsSink",
    "LedgerRecord",
    "LedgerUnavailableError",
    "LedgerWriter",
    "RequestRecord",
    "add_export_arguments",
    "create_ledger_engine",
    "current_version",
    "export_ledger",
    "get_request",
    "hash_secret",
    "migrate",
    "open_ledger_engine",
    "read_export",
    "run_export",
    "spend_report",
    "totals",
]
