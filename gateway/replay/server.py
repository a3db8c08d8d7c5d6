"""Running the replay upstream: ``serve()`` and the CLI behind ``xrouter replay-upstream`` and
``python -m gateway.replay``.

The replay upstream is an OpenAI-compatible chat server, in its own process, that answers
every pool model from an outcome table of real recorded outcomes (by default the packaged
demo table), with fault and latency injection. It stands in for real providers in the demo
(``xrouter serve`` with no config), in end-to-end tests and in throughput benchmarks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.cli import add_log_level_argument, cannot_listen, configure_logging, set_log_level
from gateway.replay.app import create_app
from gateway.replay.table import ReplayTable
from gateway.writable import cannot_make_files_in

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8001
API_KEY_ENV = "XROUTER_REPLAY_API_KEY"

__all__ = ["add_arguments", "create_app", "run", "serve", "start"]


def _announce(ready: int | str | Path, port: int) -> None:
    """Tell whoever started us which port we listen on (startup only, so sync I/O is fine)."""
    line = f"{port}\n".encode()
    if isinstance(ready, int):
        os.write(ready, line)
        return
    path = Path(ready)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(line)
        os.replace(tmp, path)  # atomic: a reader never sees a half-written port
    except OSError:
        # Onto a directory the write succeeded and the replace failed, and the .tmp was left.
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def _withdraw(path: Path, port: int) -> None:
    """Remove the port file once nothing listens on the port it names (shutdown only, so
    sync I/O is fine): a script that waits for it before its next start would read a dead
    port at once. Left alone if another run has written its own port there since."""
    with contextlib.suppress(OSError):
        if path.read_bytes() == f"{port}\n".encode():
            path.unlink()


def _port_file_problem(path: Path) -> str | None:
    """Why ``--port-file`` could not be written once listening, or None. Checked before
    starting (it was refused after the "listening" line), and without writing the file: one
    written now would name a port nothing listens on if the start then failed otherwise."""
    if path.is_dir():
        return f"--port-file {path}: Is a directory"
    parent = path.parent  # "." for a bare name
    reason = cannot_make_files_in(parent)
    if reason is not None:
        return f"--port-file {path}: cannot write in {parent}: {reason}"
    return None


async def start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving ``app`` on the running loop; returns the runner (``await
    runner.cleanup()`` to stop) and the bound port. For embedding (benchmarks, tools)."""
    # handler_cancellation: when a client disconnects, its handler is cancelled, so an
    # injected `timeout` fault (a long sleep) does not outlive the client.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=2048)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    # A child started by `xrouter serve` must not outlive it, however the gateway ends
    # (uvicorn re-raises SIGTERM, which skips atexit; SIGKILL skips everything).
    while os.getppid() == parent:  # noqa: ASYNC110 - no event exists for "parent died"
        await asyncio.sleep(1.0)
    log.info("parent process %d is gone; shutting down", parent)
    stop.set()


async def _serve_app(
    app: web.Application,
    host: str,
    port: int,
    ready: int | str | Path | None,
    exit_with_parent: int | None = None,
) -> None:
    runner, bound = await start(app, host, port)
    try:
        log.info("replay upstream listening on http://%s:%d", host, bound)
        if ready is not None:
            _announce(ready, bound)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass  # not the main thread (or no signals here): stopped by cancellation
        # The parent named by the caller, else ours now: if the parent died before this
        # line, ours is already init's pid, and only the named one is still the right one.
        watcher = (
            asyncio.create_task(_watch_parent(exit_with_parent or os.getppid(), stop))
            if exit_with_parent is not None
            else None
        )
        await stop.wait()
        if watcher is not None:
            watcher.cancel()
        log.info("replay upstream shutting down")
    finally:
        await runner.cleanup()
        if isinstance(ready, str | Path):
            _withdraw(Path(ready), bound)


