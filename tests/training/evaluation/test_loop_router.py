"""Real policies evaluated offline through the orchestration loop (recorded outcomes)."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from pricing import ModelPrice, load_default_catalog
from router.checkpoint import default_checkpoint_path
from router.outcomes import OutcomeRecord, load_outcome_table
from router.policies.llm import LLMRouterPolicy, router_system_prompt
from router.providers.native import NativeOpenAIProvider
from router.tools import tool_name
from tests.conftest import ScriptedRouter
from tests.support.outcomes import without_responses
from tests.support.routes import trajectories
from training.evaluation.compare import Entry, compare
from training.evaluation.loop_router import LoopRouter, parse_llm_spec, pool_for, replay_model
from training.evaluation.registry import LoadContext, default_registry
from training.evaluation.sweep import RoutedPrompt, RoutingError

DEMO = Path(__file__).resolve().parents[3] / "router" / "assets" / "demo_outcomes.jsonl"


@pytest.fixture(scope="module")
def records() -> list[OutcomeRecord]:
    return load_outcome_table(DEMO)[:40]


def test_fixed_policy_through_the_loop_matches_the_recorded_outcomes(
    records: list[OutcomeRecord],
) -> None:
    router = default_registry().load("policy:fixed:gemma-2-9b-it", LoadContext(train=records))
    routes = router.route(records, 0.0)
    for r, route in zip(records, routes, strict=True):
        assert isinstance(route, RoutedPrompt)
        assert route.final_model == "gemma-2-9b-it" and route.models_called == ("gemma-2-9b-it",)
        assert route.score == r.outcomes["gemma-2-9b-it"].score
        assert route.cost_usd == pytest.approx(r.outcomes["gemma-2-9b-it"].cost_usd)


def test_agreement_cascade_sums_the_costs_of_every_call(records: list[OutcomeRecord]) -> None:
    routes = trajectories(
        default_registry().load("policy:cascade", LoadContext(train=records)).route(records, 0.0)
    )
    multi = [(r, x) for r, x in zip(records, routes, strict=True) if len(x.models_called) > 1]
    assert multi, "the agreement cascade always calls at least two models"
    for r, x in multi:
        assert x.cost_usd == pytest.approx(
            sum(r.outcomes[m].cost_usd or 0 for m in x.models_called)
        )
        assert x.final_model in x.models_called


def test_compact_checkpoint_loader_prefers_cheaper_models_at_high_cost_weight(
    records: list[OutcomeRecord],
) -> None:
    router = default_registry().load(
        f"compact:{default_checkpoint_path()}", LoadContext(train=records)
    )
    cheap = trajectories(router.route(records, 20.0))
    rich = trajectories(router.route(records, 0.0))
    assert sum(x.cost_usd for x in cheap) < sum(x.cost_usd for x in rich)
    assert all(len(x.models_called) == 1 for x in rich)


@pytest.mark.parametrize("flag", ["", "#lambda"])
def test_an_llm_router_endpoint_is_evaluated_through_the_loop(
    records: list[OutcomeRecord], scripted_router: ScriptedRouter, flag: str
) -> None:
    record = records[0]
    model = "gemma-2-9b-it"
    call = {"id": "t1", "name": tool_name(model), "arguments": {"system_prompt": "Be brief."}}
    select = {"id": "s1", "name": "select_response", "arguments": {"tool_call_id": "t1"}}
    scripted_router.script({"tool_calls": [call]}, {"tool_calls": [select]})
    spec = f"llm:{scripted_router.base_url}#router{flag}"
    (route,) = trajectories(
        default_registry().load(spec, LoadContext(train=records)).route([record], 0.3)
    )
    assert route.final_model == model and route.models_called == (model,)
    assert route.score == record.outcomes[model].score
    system = scripted_router.requests()[-2]["messages"][0]["content"]
    # "#lambda": the router reads the swept cost weight from its prompt, as it was trained.
    assert system == router_system_prompt(0.3 if flag else None)


def test_an_llm_router_reads_the_whole_tables_prices_not_the_evaluated_parts(
    records: list[OutcomeRecord], scripted_router: ScriptedRouter
) -> None:
    # Its tools' prices came from the evaluated part's mean costs, while `xrouter verl-data`
    # trained it on the whole table's: the router read other prices than it learned.
    # A model the catalog does not price: priced by its mean recorded cost.
    model = "house-model"
    table = [
        r.model_copy(update={"outcomes": {**r.outcomes, model: r.outcomes["gemma-2-9b-it"]}})
        for r in records
    ]
    record = table[0]
    whole, part = pool_for(table), pool_for([record])
    assert whole[model].price.input != part[model].price.input
    call = {"id": "t1", "name": tool_name(model), "arguments": {"system_prompt": "Be brief."}}
    select = {"id": "s1", "name": "select_response", "arguments": {"tool_call_id": "t1"}}
    router = default_registry().load(
        f"llm:{scripted_router.base_url}#router", LoadContext(train=table)
    )
    assert isinstance(router, LoopRouter)
    router.pool = whole  # as `xrouter eval` sets it
    scripted_router.script({"tool_calls": [call]}, {"tool_calls": [select]})
    router.route([record], 0.3)
    (tool,) = [
        t["function"]
        for t in scripted_router.requests()[-2]["tools"]
        if t["function"]["name"] == tool_name(model)
    ]
    assert f"${whole[model].price.input}/1M input tokens" in tool["description"]


@pytest.mark.parametrize(
    "spec",
    [
        "llm:http://127.0.0.1:9/v1#router#fast",
        "llm:http://127.0.0.1:9/v1#router#price=1",
        "llm:http://127.0.0.1:9/v1#router#price=-1/2",
        "llm:http://127.0.0.1:9/v1#router#price=1/x",
        "llm:http://127.0.0.1:9/v1#router#price=inf/1",
        "llm:#router",
    ],
)
def test_a_malformed_llm_spec_is_refused(records: list[OutcomeRecord], spec: str) -> None:
    with pytest.raises(ValueError, match=r"BASE_URL|price is two"):
        default_registry().load(spec, LoadContext(train=records))


def test_llm_spec_options_parse() -> None:
    base, model, reads_lambda, price = parse_llm_spec("llm:http://h:1/v1/#r#lambda, price=0.05/0.2")
    assert (base, model, reads_lambda) == ("http://h:1/v1", "r", True)
    assert price is not None and (price.input, price.output) == (Decimal("0.05"), Decimal("0.2"))
    assert parse_llm_spec("llm:http://h:1/v1") == ("http://h:1/v1", "xrouter-router", False, None)


def test_a_priced_router_models_tokens_count_in_the_cost(
    records: list[OutcomeRecord], scripted_router: ScriptedRouter
) -> None:
    record, model = records[0], "gemma-2-9b-it"
    call = {"id": "t1", "name": tool_name(model), "arguments": {"system_prompt": "Be brief."}}
    select = {"id": "s1", "name": "select_response", "arguments": {"tool_call_id": "t1"}}
    usage = {"prompt_tokens": 100, "completion_tokens": 20}
    scripted_router.script({"tool_calls": [call]}, {"tool_calls": [select]}, usage=usage)
    priced = dataclasses.replace(
        replay_model("router", ModelPrice(input=Decimal(1), output=Decimal(2))),
        api_base=scripted_router.base_url,
    )
    router = LoopRouter("llm", lambda pool: LLMRouterPolicy(NativeOpenAIProvider(), priced))
    (route,) = trajectories(router.route([record], 0.0))
    # Two router calls of 100 + 20 tokens at $1 / $2 per 1M, on top of the recorded call.
    assert route.final_model == model
    recorded = record.outcomes[model].cost_usd
    assert recorded is not None
    assert route.cost_usd == pytest.approx(recorded + 2 * 140e-6)


@pytest.mark.parametrize(
    ("router_model", "options", "per_call_usd"),
    [
        # Priced in the spec: 100 input + 20 output tokens at $1 / $2 per 1M.
        ("router", "#price=1/2", 140e-6),
        # A model the price catalog knows costs what the gateway would charge for it.
        ("gpt-4o-mini", "", None),
        # Unpriced and unknown: free (and a warning says so).
        ("router", "", 0.0),
    ],
)
def test_an_llm_specs_router_tokens_are_priced_from_the_spec_or_the_catalog(
    records: list[OutcomeRecord],
    scripted_router: ScriptedRouter,
    router_model: str,
    options: str,
    per_call_usd: float | None,
) -> None:
    record, model = records[0], "gemma-2-9b-it"
    call = {"id": "t1", "name": tool_name(model), "arguments": {"system_prompt": "Be brief."}}
    select = {"id": "s1", "name": "select_response", "arguments": {"tool_call_id": "t1"}}
    scripted_router.script(
        {"tool_calls": [call]},
        {"tool_calls": [select]},
        usage={"prompt_tokens": 100, "completion_tokens": 20},
    )
    if per_call_usd is None:
        catalog_price = load_default_catalog().require(router_model)
        per_call_usd = float(catalog_price.input * 100 + catalog_price.output * 20) / 1e6
        assert per_call_usd > 0
    spec = f"llm:{scripted_router.base_url}#{router_model}{options}"
    (route,) = trajectories(
        default_registry().load(spec, LoadContext(train=records)).route([record], 0.0)
    )
    assert route.final_model == model
    recorded = record.outcomes[model].cost_usd
    assert recorded is not None
    assert route.cost_usd == pytest.approx(recorded + 2 * per_call_usd)


def test_router_model_failures_are_reported_not_scored_as_the_router(
    records: list[OutcomeRecord], scripted_router: ScriptedRouter
) -> None:
    # The first prompt's router call fails, and so does its one retry (the serving loop
    # falls back to the cheapest model); the second is routed by the router. The
    # evaluation says so.
    model = "gemma-2-9b-it"
    call = {"id": "t1", "name": tool_name(model), "arguments": {"system_prompt": "Be brief."}}
    select = {"id": "s1", "name": "select_response", "arguments": {"tool_call_id": "t1"}}
    failed = {"error_status": 500}
    scripted_router.script(failed, failed, {"tool_calls": [call]}, {"tool_calls": [select]})
    router = default_registry().load(
        f"llm:{scripted_router.base_url}#router", LoadContext(train=records)
    )
    assert isinstance(router, LoopRouter) and router.notes == []
    fallback, routed = trajectories(router.route(records[:2], 0.0))
    assert routed.final_model == model
    assert fallback.final_model != "router" and len(fallback.models_called) == 1
    (note,) = router.notes
    assert "failed on 1 of 2 routed prompts" in note and "fallback" in note


def test_an_unreachable_router_model_is_not_evaluated(records: list[OutcomeRecord]) -> None:
    router = default_registry().load("llm:http://127.0.0.1:9/v1#router", LoadContext(train=records))
    with pytest.raises(RoutingError, match="never answered"):
        router.route(records[:3], 0.0)
    # Through the comparison: no curve, a note saying why.
    comparison = compare([Entry(router, "policy", [0.0])], records[:3])
    assert all(c.name != router.name for c in comparison.curves)
    assert any("never answered" in n for n in comparison.notes)


def _logged(
    records: list[OutcomeRecord], actions: list[str], propensity: float
) -> list[OutcomeRecord]:
    """The records as a gateway logs them: one model's outcome each, with its propensity."""
    out = []
    for r, action in zip(records, actions, strict=True):
        data = r.model_dump(exclude_none=True)
        data["outcomes"] = {action: data["outcomes"][action]}
        data["logged"] = {"action": action, "propensity": propensity}
        out.append(OutcomeRecord.model_validate(data))
    return out


