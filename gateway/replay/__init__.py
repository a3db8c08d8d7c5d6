"""The replay upstream: an OpenAI-compatible server that answers every pool model from an
outcome table of real recorded outcomes (the demo, end-to-end tests, benchmarks).

Submodules: ``table`` (the prompt index), ``synth`` (answers and deterministic synthesis),
``render`` (wire encoding), ``faults`` (fault injection), ``app`` (the aiohttp application),
``server`` (``serve`` and the CLI). Importing this package imports nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.replay.app import create_app
    from gateway.replay.server import add_arguments, run, serve
    from gateway.replay.table import ReplayTable

__all__ = ["ReplayTable", "add_arguments", "create_app", "run", "serve"]

_EXPORTS = {
    "ReplayTable": "gateway.replay.table",
    "create_app": "gateway.replay.app",
    "add_arguments": "gateway.replay.server",
    "run": "gateway.replay.server",
    "serve": "gateway.replay.server",
}


def __getattr__(name: str) -> Any:
    # Lazy, so `xrouter --help` and the gateway do not pay for aiohttp unless they serve.
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
