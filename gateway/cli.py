"""The ``xrouter`` command line: serve, replay-upstream, export, train, eval, deploy,
checkpoints.

Training and evaluation are imported lazily so that the gateway never imports torch.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("xrouter")


# What ``${XROUTER_REPLAY_URL}`` reads as while ``serve`` validates its config before the
# replay upstream it starts is listening (and its port known): a URL of the same shape.
REPLAY_URL_STAND_IN = "http://127.0.0.1:1"


def demo_config_path() -> str:
    return str(resources.files("gateway").joinpath("data/demo.yaml"))


class ReplayStartError(RuntimeError):
    """The replay upstream ``serve`` starts for the demo did not come up."""


def start_replay_upstream(
    host: str = "127.0.0.1", table: str | None = None, log_level: str | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """Start the replay upstream as a child process on a free port and wait until it listens.
    ``log_level``: the gateway's ``--log-level``, which the child's lines share a terminal
    with."""
    port_file = Path(tempfile.mkdtemp(prefix="xrouter-replay-")) / "port"
    cmd = [
        sys.executable,
        "-m",
        "gateway.replay",
        "--host",
        host,
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--exit-with-parent",
        str(os.getpid()),
    ]
    if table:
        cmd += ["--table", table]
    if log_level:
        cmd += ["--log-level", log_level]
    # A process group of its own: Ctrl-C in a terminal signals the foreground group, and
    # the replay upstream must keep answering while the gateway's graceful shutdown lets
    # its in-flight requests finish; the gateway stops it afterwards (``_stop``), or it
    # notices the gateway is gone (``--exit-with-parent``).
    proc = subprocess.Popen(cmd, process_group=0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            url = f"http://{host}:{int(port_file.read_text().strip())}"
            atexit.register(_stop, proc)
            # Read once: the directory is ours to remove (it was left in /tmp each start).
            shutil.rmtree(port_file.parent, ignore_errors=True)
            return proc, url
        if proc.poll() is not None:
            # Its own line said why (a demo.replay_table it cannot read, say).
            raise ReplayStartError(f"the replay upstream exited with code {proc.returncode}")
        time.sleep(0.05)
    proc.kill()
    raise ReplayStartError("the replay upstream did not start within 30 s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wants_replay(path: str) -> tuple[bool, str | None]:
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False, None  # load_settings reports what is wrong with the file
    demo = raw.get("demo") if isinstance(raw, dict) else None
    if not isinstance(demo, dict):
        return False, None
    table = demo.get("replay_table")
    return bool(demo.get("replay_upstream")), str(table) if table is not None else None


async def _check_ledger(url: str) -> tuple[str | None, Any]:
    """Open the ledger once and bring its schema up to date before the server starts: a
    database that is down, missing or refusing us is one line here, not a traceback from
    every worker's startup (and the workers then find the schema migrated). Returns the
    problem, or the newest router deployment (None if there is none)."""
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    from gateway.ledger.deployments import DeploymentRepository
    from gateway.ledger.migrations import MigrationError
    from gateway.ledger.store import describe_error, open_ledger_engine

    try:
        engine = await open_ledger_engine(url)
    # ImportError: a database whose driver is not installed (mysql://); MigrationError: one
    # that holds another application's tables.
    except (OSError, ValueError, ImportError, sa.exc.SQLAlchemyError, MigrationError) as exc:
        try:
            where = make_url(url).render_as_string(hide_password=True)
        except (ValueError, sa.exc.ArgumentError):
            where = "URL"  # malformed: the error says so; it may hold a password
        return f"the ledger database {where} is not usable: {describe_error(exc)}", None
    try:
        return None, await DeploymentRepository(engine).latest()
    except (OSError, sa.exc.SQLAlchemyError) as exc:
        return f"reading router deployments failed: {describe_error(exc)}", None
    finally:
        await engine.dispose()


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import CONFIG_ENV, SERVE_FLAGS_ENV, SUPERVISOR_ENV, create_app
    from gateway.settings import SettingsError, load_settings
    from gateway.supervisor import hangup_stops_gracefully, run_workers

    if args.log_level:  # now: the lines before the config is read obey it too
        set_log_level(args.log_level)
    path = args.config or demo_config_path()
    if not Path(path).exists():
        log.error("config file not found: %s", path)
        return 2
    wants_replay, table = _wants_replay(path)
    start_replay = wants_replay and not os.environ.get("XROUTER_REPLAY_URL")
    overrides = {"server.host": args.host, "server.port": args.port, "server.workers": args.workers}
    # The server settings the command line sets, not the file: a reload does not report the
    # file's values for them as changes.
    flags = [
        f
        for f, v in (
            ("host", args.host),
            ("port", args.port),
            ("workers", args.workers),
            ("log_level", args.log_level),
        )
        if v is not None
    ]
    # The replay upstream (a child process) is started only once the config and the port
    # have proved usable: a start refused for them is one line, with no child started and
    # its lines in between. Its URL is not known until it listens, so the config is
    # validated here with a stand-in of the same shape, and loaded again with the real one.
    env = {**os.environ, "XROUTER_REPLAY_URL": REPLAY_URL_STAND_IN} if start_replay else None
    try:
        settings = load_settings(path, env=env, overrides=overrides)
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
    if start_replay and table is not None:
        # Opened here as the replay upstream opens it: a table missing, a directory or
        # unreadable is one line with no child started (what is in it is the child's to read).
        try:
            Path(table).open("rb").close()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            log.error("cannot start: outcome table %s: %s", table, reason)
            return 2
    srv = settings.server
    # One level for every line (else the config's): uvicorn's log_level alone left
    # xrouter's own INFO lines on.
    level = args.log_level or srv.log_level
    set_log_level(level)
    os.environ[LOG_LEVEL_ENV] = level  # for the workers (configure_logging)
    if srv.workers > 1 and not settings.router.watch_files:
        # POST /admin/reload reloads the worker that answers it; the others take a config
        # change up through their file watchers, which are off.
        log.warning(
            "%d workers with router.watch_files off: POST /admin/reload reloads only the "
            "worker that answers it; turn the watcher on for every worker to follow a config "
            "change (checkpoints deployed with xrouter deploy reach every worker either way)",
            srv.workers,
        )
    # Empty counts as none, as it does to the authenticator: `${XROUTER_ADMIN_KEY:-}` with
    # the variable unset (the Helm chart's values) is an empty key, a SecretStr that is false.
    if settings.auth.enabled and not settings.auth.admin_key:
        # Not refused: keys live in the ledger and outlive the admin key (made while one was
        # set, or by another replica sharing the ledger that has one), and a gateway without
        # one serves them with its admin API shut. But on a ledger with no key it answers
        # every request 401, so the start says so, once (here, not in every worker).
        log.warning(
            "auth is on and no admin key is set: requests need keys made while one was set "
            "(kept in the ledger), and the admin API answers 403 admin_disabled, so no key can "
            "be made; set auth.admin_key (env XROUTER_AUTH__ADMIN_KEY) to make keys"
        )
    # Checked before anything is made: a port in use is one line, not a start that opens the
    # ledger and then fails.
    problem = cannot_listen(srv.host, srv.port, srv.workers)
    if problem is not None:
        log.error("cannot start: %s", problem)
        return 2
    # A start that fails leaves nothing it made behind (the demo's ./xrouter.db and
    # ./xrouter-spill in the working directory): a SQLite ledger that does not exist yet is
    # made only once the config has proved usable (it holds no deployment to check it with).
    new_ledger = _new_sqlite_ledger(settings.ledger.url)
    deployment = None
    if new_ledger is None:
        problem, deployment = asyncio.run(_check_ledger(settings.ledger.url))
        if problem is not None:
            log.error("cannot start: %s", problem)
            return 2
    if start_replay:
        try:
            _, url = start_replay_upstream(table=table, log_level=args.log_level)
        except ReplayStartError as exc:  # was a bare line and exit 1, as no other refusal
            log.error("cannot start: %s", exc)
            return 2
        os.environ["XROUTER_REPLAY_URL"] = url
        log.info("demo: replay upstream at %s", url)
        try:
            settings = load_settings(path, overrides=overrides)
        except SettingsError as exc:  # not expected (only the URL differs); the child stops at exit
            log.error("%s", exc)
            return 2
    try:
        # The pool, prices and checkpoint (the deployed one, if any) must be usable: say so
        # here, in one line, rather than as a traceback from inside the server's startup
        # (and once, not per worker). One worker serves the runtime built here; several
        # build their own.
        app = create_app(settings, config_path=path, serve_flags=flags)
        app.state.services.prepare(deployment)
    except Exception as exc:
        log.error("cannot start: %s", exc)
        return 2
    from gateway.ledger.private_files import make_private_dir

    spill_dir = Path(settings.ledger.spill_dir)
    made = _missing_dirs(spill_dir)
    try:
        # Where rows wait while the database is down: made now, so a path that cannot be a
        # directory is this line and not a traceback from every worker's startup. Owner-only
        # (0700) when made here: it holds ledger records.
        make_private_dir(spill_dir)
    except OSError as exc:
        _remove_empty_dirs(made)
        log.error("cannot start: ledger.spill_dir %s is not usable: %s", spill_dir, exc)
        return 2
    if new_ledger is not None:
        made += _missing_dirs(new_ledger.parent)
        problem, _ = asyncio.run(_check_ledger(settings.ledger.url))
        if problem is not None:
            # Only the directories: a database file, once made, may already be another
            # start's (two started together on the same config).
            _remove_empty_dirs(made)
            log.error("cannot start: %s", problem)
            return 2
    common: dict[str, Any] = dict(
        host=srv.host,
        port=srv.port,
        log_level=level,
        access_log=False,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=30,
        timeout_keep_alive=srv.keep_alive_s,
    )
    # Not "listening" yet: uvicorn binds the port after this (and says so, "Uvicorn running
    # on ...", once it has); one worker runs the app's startup first.
    log.info(
        "xrouter starting on http://%s:%d (%d worker%s)",
        srv.host,
        srv.port,
        srv.workers,
        "s" * (srv.workers > 1),
    )
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if given:
        # Set by the operator, it puts one worker in multiprocess mode too: either way its
        # previous run's files must go, or their counts add to this run's.
        _empty_metrics_dir(Path(given))
    if srv.workers == 1:
        hangup_stops_gracefully()
        uvicorn.run(app, **common)
        return 0
    # Several workers: each builds its own app from the same config; metrics aggregate
    # through prometheus_client's multiprocess mode. The config's path is made absolute
    # without following symlinks: a Kubernetes ConfigMap is a symlink into a dated
    # directory that an update replaces, so a resolved path would name a file that is gone
    # (reloads, and workers restarted after a crash, would fail on it).
    os.environ[CONFIG_ENV] = os.path.abspath(path)
    os.environ[SUPERVISOR_ENV] = str(os.getpid())
    os.environ[SERVE_FLAGS_ENV] = ",".join(flags)
    # The host and port the command line set, as the workers' settings: passed only then,
    # since a worker reading the file's value from the environment would not see a reload
    # change it (and so not warn that the change takes a restart).
    for flag, value in (("host", srv.host), ("port", srv.port)):
        if flag in flags:
            os.environ[f"XROUTER_SERVER__{flag.upper()}"] = str(value)
    if given:
        metrics_dir = None
    else:
        metrics_dir = tempfile.mkdtemp(prefix="xrouter-prom-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        return run_workers(
            uvicorn.Config(
                "gateway.app:create_app_from_env", factory=True, workers=srv.workers, **common
            )
        )
    finally:
        if metrics_dir is not None:  # ours: nothing reads it once the workers are gone
            shutil.rmtree(metrics_dir, ignore_errors=True)


def cannot_listen(host: str, port: int, workers: int) -> str | None:
    """Why the server cannot listen on ``host:port`` (one line), or None. Bound as uvicorn
    binds (address reuse on): one worker, every address of the host (asyncio's
    ``create_server``, which skips an address family the machine lacks); several, one socket
    whose family the host's spelling says. A process that takes the port between this check
    and uvicorn's bind still makes the start fail, in uvicorn's own line (exit 3). The replay
    upstream checks its port with it too (``workers`` 1: aiohttp binds with asyncio's
    ``create_server``)."""
    import errno
    import socket

    if workers > 1:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
    else:
        family = socket.AF_UNSPEC
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except OSError as exc:  # socket.gaierror: a host name that does not resolve
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    refused: OSError | None = None
    bound = 0
    for fam, kind, proto, _, addr in infos:
        with socket.socket(fam, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if fam == socket.AF_INET6 and workers == 1:
                # As asyncio's create_server binds each family apart; uvicorn's one socket
                # for several workers is dual-stack, so "::" there also takes 0.0.0.0's port.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
                bound += 1
            except OSError as exc:
                if workers > 1 or exc.errno != errno.EADDRNOTAVAIL:
                    refused = exc
                    break
                refused = refused or exc
    if refused is None or (bound and refused.errno == errno.EADDRNOTAVAIL):
        return None
    if refused.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use (another server listens there): stop it, or "
            "give another --port"
        )
    return f"cannot listen on {host}:{port}: {refused.strerror or refused}"


def _new_sqlite_ledger(url: str) -> Path | None:
    """The file of a SQLite ledger that does not exist yet (this start would make it), else
    None (another database, or a URL that ``_check_ledger`` reports on)."""
    from gateway.ledger.store import ledger_url, sqlite_file

    try:
        path = sqlite_file(ledger_url(url))
    except Exception:  # malformed: _check_ledger says what is wrong with it
        return None
    return path if path is not None and not os.path.lexists(path) else None


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first: the directories a
    ``mkdir(parents=True)`` of it makes."""
    missing: list[Path] = []
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path.parent != path:
        missing.append(path)
        path = path.parent
    return missing


