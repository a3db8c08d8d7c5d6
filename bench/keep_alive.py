"""What the gateway's idle-connection timeout does to clients that reuse connections after a
pause (prints figures).

    .venv/bin/python bench/keep_alive.py [--clients 64] [--seconds 120] [--gap 4.5,5.5]
        [--keep-alive 5,75] [--port 18400]

For each ``server.keep_alive_s`` (5 s is uvicorn's own default, 75 s the gateway's), starts
``xrouter serve`` on its embedded demo with that setting (on ``--port``, the next setting's
on the next port) and runs ``--clients`` polling clients for ``--seconds``: each holds one
pooled connection (kept idle up to 120 s, as a load balancer keeps its backend connections)
and sends a routed request (``model: xrouter``), waits a pause drawn uniformly from
``--gap`` seconds, and sends the next. Prints per setting the requests sent, the connections
the clients had to open (beyond the first, each one a connection the gateway had closed
while idle) and the requests that failed with a transport error: sent on a connection the
gateway was closing at that moment. The OpenAI SDK retries those; a balancer answers 502, a
client without retries fails.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from xrouter_serve import start_gateway


@dataclass
class Counts:
    requests: int = 0
    failed: int = 0
    ports: set[int] = field(default_factory=set)  # one local port per connection opened


async def poll(port: int, clients: int, seconds: float, gap: tuple[float, float]) -> Counts:
    counts = Counts()
    body = {"model": "xrouter", "messages": [{"role": "user", "content": "keep-alive bench"}]}
    stop = time.monotonic() + seconds

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        limits = httpx.Limits(max_connections=1, keepalive_expiry=120)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}/v1", timeout=60, limits=limits
        ) as c:
            await asyncio.sleep(rng.uniform(0, gap[1]))  # spread the clients out
            while time.monotonic() < stop:
                counts.requests += 1
                try:
                    r = await c.post("/chat/completions", json=body)
                except httpx.TransportError:
                    counts.failed += 1
                else:
                    r.raise_for_status()
                    stream = r.extensions.get("network_stream")
                    if stream is not None:
                        counts.ports.add(stream.get_extra_info("client_addr")[1])
                await asyncio.sleep(rng.uniform(*gap))

    await asyncio.gather(*(client(i) for i in range(clients)))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--gap", default="4.5,5.5", help="pause between requests, MIN,MAX s")
    parser.add_argument("--keep-alive", default="5,75", help="seconds, comma-separated")
    parser.add_argument(
        "--port", type=int, default=18400, help="the first setting's gateway's port (the next: +1)"
    )
    args = parser.parse_args()
    lo, hi = (float(x) for x in args.gap.split(","))
    settings = [int(x) for x in args.keep_alive.split(",")]
    print(
        f"{args.clients} clients, one connection each, a request every {lo:g}-{hi:g} s for "
        f"{args.seconds:g} s (model xrouter):"
    )
    print(f"{'keep_alive_s':>12}{'requests':>10}{'connections reopened':>22}{'failed':>8}")
    with tempfile.TemporaryDirectory(prefix="xrouter-keepalive-") as d:
        for n, keep_alive in enumerate(settings):
            tmp = Path(d) / str(keep_alive)
            tmp.mkdir()
            port = args.port + n
            env = {"XROUTER_SERVER__KEEP_ALIVE_S": str(keep_alive)}
            proc = start_gateway(tmp, port, env=env)
            try:
                c = asyncio.run(poll(port, args.clients, args.seconds, (lo, hi)))
                reopened = len(c.ports) - args.clients
                print(f"{keep_alive:>12}{c.requests:>10}{reopened:>22}{c.failed:>8}")
            finally:
                proc.terminate()
                proc.wait(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
