"""A request too long for a model's declared context window is not routed to it: routers
choose among the models it fits in, a pass-through to a model it does not fit in is a 400
``context_length_exceeded`` (OpenAI's code), and nothing reaches that model."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from pricing.catalog import load_default_catalog
from router.context_window import fits, likely_prompt_tokens, tokens_needed
from router.pool import ModelPool, PoolModelConfig
from tests.gateway.conftest import Upstream
from tests.support.gateway import Gateway, gateway_config, start_gateway

SMALL = "llama-3.2-3b-instruct"  # the cheapest model, with a small window here
WINDOW = 2000


def _prompt(tokens: int) -> list[dict[str, str]]:
    # Plain ASCII: 4 bytes a token, as the count reads it.
    return [{"role": "user", "content": "word " * (tokens * 4 // 5)}]


def test_the_count_and_the_window() -> None:
    short, long = _prompt(100), _prompt(3000)
    assert 90 <= likely_prompt_tokens(short) <= 120
    assert 2900 <= likely_prompt_tokens(long) <= 3100
    price = {"input": 1, "output": 1}
    pool = ModelPool.from_configs(
        [
            PoolModelConfig.model_validate(
                {
                    "name": "m",
                    "model": "openai/m",
                    "price": price,
                    "context_window": WINDOW,
                    "max_output_tokens": 500,
                }
            )
        ],
        load_default_catalog(),
    )
    m = pool["m"]
    # The output asked for counts, capped at what the model is asked for at most.
    assert tokens_needed(m, 1000, None) == 1001
    assert tokens_needed(m, 1000, 300) == 1300 and tokens_needed(m, 1000, 4000) == 1500
    assert fits(m, 1600, 400) and not fits(m, 1600, 401) and not fits(m, 2000, None)
    assert fits(m, 1500, 4000)  # capped at 500: 1,500 + 500 fit
    undeclared = ModelPool.from_configs(
        [PoolModelConfig.model_validate({"name": "u", "model": "openai/u", "price": price})],
        load_default_catalog(),
    )["u"]
    assert fits(undeclared, 10**9, 10**6)
    with pytest.raises(ValueError):
        PoolModelConfig.model_validate({"name": "m", "model": "openai/m", "context_window": 0})


@pytest.fixture(scope="module")
def windows(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("windows")
    cfg = gateway_config(tmp, upstream.base_url)
    for entry in cfg["pool"]:
        if entry["name"] == SMALL:
            entry["context_window"] = WINDOW
    gw = start_gateway(tmp, cfg)
    yield gw
    gw.stop()


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def test_routers_leave_out_the_models_a_request_does_not_fit_in(
    windows: Gateway, upstream: Upstream
) -> None:
    client = _client(windows)
    short = client.chat.completions.create(model="xrouter/cheapest", messages=_prompt(100))  # type: ignore[arg-type]
    assert short.model == SMALL
    long = client.chat.completions.create(model="xrouter/cheapest", messages=_prompt(3000))  # type: ignore[arg-type]
    assert long.model != SMALL
    # The output it asks for counts: 1,500 tokens fit with 100 more, not with 1,000.
    fits_in = client.chat.completions.create(
        model="xrouter/cheapest",
        messages=_prompt(1500),  # type: ignore[arg-type]
        max_tokens=100,
    )
    assert fits_in.model == SMALL
    too_much = client.chat.completions.create(
        model="xrouter/cheapest",
        messages=_prompt(1500),  # type: ignore[arg-type]
        max_completion_tokens=1000,
    )
    assert too_much.model != SMALL
    assert upstream.stats()["requests"][SMALL] == 2


@pytest.mark.parametrize(
    ("model", "extra"),
    [(SMALL, {}), ("xrouter", {"xrouter": {"models": [SMALL]}})],
)
def test_a_request_no_model_it_may_use_takes_is_a_400(
    windows: Gateway, upstream: Upstream, model: str, extra: dict[str, object]
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        _client(windows).chat.completions.create(
            model=model,
            messages=_prompt(3000),  # type: ignore[arg-type]
            extra_body=extra,
        )
    err = exc.value.body
    assert isinstance(err, dict)
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert str(WINDOW) in err["message"]
    assert upstream.stats()["requests"].get(SMALL, 0) == 0
    # Anthropic's clients are told the same before anything is counted or routed.
    r = httpx.post(
        f"{windows.url}/v1/messages/count_tokens",
        json={"model": model, "messages": _prompt(3000), **extra},
    )
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]


def test_the_model_list_shows_the_windows(windows: Gateway) -> None:
    models = {m["id"]: m["xrouter"] for m in httpx.get(f"{windows.base_url}/models").json()["data"]}
    assert models[SMALL]["context_window"] == WINDOW
    assert models["gemma-2-9b-it"]["context_window"] is None