def _remove_empty_dirs(dirs: list[Path]) -> None:
    """Remove the directories a failed start made (``_missing_dirs``), deepest first; one
    that is not empty (something else put a file there since) stays, as do its parents."""
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass


def _empty_metrics_dir(path: Path) -> None:
    """An operator's ``PROMETHEUS_MULTIPROC_DIR`` may hold a previous run's files, whose
    counts /metrics would add to this run's (prometheus_client: "wiped between runs").
    Only its metric files go; the directory stays."""
    stale = list(path.glob("*.db")) if path.is_dir() else []
    for f in stale:
        f.unlink(missing_ok=True)
    if stale:
        log.info("removed %d metric files of a previous run from %s", len(stale), path)


def cmd_replay(args: argparse.Namespace) -> int:
    from gateway.replay.server import run

    return run(args)


def cmd_export(args: argparse.Namespace) -> int:
    from gateway.ledger.export_cli import run_export
    from gateway.settings import SettingsError, load_ledger_settings

    url = args.ledger
    if url is None:
        try:
            # The ledger section alone: an export (a cron job) needs none of the gateway's
            # other settings, nor the environment variables they name (provider keys).
            url = load_ledger_settings(args.config).url
        except SettingsError as exc:
            log.error("%s", exc)
            return 2
    return asyncio.run(run_export(args, url))


