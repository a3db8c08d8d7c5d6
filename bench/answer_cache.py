"""What the answer cache costs a request: deriving the key, looking it up and storing the
answer (``gateway.cache``), on the in-process backend and on the real Redis at
127.0.0.1:6379 (skipped when it is not there).

A miss pays the key and the lookup, plus a store that runs after the response; a hit pays
the key, the lookup and decoding the answer, instead of routing and an upstream call. Runs
on one thread with a demo prompt's real recorded answer, for a short request (one user
turn) and a long one (a 40-turn conversation, ~30 KB). Prints µs per operation, p50 / p99.

Usage::

    .venv/bin/python bench/answer_cache.py [--n 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import statistics
import sys
import time
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

from gateway.cache import AnswerCache, CachedAnswer, MemoryBackend, RedisBackend  # noqa: E402
from gateway.schemas import ChatCompletionRequest  # noqa: E402
from gateway.settings import CacheSettings  # noqa: E402
from router.outcomes import load_outcome_table  # noqa: E402

log = logging.getLogger("answer_cache")
DEMO = REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl"
MODEL = "mistral-small-24b-instruct-2501-bf16"
# Where the Redis rows run (``--redis-url``): keys under a random prefix, deleted after.
REDIS_URL = "redis://127.0.0.1:6379/0"


def requests_and_answer() -> tuple[dict[str, dict[str, Any]], CachedAnswer]:
    table = load_outcome_table(DEMO)
    rec = next(r for r in table if MODEL in r.outcomes and r.outcomes[MODEL].response)
    text = rec.outcomes[MODEL].response or ""
    short = {"model": "xrouter", "messages": [{"role": "user", "content": rec.text}]}
    turns: list[dict[str, Any]] = []
    for r in table[:20]:
        turns.append({"role": "user", "content": r.text})
        turns.append({"role": "assistant", "content": next(iter(r.outcomes.values())).response})
    long = {"model": "xrouter", "messages": [*turns, {"role": "user", "content": rec.text}]}
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
    }
    usage = {"prompt_tokens": 444, "completion_tokens": 134, "total_tokens": 578}
    return {"short": short, "long": long}, CachedAnswer(
        "0" * 32, time.time(), MODEL, [choice], usage, 85
    )


def report(name: str, samples: list[float]) -> None:
    us = sorted(s * 1e6 for s in samples)
    p99 = us[min(len(us) - 1, int(len(us) * 0.99))]
    log.info("%-44s p50 %8.1f µs   p99 %8.1f µs", name, statistics.median(us), p99)


async def timed(n: int, op: Callable[[], Awaitable[Any]]) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        await op()
        out.append(time.perf_counter() - t0)
    return out


def redis_up(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 0.5):
            return True
    except OSError:
        return False


async def run(n: int, redis_url: str = REDIS_URL) -> None:
    bodies, answer = requests_and_answer()
    encoded = answer.encode()
    log.info("answer: %d bytes stored; requests: %s", len(encoded),
             ", ".join(f"{k} {len(str(v))} chars" for k, v in bodies.items()))  # fmt: skip
    backends: list[tuple[str, Any]] = [("memory", MemoryBackend(10_000, 64 << 20))]
    prefix = f"xrbench-{uuid.uuid4().hex[:8]}"
    if redis_up(redis_url):
        backends.append(("redis", RedisBackend(redis_url, prefix=prefix, timeout_s=0.1)))
    else:
        log.info("Redis is not running at %s: its rows are skipped", redis_url)
    for name, body in bodies.items():
        req = ChatCompletionRequest.model_validate(body)
        controls = req.xrouter.cache if req.xrouter else None
        for bname, backend in backends:
            cache = AnswerCache(CacheSettings(enabled=True), backend)

            def ticket(
                cache: AnswerCache = cache, body: dict[str, Any] = body, controls: Any = controls
            ) -> Any:
                return cache.ticket(
                    body, key_id="key_1", policy="compact", checkpoint="v1", controls=controls
                )

            async def key_only() -> Any:
                return ticket()

            if bname == "memory":
                report(f"{name}: key (canonical JSON + SHA-256)", await timed(n, key_only))
            t = ticket()
            cache.store(t, answer)
            await asyncio.sleep(0.05)

            async def hit(cache: AnswerCache = cache) -> Any:
                found = await cache.lookup(ticket())
                assert found is not None
                return found

            async def miss(cache: AnswerCache = cache) -> Any:
                t = ticket()
                t.key = "absent"
                # Not leading: a leader's identical followers wait for its answer (30 s,
                # coalesce_wait_s) and this one never stores any.
                return await cache.lookup(t, may_lead=False)

            report(f"{name}: {bname} hit (key + get + decode)", await timed(n, hit))
            report(f"{name}: {bname} miss (key + get)", await timed(n, miss))

            async def store(cache: AnswerCache = cache) -> None:
                cache.store(ticket(), answer)  # schedules the write
                await asyncio.sleep(0)  # and lets it run

            report(f"{name}: {bname} store (encode + put)", await timed(n, store))
    for bname, backend in backends:
        if bname == "redis":
            # Concurrent lookups share the connection's pipeline: the latency one request
            # sees when 16 look up at once.
            cache = AnswerCache(CacheSettings(enabled=True), backend)
            body = bodies["short"]

            async def one(cache: AnswerCache = cache, body: dict[str, Any] = body) -> float:
                t0 = time.perf_counter()
                await cache.lookup(
                    cache.ticket(body, key_id="k", policy="p", checkpoint=None, controls=None),
                    may_lead=False,  # 16 lookups, not one leader and 15 waiting for it
                )
                return time.perf_counter() - t0

            samples: list[float] = []
            for _ in range(max(n // 16, 1)):
                samples += await asyncio.gather(*(one() for _ in range(16)))
            report("short: redis lookup, 16 at once", samples)
            client = backend._client
            keys = await client.execute("KEYS", f"{prefix}:*")
            if keys:
                await client.execute("DEL", *keys)
        await backend.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument(
        "--redis-url",
        default=REDIS_URL,
        help=f"the Redis its rows use, keys under a random prefix deleted after ({REDIS_URL})",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    asyncio.run(run(args.n, args.redis_url))


if __name__ == "__main__":
    main()
