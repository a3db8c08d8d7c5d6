"""Deterministic synthesis, fault syntax and stream encoding (the pure parts of the server)."""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest

from gateway.replay.faults import Fault, FaultQueue, FaultSyntaxError, split_marker
from gateway.replay.render import (
    CONTENT,
    ENDING,
    USAGE,
    ChunkEncoder,
    IdFactory,
    split_pieces,
    stream_events,
)
from gateway.replay.schema import ChatRequest
from gateway.replay.synth import ReplayRequestError, fallback_text, schema_instance, synthesize
from gateway.replay.table import ReplayTable

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "location": {"type": "string", "minLength": 3},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "ratio": {"type": "number", "exclusiveMinimum": 0},
            "verbose": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "when": {"type": "string", "format": "date-time"},
            "optional": {"type": "string"},
        },
        "required": ["location", "unit", "days", "ratio", "verbose", "tags", "when"],
        "additionalProperties": False,
    },
    {  # pydantic / OpenAI strict style: $defs, $ref, nullable unions, const
        "$defs": {
            "Step": {
                "type": "object",
                "properties": {"explanation": {"type": "string"}, "n": {"type": "integer"}},
                "required": ["explanation", "n"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}},
            "final": {"anyOf": [{"type": "null"}, {"type": "string"}]},
            "kind": {"const": "math"},
            "score": {"type": ["null", "number"], "maximum": -2},
        },
        "required": ["steps", "final", "kind", "score"],
        "additionalProperties": False,
    },
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_schema_instances_validate(schema: dict[str, Any]) -> None:
    instance = schema_instance(schema, "the answer")
    jsonschema.validate(instance, schema)
    assert schema_instance(schema, "the answer") == instance  # deterministic
    assert "the answer" in orjson.dumps(instance).decode()  # the text lands in a string field


def test_schema_instance_fills_only_required() -> None:
    inst = schema_instance(SCHEMAS[0], "Paris")
    assert "optional" not in inst
    assert inst["location"] == "Paris" and inst["unit"] == "celsius" and inst["days"] == 1


def test_fallback_is_a_function_of_model_and_prompt() -> None:
    a = fallback_text("m1", "hello world")
    assert a == fallback_text("m1", "  hello\nworld ")
    assert a != fallback_text("m2", "hello world")
    assert a != fallback_text("m1", "hello there")


def test_tool_choice_naming_unknown_function_is_rejected() -> None:
    table = ReplayTable([])
    req = ChatRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "a", "parameters": {}}}],
            "tool_choice": {"type": "function", "function": {"name": "b"}},
        }
    )
    with pytest.raises(ReplayRequestError, match="'b'"):
        synthesize(table, req, "hi")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("drop", Fault("drop")),
        (" status=503 ", Fault("status", 503)),
        ("timeout", Fault("timeout", 300.0)),
        ("timeout=2.5", Fault("timeout", 2.5)),
        ("cut-stream=0", Fault("cut-stream", 0)),
        ("latency=40", Fault("latency", 40.0)),
        ("no-usage", Fault("no-usage")),
    ],
)
def test_fault_syntax(text: str, expected: Fault) -> None:
    assert Fault.parse(text) == expected
    assert Fault.parse(str(expected)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "status",
        "status=200",
        "status=x",
        "cut-stream=-1",
        "drop=1",
        "boom",
        "timeout=nan",
        "latency=inf",
        "no-usage=1",
    ],
)
def test_bad_fault_syntax(text: str) -> None:
    with pytest.raises(FaultSyntaxError):
        Fault.parse(text)


def test_marker_is_found_and_stripped() -> None:
    assert split_marker("plain prompt") == ("plain prompt", None)
    assert split_marker("[[replay:status=429]] What is 2+2?") == (" What is 2+2?", "status=429")


def test_fault_queue_prefers_the_model_then_wildcard() -> None:
    q = FaultQueue()
    q.push("*", Fault("drop"))
    q.push("a", Fault("status", 500), count=2)
    assert q.snapshot() == {"*": ["drop"], "a": ["status=500", "status=500"]}
    assert q.pop("b") == Fault("drop")
    assert q.pop("b") is None
    assert [q.pop("a"), q.pop("a"), q.pop("a")] == [Fault("status", 500)] * 2 + [None]
    q.push("a", Fault("drop"), count=3)
    assert q.clear() == 3 and q.pop("a") is None


@pytest.mark.parametrize(
    "text", ["", "one", "  leading and trailing  ", "a b c d e f g h i j", "x\n\ny  z\t", "   "]
)
def test_split_pieces_round_trips(text: str) -> None:
    pieces = split_pieces(text)
    assert "".join(pieces) == text
    assert all(len(p.split()) <= 4 for p in pieces)


def test_stream_events_order() -> None:
    table = ReplayTable([])
    req = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "q"}]})
    completion = synthesize(table, req, "q")
    events = list(stream_events(completion, 1, IdFactory().meta("m"), include_usage=True))
    kinds = [k for _, k in events]
    assert kinds[-3:] == [ENDING, USAGE, ENDING] and events[-1][0] == b"data: [DONE]\n\n"
    chunks = [orjson.loads(e[len(b"data: ") :]) for e, _ in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(
        c["choices"][0]["delta"]["content"]
        for c, k in zip(chunks, kinds, strict=False)
        if k == CONTENT
    )
    assert text == completion.content
    assert (
        chunks[-1]["choices"] == []
        and chunks[-1]["usage"]["completion_tokens"] == completion.completion_tokens
    )


def test_fast_content_encoding_matches_the_generic_one() -> None:
    enc = ChunkEncoder(IdFactory().meta("m"), include_usage=True)
    for index, piece in [(0, "plain words "), (3, 'quotes " and \\ and \n and é ✓')]:
        assert enc.content(index, piece) == enc.delta(index, {"content": piece})
