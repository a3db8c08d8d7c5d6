"""The cascade baseline's ``nonempty`` check (``router.cascade_check: nonempty``), run by the
real loop against a replay upstream: the cheap model's answer is accepted unless it is empty
or was cut off (finish_reason "length"), and then the next model up is asked."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from pricing import load_default_catalog
from router.executors import ProviderExecutor
from router.loop import Orchestrator
from router.policies.baselines import CascadePolicy
from router.policy import RouteContext
from router.pool import ModelPool, PoolModelConfig
from router.providers.client import DownstreamClient
from tests.support.replay import replay_root, start_replay_upstream, stop_replay_upstream

CHEAP, MID, DEAR = "llama-3.2-3b-instruct", "gemma-2-9b-it", "llama-3.3-70b-instruct"
EMPTY = "Which ocean is the largest on Earth?"
LONG = "Name the capital of France."
LONG_ANSWER = "The capital of France is Paris, " + "a city on the Seine, " * 20 + "of course."

# The replay upstream has no fault that empties an answer, so its table records one: the
# cheap model answered EMPTY with nothing but whitespace. On LONG, the cheap model rambles
# (60 tokens) while the others are brief, so a small max_tokens cuts only the cheap answer.
TABLE = [
    {
        "id": "empty",
        "prompt": EMPTY,
        "outcomes": {
            CHEAP: {"score": 0.0, "prompt_tokens": 12, "completion_tokens": 1, "response": " \n"},
            MID: {"score": 1.0, "prompt_tokens": 12, "completion_tokens": 3, "response": "Pacific"},
            DEAR: {
                "score": 1.0,
                "prompt_tokens": 12,
                "completion_tokens": 3,
                "response": "Pacific",
            },
        },
    },
    {
        "id": "long",
        "prompt": LONG,
        "outcomes": {
            CHEAP: {
                "score": 1.0,
                "prompt_tokens": 10,
                "completion_tokens": 60,
                "response": LONG_ANSWER,
            },
            MID: {"score": 1.0, "prompt_tokens": 10, "completion_tokens": 2, "response": "Paris"},
            DEAR: {"score": 1.0, "prompt_tokens": 10, "completion_tokens": 2, "response": "Paris"},
        },
    },
]


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("cascade")
    table = tmp / "table.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in TABLE))
    proc, base = start_replay_upstream(tmp, "--table", str(table))
    yield base
    stop_replay_upstream(proc)


@pytest.fixture
async def run(replay: str) -> AsyncIterator[Any]:
    cfgs = [
        PoolModelConfig(name=m, model=f"openai/{m}", api_base=replay, timeout_s=5, max_retries=0)
        for m in (CHEAP, MID, DEAR)
    ]
    pool = ModelPool.from_configs(cfgs, load_default_catalog())
    client = DownstreamClient(pool)
    orch = Orchestrator(ProviderExecutor(client))
    policy = CascadePolicy(order=[CHEAP, MID, DEAR], check="nonempty")

    async def go(prompt: str, **params: Any) -> Any:
        ctx = RouteContext(
            request_id="r1",
            messages=[{"role": "user", "content": prompt}],
            pool=pool,
            cost_weight=0.5,
            request_params=params,
        )
        return await orch.run(policy, ctx)

    yield go
    await client.aclose()


def requests_seen(replay: str) -> dict[str, int]:
    return httpx.get(f"{replay_root(replay)}/_replay/stats", timeout=10).json()["requests"]


async def test_a_good_cheap_answer_is_accepted_without_escalating(run: Any, replay: str) -> None:
    before = requests_seen(replay)
    r = await run(LONG)
    assert r.final_model == CHEAP and r.message["content"] == LONG_ANSWER
    assert [o.model for o in r.outcomes] == [CHEAP] and r.decision.actions == [CHEAP]
    after = requests_seen(replay)
    assert after.get(MID, 0) == before.get(MID, 0)  # the dearer models were never asked


async def test_an_empty_cheap_answer_escalates_to_the_next_model(run: Any) -> None:
    # A blank answer "succeeded" as far as HTTP goes; the check must still reject it.
    r = await run(EMPTY)
    assert [o.model for o in r.outcomes] == [CHEAP, MID]
    assert r.outcomes[0].ok and not r.outcomes[0].text.strip()
    assert r.final_model == MID and r.message["content"] == "Pacific"
    assert r.decision.actions == [CHEAP, MID]


async def test_a_truncated_cheap_answer_escalates_to_the_next_model(run: Any) -> None:
    # max_tokens cuts the cheap model's 60-token answer (finish_reason "length"): a partial
    # answer is no answer, though it is not empty. The brief one fits and is accepted.
    r = await run(LONG, max_tokens=5)
    assert [o.model for o in r.outcomes] == [CHEAP, MID]
    cut = r.outcomes[0]
    assert cut.ok and cut.text.strip() and cut.text != LONG_ANSWER
    assert cut.response["choices"][0]["finish_reason"] == "length"
    assert r.final_model == MID and r.message["content"] == "Paris"
    assert r.finish_reason == "stop"
