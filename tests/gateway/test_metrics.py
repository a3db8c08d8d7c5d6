from __future__ import annotations

import random
import string
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gateway.metrics import LLM_BUCKETS, WRITE_ERROR_KINDS, GatewayMetrics

MODELS = ["gpt-5-mini", "claude-haiku", "qwen3-8b"]
POLICIES = ["compact", "llm", "cheapest"]
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> GatewayMetrics:
    return GatewayMetrics(
        registry, models=MODELS, policies=POLICIES, budget_gauge_keys=2, version="1.2.3"
    )


def label_values(registry: CollectorRegistry, sample_name: str, label: str) -> set[str]:
    return {
        s.labels[label]
        for family in registry.collect()
        for s in family.samples
        if s.name == sample_name and label in s.labels
    }


def test_unknown_models_and_policies_collapse_to_other(
    registry: CollectorRegistry, metrics: GatewayMetrics
) -> None:
    rng = random.Random(3)
    names = ["".join(rng.choices(string.ascii_lowercase, k=10)) for _ in range(100)]
    for name in [*names, *MODELS]:
        metrics.observe_request(name, name, 200, 1.0, 0.001, 10)
        metrics.observe_call(name, 10, 5, 0, 0, 10, 0.5)
        metrics.decision(name, name)
        metrics.upstream_error(name, "timeout")
        metrics.fallback(name)

    for sample, label in [
        ("xrouter_requests_total", "model"),
        ("xrouter_tokens_total", "model"),
        ("xrouter_cost_usd_total", "model"),
        ("xrouter_upstream_duration_seconds_count", "model"),
        ("xrouter_routing_decisions_total", "model"),
        ("xrouter_upstream_errors_total", "model"),
        ("xrouter_fallbacks_total", "model"),
    ]:
        assert label_values(registry, sample, label) == {*MODELS, "other"}, sample
    assert label_values(registry, "xrouter_requests_total", "policy") == {"other"}
    assert label_values(registry, "xrouter_routing_decisions_total", "policy") == {"other"}
    other = {"policy": "other", "model": "other", "status_class": "2xx", "api": "chat"}
    assert registry.get_sample_value("xrouter_requests_total", other) == 100


def test_no_model_and_no_policy_are_none_not_other(
    registry: CollectorRegistry, metrics: GatewayMetrics
) -> None:
    # What accounting passes for a request no model answered and one that failed before a
    # policy was resolved (the ledger's words): the documented label "none".
    metrics.observe_request("unresolved", "none", 404, 0.01, 0.001, 0)
    metrics.observe_request("compact", "none", 503, 0.01, 0.001, 0)
    metrics.decision("unresolved", None)
    get = registry.get_sample_value
    assert (
        get(
            "xrouter_requests_total",
            {"policy": "none", "model": "none", "status_class": "4xx", "api": "chat"},
        )
        == 1
    )
    assert (
        get(
            "xrouter_requests_total",
            {"policy": "compact", "model": "none", "status_class": "5xx", "api": "chat"},
        )
        == 1
    )
    assert label_values(registry, "xrouter_requests_total", "model") == {"none"}
    assert get("xrouter_routing_decisions_total", {"policy": "none", "model": "none"}) == 1


def test_names_a_reload_brings_are_known_within_a_bounded_room(
    registry: CollectorRegistry, metrics: GatewayMetrics
) -> None:
    metrics.observe_request("cascade", "new-model", 200, 0.1, 0.001, 1)
    metrics.add_known(models=[*MODELS, "new-model"], policies=[*POLICIES, "cascade"])
    metrics.observe_request("cascade", "new-model", 200, 0.1, 0.001, 1)
    req = {"status_class": "2xx", "api": "chat"}
    get = registry.get_sample_value
    assert get("xrouter_requests_total", {"policy": "other", "model": "other", **req}) == 1
    assert get("xrouter_requests_total", {"policy": "cascade", "model": "new-model", **req}) == 1
    # A config renamed at every reload: names past the room stay "other".
    for i in range(200):
        metrics.add_known(models=[f"renamed-{i}"], policies=[])
        metrics.observe_call(f"renamed-{i}", 1, 1, 0, 0, 1, 0.1)
    models = label_values(registry, "xrouter_tokens_total", "model")
    assert "renamed-0" in models and "other" in models and "renamed-199" not in models
    assert len(models) == 64  # the room, less "new-model", plus "other"