def test_on_logged_traffic_a_checkpoint_picks_among_every_model_not_the_logged_one() -> None:
    # Partial feedback: each prompt keeps only the outcome of a uniformly logged model. The
    # policy must still choose over the whole pool, exactly as it does on the full table;
    # restricting it to the models a record has outcomes for would return the logged action.
    full = load_outcome_table(DEMO)[:160]
    models = list(full[0].outcomes)
    rng = np.random.default_rng(0)
    picks = [models[int(rng.integers(len(models)))] for _ in full]
    logged = _logged(full, picks, 1 / len(models))
    router = default_registry().load("compact:packaged:demo", LoadContext(train=full))
    on_full = router.route(full, 0.0)
    on_logged = router.route(logged, 0.0)
    assert list(on_logged) == [x.final_model for x in on_full if isinstance(x, RoutedPrompt)]
    same = sum(a == r.logged.action for a, r in zip(on_logged, logged, strict=True) if r.logged)
    assert same < len(logged) / 2


def test_a_multi_call_policy_is_refused_on_logged_traffic(records: list[OutcomeRecord]) -> None:
    logged = _logged(records, [list(r.outcomes)[i % 2] for i, r in enumerate(records)], 0.5)
    router = default_registry().load("policy:cascade", LoadContext(train=records))
    with pytest.raises(RoutingError, match="multi-call"):
        router.route(logged, 0.0)


