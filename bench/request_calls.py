"""Python function calls per request on the gateway's event-loop thread: a measure of
request-path overhead that does not move with the VM's load. On these 2-vCPU VMs two
``bench/gateway/run.sh`` runs of one commit differ by ±10% in requests/s, so a change that
costs 5% needs many alternated runs to show; the call count of one commit varies by about 2%
between runs, so two commits' counts can be compared in one run each.

It starts the shared harness's fake upstream and a pass-through gateway (auth off,
in-process limits, SQLite ledger: ``bench/gateway/xrouter_config.sh`` MODE=bare) from a
source tree, sends ``--warmup`` requests, then profiles ``--n`` requests at ``--concurrency``
with ``cProfile`` (started and stopped by signals, so startup and warm-up are not counted)
and prints the calls per request by module. With ``--against OLD_TREE`` it does the same for
an older tree (e.g. ``git archive <commit> | tar -x -C /tmp/old``), run through the same
virtualenv, and prints where the counts differ. A call count is not a CPU time — a C builtin
costs less than a Python frame — but a change that adds work on the request path adds calls.

Only the event-loop thread is profiled: the ledger's journal thread and the SQLite writer's
threads are not counted.

Usage::

    .venv/bin/python bench/request_calls.py [--tree DIR] [--against OLD_TREE] [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "bench"))  # run as a plain script from a checkout

from xrouter_serve import wait_for  # noqa: E402

HARNESS = REPO_ROOT.parent / "shared" / "bench" / "gateway"
log = logging.getLogger("bench.request_calls")

# Run `xrouter serve` with a profiler that SIGUSR1 starts and SIGUSR2 stops and writes out.
# Python runs signal handlers on the main thread, which is the event loop's.
BOOTSTRAP = """
import cProfile, os, signal, sys
prof = cProfile.Profile()
out = os.environ["XR_PROFILE_OUT"]
def start(*_): prof.enable()
def stop(*_):
    prof.disable(); prof.dump_stats(out); open(out + ".done", "w").close()
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
from gateway.cli import main
sys.argv = ["xrouter", *sys.argv[1:]]
main()
"""

BODY = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
    "max_tokens": 16,
}


def area(filename: str, tree: Path) -> str:
    """The module a profiled function lives in: a project file by its path, a library by its
    distribution, the standard library by its module, C builtins as one row."""
    if filename == "~":
        return "builtins"
    if "site-packages/" in filename:  # first: the venv may live inside the tree
        return "lib:" + filename.split("site-packages/", 1)[1].split("/", 1)[0]
    if filename.startswith(str(tree) + "/"):
        return filename[len(str(tree)) + 1 :]
    if "/python3." in filename:
        return "stdlib:" + filename.split("/python3.", 1)[1].split("/", 2)[1]
    return filename


def calls_by_area(stats_file: Path, tree: Path) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    stats = pstats.Stats(str(stats_file)).stats  # type: ignore[attr-defined]
    for (filename, _line, _name), (_prim, ncalls, *_rest) in stats.items():
        counts[area(filename, tree)] += ncalls
    return counts


async def load(base: str, n: int, concurrency: int) -> int:
    """Send ``n`` chat requests, ``concurrency`` at a time; the number that were not 200."""
    remaining = iter(range(n))
    failed = 0
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:

        async def worker() -> None:
            nonlocal failed
            for _ in remaining:
                r = await client.post("/v1/chat/completions", json=BODY)
                failed += r.status_code != 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return failed


def profile_tree(tree: Path, args: argparse.Namespace, work: Path) -> collections.Counter[str]:
    """Profile ``args.n`` requests through a gateway run from ``tree``; calls by area."""
    work.mkdir(parents=True, exist_ok=True)
    config = work / "bare.yaml"
    upstream_base = f"http://127.0.0.1:{args.upstream_port}/v1"
    env = {**os.environ, "MODE": "bare", "UPSTREAM_BASE": upstream_base}
    script = REPO_ROOT / "bench" / "gateway" / "xrouter_config.sh"
    subprocess.run(["bash", str(script), str(config)], check=True, env=env)
    out = work / "profile.out"
    done = Path(str(out) + ".done")
    done.unlink(missing_ok=True)
    upstream = subprocess.Popen(
        [sys.executable, str(args.harness / "fake_upstream.py"), "--port", str(args.upstream_port)],
        stdout=(work / "upstream.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    serve = ["serve", "--config", str(config), "--port", str(args.port)]
    gateway = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP, *serve],
        env={**os.environ, "PYTHONPATH": str(tree), "XR_PROFILE_OUT": str(out)},
        # Not the caller's directory: ``-c`` puts the working directory first on sys.path,
        # and a checkout there would be imported instead of ``tree``.
        cwd=work,
        stdout=(work / "gateway.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        wait_for(upstream_base.removesuffix("/v1") + "/health", upstream, work / "upstream.log")
        wait_for(base + "/readyz", gateway, work / "gateway.log")
        asyncio.run(load(base, args.warmup, args.concurrency))
        gateway.send_signal(signal.SIGUSR1)
        time.sleep(0.2)  # the handler runs at the loop's next bytecode boundary
        failed = asyncio.run(load(base, args.n, args.concurrency))
        gateway.send_signal(signal.SIGUSR2)
        for _ in range(600):
            if done.exists():
                break
            time.sleep(0.1)
        else:
            raise SystemExit("the gateway did not write its profile")
    finally:
        for proc in (gateway, upstream):
            proc.terminate()
            proc.wait(timeout=30)
    if failed:
        raise SystemExit(f"{failed} of {args.n} requests were not 200: see {work}/gateway.log")
    return calls_by_area(out, tree)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=REPO_ROOT, help="source tree to measure")
    parser.add_argument("--against", type=Path, help="an older source tree to compare with")
    parser.add_argument("--n", type=int, default=2000, help="profiled requests")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--port", type=int, default=4160)
    parser.add_argument("--upstream-port", type=int, default=18060)
    parser.add_argument("--harness", type=Path, default=HARNESS, help="shared wrk harness dir")
    parser.add_argument("--top", type=int, default=25, help="rows of the difference table")
    args = parser.parse_args()
    if not (args.harness / "fake_upstream.py").exists():
        raise SystemExit(f"no fake_upstream.py in {args.harness} (give --harness)")
    with tempfile.TemporaryDirectory(prefix="xrouter-calls-") as tmp:
        new = profile_tree(args.tree.resolve(), args, Path(tmp) / "new")
        total = sum(new.values()) / args.n
        log.info("%s: %.0f Python function calls per request", args.tree, total)
        if args.against is None:
            for name, count in new.most_common(args.top):
                log.info("%8.1f  %s", count / args.n, name)
            return
        old = profile_tree(args.against.resolve(), args, Path(tmp) / "old")
        old_total = sum(old.values()) / args.n
        log.info(
            "%s: %.0f calls per request; difference %+.0f (%+.1f%%)",
            args.against,
            old_total,
            total - old_total,
            100 * (total - old_total) / old_total,
        )
        log.info("%8s  %8s  %8s  %s", "change", "old", "new", "module")
        for name in sorted(set(old) | set(new), key=lambda k: -abs(new[k] - old[k]))[: args.top]:
            log.info(
                "%+8.1f  %8.1f  %8.1f  %s",
                (new[name] - old[name]) / args.n,
                old[name] / args.n,
                new[name] / args.n,
                name,
            )


if __name__ == "__main__":
    main()
