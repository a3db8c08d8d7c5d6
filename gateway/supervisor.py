"""The supervisor of ``xrouter serve --workers N``: uvicorn's own, with one change to its
shutdown; and what SIGHUP does to the processes of ``serve``.

uvicorn binds the listening socket in the supervisor and hands it to the workers. On
SIGTERM each worker closes its copy as its graceful shutdown begins, but the supervisor's
stayed open until every worker had exited, so the kernel went on completing connections
into the socket's backlog that no worker would ever accept, and reset them all when the
supervisor exited, seconds later: requests a client had sent, lost without an answer or a
ledger row. One worker refuses such connections at once, and a client or load balancer
retries them elsewhere; closing the supervisor's copy as the shutdown begins makes several
workers do the same.
"""

from __future__ import annotations

import logging
import signal
import time
from socket import socket

from uvicorn import Config
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import Process

log = logging.getLogger(__name__)

# A replacement worker that fails to start is tried again after this, doubling each time.
_RETRY_FIRST_S = 1.0
_RETRY_MAX_S = 30.0


class Supervisor(Multiprocess):
    """uvicorn's supervisor, but for two things. Its shutdown closes the listening socket
    first (above). And a worker that dies while the others serve is replaced even when its
    replacement fails to start: uvicorn stopped the whole server then (a broken app would
    fail the same way on every restart), so one worker killed — by the OOM killer, say —
    during a PostgreSQL outage, when a new worker cannot open the ledger, took the healthy
    ones down with it, and ``serve`` exited 0. Only a failure of the first start stops
    ``serve`` now (exit 3, as with one worker); a replacement's is logged and tried again,
    backing off up to 30 s, while the other workers serve on."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        super().__init__(config, sockets)
        self.startup_failed = False
        self._first: list[Process] = []  # the first start's (held: an id could be reused)
        self._retry_at: dict[int, float] = {}  # slot -> when to try a replacement again
        self._failures: dict[int, int] = {}  # slot -> replacements that failed in a row

    def init_processes(self) -> None:
        super().init_processes()
        self._first = list(self.processes)

    def terminate_all(self) -> None:
        # Before the workers are told to stop: from here on the port refuses connections
        # (each worker still finishes the requests it has, up to the grace period).
        for sock in self.sockets:
            sock.close()
        super().terminate_all()

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for idx, process in enumerate(self.processes):
            retry_at = self._retry_at.get(idx)
            if retry_at is not None:
                if process.exitcode is None:  # replaced meanwhile (SIGHUP's restart)
                    del self._retry_at[idx]
                elif time.monotonic() >= retry_at:
                    del self._retry_at[idx]
                    self._replace(idx)
                continue
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                if self._failures.get(idx) and process.is_ready(timeout=1):
                    self._failures.pop(idx)
                continue
            process.kill()  # hung, or already gone
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                if any(process is p for p in self._first):
                    log.error("worker [%s] failed to start; stopping", process.pid)
                    self.startup_failed = True
                    self.should_exit.set()
                    return
                failures = self._failures.get(idx, 0) + 1
                self._failures[idx] = failures
                delay = min(_RETRY_MAX_S, _RETRY_FIRST_S * 2 ** (failures - 1))
                log.error(
                    "replacement worker [%s] failed to start (see its error above); the "
                    "other workers serve on, and it is tried again in %.0f s",
                    process.pid,
                    delay,
                )
                self._retry_at[idx] = time.monotonic() + delay
                continue
            if self.should_exit.is_set():
                return
            log.info("worker [%s] died (exit %s); starting another", process.pid, process.exitcode)
            self._replace(idx)

    def _replace(self, idx: int) -> None:
        process = Process(self.config, self.sockets)
        process.start()
        self.processes[idx] = process


def run_workers(config: Config) -> int:
    """Serve ``config`` (an app factory's import string, ``workers`` > 1) until a signal
    stops it, as ``uvicorn.run`` does for several workers. Returns the exit status: 0, or
    3 when a worker of the first start failed to start (uvicorn's status for one worker)."""
    sock: socket = config.bind_socket()
    supervisor = Supervisor(config, sockets=[sock])
    try:
        supervisor.run()
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
    return STARTUP_FAILURE if supervisor.startup_failed else 0


def hangup_stops_gracefully() -> None:
    """One worker (``serve`` without a supervisor): SIGHUP is a graceful shutdown, as
    SIGTERM is. uvicorn's server handles SIGINT and SIGTERM only, so a hangup (the terminal
    closed, ``kill -HUP``, a service manager's reload) killed the process on the spot: the
    requests in flight cut without an answer or a ledger row, their budget holds left to
    expire."""
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: signal.raise_signal(signal.SIGTERM))


def workers_ignore_hangup() -> None:
    """A worker of several leaves SIGHUP to the supervisor, which replaces the workers one
    at a time, each stopped gracefully (uvicorn's restart). A hangup sent to the whole process
    group (a closed terminal) reached the workers too, and killed them on the spot."""
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