def test_gateway_model_names_name_the_gateways_policies(records: list[OutcomeRecord]) -> None:
    """DESIGN's model names (`xrouter`, `xrouter/<policy>`) are what a reader of the HTTP
    contract writes after `--policy`; they were refused as unknown policies."""
    ctx = LoadContext(train=records)
    registry = default_registry()

    def choices(spec: str) -> list[tuple[str, ...]]:
        return [r.models_called for r in trajectories(registry.load(spec, ctx).route(records, 0.5))]

    assert choices("xrouter/fixed:gemma-2-9b-it") == [("gemma-2-9b-it",)] * len(records)
    assert choices("xrouter") == choices("xrouter/compact") == choices("compact")
    assert choices("xrouter/cheapest") == choices("cheapest")
    # The gateway's cascade (the agreement check), not the eval's fitted cascade baseline.
    assert choices("xrouter/cascade") == choices("policy:cascade")
    assert registry.load("xrouter/random", ctx).name == "policy:random"
    with pytest.raises(ValueError, match="evaluated over HTTP"):
        registry.load("xrouter/llm", ctx)


def test_a_multi_call_policy_is_refused_on_a_table_without_responses(
    records: list[OutcomeRecord],
) -> None:
    # RouterDC's and RouteLLM's tables record scores, not answers: a cascade replayed on
    # them compared empty answers and was scored anyway (AIQ 0, every model called).
    bare = without_responses(records)
    cascade = default_registry().load("policy:cascade", LoadContext(train=bare))
    with pytest.raises(RoutingError, match="has no recorded response"):
        cascade.route(bare, 0.0)
    # One call per prompt reads no answer: still scored.
    fixed = default_registry().load("policy:fixed:gemma-2-9b-it", LoadContext(train=bare))
    assert len(fixed.route(bare, 0.0)) == len(bare)
