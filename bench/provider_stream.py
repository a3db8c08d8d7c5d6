"""CPU cost of one streamed upstream call in the native provider: open the stream, read its
events, parse them, close it — the work on the gateway's side of every streamed answer.

Measures this process's CPU time (time.process_time) over N streams, one at a time, on
uvloop as the gateway runs, against the shared harness's fake upstream (4 content events,
a usage event and [DONE] per stream), which runs in its own process on CPU 1 while this
one is pinned to CPU 0. Alternate runs of two trees (PYTHONPATH) to compare changes: the
figure moves by ±10% from run to run on a shared machine.

    .venv/bin/python bench/provider_stream.py [--n 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pricing import ModelPrice, load_default_catalog
from router.pool import ModelPool, PoolModelConfig
from router.providers.base import StreamStats
from router.providers.native import NativeOpenAIProvider

HARNESS = Path(__file__).resolve().parents[2] / "shared" / "bench" / "gateway"
FAKE_PYTHON = "/tmp/venvs/fake/bin/python"  # the harness's setup.sh makes it
PORT = 18010


async def run(n: int) -> float:
    cfg = PoolModelConfig(
        name="fake-model",
        model="openai/fake-model",
        api_base=f"http://127.0.0.1:{PORT}/v1",
        timeout_s=5,
        max_retries=0,
        price=ModelPrice(input=Decimal(1), output=Decimal(1)),
    )
    model = ModelPool.from_configs([cfg], load_default_catalog())["fake-model"]
    provider = NativeOpenAIProvider()
    body: dict[str, Any] = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 16,
    }
    try:
        for _ in range(min(n, 500)):  # warm-up: connections, caches
            async for _chunk in provider.stream(model, dict(body), StreamStats()):
                pass
        t0 = time.process_time()
        for _ in range(n):
            async for _chunk in provider.stream(model, dict(body), StreamStats()):
                pass
        return (time.process_time() - t0) / n
    finally:
        await provider.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()
    script = HARNESS / "fake_upstream.py"
    if not script.exists() or not Path(FAKE_PYTHON).exists():
        print(f"needs {script} and {FAKE_PYTHON} (the harness's setup.sh)", file=sys.stderr)
        return 2
    fake = subprocess.Popen(
        ["taskset", "-c", "1", FAKE_PYTHON, str(script), "--port", str(PORT)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{PORT}/", timeout=0.5)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    print("the fake upstream did not start", file=sys.stderr)
                    return 1
                time.sleep(0.1)
        os.sched_setaffinity(0, {0})
        uvloop.install()
        per_stream = asyncio.run(run(args.n))
        print(f"{per_stream * 1e6:.1f} µs CPU per streamed call ({args.n} calls, one at a time)")
    finally:
        fake.terminate()
        fake.wait(5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
