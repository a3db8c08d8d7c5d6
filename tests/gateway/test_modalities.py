"""Requests with images or audio only reach models that declare they can read them, and
requests for spoken answers only models that declare they give them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import (
    ChatCompletionContentPartImageParam,
    ChatCompletionContentPartInputAudioParam,
    ChatCompletionContentPartParam,
    ChatCompletionMessageParam,
)

from router.modalities import accepts, produces, request_modalities, requested_outputs
from router.pool import PoolModelConfig
from tests.gateway.conftest import Upstream
from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.sdk import extra

VISION = "llama-3.3-70b-instruct"  # declares text and image
UNDECLARED = "mixtral-8x22b-instruct-v0.1"  # declares nothing: taken to read anything
SPEAKER = "qwen2.5-7b-instruct"  # declares text and audio output (the others: text)
IMAGE: ChatCompletionContentPartImageParam = {
    "type": "image_url",
    "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
}
AUDIO: ChatCompletionContentPartInputAudioParam = {
    "type": "input_audio",
    "input_audio": {"data": "UklGRg==", "format": "wav"},
}


def _with(
    part: ChatCompletionContentPartParam, text: str = "What is shown here?"
) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, part]}]


def test_request_modalities_and_accepts() -> None:
    assert request_modalities([{"role": "user", "content": "hi"}]) == {"text"}
    assert request_modalities(_with(IMAGE)) == {"text", "image"}
    assert request_modalities(_with(AUDIO) + _with(IMAGE)) == {"text", "image", "audio"}
    assert request_modalities([{"role": "user", "content": [{"type": "input_image"}]}]) == {
        "text",
        "image",
    }
    assert accepts(None, {"text", "audio"}) and accepts(("text", "image"), {"text", "image"})
    assert not accepts(("text",), {"text", "image"})
    assert requested_outputs(None) == requested_outputs([]) == {"text"}
    assert requested_outputs(["text", "audio"]) == {"text", "audio"}
    assert produces(None, {"text", "audio"}) and produces(("text", "audio"), {"text"})
    assert not produces(("text",), {"text", "audio"})


def test_declared_modalities_must_include_text_and_be_known() -> None:
    # As a config file gives them: a list, validated into a tuple of known kinds.
    base = {"name": "m", "model": "openai/m"}
    declared = PoolModelConfig.model_validate({**base, "input_modalities": ["text", "image"]})
    assert declared.input_modalities == ("text", "image")
    for bad in (["image"], ["text", "video"]):
        with pytest.raises(ValueError):
            PoolModelConfig.model_validate({**base, "input_modalities": bad})
    speaks = PoolModelConfig.model_validate({**base, "output_modalities": ["text", "audio"]})
    assert speaks.output_modalities == ("text", "audio")
    for bad in (["audio"], ["text", "image"]):
        with pytest.raises(ValueError):
            PoolModelConfig.model_validate({**base, "output_modalities": bad})


@pytest.fixture(scope="module")
def mixed(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("modalities")
    cfg = gateway_config(tmp, upstream.base_url)
    for entry in cfg["pool"]:
        if entry["name"] == VISION:
            entry["input_modalities"] = ["text", "image"]
        elif entry["name"] != UNDECLARED:
            entry["input_modalities"] = ["text"]
        if entry["name"] == SPEAKER:
            entry["output_modalities"] = ["text", "audio"]
        elif entry["name"] != UNDECLARED:
            entry["output_modalities"] = ["text"]
    gw = start_gateway(tmp, cfg)
    yield gw
    gw.stop()


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("model", ["xrouter", "xrouter/cheapest", "xrouter/cascade"])
def test_routed_image_requests_only_reach_models_that_read_images(
    mixed: Gateway, model: str
) -> None:
    r = _client(mixed).chat.completions.with_raw_response.create(
        model=model, messages=_with(IMAGE, "Describe the picture in one sentence."), max_tokens=64
    )
    body = r.parse()
    meta = r.http_response.json()["xrouter"]
    assert body.model in {VISION, UNDECLARED}
    assert meta["calls"] and {c["model"] for c in meta["calls"]} <= {VISION, UNDECLARED}


def test_audio_is_routed_only_to_the_model_that_declares_nothing(mixed: Gateway) -> None:
    r = _client(mixed).chat.completions.create(model="xrouter", messages=_with(AUDIO))
    assert r.model == UNDECLARED


def test_pass_through_to_a_model_that_cannot_read_the_input_is_400(mixed: Gateway) -> None:
    client = _client(mixed)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="llama-3.2-3b-instruct", messages=_with(IMAGE))
    err = exc.value.body
    assert isinstance(err, dict)
    assert err["code"] == "unsupported_input" and err["param"] == "messages"
    assert "image input" in err["message"] and "llama-3.2-3b-instruct" in err["message"]
    with pytest.raises(openai.BadRequestError, match="audio input"):
        client.chat.completions.create(model=VISION, messages=_with(AUDIO))
    # Text to a text-only model, and an image to the models that take it, go through.
    assert (
        client.chat.completions.create(
            model="llama-3.2-3b-instruct", messages=[{"role": "user", "content": "Hello?"}]
        )
        .choices[0]
        .message.content
    )
    assert client.chat.completions.create(model=VISION, messages=_with(IMAGE)).model == VISION


def test_no_capable_model_left_is_400_not_a_failed_call(mixed: Gateway) -> None:
    with pytest.raises(openai.BadRequestError, match="no model it may use does accept"):
        _client(mixed).chat.completions.create(
            model="xrouter",
            messages=_with(AUDIO),
            extra_body={"xrouter": {"models": [VISION, "gemma-2-9b-it"]}},
        )


def test_models_list_shows_declared_modalities(mixed: Gateway) -> None:
    listed = {m.id: m for m in _client(mixed).models.list()}
    declared = {k: extra(v)["xrouter"].get("input_modalities") for k, v in listed.items()}
    assert declared[VISION] == ["image", "text"]
    assert declared["gemma-2-9b-it"] == ["text"]
    assert declared[UNDECLARED] is None


SPOKEN: dict[str, Any] = {
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
}


@pytest.mark.parametrize("model", ["xrouter", "xrouter/cheapest", "xrouter/cascade"])
def test_a_request_for_a_spoken_answer_only_reaches_models_that_speak(
    mixed: Gateway, model: str
) -> None:
    r = _client(mixed).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], **SPOKEN
    )
    meta = r.http_response.json()["xrouter"]
    assert r.parse().model in {SPEAKER, UNDECLARED}
    assert meta["calls"] and {c["model"] for c in meta["calls"]} <= {SPEAKER, UNDECLARED}


def test_no_model_left_that_speaks_is_400_naming_modalities(mixed: Gateway) -> None:
    client = _client(mixed)
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="llama-3.2-3b-instruct", messages=[{"role": "user", "content": "Hi"}], **SPOKEN
        )
    err = exc.value.body
    assert isinstance(err, dict)
    assert (err["code"], err["param"]) == ("unsupported_output", "modalities")
    assert "audio output" in err["message"] and "llama-3.2-3b-instruct" in err["message"]
    with pytest.raises(openai.BadRequestError, match="no model it may use does give"):
        client.chat.completions.create(
            model="xrouter",
            messages=[{"role": "user", "content": "Hi"}],
            extra_body={"xrouter": {"models": [VISION, "gemma-2-9b-it"]}},
            **SPOKEN,
        )
    # Text only, said or not, goes anywhere; an output kind OpenAI does not define is a 400.
    assert (
        client.chat.completions.create(
            model="llama-3.2-3b-instruct",
            messages=[{"role": "user", "content": "Hello?"}],
            modalities=["text"],
        )
        .choices[0]
        .message.content
    )
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(
            model="xrouter",
            messages=[{"role": "user", "content": "Hi"}],
            extra_body={"modalities": ["text", "video"]},
        )
    assert isinstance(exc.value.body, dict) and exc.value.body["param"] == "modalities[1]"


def test_models_list_shows_declared_output_modalities(mixed: Gateway) -> None:
    listed = {m.id: m for m in _client(mixed).models.list()}
    declared = {k: extra(v)["xrouter"].get("output_modalities") for k, v in listed.items()}
    assert declared[SPEAKER] == ["audio", "text"]
    assert declared[VISION] == ["text"]
    assert declared[UNDECLARED] is None
