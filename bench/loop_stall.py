"""How long one large request holds the gateway's event loop (prints figures).

    .venv/bin/python bench/loop_stall.py [--turns 1000,5000,20000] [--repeat 3]
        [--against DIR] [--port 18700]

Starts ``xrouter serve`` on its embedded demo (one worker) and, for each API (chat
completions, the Responses API, the Messages API) and each ``--turns``, sends one request
of that many one-line turns to a pool model while a second client asks ``GET /healthz``
back to back. Prints the request's size and time and the slowest ``/healthz`` answer while
it was in flight, best of ``--repeat``: with the request read on the loop, that is how long
every other request and stream on the worker waited; read in a worker thread
(``gateway.off_loop``), the loop keeps answering. ``--against DIR`` runs the same on another
checkout of xrouter (``PYTHONPATH=DIR``), e.g. a ``git worktree`` of an older commit, on
``--port`` + 1.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from xrouter_serve import REPO, start_gateway

MODEL = "qwen2.5-7b-instruct"
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def body(api: str, turns: int) -> dict[str, Any]:
    msgs = [
        {"role": "assistant" if i % 2 else "user", "content": f"turn {i}"} for i in range(turns)
    ]
    if api == "responses":
        return {"model": MODEL, "input": msgs}
    if api == "messages":
        return {"model": MODEL, "max_tokens": 64, "messages": msgs}
    return {"model": MODEL, "messages": msgs}


async def one(url: str, api: str, turns: int) -> tuple[int, float, float]:
    """(body bytes, request seconds, slowest /healthz seconds while it was in flight)."""
    payload = body(api, turns)
    raw = httpx.Request("POST", url, json=payload).read()
    async with (
        httpx.AsyncClient(base_url=url, timeout=120) as big,
        httpx.AsyncClient(base_url=url, timeout=120) as probe,
    ):
        await probe.get("/healthz")  # the probe's connection is open before the request
        done = asyncio.Event()
        slowest = 0.0

        async def ping() -> None:
            nonlocal slowest
            while not done.is_set():
                t = time.perf_counter()
                await probe.get("/healthz")
                slowest = max(slowest, time.perf_counter() - t)

        pinger = asyncio.create_task(ping())
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        r = await big.post(PATHS[api], content=raw, headers={"content-type": "application/json"})
        took = time.perf_counter() - t0
        done.set()
        await pinger
        if r.status_code != 200:
            raise SystemExit(f"{api} {turns}: {r.status_code} {r.text[:300]}")
    return len(raw), took, slowest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", default="1000,5000,20000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", type=Path, help="another checkout to measure the same way")
    ap.add_argument(
        "--port", type=int, default=18700, help="this tree's gateway's port (--against's: the next)"
    )
    args = ap.parse_args()
    turns = [int(t) for t in args.turns.split(",")]
    trees = [("this tree", REPO)] + ([("--against", args.against)] if args.against else [])
    print(
        f"{'tree':<10} {'api':<10} {'turns':>6} {'body':>9} {'request':>9} {'slowest /healthz':>17}"
    )
    for label, tree in trees:
        with tempfile.TemporaryDirectory() as tmp:
            port = args.port + (0 if tree == REPO else 1)
            proc = start_gateway(Path(tmp), port, tree=tree)
            try:
                for api in PATHS:
                    for n in turns:
                        runs = [
                            asyncio.run(one(f"http://127.0.0.1:{port}", api, n))
                            for _ in range(args.repeat)
                        ]
                        size, took, slowest = min(runs, key=lambda r: r[2])
                        print(
                            f"{label:<10} {api:<10} {n:>6} {size / 1024:>7.0f} K "
                            f"{took * 1000:>7.0f} ms {slowest * 1000:>14.1f} ms"
                        )
            finally:
                proc.terminate()
                proc.wait(30)


if __name__ == "__main__":
    main()
