"""``GET /dashboard``: one server-rendered page for operators — what is serving, what it
costs, and which keys are near their budgets.

Read from the same sources as the admin API (the runtime snapshot, the ledger's spend
report, the key store and the limit backend), rendered without JavaScript and refreshed
every 30 s, under a Content-Security-Policy that allows its own style sheet and nothing
else. Open when auth is off, like the rest of the gateway; with auth on it takes the admin
key (a browser's Basic login prompt, password = the admin key, or a bearer token).
Every value that a client or an operator chose (model names, aliases, paths) is escaped.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import html
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, Response

from gateway.routes.ledger_read import ledger_read
from gateway.routes.openai import services

router = APIRouter()

_STYLE = """
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin-top:6px}
th,td{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#777}
.warn{color:#a40}
"""

# The page runs no script and loads nothing: the one inline style sheet above, allowed by its
# hash (not 'unsafe-inline', so text injected into the page could not style it either), and
# no framing by another site (clickjacking the admin's logged-in page). X-Frame-Options for
# browsers that predate frame-ancestors. The refresh <meta> and the /metrics link are
# navigation, which these leave alone.
CSP = (
    "default-src 'none'; "
    f"style-src 'sha256-{base64.b64encode(hashlib.sha256(_STYLE.encode()).digest()).decode()}'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
}


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _usd(value: Any) -> str:
    return "–" if value is None else f"${float(value):,.6f}"


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: set[int]) -> str:
    head = "".join(
        f'<th class="n">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="n">{_e(v)}</td>' if i in numeric else f"<td>{_e(v)}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr>{cells}</tr>")
    if not body:
        body.append(f'<tr><td class="muted" colspan="{len(headers)}">nothing yet</td></tr>')
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _spend_rows(rows: list[dict[str, Any]], key: str) -> list[list[Any]]:
    return [
        [
            r.get(key) or "–",
            r.get("requests", 0),
            r.get("calls", "–"),
            _usd(r.get("total_cost_usd")),
            r.get("prompt_tokens", 0),
            r.get("completion_tokens", 0),
        ]
        for r in rows
    ]


TOP_END_USERS = 10
# The window of the spend by model and by policy.
SPEND_DAYS = 30


async def _end_users_section(s: Any, since: dt.datetime) -> list[str]:
    """The end users who cost the most lately, when requests name them (``user``)."""
    if s.engine is None:
        return []
    from gateway.ledger.spend import spend_report

    # The database ranks them: one end user per request can mean many groups. One more
    # than shown, as the requests that named nobody may be among them.
    top = await spend_report(
        s.engine, ["user"], since=since, limit=TOP_END_USERS + 1, costliest_first=True
    )
    rows = [r for r in top if r["user"]]
    if not rows:
        return []
    return [
        f"<h2>Top {TOP_END_USERS} end users by cost (last 14 days, the requests' "
        "<code>user</code>)</h2>",
        _table(
            ["user", "requests", "calls", "cost", "prompt tokens", "completion tokens"],
            _spend_rows(rows[:TOP_END_USERS], "user"),
            {1, 2, 3, 4, 5},
        ),
    ]


async def _cache_section(s: Any, since: dt.datetime) -> list[str]:
    """Hits and savings of the answer cache, when it is on: in the page's recent days only,
    as every aggregate here is (an all-time sum would scan every hit ever logged on each
    30 s refresh; ``GET /admin/spend`` counts all-time hits)."""
    if s.cache is None or s.engine is None:
        return []
    from gateway.ledger.spend import cache_savings

    recent = await cache_savings(s.engine, since=since)
    return [
        "<h2>Answer cache</h2>",
        _table(
            ["period", "answered from the cache", "saved"],
            [["last 14 days", recent["cache_hits"], _usd(recent["saved_usd"])]],
            {1, 2},
        ),
    ]


# The dashboard's key table: the oldest keys, each a limit-store read; the rest are in
# GET /admin/keys, page by page.
DASHBOARD_KEYS = 100


async def _keys_section(s: Any) -> list[str]:
    rows = await _keys(s)
    out = [
        "<h2>Keys and budgets</h2>",
        _table(
            [
                "alias",
                "key id",
                "budget",
                "period",
                "spent",
                "remaining",
                "rpm",
                "tpm",
                "parallel",
                "expires",
            ],
            rows,
            {2, 4, 5, 6, 7, 8},
        ),
    ]
    if len(rows) == DASHBOARD_KEYS:
        total = await s.keys.count()
        if total > DASHBOARD_KEYS:
            out.append(
                f'<p class="muted">The oldest {DASHBOARD_KEYS} of {total} keys; every key: '
                "GET /admin/keys, page by page.</p>"
            )
    return out


async def _keys(s: Any) -> list[list[Any]]:
    if s.keys is None:
        return []
    out = []
    for k in await s.keys.list(include_revoked=False, limit=DASHBOARD_KEYS):
        spent, remaining = await s.key_spend(k)
        out.append(
            [
                k.alias or "–",
                k.key_id,
                _usd(k.budget_usd),
                k.budget_period or "–",
                _usd(spent),
                _usd(remaining),
                k.rpm or "–",
                k.tpm or "–",
                k.max_parallel or "–",
                _expiry(k),
            ]
        )
    return out


def _expiry(k: Any) -> str:
    if k.expires_at is None:
        return "never"
    when = k.expires_at.strftime("%Y-%m-%d %H:%M UTC")
    return f"expired {when}" if k.expired() else when


@router.get("/dashboard", response_class=HTMLResponse)
@ledger_read
async def dashboard(request: Request) -> Response:
    from gateway.ledger.spend import spend_report

    s = services(request)
    assert s.auth is not None
    s.auth.require_dashboard(request.headers.get("authorization"))
    rt = s.current()
    now = dt.datetime.now(dt.UTC)
    # Whole UTC days, today and the 13 before it: a window of 14 × 24 h from now began
    # within the oldest day, whose row then counted only its later part under its whole
    # date (and /admin/spend?group_by=day said otherwise for the same day).
    since = dt.datetime.combine(now.date() - dt.timedelta(days=13), dt.time(), dt.UTC)
    # Bounded, as every section is: the page refreshes every 30 s, and an all-time
    # aggregate would re-read the whole ledger each time (200 ms per 100,000 requests on
    # PostgreSQL, bench/ledger_export.py's ledger). All time is GET /admin/spend's.
    month = now - dt.timedelta(days=SPEND_DAYS)
    if s.engine is not None:
        by_model = await spend_report(s.engine, ["model"], since=month)
        by_policy = await spend_report(s.engine, ["policy"], since=month)
        by_day = await spend_report(s.engine, ["day"], since=since)
    else:
        by_model = by_policy = by_day = []
    ckpt = rt.checkpoint_info
    prices = rt.pool.price_snapshot()
    sections = [
        "<h1>xrouter</h1>",
        f"<p>default policy <b>{_e(rt.default_policy)}</b>; policies "
        f"{_e(', '.join(rt.policy_names))}; compact checkpoint "
        + (
            f"<b>{_e(ckpt.get('kind'))}</b> {_e(ckpt.get('version'))} "
            f'<span class="muted">{_e(ckpt.get("path"))}</span>'
            if ckpt
            else '<span class="muted">none</span>'
        )
        + (
            f" (deployment {d.id}, {_e(d.created_at.isoformat(timespec='seconds'))})"
            if (d := s.active_deployment) is not None
            else ""
        )
        + (
            # A model added since the checkpoint was trained: the operator should know that
            # the learned router never picks it.
            f'; <span class="warn">not routed by the checkpoint (not trained on): '
            f"{_e(', '.join(untrained))}</span>"
            if ckpt and (untrained := ckpt.get("untrained_models"))
            else ""
        )
        + "</p>",
        f"<h2>Spend by model (last {SPEND_DAYS} days)</h2>",
        _table(
            ["model", "requests", "calls", "cost", "prompt tokens", "completion tokens"],
            _spend_rows(by_model, "model"),
            {1, 2, 3, 4, 5},
        ),
        f"<h2>Spend by policy (last {SPEND_DAYS} days)</h2>",
        _table(
            ["policy", "requests", "calls", "cost", "prompt tokens", "completion tokens"],
            _spend_rows(by_policy, "policy"),
            {1, 2, 3, 4, 5},
        ),
        "<h2>Spend by day (UTC, last 14 days)</h2>",
        _table(
            ["day", "requests", "calls", "cost", "prompt tokens", "completion tokens"],
            _spend_rows(sorted(by_day, key=lambda r: str(r.get("day")), reverse=True), "day"),
            {1, 2, 3, 4, 5},
        ),
        *(await _end_users_section(s, since)),
        *(await _cache_section(s, since)),
        *(await _keys_section(s)),
        "<h2>Pool (USD per 1M tokens; circuit as this worker sees it)</h2>",
        _table(
            ["model", "input", "output", "circuit"],
            [
                [m, p.get("input"), p.get("output"), rt.client.breakers.state(m)]
                for m, p in prices.items()
            ],
            {1, 2},
        ),
        '<p class="muted">Refreshes every 30 s. Prometheus metrics: <a href="/metrics">'
        "/metrics</a>.</p>",
    ]
    page = (
        '<!doctype html><html><head><meta charset="utf-8">'
        '<meta http-equiv="refresh" content="30"><title>xrouter dashboard</title>'
        f"<style>{_STYLE}</style></head><body>{''.join(sections)}</body></html>"
    )
    return HTMLResponse(page, headers=PAGE_HEADERS)
