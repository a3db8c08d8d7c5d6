"""Rendering ``/metrics``: one process's registry, or every worker's values aggregated.

With several server workers each process has its own counters. When
``PROMETHEUS_MULTIPROC_DIR`` is set *before* ``prometheus_client`` is first imported, every
metric writes to memory-mapped files in that directory, ``render_metrics`` aggregates them,
and the server's worker-exit hook must call ``mark_process_dead(pid)`` so a dead worker's
live gauges (the ledger queue depth) stop counting. A worker killed outright (SIGKILL, OOM)
runs no hook, so every render also reaps the live-gauge files of pids that no longer exist.
How each gauge combines across workers is declared with the metric (``gateway.metrics``).
"""

from __future__ import annotations

import asyncio
import os
import re

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import multiprocess as _multiprocess

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def multiprocess_enabled() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The ``/metrics`` body and content type.

    In multiprocess mode the values of every worker (read from the shared directory) are
    aggregated on a fresh registry and ``registry`` is not read (its metrics write to that
    directory too). This reads files: call it off the event loop (``arender_metrics``)."""
    if multiprocess_enabled():
        reap_dead_workers(os.environ[MULTIPROC_ENV])
        collecting = CollectorRegistry()
        _multiprocess.MultiProcessCollector(collecting)
        return generate_latest(collecting), CONTENT_TYPE_LATEST
    return generate_latest(registry), CONTENT_TYPE_LATEST


async def arender_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    """``render_metrics`` in a worker thread, for async endpoints."""
    return await asyncio.to_thread(render_metrics, registry)


_LIVE_GAUGE_FILE = re.compile(r"^gauge_live\w*_(\d+)\.db$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def reap_dead_workers(path: str) -> list[int]:
    """``mark_process_dead`` for every pid with live-gauge files in ``path`` that is no
    longer running (a worker killed without running its exit hook). Returns those pids. The
    directory is per host (the CLI makes a fresh one per server), so pids are comparable;
    a recycled pid only delays the reaping until that process exits too."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    dead = sorted(
        {int(m.group(1)) for n in names if (m := _LIVE_GAUGE_FILE.match(n))} - {os.getpid()}
    )
    dead = [pid for pid in dead if not _alive(pid)]
    for pid in dead:
        _multiprocess.mark_process_dead(pid, path)
    return dead


def mark_process_dead(pid: int) -> None:
    """For the server's worker-exit hook: drop a dead worker's live gauges. No-op when not
    in multiprocess mode."""
    if multiprocess_enabled():
        _multiprocess.mark_process_dead(pid)