def _run(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(coro)


def serve(
    host: str,
    port: int,
    table_path: str | Path | None = None,
    *,
    latency_ms: float = 0.0,
    api_key: str | None = None,
    ready_fd_or_file: int | str | Path | None = None,
    stream_chunk_delay_ms: float = 0.0,
    exit_with_parent: int | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM (blocking). ``port`` 0 picks a free port; once listening,
    the bound port is written (``"<port>\\n"``) to ``ready_fd_or_file`` — an open file
    descriptor (int) or a path (written atomically). ``table_path`` None = the packaged demo
    table."""
    _serve_table(
        _load_table(table_path),
        host,
        port,
        latency_ms=latency_ms,
        api_key=api_key,
        ready_fd_or_file=ready_fd_or_file,
        stream_chunk_delay_ms=stream_chunk_delay_ms,
        exit_with_parent=exit_with_parent,
    )


def _load_table(path: str | Path | None) -> ReplayTable:
    return ReplayTable.load(path) if path is not None else ReplayTable.load_default()


def _serve_table(
    table: ReplayTable,
    host: str,
    port: int,
    *,
    latency_ms: float,
    api_key: str | None,
    ready_fd_or_file: int | str | Path | None,
    stream_chunk_delay_ms: float,
    exit_with_parent: int | None,
) -> None:
    app = create_app(
        table, latency_ms=latency_ms, api_key=api_key, stream_chunk_delay_ms=stream_chunk_delay_ms
    )
    _run(_serve_app(app, host, port, ready_fd_or_file, exit_with_parent))


def _port(text: str) -> int:
    """argparse ``type`` of ``--port``: a TCP port, as ``xrouter serve`` checks its own;
    beyond it the OS wrapped the number (70000 listened on 4464) or refused it late."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: 0..65535 (0 = a free one)")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})"
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"port, 0 = a free one (default {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--table",
        type=Path,
        default=None,
        help="outcome table JSONL (default: the packaged demo table)",
    )
    parser.add_argument(
        "--latency-ms", type=float, default=0.0, help="fixed delay before every answer"
    )
    parser.add_argument(
        "--stream-chunk-delay-ms", type=float, default=0.0, help="delay after every streamed delta"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require 'Authorization: Bearer <key>' (default ${API_KEY_ENV}; unset = no auth)",
    )
    parser.add_argument(
        "--port-file", type=Path, default=None, help="write the bound port here once listening"
    )
    parser.add_argument(
        "--exit-with-parent",
        nargs="?",
        type=int,
        const=0,
        default=None,
        metavar="PID",
        help="shut down when the parent process (PID, default: the one that started this) "
        "exits (how `xrouter serve` starts it)",
    )
    add_log_level_argument(parser, default="info")


def run(args: argparse.Namespace) -> int:
    """Exit statuses as ``xrouter serve``'s: 2 for a start refused (a bad option, an outcome
    table missing, unreadable or malformed, a port in use or a host it cannot bind, a
    ``--port-file`` it cannot write), each one ``cannot start:`` line; 0 after a shutdown by
    signal or by its parent's exit."""
    # configure_logging, then the level on the root logger: under `xrouter replay-upstream`
    # the root logger is configured already, and basicConfig(level=...) alone left it at INFO.
    configure_logging()
    set_log_level(args.log_level)
    for name in ("latency_ms", "stream_chunk_delay_ms"):
        if getattr(args, name) < 0:
            log.error("--%s must be >= 0", name.replace("_", "-"))
            return 2
    if args.port_file is not None:
        if problem := _port_file_problem(args.port_file):
            log.error("cannot start: %s", problem)
            return 2
        # A port file left by an earlier run (killed, so it could not withdraw it) names a
        # port nothing may listen on: gone now, so that a reader waits for this run's port
        # rather than take that one, and finds none if this start is refused.
        with contextlib.suppress(OSError):
            Path(args.port_file).unlink(missing_ok=True)
    try:
        table = _load_table(args.table)
    except OSError as exc:
        log.error("cannot start: outcome table %s", _os_problem(exc))
        return 2
    except ValueError as exc:  # malformed (OutcomeTableError), or not UTF-8
        log.error("cannot start: bad outcome table: %s", exc)
        return 2
    # As serve checks its port, before anything listens: the bind error's own text was
    # "[Errno 98] error while attempting to bind on address (...)" and exit 1.
    problem = cannot_listen(args.host, args.port, 1)
    if problem is not None:
        log.error("cannot start: %s", problem)
        return 2
    try:
        _serve_table(
            table,
            args.host,
            args.port,
            latency_ms=args.latency_ms,
            api_key=args.api_key or None,
            ready_fd_or_file=args.port_file,
            stream_chunk_delay_ms=args.stream_chunk_delay_ms,
            exit_with_parent=args.exit_with_parent,
        )
    except OSError as exc:  # the port taken since the check, or --port-file since its check
        log.error("cannot start: %s", _os_problem(exc))
        return 2
    return 0


def _os_problem(exc: OSError) -> str:
    """``exc`` as "file: reason" (or the reason): not "[Errno 2] No such file or directory:
    'x'"."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename is not None else reason
