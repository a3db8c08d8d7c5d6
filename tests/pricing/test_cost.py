from decimal import Decimal

import pytest

from pricing import (
    CatalogError,
    ModelPrice,
    PriceCatalog,
    TokenUsage,
    estimate_tokens,
    load_default_catalog,
    usd_to_micros,
)
from pricing.money import format_usd, round_micros
from pricing.usage import MAX_CALL_TOKENS


def test_cost_is_tokens_times_price_per_million() -> None:
    price = ModelPrice(input=Decimal("2.5"), output=Decimal("10"))
    # 1000 x 2.5 + 500 x 10 micro-USD
    assert price.cost_micros(TokenUsage(1000, 500)) == 7500


def test_cached_and_reasoning_tokens_use_their_own_prices() -> None:
    price = ModelPrice(
        input=Decimal("2"),
        output=Decimal("8"),
        cached_input=Decimal("0.5"),
        reasoning=Decimal("12"),
    )
    usage = TokenUsage(
        prompt_tokens=1000, completion_tokens=400, cached_tokens=600, reasoning_tokens=100
    )
    # uncached 400x2 + cached 600x0.5 + visible output 300x8 + reasoning 100x12
    assert price.cost_micros(usage) == 800 + 300 + 2400 + 1200


def test_missing_cached_price_falls_back_to_input_price() -> None:
    price = ModelPrice(input=Decimal("1"), output=Decimal("1"))
    assert price.cost_micros(TokenUsage(100, 0, cached_tokens=100)) == 100


def test_no_float_drift_over_many_calls() -> None:
    price = ModelPrice.model_validate({"input": 0.1, "output": 0.3})
    assert price.input == Decimal("0.1")
    total = sum(price.cost_micros(TokenUsage(10, 10)) for _ in range(100_000))
    assert total == 100_000 * 4  # 10x0.1 + 10x0.3 = 4 µUSD exactly, every time


def test_rounding_is_half_up_once_per_call() -> None:
    price = ModelPrice(input=Decimal("0.05"), output=Decimal("0"))
    assert price.cost_micros(TokenUsage(10, 0)) == 1  # 0.5 µUSD rounds up
    assert price.cost_micros(TokenUsage(9, 0)) == 0  # 0.45 rounds down
    assert round_micros(Decimal("2.5")) == 3


def test_worst_case_bounds_every_real_cost() -> None:
    price = ModelPrice(input=Decimal("0.15"), output=Decimal("0.6"), reasoning=Decimal("2"))
    worst = price.worst_case_micros(prompt_tokens=333, max_output_tokens=77)
    for out in range(78):
        for reasoning in (0, out):
            assert price.cost_micros(TokenUsage(333, out, 0, reasoning)) <= worst


def test_usd_conversion_and_format() -> None:
    assert usd_to_micros(0.1) == 100_000
    assert usd_to_micros("1.0000005") == 1_000_001
    assert format_usd(1_234_567) == "1.234567"
    assert format_usd(5) == "0.000005"


def test_usage_parses_openai_details() -> None:
    u = TokenUsage.from_openai(
        {
            "prompt_tokens": 10,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 4},
            "completion_tokens_details": {"reasoning_tokens": 2},
        }
    )
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens, u.reasoning_tokens) == (
        10,
        5,
        4,
        2,
    )
    assert u.to_openai()["total_tokens"] == 15


def test_usage_from_another_server_is_read_defensively() -> None:
    # Counts become money: no refunds through negative counts, no ledger overflow through
    # absurd ones, nothing unreadable, subsets never larger than their totals.
    u = TokenUsage.from_openai(
        {
            "prompt_tokens": -5,
            "completion_tokens": 10**30,
            "prompt_tokens_details": {"cached_tokens": 99},
            "completion_tokens_details": {"reasoning_tokens": "many"},
        }
    )
    assert u == TokenUsage(0, MAX_CALL_TOKENS, 0, 0)
    assert TokenUsage.from_openai({"prompt_tokens": "12", "completion_tokens": 3.9}) == TokenUsage(
        12, 3
    )
    assert TokenUsage.from_openai(
        {
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 50},
            "completion_tokens_details": {"reasoning_tokens": 9},
        }
    ) == TokenUsage(10, 4, 10, 4)
    junk: object  # deliberately not a usage dict
    for junk in (None, [], "x", {"prompt_tokens": float("nan"), "completion_tokens": True}):
        assert TokenUsage.from_openai(junk) == TokenUsage()  # type: ignore[arg-type]
    # 50 cached of 10 prompt tokens: the 10 are priced as cached, never a negative remainder.
    price = ModelPrice(input=Decimal("1"), output=Decimal("2"), cached_input=Decimal("0.5"))
    usage = TokenUsage.from_openai(
        {
            "prompt_tokens": 10,
            "completion_tokens": 0,
            "prompt_tokens_details": {"cached_tokens": 50},
        }
    )
    assert price.cost_micros(usage) == 5


def test_token_estimate_is_a_quarter_of_the_characters_rounded_up() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5)] == [0, 1, 1, 2]


def test_packaged_catalog_prices_demo_pool_and_litellm_models() -> None:
    cat = load_default_catalog()
    assert cat.require("llama-3.3-70b-instruct").input == Decimal("0.88")
    assert cat.require("gpt-4o-mini").output == Decimal("0.6")
    assert "litellm" in cat.require("gpt-4o").source


def test_unknown_model_is_an_error_not_zero() -> None:
    with pytest.raises(CatalogError, match="price: 0"):
        PriceCatalog({}).require("mystery-model")


def test_overrides_replace_prices() -> None:
    cat = load_default_catalog().with_overrides(
        {"gpt-4o": ModelPrice(input=Decimal(1), output=Decimal(2))}
    )
    assert cat.require("gpt-4o").input == Decimal(1)


def test_malformed_catalog_is_rejected() -> None:
    with pytest.raises(CatalogError):
        PriceCatalog.from_yaml("models:\n  x: {input: -1, output: 1}\n")
    with pytest.raises(CatalogError):
        PriceCatalog.from_yaml("version: 1\n")


def test_a_catalog_that_is_not_yaml_is_one_line_naming_where() -> None:
    # A Markdown table given as the catalog: PyYAML's message ran over four lines, quoting
    # the line with a caret under it, and `serve`'s "cannot start:" line with it.
    with pytest.raises(CatalogError) as exc:
        PriceCatalog.from_yaml("# Prices\n\n| model | input |\nfoo: bar: baz\n")
    message = str(exc.value)
    assert "\n" not in message, message
    assert message == (
        "a price catalog that is not YAML: expected a comment or a line break, but found 'm'"
        " at line 3, column 3"
    )
