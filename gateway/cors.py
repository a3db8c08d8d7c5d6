"""Cross-origin requests (CORS), for web apps that call the gateway from the browser — the
OpenAI and Anthropic JavaScript SDKs do, with ``dangerouslyAllowBrowser``.

Off unless ``server.cors_allow_origins`` names origins (``["*"]`` for any, LiteLLM's proxy
default): a gateway spends money on every request, so which web pages may read its answers
is the operator's call. Credentials are never allowed: keys travel as bearer tokens, which
a page must hold to send, never as cookies a browser attaches on its own, so no origin
gains anything by the browser's credentials (the dashboard's basic-auth login included)."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

# The answer headers a page may read: request ids (the SDKs read x-request-id and
# request-id into errors), the gateway's cost and routing headers, rate limits.
EXPOSED_HEADERS = (
    "x-request-id",
    "request-id",
    "x-xrouter-request-id",
    "x-xrouter-cost-usd",
    "x-xrouter-model",
    "x-xrouter-policy",
    "x-xrouter-overhead-ms",
    "x-xrouter-cache",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-budget-usd",
    "x-should-retry",
    "retry-after",
)


def install_cors(app: FastAPI, origins: Sequence[str]) -> None:
    """Answer preflights and mark answers readable by ``origins``. Added last, so that it
    is the outermost middleware: preflights never reach routing (which would answer 405),
    and errors carry the headers too, so a page can read why it was refused."""
    if not origins:
        return
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_methods=["GET", "POST", "PATCH", "DELETE"],
        # The SDKs send their own headers (x-stainless-*, anthropic-version, …): any.
        allow_headers=["*"],
        expose_headers=list(EXPOSED_HEADERS),
        allow_credentials=False,
        max_age=600,
    )
