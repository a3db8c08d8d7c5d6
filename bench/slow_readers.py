"""Streams to clients that read slowly or not at all, and upstreams that send many tiny chunks.

    python bench/slow_readers.py [--port 8000] [--clients 100] [--api chat]

Starts an upstream of its own (an OpenAI-compatible server streaming a long answer as fast as
it can) and ``xrouter serve`` in front of it (one worker, SQLite ledger,
``server.request_timeout_s`` from ``--timeout``), then:

1. *stalled readers*: ``--clients`` raw sockets each send a streamed request and never read
   the answer. Prints the gateway's RSS (``/proc/PID/status`` VmRSS) before and while they
   are stalled, ``/healthz`` latency meanwhile, and, once ``--timeout`` has passed, how
   many of those requests have a ledger row and with which status; ``--rounds`` times,
   so that memory kept after a round shows as growth in the next.
2. *tiny chunks*: one client reads a stream of ``--tiny`` one-character deltas; prints the
   gateway's CPU time per chunk (``/proc/PID/stat``) and ``/healthz`` latency meanwhile.

Uses ports ``--port`` (gateway) and ``--port`` + 1 (upstream).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson
import yaml
from xrouter_serve import start_gateway

MODEL = "llama-3.2-3b-instruct"


# The upstream (run as this script with --upstream PORT).


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {"content": content} if content is not None else {}
    c = {"id": "u", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + orjson.dumps(c) + b"\n\n"


def run_upstream(port: int) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        # The prompt says what to stream: "<chunks> <piece chars>".
        chunks, size = (int(x) for x in body["messages"][-1]["content"].split()[:2])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        event = _chunk("x" * size)
        try:
            for _ in range(chunks):
                await resp.write(event)  # waits while the gateway does not read
        except ConnectionError:
            return resp  # the gateway closed the call (its client stalled, then was cut)
        usage = {"prompt_tokens": 10, "completion_tokens": chunks, "total_tokens": chunks + 10}
        tail = {"id": "u", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                "choices": [], "usage": usage}  # fmt: skip
        await resp.write(_chunk(None, "stop") + b"data: " + orjson.dumps(tail) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


# Measurements.


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_pid(parent: int) -> int:
    """The uvicorn process serving requests: the deepest descendant of ``parent``."""
    pid = parent
    while True:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not kids:
            return pid
        pid = int(kids[0])


def body_for(api: str, prompt: str, user: str) -> dict[str, object]:
    msgs = [{"role": "user", "content": prompt}]
    if api == "responses":
        return {"model": MODEL, "input": prompt, "user": user, "stream": True}
    if api == "messages":
        return {"model": MODEL, "max_tokens": 10**6, "messages": msgs, "stream": True,
                "metadata": {"user_id": user}}  # fmt: skip
    return {"model": MODEL, "messages": msgs, "user": user, "stream": True}


PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


def stalled_client(port: int, api: str, prompt: str, user: str) -> socket.socket:
    """A client that sends its request and never reads: a small receive buffer, no recv."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    payload = json.dumps(body_for(api, prompt, user)).encode()
    head = (f"POST {PATHS[api]} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n").encode()  # fmt: skip
    s.sendall(head + payload)
    return s


async def healthz_latency(port: int, seconds: float, out: list[float] | None = None) -> list[float]:
    out = [] if out is None else out
    async with httpx.AsyncClient() as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t = time.perf_counter()
            await client.get(f"http://127.0.0.1:{port}/healthz", timeout=30)
            out.append((time.perf_counter() - t) * 1000)
            await asyncio.sleep(0.05)
    return out


