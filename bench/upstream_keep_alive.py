"""What the provider layer's idle-connection timeout does against an upstream that closes idle
connections after 5 s, as vLLM and SGLang (uvicorn) do (prints figures).

    .venv/bin/python bench/upstream_keep_alive.py [--lanes 64] [--seconds 120]
        [--gap 4.8,5.2] [--keep-alive 30,4]

Starts a minimal OpenAI-compatible upstream under uvicorn with its default 5 s keep-alive,
then for each pool ``keep_alive_s`` runs ``--lanes`` callers through the native provider
(``router.providers.native``), each holding its own connection pool, calling, pausing a time
drawn from ``--gap`` and calling again for ``--seconds``. Prints per setting the calls made
and the calls that failed with ``connection``: sent on a connection the upstream was closing
at that moment. The gateway retries those (``max_retries``), but counts each as an upstream
error and toward the model's circuit breaker.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pricing import ModelPrice  # noqa: E402
from router.pool import PoolModel  # noqa: E402
from router.providers.errors import ProviderError  # noqa: E402
from router.providers.native import NativeOpenAIProvider  # noqa: E402

_BODY = {"model": "m", "messages": [{"role": "user", "content": "keep-alive bench"}]}


def upstream_main(port: int) -> None:
    """The upstream process: one fixed chat completion, uvicorn's default keep-alive."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    answer = {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }

    async def chat(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse(answer)

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, timeout_keep_alive=5, log_level="warning")


def start_upstream() -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("upstream not ready")


def model(port: int, keep_alive_s: float) -> PoolModel:
    return PoolModel(
        name="m",
        provider="openai",
        upstream_model="m",
        api_base=f"http://127.0.0.1:{port}/v1",
        api_key=None,
        transport="native",
        price=ModelPrice.free(),
        max_output_tokens=16,
        timeout_s=10,
        max_concurrency=1,
        max_retries=0,
        fallbacks=(),
        description="",
        keep_alive_s=keep_alive_s,
    )


async def run(
    port: int, keep_alive_s: float, lanes: int, seconds: float, gap: tuple[float, float]
) -> tuple[int, int]:
    m = model(port, keep_alive_s)
    calls = failed = 0
    stop = time.monotonic() + seconds

    async def lane(seed: int) -> None:
        nonlocal calls, failed
        rng = random.Random(seed)
        provider = NativeOpenAIProvider()  # one pool per lane: its connection idles the gap
        try:
            await asyncio.sleep(rng.uniform(0, gap[1]))
            while time.monotonic() < stop:
                calls += 1
                try:
                    await provider.complete(m, _BODY)
                except ProviderError as exc:
                    if exc.kind != "connection":
                        raise
                    failed += 1
                await asyncio.sleep(rng.uniform(*gap))
        finally:
            await provider.aclose()

    await asyncio.gather(*(lane(i) for i in range(lanes)))
    return calls, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lanes", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--gap", default="4.8,5.2", help="pause between calls, MIN,MAX s")
    parser.add_argument("--keep-alive", default="30,4", help="seconds, comma-separated")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        upstream_main(args.serve)
        return 0
    lo, hi = (float(x) for x in args.gap.split(","))
    print(
        f"{args.lanes} callers, a call every {lo:g}-{hi:g} s for {args.seconds:g} s, against "
        "a uvicorn upstream (keep-alive 5 s):"
    )
    print(f"{'keep_alive_s':>12}{'calls':>8}{'failed (connection)':>21}")
    proc, port = start_upstream()
    try:
        for keep_alive in (float(x) for x in args.keep_alive.split(",")):
            calls, failed = asyncio.run(run(port, keep_alive, args.lanes, args.seconds, (lo, hi)))
            print(f"{keep_alive:>12g}{calls:>8}{failed:>21}")
    finally:
        proc.terminate()
        proc.wait(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