def test_a_call_no_model_answered_has_no_duration(
    registry: CollectorRegistry, metrics: GatewayMetrics
) -> None:
    metrics.observe_call("qwen3-8b", 0, 0, 0, 0, 0, None, policy="compact")
    metrics.observe_call("qwen3-8b", 10, 5, 0, 0, 7, 0.4, policy="compact")
    assert (
        registry.get_sample_value("xrouter_upstream_duration_seconds_count", {"model": "qwen3-8b"})
        == 1
    )


def test_free_form_labels_are_bounded(registry: CollectorRegistry, metrics: GatewayMetrics) -> None:
    for i in range(40):
        metrics.write_error(f"kind-{i}")
        metrics.upstream_error("qwen3-8b", f"weird-{i}")
    kinds = label_values(registry, "xrouter_ledger_write_errors_total", "kind")
    # The writer's own kinds (exported at 0 from the start), first-come room, other.
    assert len(kinds) == len(WRITE_ERROR_KINDS) + 16 + 1
    assert "other" in kinds and "kind-0" in kinds and "kind-39" not in kinds
    assert registry.get_sample_value("xrouter_ledger_write_errors_total", {"kind": "other"}) == 24
    error_kinds = label_values(registry, "xrouter_upstream_errors_total", "kind")
    assert len(error_kinds) == 16 + 1  # first-come room + other
    # The API a request came in: the three the gateway serves, anything else is other.
    for api in ("chat", "responses", "messages", "completions", "x" * 100):
        metrics.observe_request("compact", "qwen3-8b", 200, 0.1, 0.001, 1, api=api)
    apis = label_values(registry, "xrouter_requests_total", "api")
    assert apis == {"chat", "responses", "messages", "other"}


def test_values_after_a_sequence_of_requests(
    registry: CollectorRegistry, metrics: GatewayMetrics
) -> None:
    get = registry.get_sample_value
    # compact routed to the cheap model: saved 0.0009 USD against the reference
    metrics.decision("compact", "qwen3-8b")
    metrics.observe_call(
        model="qwen3-8b",
        prompt_tokens=1000,
        completion_tokens=200,
        cached_tokens=400,
        reasoning_tokens=50,
        cost_micros=100,
        duration_s=0.3,
        ttft_s=0.04,
        policy="compact",
    )
    metrics.observe_request(
        "compact", "qwen3-8b", 200, 0.31, 0.0008, 100, 1_000, downstream_calls=1
    )
    # llm policy called the dear model: cost 0.0025 more than the reference
    metrics.decision("llm", "claude-haiku")
    metrics.observe_call("claude-haiku", 2000, 500, 0, 0, 3_500, 7.0, None, policy="llm")
    metrics.observe_request(
        "llm", "claude-haiku", 200, 7.2, 0.003, 3_500, 1_000, downstream_calls=3
    )
    # a failed request: no model answered
    metrics.upstream_error("gpt-5-mini", "rate_limited")
    metrics.fallback("gpt-5-mini")
    metrics.observe_request("compact", None, 503, 0.05, 0.0002, 0)
    metrics.rate_limited("tpm")
    metrics.budget_rejected("request")
    metrics.limit_store_error("open")
    metrics.query_copied()
    metrics.query_copied(2)

    assert (
        get(
            "xrouter_requests_total",
            {"policy": "compact", "model": "qwen3-8b", "status_class": "2xx", "api": "chat"},
        )
        == 1
    )
    assert (
        get(
            "xrouter_requests_total",
            {"policy": "compact", "model": "none", "status_class": "5xx", "api": "chat"},
        )
        == 1
    )
    assert get("xrouter_tokens_total", {"model": "qwen3-8b", "kind": "prompt"}) == 1000
    assert get("xrouter_tokens_total", {"model": "qwen3-8b", "kind": "completion"}) == 200
    assert get("xrouter_tokens_total", {"model": "qwen3-8b", "kind": "cached"}) == 400
    assert get("xrouter_tokens_total", {"model": "qwen3-8b", "kind": "reasoning"}) == 50
    assert get("xrouter_tokens_total", {"model": "claude-haiku", "kind": "cached"}) is None
    assert get(
        "xrouter_cost_usd_total", {"model": "claude-haiku", "policy": "llm"}
    ) == pytest.approx(0.0035)
    assert get("xrouter_savings_usd_total", {"policy": "compact"}) == pytest.approx(0.0009)
    assert get("xrouter_overspend_usd_total", {"policy": "llm"}) == pytest.approx(0.0025)
    assert get("xrouter_savings_usd_total", {"policy": "llm"}) is None

    assert get("xrouter_request_duration_seconds_count", {"policy": "compact"}) == 2
    assert get("xrouter_request_duration_seconds_sum", {"policy": "compact"}) == pytest.approx(0.36)
    assert get("xrouter_request_duration_seconds_bucket", {"policy": "llm", "le": "5.0"}) == 0
    assert get("xrouter_request_duration_seconds_bucket", {"policy": "llm", "le": "10.0"}) == 1
    assert get("xrouter_overhead_seconds_count") == 3
    calls = "xrouter_downstream_calls_per_request"
    assert get(f"{calls}_bucket", {"policy": "compact", "le": "1.0"}) == 1
    assert get(f"{calls}_bucket", {"policy": "llm", "le": "2.0"}) == 0
    assert get(f"{calls}_bucket", {"policy": "llm", "le": "3.0"}) == 1
    assert get(f"{calls}_count", {"policy": "compact"}) == 1  # the failed one did not say
    assert get("xrouter_overhead_seconds_bucket", {"le": "0.001"}) == 2
    assert get("xrouter_upstream_duration_seconds_bucket", {"model": "qwen3-8b", "le": "0.25"}) == 0
    assert get("xrouter_upstream_duration_seconds_bucket", {"model": "qwen3-8b", "le": "0.5"}) == 1
    assert get("xrouter_time_to_first_token_seconds_count", {"model": "qwen3-8b"}) == 1
    assert get("xrouter_time_to_first_token_seconds_count", {"model": "claude-haiku"}) is None
    assert (
        get("xrouter_upstream_duration_seconds_bucket", {"model": "qwen3-8b", "le": "600.0"}) == 1
    )
    assert LLM_BUCKETS[0] == 0.005 and LLM_BUCKETS[-1] == 600.0

    assert get("xrouter_routing_decisions_total", {"policy": "llm", "model": "claude-haiku"}) == 1
    assert (
        get("xrouter_upstream_errors_total", {"model": "gpt-5-mini", "kind": "rate_limited"}) == 1
    )
    assert get("xrouter_fallbacks_total", {"model": "gpt-5-mini"}) == 1
    assert get("xrouter_rate_limited_total", {"limit": "tpm"}) == 1
    assert get("xrouter_rate_limited_total", {"limit": "rpm"}) == 0  # exists from the start
    assert get("xrouter_budget_rejections_total", {"reason": "request"}) == 1
    assert get("xrouter_budget_rejections_total", {"reason": "key"}) == 0
    assert get("xrouter_limit_store_errors_total", {"mode": "open"}) == 1
    assert get("xrouter_router_query_copies_total") == 3
    assert get("xrouter_build_info", {"version": "1.2.3"}) == 1


