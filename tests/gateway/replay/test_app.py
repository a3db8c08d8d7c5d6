"""``create_app`` + ``start`` embedded in the test's own event loop (the in-process API)."""

from __future__ import annotations

import time

import openai
import pytest

from gateway.replay.app import SERVICE_KEY, create_app
from gateway.replay.server import start
from gateway.replay.table import ReplayTable
from router.outcomes import OutcomeRecord


async def test_embedded_app_with_latency_and_key() -> None:
    record = OutcomeRecord.model_validate(
        {"id": "x", "prompt": "ping", "outcomes": {"echo": {"score": 1, "response": "pong"}}}
    )
    app = create_app(ReplayTable([record]), latency_ms=80, api_key="k")
    runner, port = await start(app, "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        async with openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0) as client:
            started = time.monotonic()
            resp = await client.chat.completions.create(
                model="echo", messages=[{"role": "user", "content": "ping"}]
            )
            assert time.monotonic() - started >= 0.08
            assert resp.choices[0].message.content == "pong"
        async with openai.AsyncOpenAI(base_url=base, api_key="other", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                await bad.models.list()
        assert app[SERVICE_KEY].stats.snapshot()["requests"] == {"echo": 1}
    finally:
        await runner.cleanup()
