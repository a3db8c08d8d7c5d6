"""Routing through the gateway: the compact policy (the packaged checkpoint), per-request
controls, the llm policy against a scripted router model, and checkpoint deployment."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall, ChatCompletionToolUnionParam
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from pricing import load_default_catalog
from router.outcomes import OutcomeRecord
from router.tools import tool_name
from tests.conftest import ScriptedRouter
from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.replay import REPO_ROOT
from tests.support.sdk import WEATHER_TOOL, extra

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def xrouter_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The `xrouter` command, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def test_compact_routes_with_a_logged_propensity(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    resp = client(gateway).chat.completions.create(
        model="xrouter/compact", messages=[{"role": "user", "content": demo_table[0].text}]
    )
    d = extra(resp)["xrouter"]["decision"]
    assert d["policy"] == "compact" and d["feature_version"].startswith("fx")
    assert d["actions"] == [resp.model] and 0 < d["propensity"] <= 1
    assert set(d["distribution"]) <= set(load_default_catalog().names())
    assert resp.choices[0].message.content == demo_table[0].outcomes[resp.model].response


def test_a_negative_zero_cost_weight_is_zero(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    # -0.0 passes `>= 0`; it was logged and shown as "-0", and keyed apart in the cache.
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        content=b'{"model": "xrouter/compact", "xrouter": {"cost_weight": -0.0}, "messages": '
        + json.dumps([{"role": "user", "content": demo_table[1].text}]).encode()
        + b"}",
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert '"cost_weight":0.0' in r.text.replace(" ", "") and "-0.0" not in r.text


def test_default_model_name_is_the_compact_policy(gateway: Gateway) -> None:
    raw = client(gateway).chat.completions.with_raw_response.create(
        model="xrouter", messages=[{"role": "user", "content": "Hello"}]
    )
    assert raw.headers["x-xrouter-policy"] == "compact"


def test_compact_streams_the_chosen_model_straight_through(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    rec = demo_table[5]
    chunks = list(
        client(gateway).chat.completions.create(
            model="xrouter/compact", stream=True, messages=[{"role": "user", "content": rec.text}]
        )
    )
    model = chunks[0].model
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == rec.outcomes[model].response
    )
    last = chunks[-1]
    assert last.usage is not None and extra(last)["xrouter"]["decision"]["actions"] == [model]


def test_cost_weight_moves_traffic_to_cheaper_models(
    gateway: Gateway, demo_table: list[OutcomeRecord]
) -> None:
    prompts = [r.text for r in demo_table[::25]]
    c = client(gateway)

    def mean_cost(weight: float) -> float:
        costs = [
            extra(
                c.chat.completions.create(
                    model="xrouter/compact",
                    messages=[{"role": "user", "content": p}],
                    extra_body={"xrouter": {"cost_weight": weight}},
                ).usage
            )["cost"]
            for p in prompts
        ]
        return sum(costs) / len(costs)

    assert mean_cost(20.0) < mean_cost(0.0)


def test_models_allow_list_is_respected(gateway: Gateway, demo_table: list[OutcomeRecord]) -> None:
    allowed = ["gemma-2-9b-it", "llama-3.2-3b-instruct"]
    for rec in demo_table[:6]:
        resp = client(gateway).chat.completions.create(
            model="xrouter/compact",
            messages=[{"role": "user", "content": rec.text}],
            extra_body={"xrouter": {"models": allowed}},
        )
        assert resp.model in allowed
        assert set(extra(resp)["xrouter"]["decision"]["distribution"]) <= set(allowed)
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={
            "model": "xrouter",
            "messages": [{"role": "user", "content": "x"}],
            "xrouter": {"models": ["gpt-99"]},
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "xrouter.models"


@pytest.mark.parametrize("policy", ["cheapest", "random", "cascade", "fixed:gemma-2-9b-it"])
def test_baseline_policies_by_model_name(gateway: Gateway, policy: str) -> None:
    resp = client(gateway).chat.completions.create(
        model=f"xrouter/{policy}", messages=[{"role": "user", "content": "What is 2+2?"}]
    )
    assert extra(resp)["xrouter"]["policy"] == policy
    if policy == "cheapest":
        assert resp.model == "llama-3.2-3b-instruct"
    if policy.startswith("fixed:"):
        assert resp.model == "gemma-2-9b-it"


def test_random_policy_spreads_traffic_and_logs_its_uniform_propensity(gateway: Gateway) -> None:
    # The random baseline is the logging policy for off-policy evaluation: its answers must
    # really vary, and each logged decision must carry the exact propensity 1/|pool| and the
    # whole uniform distribution, or estimates built on the log are wrong.
    pool = httpx.get(f"{gateway.base_url}/models").json()["data"]
    names = {m["id"] for m in pool if m["xrouter"]["kind"] == "pool"}
    p = 1.0 / len(names)
    answered: set[str] = set()
    for i in range(30):
        resp = client(gateway).chat.completions.create(
            model="xrouter/random", messages=[{"role": "user", "content": f"Say {i}."}]
        )
        answered.add(resp.model)
        logged = httpx.get(f"{gateway.base_url}/generation", params={"id": resp.id}, timeout=30)
        assert logged.status_code == 200, logged.text
        d = logged.json()["data"]["decision"]
        assert d["policy"] == "random" and d["actions"] == [resp.model]
        assert d["propensities"] == [pytest.approx(p)] and d["propensity"] == pytest.approx(p)
        assert d["distribution"] == pytest.approx(dict.fromkeys(names, p))
    # 30 uniform draws over 8 models all land on one with probability 8 * (1/8)**30.
    assert len(answered) > 1 and answered <= names


# ---------------------------------------------------------------- llm policy through the gateway


@pytest.fixture(scope="module")
def llm_gateway(
    upstream: Upstream, scripted_router: ScriptedRouter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gateway, Path]]:
    tmp = tmp_path_factory.mktemp("llm")
    cfg = gateway_config(
        tmp,
        upstream.base_url,
        router={
            "watch_files": False,
            "default_policy": "llm",
            "llm": {
                "base_url": scripted_router.base_url,
                "model": "router",
                "price": {"input": 0.5, "output": 1.5},
            },
        },
        auth={"enabled": False, "admin_key": ADMIN_KEY},
        metrics={"reference_model": "llama-3.3-70b-instruct"},
    )
    gw = start_gateway(tmp, cfg)
    yield gw, tmp / "ledger.db"
    gw.stop()


async def _rows(db: Path, sql: str, **params: Any) -> list[Any]:
    engine = create_async_engine(f"sqlite+aiosqlite:///{db}")
    try:
        async with engine.connect() as conn:
            return list((await conn.execute(text(sql), params)).all())
    finally:
        await engine.dispose()


def test_llm_policy_costs_and_ledger_rows_add_up(
    llm_gateway: tuple[Gateway, Path], scripted_router: ScriptedRouter
) -> None:
    import asyncio

    gw, db = llm_gateway
    query = "Which planet is known as the red planet in our solar system?"
    scripted_router.script(
        {
            "tool_calls": [
                {
                    "id": "a",
                    "name": tool_name("gemma-2-9b-it"),
                    "arguments": {"system_prompt": "Be brief."},
                },
                {
                    "id": "b",
                    "name": tool_name("llama-3.3-70b-instruct"),
                    "arguments": {"system_prompt": f"Answer: {query}"},
                },
            ]
        },
        {
            "tool_calls": [
                {"id": "s", "name": "select_response", "arguments": {"tool_call_id": "b"}}
            ]
        },
        usage={"prompt_tokens": 300, "completion_tokens": 40},
    )
    resp = client(gw).chat.completions.create(
        model="xrouter", messages=[{"role": "user", "content": query}]
    )
    meta = extra(resp)["xrouter"]
    assert resp.model == "llama-3.3-70b-instruct" and meta["policy"] == "llm"
    assert meta["router_cost_usd"] == pytest.approx(2 * (300 * 0.5 + 40 * 1.5) / 1e6)
    assert meta["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in meta["calls"]))
    assert [c["role"] for c in meta["calls"]].count("router") == 2
    # The ledger writes off the request path, in batches: wait for this request's row and
    # its four call rows (two router turns, two downstream calls) rather than for a time.
    deadline = time.monotonic() + 10
    while True:
        req = asyncio.run(
            _rows(
                db,
                "SELECT total_cost_micros, router_cost_micros, downstream_cost_micros FROM requests WHERE request_id = :r",
                r=meta["request_id"],
            )
        )
        calls = asyncio.run(
            _rows(
                db,
                "SELECT role, cost_micros FROM calls WHERE request_id = :r",
                r=meta["request_id"],
            )
        )
        if req and len(calls) == len(meta["calls"]):
            break
        assert time.monotonic() < deadline, f"ledger rows not written: {req}, {calls}"
        time.sleep(0.05)
    total, router, downstream = req[0]
    assert total == router + downstream == sum(c[1] for c in calls)
    assert router == sum(c[1] for c in calls if c[0] == "router") == 420
    assert round(meta["cost_usd"] * 1e6) == total
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert "xrouter_router_query_copies_total 1.0" in metrics
    # The router model's tokens are reported under "router", not lost in "other".
    router_prompt = [
        line
        for line in metrics.splitlines()
        if line.startswith("xrouter_tokens_total{") and 'model="router"' in line
        and 'kind="prompt"' in line
    ]  # fmt: skip
    assert router_prompt and float(router_prompt[0].split()[-1]) >= 600


def test_a_keys_budget_pays_for_the_router_models_calls(
    upstream: Upstream, scripted_router: ScriptedRouter, tmp_path: Path
) -> None:
    cfg = gateway_config(
        tmp_path,
        upstream.base_url,
        router={
            "watch_files": False,
            "default_policy": "llm",
            "llm": {
                "base_url": scripted_router.base_url,
                "model": "router",
                "price": {"input": 0.5, "output": 1.5},
            },
        },
        auth={"enabled": True, "admin_key": ADMIN_KEY},
    )
    gw = start_gateway(tmp_path, cfg)
    try:

        def key(budget_usd: float) -> dict[str, Any]:
            r = httpx.post(
                f"{gw.url}/admin/keys",
                json={"alias": f"k{budget_usd}", "budget_usd": budget_usd},
                headers=ADMIN,
            )
            assert r.status_code == 201, r.text
            return dict(r.json())

        def spent(k: dict[str, Any]) -> float:
            listed = httpx.get(f"{gw.url}/admin/keys", headers=ADMIN).json()["data"]
            return float(next(x for x in listed if x["key_id"] == k["key_id"])["spent_usd"])

        rich = key(1.0)
        scripted_router.script(
            {"tool_calls": [{"id": "a", "name": tool_name("gemma-2-9b-it"), "arguments": {}}]},
            {"tool_calls": [{"id": "s", "name": "select_response", "arguments": {"tool_call_id": "a"}}]},
            usage={"prompt_tokens": 900, "completion_tokens": 60},
        )  # fmt: skip
        c = openai.OpenAI(base_url=gw.base_url, api_key=rich["key"], max_retries=0)
        resp = c.chat.completions.create(
            model="xrouter", messages=[{"role": "user", "content": "Name a red planet."}]
        )
        meta = extra(resp)["xrouter"]
        assert meta["router_cost_usd"] == pytest.approx(2 * (900 * 0.5 + 60 * 1.5) / 1e6)
        # The key paid for the router's two turns as well as the downstream call.
        assert spent(rich) == pytest.approx(meta["cost_usd"], abs=1e-9)

        # A budget below one router turn's worst case: the router model is never called.
        poor = key(0.0005)
        scripted_router.script({"content": "I would have answered this myself."})
        c = openai.OpenAI(base_url=gw.base_url, api_key=poor["key"], max_retries=0)
        with pytest.raises(openai.RateLimitError) as exc:
            c.chat.completions.create(
                model="xrouter", messages=[{"role": "user", "content": "Name a red planet."}]
            )
        assert exc.value.body["code"] == "key_budget_exceeded"  # type: ignore[index]
        assert scripted_router.requests() == [] and spent(poor) == 0
        m = httpx.get(f"{gw.url}/metrics").text
        assert 'xrouter_budget_rejections_total{reason="key"} 1.0' in m
    finally:
        gw.stop()


# ---------------------------------------------------------------- deploy


def test_deploy_hot_loads_a_checkpoint_and_refuses_a_mismatched_one(
    upstream: Upstream, tmp_path: Path
) -> None:
    from router.checkpoint import default_checkpoint_path, load_checkpoint

    cfg = gateway_config(
        tmp_path, upstream.base_url, auth={"enabled": True, "admin_key": ADMIN_KEY}
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        cmd = [
            sys.executable,
            "-m",
            "gateway.cli",
            "deploy",
            "packaged:demo-rl",
            "--url",
            gw.url,
            "--admin-key",
            ADMIN_KEY,
        ]
        # The gateway serves the packaged default (kNN); deploying the packaged policy
        # network by name swaps it in.
        assert load_checkpoint(default_checkpoint_path()).metadata.architecture.kind == "knn"
        out = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        answer = json.loads(out.stdout)
        deployed = answer["checkpoint"]
        assert deployed["version"] == load_checkpoint("packaged:demo-rl").version
        assert deployed["kind"] == "mlp"
        # What the checkpoint was trained on, and what the gateway serves, both said: the
        # gateway's "pool" used to overwrite the checkpoint's.
        assert answer["checkpoint_pool"] == load_checkpoint("packaged:demo-rl").pool
        assert answer["pool"] == [m["name"] for m in cfg["pool"]]
        serving = httpx.get(
            f"{gw.url}/admin/router", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ).json()
        assert serving["checkpoint"]["version"] == deployed["version"]
        # A gateway whose pool holds none of the checkpoint's models refuses it and keeps
        # serving.
        small = gateway_config(
            tmp_path / "small", upstream.base_url, auth={"enabled": True, "admin_key": ADMIN_KEY}
        )
        small["pool"] = [
            {
                "name": "extra-model",
                "model": "openai/gemma-2-9b-it",
                "api_base": upstream.base_url,
                "price": {"input": 1, "output": 1},
            }
        ]
        gw2 = start_gateway(tmp_path / "small", small)
        try:
            out = subprocess.run(
                [*cmd[:-4], "--url", gw2.url, "--admin-key", ADMIN_KEY],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 1 and "reload_failed" in out.stderr
            r = httpx.post(
                f"{gw2.base_url}/chat/completions",
                json={"model": "extra-model", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": "Bearer x"},
            )
            assert r.status_code == 401  # still up and serving
        finally:
            gw2.stop()
    finally:
        gw.stop()


def test_deploy_to_a_gateway_without_an_admin_key_says_the_admin_api_is_off(
    upstream: Upstream, tmp_path: Path
) -> None:
    """The demo has no admin key: its 403 is not a refusal of the checkpoint."""
    cfg = gateway_config(tmp_path, upstream.base_url, auth={"enabled": False, "admin_key": None})
    gw = start_gateway(tmp_path, cfg)
    try:
        out = xrouter_cli("deploy", "packaged:demo-rl", "--url", gw.url, "--admin-key", "k")
        assert out.returncode == 1, out.stderr
        assert "refused the admin call (403)" in out.stderr and "admin_disabled" in out.stderr
        assert "refused the checkpoint" not in out.stderr and "Traceback" not in out.stderr
    finally:
        gw.stop()


def test_a_model_added_since_training_is_served_and_explored_not_routed(
    upstream: Upstream, demo_table: list[OutcomeRecord], tmp_path: Path
) -> None:
    """Adding a model to the pool keeps the learned router serving: it routes among the
    models it knows, the new one is served by name, explored with its propensity logged
    (so the next checkpoint can learn it), and the operator is told."""
    cfg = gateway_config(tmp_path, upstream.base_url, router={"epsilon": 1.0})
    house = "house-model"
    cfg["pool"].append(
        {
            "name": house,
            "model": "openai/gemma-2-9b-it",
            "api_base": upstream.base_url,
            "price": {"input": 0.05, "output": 0.05},
        }
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        serving = httpx.get(f"{gw.url}/admin/router", headers=ADMIN).json()
        assert serving["default_policy"] == "compact"
        assert serving["checkpoint"]["kind"] == "knn"
        assert serving["checkpoint"]["untrained_models"] == [house]
        # How it explores, which the logged propensities come from.
        assert serving["exploration"] == {"epsilon": 1.0, "sample": False, "temperature": 1.0}
        assert "not trained on" in httpx.get(f"{gw.url}/dashboard").text
        c = client(gw)
        named = c.chat.completions.create(model=house, messages=[{"role": "user", "content": "hi"}])
        assert named.model == house
        # ε = 1 over an allow-list of the new model and one the checkpoint knows: a fair
        # coin per request, each outcome logged with propensity 1/2.
        known = "gemma-2-9b-it"
        seen = set()
        for rec in demo_table[:30]:
            resp = c.chat.completions.create(
                model="xrouter",
                messages=[{"role": "user", "content": rec.text}],
                extra_body={"xrouter": {"models": [house, known]}},
            )
            d = extra(resp)["xrouter"]["decision"]
            assert d["distribution"] == {house: 0.5, known: 0.5}
            assert d["actions"] == [resp.model] and d["propensity"] == 0.5
            seen.add(resp.model)
        assert seen == {house, known}  # P(one side never drawn in 30) = 2^-29
        # Allowing only the new model: the checkpoint cannot rank it; it answers.
        only = c.chat.completions.create(
            model="xrouter",
            messages=[{"role": "user", "content": demo_table[0].text}],
            extra_body={"xrouter": {"models": [house]}},
        )
        assert only.model == house and extra(only)["xrouter"]["decision"]["propensity"] == 1.0
    finally:
        gw.stop()


def test_a_knn_checkpoint_is_trained_deployed_and_served(
    upstream: Upstream, demo_table: list[OutcomeRecord], tmp_path: Path
) -> None:
    from router.checkpoint import load_checkpoint

    table = REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl"
    run = tmp_path / "knn"
    out = xrouter_cli("train", "--table", str(table), "--out", str(run), "--knn", "25,100")
    assert out.returncode == 0, out.stderr[-2000:]
    ckpt = load_checkpoint(run / "checkpoint")
    assert ckpt.architecture.kind == "knn"

    cfg = gateway_config(
        tmp_path, upstream.base_url, auth={"enabled": True, "admin_key": ADMIN_KEY}
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        # The run directory names its checkpoint, as `xrouter eval --policy` takes it.
        out = xrouter_cli("deploy", str(run), "--url", gw.url, "--admin-key", ADMIN_KEY)
        assert out.returncode == 0, out.stderr
        body = json.loads(out.stdout)
        deployed = body["checkpoint"]
        assert (deployed["version"], deployed["kind"]) == (ckpt.version, "knn")
        assert body["deployment"]["checkpoint"] == str((run / "checkpoint").resolve())
        made = httpx.post(f"{gw.url}/admin/keys", json={"alias": "knn"}, headers=ADMIN)
        assert made.status_code == 201, made.text
        key = made.json()["key"]
        client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
        rec = demo_table[0]
        r = client.chat.completions.with_raw_response.create(
            model="xrouter/compact", messages=[{"role": "user", "content": rec.text}]
        )
        meta = r.http_response.json()["xrouter"]
        assert meta["policy"] == "compact" and r.parse().model in ckpt.pool
        assert meta["decision"]["feature_version"] == ckpt.feature_version
        assert meta["decision"]["checkpoint"] == ckpt.version
        # The recorded answer of the model the neighbours picked.
        assert r.parse().choices[0].message.content == rec.outcomes[r.parse().model].response
    finally:
        gw.stop()


def test_a_cascade_checkpoint_is_trained_deployed_and_runs_its_plan(
    upstream: Upstream, demo_table: list[OutcomeRecord], tmp_path: Path
) -> None:
    """`xrouter train --cascade` → `xrouter deploy` → a request that the checkpoint answers
    with a multi-call plan: the gateway makes exactly the calls that replaying the plan on
    the recorded responses makes, and returns the same model's recorded answer."""
    from router.checkpoint import load_checkpoint
    from router.policies.planned import PlannedPolicy
    from training.evaluation.cascade import CascadeRouter
    from training.evaluation.loop_router import pool_for

    table = REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl"
    run = tmp_path / "cascade"
    out = xrouter_cli("train", "--table", str(table), "--out", str(run), "--cascade", "25,100")
    assert out.returncode == 0, out.stderr[-2000:]
    ckpt = load_checkpoint(run / "checkpoint")
    assert ckpt.architecture.kind == "cascade"
    # A prompt the checkpoint answers with more than one call at the request's cost weight.
    lam = 0.5
    policy = PlannedPolicy(ckpt, pool_for(demo_table))
    features = policy.extractor.extract_batch([r.chat_messages() for r in demo_table[:100]])
    record, plan = next(
        (r, p)
        for r, p in zip(demo_table, policy.route_batch(features, lam), strict=False)
        if len(p.order) > 1
    )
    want = CascadeRouter(plan.order, plan.k, plan.quorum).trajectory(record)

    cfg = gateway_config(
        tmp_path, upstream.base_url, auth={"enabled": True, "admin_key": ADMIN_KEY}
    )
    gw = start_gateway(tmp_path, cfg)
    try:
        out = xrouter_cli(
            "deploy", str(run / "checkpoint"), "--url", gw.url, "--admin-key", ADMIN_KEY
        )
        assert out.returncode == 0, out.stderr
        deployed = json.loads(out.stdout)["checkpoint"]
        assert (deployed["version"], deployed["kind"]) == (ckpt.version, "cascade")
        serving = httpx.get(f"{gw.url}/admin/router", headers=ADMIN).json()
        assert serving["checkpoint"] == deployed and serving["default_policy"] == "compact"
        made = httpx.post(f"{gw.url}/admin/keys", json={"alias": "cascade"}, headers=ADMIN)
        key = made.json()["key"]
        client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
        r = client.chat.completions.with_raw_response.create(
            model="xrouter/compact",
            messages=[{"role": "user", "content": record.text}],
            extra_body={"xrouter": {"cost_weight": lam}},
        )
        meta = r.http_response.json()["xrouter"]
        assert [c["model"] for c in meta["calls"]] == list(want.models_called)
        assert [c["turn"] for c in meta["calls"]][: plan.k] == [0] * plan.k
        assert meta["decision"]["actions"] == list(want.models_called)
        assert meta["decision"]["propensity"] == 1.0
        assert meta["decision"]["checkpoint"] == ckpt.version
        assert r.parse().model == want.final_model
        assert r.parse().choices[0].message.content == record.outcomes[want.final_model].response
        # Every call is charged: the usage covers the whole plan.
        assert meta["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in meta["calls"]))
        # Operators see how many calls the request made.
        n = len(want.models_called)
        scraped = httpx.get(f"{gw.url}/metrics").text
        line = f'xrouter_downstream_calls_per_request_bucket{{le="{n - 1}.0",policy="compact"}} 0.0'
        assert line in scraped
        assert 'xrouter_downstream_calls_per_request_count{policy="compact"} 1.0' in scraped
        # Streamed, the same plan runs and the chosen answer arrives whole, with the usage
        # and cost of every call in the last chunk.
        chunks = list(
            client.chat.completions.create(
                model="xrouter/compact",
                stream=True,
                messages=[{"role": "user", "content": record.text}],
                extra_body={"xrouter": {"cost_weight": lam}},
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == record.outcomes[want.final_model].response
        last = chunks[-1]
        assert last.usage is not None
        streamed = extra(last)["xrouter"]
        assert [c["model"] for c in streamed["calls"]] == list(want.models_called)
        assert extra(last.usage)["cost"] == pytest.approx(meta["cost_usd"])
    finally:
        gw.stop()


def test_cascade_accepts_agreeing_tool_calls_without_escalating(gateway: Gateway) -> None:
    """Two cheap models that call the client's tool with the same arguments agree: the
    cascade answers with the cheaper one's call and never pays for a third model."""
    tools: list[ChatCompletionToolUnionParam] = [WEATHER_TOOL]
    r = client(gateway).chat.completions.with_raw_response.create(
        model="xrouter/cascade",
        messages=[{"role": "user", "content": "What's the weather in Paris?"}],
        tools=tools,
    )
    resp, meta = r.parse(), r.http_response.json()["xrouter"]
    calls = resp.choices[0].message.tool_calls
    assert calls and isinstance(calls[0], ChatCompletionMessageFunctionToolCall)
    assert calls[0].function.name == "get_weather"
    assert resp.choices[0].finish_reason == "tool_calls"
    assert [c["turn"] for c in meta["calls"]] == [0, 0]
    assert resp.model == meta["calls"][0]["model"] == "llama-3.2-3b-instruct"  # the cheapest