@pytest.mark.parametrize(
    ("status", "cls"), [(200, "2xx"), (429, "4xx"), ("503", "5xx"), (999, "other")]
)
def test_status_class(
    registry: CollectorRegistry, metrics: GatewayMetrics, status: int | str, cls: str
) -> None:
    metrics.observe_request("llm", "qwen3-8b", status, 1.0, None, 0)
    assert (
        registry.get_sample_value(
            "xrouter_requests_total",
            {"policy": "llm", "model": "qwen3-8b", "status_class": cls, "api": "chat"},
        )
        == 1
    )


def test_ledger_sink(registry: CollectorRegistry, metrics: GatewayMetrics) -> None:
    metrics.queue_depth(42)
    metrics.queue_depth(7)
    metrics.spilled(3, "queue_full")
    metrics.spilled(2, "queue_full")
    metrics.write_error("db")
    metrics.flushed(500)
    metrics.flushed(12)
    get = registry.get_sample_value
    assert get("xrouter_ledger_queue_depth") == 7
    assert get("xrouter_ledger_spilled_total", {"reason": "queue_full"}) == 5
    assert get("xrouter_ledger_write_errors_total", {"kind": "db"}) == 1
    assert get("xrouter_ledger_rows_total") == 512


def test_the_serving_checkpoint_is_one_series_at_1(
    registry: CollectorRegistry, metrics: GatewayMetrics
) -> None:
    def value(version: str, kind: str = "knn") -> float | None:
        return registry.get_sample_value(
            "xrouter_router_checkpoint_info", {"version": version, "kind": kind}
        )

    metrics.serving_checkpoint("aaa111", "knn")
    assert value("aaa111") == 1
    metrics.serving_checkpoint("bbb222", "mlp")  # a deploy
    assert (value("aaa111"), value("bbb222", "mlp")) == (0, 1)
    metrics.serving_checkpoint("bbb222", "mlp")  # a reload of the same one
    assert value("bbb222", "mlp") == 1
    metrics.serving_checkpoint(None, None)  # no checkpoint-served policy any more
    assert value("bbb222", "mlp") == 0
