"""Cache keys (what makes two requests the same question) and the stored answer's format."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.cache import CachedAnswer, cache_key

BASE: dict[str, Any] = {
    "model": "xrouter",
    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
    "temperature": 0,
    "xrouter": {"cost_weight": 0.5},
}


def key(data: dict[str, Any], **kw: Any) -> str:
    args: dict[str, Any] = {"scope": "key:k1", "policy": "compact", "checkpoint": "v1"}
    return cache_key(data, **{**args, **kw})


def test_transport_fields_and_cache_controls_do_not_change_the_question() -> None:
    same = [
        dict(reversed(list(BASE.items()))),  # another key order
        {**BASE, "stream": True, "stream_options": {"include_usage": True}},
        {**BASE, "usage": {"include": True}},  # OpenRouter's usage accounting: always on
        {**BASE, "store": True, "metadata": {"feature": "x"}},  # not forwarded
        {**BASE, "xrouter": {"cost_weight": 0.5, "cache": {"no_store": True, "ttl_s": 5}}},
        {**BASE, "xrouter": {"cost_weight": 0.5, "tags": ["feature-x"]}},  # filing, not asking
    ]
    assert {key(d) for d in same} == {key(BASE)}
    # An xrouter object holding only those is the plain request's question too.
    plain = {k: v for k, v in BASE.items() if k != "xrouter"}
    only_controls = [
        plain,
        {**plain, "xrouter": {"cache": {"max_age_s": 3600}}},
        {**plain, "xrouter": {"cache": {"no_cache": True}, "tags": ["t"]}},
        {**plain, "xrouter": {}},
    ]
    assert len({key(d) for d in only_controls}) == 1


def test_everything_that_can_change_the_answer_changes_the_key() -> None:
    variants = [
        {**BASE, "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
        {**BASE, "temperature": 0.7},
        {**BASE, "model": "xrouter/cheapest"},
        {**BASE, "xrouter": {"cost_weight": 2.0}},
        {**BASE, "xrouter": {"cost_weight": 0.5, "models": ["m"]}},
        {**BASE, "tools": [{"type": "function", "function": {"name": "f"}}]},
        {**BASE, "n": 2},
        {**BASE, "user": "someone-else"},
    ]
    keys = {key(BASE), *(key(d) for d in variants)}
    assert len(keys) == len(variants) + 1
    # Who asks, which policy routes and which checkpoint decides.
    assert key(BASE, scope="key:k2") != key(BASE)
    assert key(BASE, scope="*") != key(BASE)
    assert key(BASE, policy="cascade") != key(BASE)
    assert key(BASE, checkpoint="v2") != key(BASE)
    assert key(BASE, checkpoint=None) != key(BASE)
    # The trade-off a key's defaults gave a request that did not state one.
    lam = {"cost_weight": 0.5, "max_cost_micros": None}
    assert key(BASE, routing=lam) == key(BASE, routing=dict(lam))
    assert key(BASE, routing=lam) != key(BASE, routing={**lam, "cost_weight": 2.0})
    assert key(BASE, routing=lam) != key(BASE, routing={**lam, "max_cost_micros": 10})


def test_an_answer_survives_its_encoding_and_damage_is_a_miss() -> None:
    answer = CachedAnswer(
        request_id="abc",
        created_at=1_700_000_000.5,
        model="m",
        choices=[
            {"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": "four"}, "finish_reason": "length"},
        ],
        usage={"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
        cost_micros=42,
    )  # fmt: skip
    back = CachedAnswer.decode(answer.encode())
    assert back == answer
    assert back is not None and back.message == {"role": "assistant", "content": "4"}
    assert back.finish_reason == "stop"
    router = CachedAnswer("r", 1.0, None, [{"message": {"role": "assistant"}}], {}, 0)
    assert CachedAnswer.decode(router.encode()) == router
    stored = orjson.loads(answer.encode())
    damaged = [
        b"not json",
        b"[]",
        orjson.dumps({**stored, "v": 99}),  # another release's format
        orjson.dumps({**stored, "choices": []}),
        orjson.dumps({**stored, "choices": [{"message": "text"}]}),
        orjson.dumps({k: v for k, v in stored.items() if k != "cost_micros"}),
        orjson.dumps({**stored, "created_at": "yesterday"}),
    ]
    assert [CachedAnswer.decode(d) for d in damaged] == [None] * len(damaged)
