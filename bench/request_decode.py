"""What reading a request body costs the event loop: ``gateway.chat_request.decode_json`` (parse
plus the check that the body is not nested deeper than the gateway can write back) against
parsing alone (``orjson.loads``), for a one-line chat, a request with 50 tools' schemas and
a 5 MB request carrying a base64 image. Prints the best of five timings, µs per body.

Then what inflating a gzip-compressed body costs (``gateway.request_body.decode``), for those
bodies and for long prompts of recorded text: the figures behind the size above which the
gateway inflates in a worker thread instead of on the event loop.

Usage::

    .venv/bin/python bench/request_decode.py
"""

from __future__ import annotations

import base64
import gzip
import logging
import os
import sys
import timeit
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # run as a plain script from a checkout

import orjson  # noqa: E402

from gateway.chat_request import decode_json  # noqa: E402
from gateway.request_body import INLINE_DECODE_BYTES, inflate_body  # noqa: E402

log = logging.getLogger("bench.request_decode")


def bodies() -> list[tuple[str, bytes, int]]:
    """(name, body, timings per repeat)."""
    image = base64.b64encode(os.urandom(3_750_000)).decode()
    parts: list[dict[str, Any]] = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}},
    ]
    schema = {
        "type": "object",
        "properties": {f"p{j}": {"type": "string", "description": "x"} for j in range(10)},
    }
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": schema}} for i in range(50)
    ]
    user = {"role": "user", "content": "Hello"}
    return [
        ("one-line chat", orjson.dumps({"model": "m", "messages": [user]}), 30_000),
        ("50 tools", orjson.dumps({"model": "m", "messages": [user], "tools": tools}), 3_000),
        (
            "5 MB image",
            orjson.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]}),
            30,
        ),
    ]


def text_bodies() -> list[tuple[str, bytes, int]]:
    """Chat requests whose prompt is recorded text (the demo table's prompts and answers),
    of about 100 KB, 400 KB and 1.5 MB: text compresses about 4 to 8 times, as prompts do."""
    text = (REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl").read_text()
    out = []
    for size, n in ((100_000, 300), (400_000, 100), (1_500_000, 30)):
        body = {"model": "m", "messages": [{"role": "user", "content": text[:size]}]}
        out.append((f"{size // 1000} KB of text", orjson.dumps(body), n))
    return out


def best_us(fn: Callable[[bytes], object], body: bytes, n: int) -> float:
    """The best of five timings of ``fn(body)``, µs per call."""
    return min(timeit.repeat(partial(fn, body), number=n, repeat=5)) / n * 1e6


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name, body, n in bodies():
        parse = best_us(orjson.loads, body, n)
        decode = best_us(decode_json, body, n)
        log.info(
            "%-14s %9d bytes  parse %9.1f µs  decode_json %9.1f µs  (+%.1f µs)",
            name,
            len(body),
            parse,
            decode,
            decode - parse,
        )
    log.info("gzip bodies (inflated in a thread from %d bytes compressed):", INLINE_DECODE_BYTES)
    limit = 64 * 1024 * 1024
    for name, body, n in [*bodies(), *text_bodies()]:
        packed = gzip.compress(body)
        inflate = best_us(partial(inflate_body, coding="gzip", limit=limit), packed, n)
        log.info(
            "%-14s %9d bytes  from %9d gzip bytes  inflate %9.1f µs",
            name,
            len(body),
            len(packed),
            inflate,
        )


if __name__ == "__main__":
    main()