def ms(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"p50 {statistics.median(xs):.1f} ms, max {xs[-1]:.1f} ms ({len(xs)} probes)"


def rows(db: Path, prefix: str) -> dict[int, int]:
    with sqlite3.connect(db) as conn:
        found = conn.execute(
            "SELECT status, count(*) FROM requests WHERE end_user LIKE ? GROUP BY status",
            (prefix + "%",),
        ).fetchall()
    return {int(s): int(n) for s, n in found}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--api", choices=sorted(PATHS), default="chat")
    ap.add_argument("--chunks", type=int, default=20_000, help="chunks per stalled stream")
    ap.add_argument("--piece", type=int, default=50, help="characters per chunk")
    ap.add_argument("--timeout", type=float, default=20.0, help="server.request_timeout_s")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of stalled readers")
    ap.add_argument("--tiny", type=int, default=100_000, help="1-character chunks (0: skip)")
    ap.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.upstream:
        run_upstream(args.upstream)
        return 0

    up_port = args.port + 1
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)])
        cfg = {
            "server": {"request_timeout_s": args.timeout},
            "auth": {"enabled": False},
            "ledger": {"url": f"sqlite+aiosqlite:///{tmp / 'ledger.db'}",
                       "spill_dir": str(tmp / "spill"), "flush_interval_ms": 20},
            "router": {"watch_files": False, "default_policy": f"fixed:{MODEL}"},
            "pool": [{"name": MODEL, "model": f"openai/{MODEL}", "timeout_s": 10,
                      "api_base": f"http://127.0.0.1:{up_port}/v1", "max_retries": 0}],
        }  # fmt: skip
        (tmp / "gw.yaml").write_text(yaml.safe_dump(cfg))
        gw = start_gateway(tmp, args.port, args=["--config", str(tmp / "gw.yaml")])
        try:
            pid = worker_pid(gw.pid)
            # Warm up: one stream read whole.
            httpx.post(f"http://127.0.0.1:{args.port}{PATHS[args.api]}",
                       json=body_for(args.api, "200 50", "warm"), timeout=60)  # fmt: skip
            base = rss_kib(pid)
            size_kib = args.chunks * args.piece // 1024
            print(f"{args.api}: {args.clients} stalled readers, each answer {args.chunks:,} "
                  f"chunks of {args.piece} chars (~{size_kib:,} KiB of text), "
                  f"request_timeout_s {args.timeout:g}")  # fmt: skip
            print(f"  gateway RSS before: {base / 1024:.1f} MiB")
            for round_ in range(1, args.rounds + 1):
                t0 = time.monotonic()
                prefix = f"stall{round_}-"
                socks = [
                    stalled_client(
                        args.port, args.api, f"{args.chunks} {args.piece}", f"{prefix}{i}"
                    )
                    for i in range(args.clients)
                ]
                lat = asyncio.run(healthz_latency(args.port, 5))
                peak = rss_kib(pid)
                print(f"  round {round_}: RSS 5 s in: {peak / 1024:.1f} MiB "
                      f"(+{(peak - base) / args.clients:.0f} KiB per stalled stream); "
                      f"/healthz {ms(lat)}")  # fmt: skip
                # Every stream ends by the deadline; the rows follow as the worker catches up.
                booked: dict[int, int] = {}
                while time.monotonic() - t0 < args.timeout + 120:
                    booked = rows(tmp / "ledger.db", prefix)
                    if sum(booked.values()) >= args.clients:
                        break
                    time.sleep(0.5)
                print(f"  round {round_}: ledger rows by status {booked or '{}'} of "
                      f"{args.clients}, all in {time.monotonic() - t0:.0f} s "
                      f"(request_timeout_s {args.timeout:g}); RSS {rss_kib(pid) / 1024:.1f} MiB")  # fmt: skip
                for s in socks:
                    s.close()
            if args.tiny:
                before = cpu_s(pid)
                prompt = f"{args.tiny} 1"

                lat2: list[float] = []

                stop = threading.Event()

                def probe() -> None:
                    # Its own thread and client: the reader's loop is busy parsing chunks.
                    with httpx.Client() as client:
                        while not stop.wait(0.05):
                            t = time.perf_counter()
                            client.get(f"http://127.0.0.1:{args.port}/healthz", timeout=30)
                            lat2.append((time.perf_counter() - t) * 1000)

                async def run_tiny() -> float:
                    prober = threading.Thread(target=probe)
                    prober.start()
                    t = time.perf_counter()
                    async with httpx.AsyncClient(timeout=600) as client:
                        await client.post(f"http://127.0.0.1:{args.port}{PATHS[args.api]}",
                                          json=body_for(args.api, prompt, "tiny"))  # fmt: skip
                    took = time.perf_counter() - t
                    stop.set()
                    prober.join()
                    return took

                took = asyncio.run(run_tiny())
                used = cpu_s(pid) - before
                print(f"{args.api}: {args.tiny:,} one-character chunks relayed in {took:.1f} s; "
                      f"gateway CPU {used:.1f} s ({used / args.tiny * 1e6:.0f} µs a chunk); "
                      f"/healthz meanwhile {ms(lat2)}")  # fmt: skip
        finally:
            gw.terminate()
            gw.wait(30)
            upstream.terminate()
            upstream.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
