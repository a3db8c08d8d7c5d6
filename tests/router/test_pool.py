"""Pool entries as configured, resolved against the price catalog: deployments."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pricing import load_default_catalog
from router.pool import DeploymentConfig, ModelPool, PoolModelConfig

MODEL = "llama-3.3-70b-instruct"


def resolve(**entry: object) -> ModelPool:
    return ModelPool.from_configs(
        [PoolModelConfig.model_validate({"name": MODEL, "model": f"openai/{MODEL}", **entry})],
        load_default_catalog(),
    )


def test_a_model_without_deployments_is_its_own_target() -> None:
    m = resolve(api_base="http://a:8000/v1")[MODEL]
    assert m.targets == (m,) and m.deployment is None and m.deployments == ()


def test_deployments_inherit_what_they_do_not_set() -> None:
    m = resolve(
        api_key="sk-entry",
        max_concurrency=32,
        deployments=[
            {"api_base": "http://vllm-a:8000/v1/"},
            {"api_base": "https://eu.example.com/v1", "api_key": "sk-eu", "model": "llama-70b",
             "max_concurrency": 4, "name": "eu"},
        ],
    )[MODEL]  # fmt: skip
    a, eu = m.targets
    assert (a.deployment, a.api_base, a.api_key, a.upstream_model, a.max_concurrency) == (
        "vllm-a:8000", "http://vllm-a:8000/v1", "sk-entry", MODEL, 32,
    )  # fmt: skip
    assert (eu.deployment, eu.api_base, eu.api_key, eu.upstream_model, eu.max_concurrency) == (
        "eu", "https://eu.example.com/v1", "sk-eu", "llama-70b", 4,
    )  # fmt: skip
    # One model to the router: one name and price, whichever deployment serves it.
    assert {t.name for t in m.targets} == {MODEL} and a.price == eu.price == m.price
    assert m.transport == a.transport == "native"


@pytest.mark.parametrize(
    ("api_base", "label"),
    [
        ("http://10.0.0.8:8000/v1", "10.0.0.8:8000"),
        ("https://api.example.com/v1?token=abc", "api.example.com"),
        # Credentials in the URL never reach a label: labels go to metrics and responses.
        ("http://user:hunter2@10.0.0.9:8000/v1", "10.0.0.9:8000"),
        ("https://key@api.example.com/v1", "api.example.com"),
    ],
)
def test_a_deployments_default_label_is_its_host_and_port(api_base: str, label: str) -> None:
    assert DeploymentConfig(api_base=api_base).label == label
    assert DeploymentConfig(api_base=api_base, name="eu-1").label == "eu-1"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"api_base": "http://a/v1", "deployments": [{"api_base": "http://b/v1"}]},
            "api_base per deployment",
        ),
        (
            {"deployments": [{"api_base": "http://a/v1"}, {"api_base": "http://a/v2"}]},
            "names must differ",
        ),
        ({"deployments": []}, "at least 1"),
        ({"deployments": [{"api_base": "http://a/v1", "weight": 2}]}, "weight"),
    ],
)
def test_bad_deployments_are_refused_by_name(entry: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        PoolModelConfig.model_validate({"name": MODEL, "model": f"openai/{MODEL}", **entry})


@pytest.mark.parametrize(
    ("entry", "where"),
    [
        ({"api_base": "http://bot:hunter2@a:8000/v1", "api_key": "sk-entry"}, ""),
        # A deployment's own key, or the one it inherits from its entry.
        ({"deployments": [{"api_base": "http://bot:hunter2@a/v1", "api_key": "sk-a"}]},
         " (deployment 'a')"),
        ({"api_key": "sk-entry", "deployments": [
            {"api_base": "http://b/v1"}, {"api_base": "https://bot:hunter2@eu/v1", "name": "eu"},
        ]}, " (deployment 'eu')"),
    ],
)  # fmt: skip
def test_credentials_in_an_api_base_and_an_api_key_are_refused_by_name(
    entry: dict[str, object], where: str
) -> None:
    # Two Authorization headers (Basic from the URL, Bearer from the key), which the HTTP
    # clients refuse on every call: each request was a 500 with no call booked.
    with pytest.raises(ValidationError) as exc:
        PoolModelConfig.model_validate({"name": MODEL, "model": f"openai/{MODEL}", **entry})
    [err] = exc.value.errors()
    assert f"pool model {MODEL!r}{where}: its api_base carries credentials" in err["msg"]
    assert "hunter2" not in err["msg"] and "sk-" not in err["msg"]


@pytest.mark.parametrize(
    "entry",
    [
        {"api_base": "http://bot:hunter2@a:8000/v1"},  # sent as HTTP Basic auth
        {"api_base": "http://bot:hunter2@a:8000/v1", "api_key": ""},  # an unset ${VAR}
        {"api_base": "http://a:8000/v1", "api_key": "sk-entry"},
        {"api_key": "sk-entry", "deployments": [{"api_base": "http://a/v1"}]},
    ],
)
def test_one_credential_per_upstream_is_accepted(entry: dict[str, object]) -> None:
    m = resolve(**entry)[MODEL]
    assert m.transport == "native"


@pytest.mark.parametrize("price", [-1, 2, 0.5, "cheap"])
def test_a_price_given_as_a_number_other_than_0_says_what_a_price_is(price: object) -> None:
    # `price: 0` is the one shorthand (free); `price: -1` said only "Input should be a
    # valid dictionary or instance of ModelPrice".
    with pytest.raises(ValidationError, match=r"price is \{input: USD, output: USD\}"):
        resolve(price=price)
    assert resolve(price=0).get(MODEL).price.input == 0  # type: ignore[union-attr]
