"""W3C Trace Context, passed through to the providers.

A client that traces its requests (OpenTelemetry, or any W3C Trace Context implementation)
sends ``traceparent`` and maybe ``tracestate``. The gateway forwards both, unchanged, on
every upstream call the request makes — downstream models, retries, fallbacks, cascade
rounds and the ``llm`` router's own model — so that a trace through the application
continues into vLLM (``--otlp-traces-endpoint``) or any provider that reads them. It does
not start spans of its own: to a tracer it is transparent, as a proxy without tracing is.

The context lives in a context variable, as OpenTelemetry keeps its own: set for one
request by ``gateway.trace_context`` and inherited by every task the request starts (the
parallel calls of a cascade), where threading it through every call signature would touch
each layer between the route and the HTTP client. Malformed values are dropped, not
forwarded (the spec's rule for a ``traceparent`` that does not parse), and so is a
``tracestate`` longer than the spec's 512 characters or without a valid ``traceparent``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from contextvars import ContextVar, Token

__all__ = ["MAX_TRACESTATE", "bind", "forwarded_headers", "parse", "unbind"]

# version-traceid-parentid-flags, lower-case hex. Version ff is invalid; a later version
# may append fields after a dash (the spec: parse the first four, keep the rest).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE = "0" * 32
_ZERO_PARENT = "0" * 16
MAX_TRACESTATE = 512

_CURRENT: ContextVar[Mapping[str, str] | None] = ContextVar("xrouter_trace_context", default=None)


def parse(traceparent: str | None, tracestate: str | None) -> dict[str, str] | None:
    """The headers to forward for a request that sent these, or None."""
    if traceparent is None:
        return None
    value = traceparent.strip()
    m = _TRACEPARENT.fullmatch(value) if value.isascii() and value.isprintable() else None
    if m is None:
        return None
    version, trace_id, parent_id, _flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or parent_id == _ZERO_PARENT:
        return None
    out = {"traceparent": value}
    if tracestate is not None:
        state = tracestate.strip()
        if state and len(state) <= MAX_TRACESTATE and state.isprintable() and state.isascii():
            out["tracestate"] = state
    return out


def bind(headers: Mapping[str, str] | None) -> Token[Mapping[str, str] | None]:
    """Make ``headers`` the current request's trace context (None: it has none)."""
    return _CURRENT.set(headers)


def unbind(token: Token[Mapping[str, str] | None]) -> None:
    _CURRENT.reset(token)


def forwarded_headers() -> Mapping[str, str] | None:
    """The trace headers of the request being served, for an upstream call, or None."""
    return _CURRENT.get()
