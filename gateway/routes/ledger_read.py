"""Routes that only read the ledger database, bounded by ``ledger.read_timeout_s``.

A database that refuses connections is a 503 at once (``install_error_handlers``); one that
hangs would hold the call as long as it hangs (a stopped server's connections may not fail
for many minutes). These routes
read and change nothing else, so giving up on them changes nothing either: the operator or
client retries. Routes that write (key creation, rotation, feedback's record) bound only
their reads, since a write given up on may still have been made.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from fastapi import Request

from gateway.routes.openai import services

P = ParamSpec("P")
R = TypeVar("R")


def ledger_read(handler: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """``handler`` (a route taking ``request``) given up as a 503 ``database_unavailable``
    once it has taken ``ledger.read_timeout_s``. FastAPI reads the handler's own signature
    (through ``__wrapped__``)."""

    @functools.wraps(handler)
    async def bounded(*args: P.args, **kwargs: P.kwargs) -> R:
        request = kwargs["request"]
        assert isinstance(request, Request)
        return await services(request).read_ledger(handler(*args, **kwargs))

    return bounded
