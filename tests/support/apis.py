"""The same request on each of the gateway's three model APIs, and the ledger row it left:
for tests that run one case on chat completions, the Responses API and the Messages API."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from tests.support.gateway import Gateway

MODEL_APIS = ("/v1/chat/completions", "/v1/responses", "/v1/messages")


def body_for(
    path: str, model: str, prompt: str, user: str, *, stream: bool = True, max_tokens: int = 64
) -> dict[str, Any]:
    """A request to ``path`` (one of ``MODEL_APIS``) for ``prompt``, naming its end user
    ``user`` in that API's own field, so that its ledger row can be found by it."""
    if path == "/v1/responses":
        return {"model": model, "input": prompt, "user": user, "stream": stream}
    message = [{"role": "user", "content": prompt}]
    if path == "/v1/messages":
        return {"model": model, "max_tokens": max_tokens, "messages": message, "stream": stream,
                "metadata": {"user_id": user}}  # fmt: skip
    return {"model": model, "messages": message, "user": user, "stream": stream}


def ledger_row(gw: Gateway, sql: str, user: str, wait_s: float = 10.0) -> tuple[Any, ...] | None:
    """The first row ``sql`` (one ``?``, the end user) finds in ``gw``'s SQLite ledger,
    looked for until ``wait_s`` have passed (the writer commits in batches); None if none."""
    db = gw.config_path.parent / "ledger.db"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            row = conn.execute(sql, (user,)).fetchone()
        if row is not None:
            return tuple(row)
        time.sleep(0.05)
    return None
