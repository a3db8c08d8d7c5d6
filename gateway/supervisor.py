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

import signal
from socket import socket

from uvicorn import Config
from uvicorn.supervisors import Multiprocess


class Supervisor(Multiprocess):
    def terminate_all(self) -> None:
        # Before the workers are told to stop: from here on the port refuses connections
        # (each worker still finishes the requests it has, up to the grace period).
        for sock in self.sockets:
            sock.close()
        super().terminate_all()


def run_workers(config: Config) -> None:
    """Serve ``config`` (an app factory's import string, ``workers`` > 1) until a signal
    stops it, as ``uvicorn.run`` does for several workers."""
    sock: socket = config.bind_socket()
    try:
        Supervisor(config, sockets=[sock]).run()
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()


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