def cmd_convert(args: argparse.Namespace) -> int:
    from training.datasets.convert import run_convert

    return run_convert(args)


def cmd_train(args: argparse.Namespace) -> int:
    from training.compact.cli import run_train

    return run_train(args)


def cmd_verl_data(args: argparse.Namespace) -> int:
    from training.verl.cli import run_verl_data

    return run_verl_data(args)


def cmd_eval(args: argparse.Namespace) -> int:
    from training.evaluation.cli import run_eval

    return run_eval(args)


def cmd_deploy(args: argparse.Namespace) -> int:
    from gateway.deploy import run_deploy

    return run_deploy(args)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from gateway.registry import run_checkpoints

    return run_checkpoints(args)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="xrouter", description="Cost-aware LLM routing gateway with an RL-trained router."
    )
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the gateway (no --config: the embedded demo)")
    p.add_argument("--config", help="YAML config file (default: the embedded demo config)")
    p.add_argument("--host", help="bind address (default from config: 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default from config: 8000)")
    p.add_argument("--workers", type=int, help="worker processes (default from config: 1)")
    add_log_level_argument(p)  # default: the config's server.log_level
    p.set_defaults(func=cmd_serve)

    from gateway.replay.server import add_arguments as replay_args

    p = sub.add_parser(
        "replay-upstream", help="serve recorded outcomes as an OpenAI-compatible upstream"
    )
    replay_args(p)
    p.set_defaults(func=cmd_replay)

    from gateway.ledger.export_cli import add_export_arguments

    p = sub.add_parser("export", help="export the ledger as an outcome table (JSONL or Parquet)")
    p.add_argument("--config", help="gateway config (for the ledger URL)")
    p.add_argument("--ledger", help="ledger database URL (overrides --config)")
    add_export_arguments(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser(
        "convert",
        help="convert routing outcome data (RouterBench, RouterDC, RouteLLM, RouteProfile, "
        "ledger export) to an outcome table",
    )
    _lazy_arguments(p, "training.datasets.convert", "add_convert_arguments")
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("train", help="train a compact router (needs the 'train' extra)")
    _lazy_arguments(p, "training.compact.cli", "add_train_arguments")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a policy over an outcome table")
    _lazy_arguments(p, "training.evaluation.cli", "add_eval_arguments")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser(
        "verl-data", help="an outcome table as verl's dataset for RL of the LLM router (GPU)"
    )
    _lazy_arguments(p, "training.verl.cli", "add_verl_data_arguments")
    p.set_defaults(func=cmd_verl_data)

    p = sub.add_parser("deploy", help="make a running gateway hot-load a checkpoint")
    p.add_argument(
        "checkpoint",
        help="a checkpoint directory, its checkpoint.json, a training run directory (its "
        "checkpoint/ is deployed), or packaged:<name> for one shipped with xrouter; a path "
        "must be one the gateway can read",
    )
    p.add_argument(
        "--url",
        default="http://127.0.0.1:8000",
        help="the gateway's base URL (default: %(default)s, where xrouter serve listens)",
    )
    p.add_argument(
        "--admin-key",
        default=os.environ.get("XROUTER_ADMIN_KEY"),
        help="admin key (env XROUTER_ADMIN_KEY)",
    )
    p.set_defaults(func=cmd_deploy)

    from gateway.registry import add_checkpoints_arguments

    p = sub.add_parser("checkpoints", help="list checkpoints and their metadata (the registry)")
    add_checkpoints_arguments(p)
    p.set_defaults(func=cmd_checkpoints)
    return ap


def _lazy_arguments(p: argparse.ArgumentParser, module: str, fn: str) -> None:
    """Argument definitions live with the (heavy) module; importing it only to build --help
    is fine because these modules import torch lazily themselves."""
    import importlib

    try:
        getattr(importlib.import_module(module), fn)(p)
    except ImportError as exc:
        p.description = f"unavailable: {exc}"


# ``--log-level`` of serve and replay-upstream; given in any case (ERROR, error).
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# The level ``serve --log-level`` chose, for its workers: spawned interpreters that configure
# their logging afresh (``configure_logging`` from the app factory).
LOG_LEVEL_ENV = "XROUTER_LOG_LEVEL"


def log_level_arg(text: str) -> str:
    """argparse ``type`` of ``--log-level``: case-insensitive, checked against LOG_LEVELS
    (``choices``) after lowering."""
    return text.lower()


def add_log_level_argument(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument(
        "--log-level",
        type=log_level_arg,
        choices=LOG_LEVELS,
        default=default,
        help="the level of every log line, xrouter's and the server's"
        + (" (default %(default)s)" if default else ""),
    )


# Libraries that log what a request carries at DEBUG: LiteLLM each call's body (the
# messages), the openai client its request options (the same), aiosqlite and SQLAlchemy's
# engine every SQL parameter (ledger rows, key hashes). They stay at INFO under the
# gateway's DEBUG, which is for routing: a prompt in a log line would go around
# ledger.log_content, which decides whether prompts are kept at all.
CONTENT_LOGGERS = (
    "LiteLLM",
    "LiteLLM Router",
    "LiteLLM Proxy",
    "openai",
    "aiosqlite",
    "sqlalchemy.engine",
)
# The lowest level each of those may log at. SQLAlchemy's engine echoes every statement
# at INFO (its own default is WARNING): raised to INFO, it wrote 3 to 5 lines of SQL per
# ledger flush and key lookup, half of a busy gateway's log at the default level.
_CONTENT_FLOOR = {"sqlalchemy.engine": logging.WARNING}


def set_log_level(level: str) -> None:
    """Apply a ``--log-level`` to the root logger, which xrouter's loggers and aiohttp's
    follow, and to uvicorn's, which have levels of their own (set again by uvicorn from its
    ``log_level``; set here too for the lines before it starts); ``CONTENT_LOGGERS`` no
    lower than INFO (SQLAlchemy's engine, whose INFO is every statement: WARNING)."""
    value = getattr(logging, level.upper())
    logging.getLogger().setLevel(value)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).setLevel(value)
    for name in CONTENT_LOGGERS:
        logging.getLogger(name).setLevel(max(value, _CONTENT_FLOOR.get(name, logging.INFO)))


def configure_logging(*, worker: bool = False) -> None:
    """Our log lines' format and level, for the ``xrouter`` process and (called from the app
    factory, ``worker``) for each worker of ``serve --workers N``: those are spawned
    interpreters that inherit no logging configuration, so the level ``serve --log-level``
    chose reaches them through the environment (LOG_LEVEL_ENV). A worker's lines carry its
    pid: two workers' "reloaded" (or "reload … failed") lines were otherwise the same line
    twice, and one worker's alone could not be told from the other's."""
    pid = "[%(process)d] " if worker else ""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s {pid}%(name)s: %(message)s"
    )
    level = os.environ.get(LOG_LEVEL_ENV, "").lower()
    if level in LOG_LEVELS:
        set_log_level(level)


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    try:
        # Building the parser imports the training commands' argument modules (numpy with
        # them): a Ctrl-C in that second is as much the user's as one during the command.
        args = build_parser().parse_args(argv)
        # Reports and checkpoints record the command that made them.
        args.command_line = shlex.join(["xrouter", *(sys.argv[1:] if argv is None else argv)])
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader went away (`xrouter checkpoints --show X | head`): as any Unix tool,
        # stop quietly. Python's documented recipe: point stdout at devnull so the
        # interpreter's final flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by it
    except KeyboardInterrupt:
        # Ctrl-C in a long eval, train or export: the user asked for it, so one line and
        # not a traceback. The commands' own cleanup (temporary outputs, a replaced run
        # directory put back) has run on the way up. 130 = 128 + SIGINT, as a shell says.
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
