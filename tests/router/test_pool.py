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
