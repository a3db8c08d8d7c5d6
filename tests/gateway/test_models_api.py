"""``GET /v1/models`` and ``GET /v1/models/{model}`` through the OpenAI SDK: the routers and the
priced pool, each retrievable by the name the chat endpoint takes, limited to what the
caller's key may use."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest

from pricing import load_default_catalog
from tests.gateway.conftest import Upstream
from tests.support.gateway import (
    ADMIN_KEY,
    DEMO_MODELS,
    Gateway,
    gateway_config,
    start_gateway,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
MODEL = "gemma-2-9b-it"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, upstream: Upstream) -> Iterator[Gateway]:
    tmp: Path = tmp_path_factory.mktemp("models")
    cfg = gateway_config(tmp, upstream.base_url, auth={"enabled": True, "admin_key": ADMIN_KEY})
    g = start_gateway(tmp, cfg)
    yield g
    g.stop()


def client(gw: Gateway, **key_fields: object) -> openai.OpenAI:
    r = httpx.post(
        f"{gw.url}/admin/keys",
        json={"alias": f"m-{secrets.token_hex(4)}", **key_fields},
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    return openai.OpenAI(base_url=gw.base_url, api_key=r.json()["key"], max_retries=0)


def test_every_listed_model_is_retrievable_by_its_id(gw: Gateway) -> None:
    c = client(gw)
    listed = {m.id: m for m in c.models.list()}
    assert {"xrouter", "xrouter/compact", "xrouter/cascade", MODEL} <= listed.keys()
    for model_id, entry in listed.items():
        got = c.models.retrieve(model_id)
        assert got.id == model_id and got.owned_by == entry.owned_by
        assert got.model_extra == entry.model_extra
    assert c.models.retrieve("xrouter").model_extra == {
        "xrouter": {"kind": "router", "policy": "compact"}
    }
    extra = c.models.retrieve(MODEL).model_extra
    assert extra is not None and float(extra["xrouter"]["price"]["input_per_mtok"]) > 0


def test_each_pool_model_lists_its_own_input_and_output_prices(gw: Gateway) -> None:
    # Clients budget from these prices; output tokens often cost more than input ones, so
    # each must be the catalog's own price, not the other one repeated.
    catalog = load_default_catalog()
    pool = {
        m.id: (m.model_extra or {})["xrouter"]["price"]
        for m in client(gw).models.list()
        if (m.model_extra or {})["xrouter"]["kind"] == "pool"
    }
    assert set(pool) == set(DEMO_MODELS)
    for name, price in pool.items():
        want = catalog.require(name)
        got = (Decimal(price["input_per_mtok"]), Decimal(price["output_per_mtok"]))
        assert got == (want.input, want.output), name
    # At least one pool model prices its output apart from its input (0.1 vs 0.3 per Mtok).
    mistral = pool["mistral-small-24b-instruct-2501-bf16"]
    assert (mistral["input_per_mtok"], mistral["output_per_mtok"]) == ("0.1", "0.3")


def test_the_listed_models_do_not_change_from_call_to_call(gw: Gateway) -> None:
    # `created` was the time of each call: a client caching the list saw every model change.
    c = client(gw)
    first = [m.model_dump() for m in c.models.list()]
    time.sleep(1.1)
    assert [m.model_dump() for m in c.models.list()] == first
    assert c.models.retrieve(MODEL).created == next(m["created"] for m in first if m["id"] == MODEL)


def test_a_fixed_policy_name_is_retrievable_though_not_listed(gw: Gateway) -> None:
    c = client(gw)
    assert f"xrouter/fixed:{MODEL}" not in {m.id for m in c.models.list()}
    got = c.models.retrieve(f"xrouter/fixed:{MODEL}")
    assert got.model_extra == {"xrouter": {"kind": "router", "policy": f"fixed:{MODEL}"}}


def test_an_unknown_model_is_an_openai_not_found(gw: Gateway) -> None:
    c = client(gw)
    for name in ("gpt-5", "xrouter/nope", "xrouter/fixed:gpt-5"):
        with pytest.raises(openai.NotFoundError) as info:
            c.models.retrieve(name)
        body = info.value.response.json()["error"]
        assert body["code"] == "model_not_found" and repr(name) in body["message"]
        assert info.value.request_id  # as OpenAI's API, an id on every answer


def test_a_restricted_key_sees_only_what_it_may_use(gw: Gateway) -> None:
    c = client(gw, allowed_models=[MODEL], allowed_policies=["cascade"])
    # `xrouter` is the default policy (compact), which this key may not use.
    assert [m.id for m in c.models.list()] == ["xrouter/cascade", MODEL]
    assert c.models.retrieve("xrouter/cascade").id == "xrouter/cascade"
    for hidden in ("xrouter", "xrouter/compact", "llama-3.3-70b-instruct"):
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve(hidden)


def test_a_key_allowed_no_pool_model_is_listed_no_router(gw: Gateway) -> None:
    # Every router routes among the models the key may use: with none, each request is a
    # 403, so none is listed (they were, and each one listed refused the key).
    c = client(gw, allowed_models=[])
    assert [m.id for m in c.models.list()] == []
    for name in ("xrouter", "xrouter/cascade", f"xrouter/fixed:{MODEL}", MODEL):
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve(name)
    with pytest.raises(openai.PermissionDeniedError) as info:
        c.chat.completions.create(model="xrouter", messages=[{"role": "user", "content": "hi"}])
    assert info.value.response.json()["error"]["code"] == "no_allowed_models"


def test_allow_lists_naming_what_the_gateway_does_not_serve_are_warned_about(
    gw: Gateway,
) -> None:
    # Accepted (a key may be made before the reload that adds its model), but said: a typo
    # showed only as the key's requests failing with 403s.
    r = httpx.post(
        f"{gw.url}/admin/keys",
        json={
            "alias": f"w-{secrets.token_hex(4)}",
            "allowed_models": [f"{MODEL} ", "gpt-5"],
            "allowed_policies": ["cascade", "cascde"],
        },
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    warnings = r.json()["warnings"]
    assert warnings[0] == f"allowed_models: '{MODEL} ' is not a model of this gateway's pool"
    assert warnings[1] == "allowed_models: 'gpt-5' is not a model of this gateway's pool"
    assert warnings[2].startswith("allowed_policies: 'cascde' is not a router policy")
    assert "cascade" in warnings[2] and "fixed:<pool model>" in warnings[2]
    assert "no model of this gateway's pool" in warnings[3] and len(warnings) == 4
    url = f"{gw.url}/admin/keys/{r.json()['key_id']}"
    # Only the names a change sets are checked; a key's GET carries no warnings.
    r = httpx.patch(url, json={"allowed_models": [MODEL]}, headers=ADMIN)
    assert r.status_code == 200 and "warnings" not in r.json()
    # The model name a client sends is not the policy's name.
    r = httpx.patch(url, json={"allowed_policies": ["xrouter/cascade"]}, headers=ADMIN)
    assert r.status_code == 200
    (warning,) = r.json()["warnings"]
    assert warning.startswith("allowed_policies: 'xrouter/cascade' is not a router policy")
    assert "warnings" not in httpx.get(url, headers=ADMIN).json()
    r = httpx.post(
        f"{gw.url}/admin/keys",
        json={"alias": f"w-{secrets.token_hex(4)}", "allowed_models": [MODEL],
              "allowed_policies": ["cascade", f"fixed:{MODEL}"]},
        headers=ADMIN,
    )  # fmt: skip
    assert r.status_code == 201 and "warnings" not in r.json()


def test_a_fixed_policy_is_kept_to_the_models_the_key_may_use(gw: Gateway) -> None:
    # fixed:<model> calls that model: a key kept off it may not reach it through the policy
    # (it was served by another model under the fixed policy's name).
    other = "llama-3.3-70b-instruct"
    c = client(gw, allowed_models=[MODEL])
    assert c.models.retrieve(f"xrouter/fixed:{MODEL}").id == f"xrouter/fixed:{MODEL}"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve(f"xrouter/fixed:{other}")
    with pytest.raises(openai.PermissionDeniedError) as info:
        c.chat.completions.create(
            model=f"xrouter/fixed:{other}", messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.response.json()["error"]["code"] == "model_not_allowed"
    answer = c.chat.completions.create(
        model=f"xrouter/fixed:{MODEL}", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.model == MODEL
    # Nor be given it as its default policy, at creation or by narrowing its models later.
    r = httpx.post(
        f"{gw.url}/admin/keys",
        json={
            "alias": f"f-{secrets.token_hex(4)}",
            "allowed_models": [MODEL],
            "routing": {"default_policy": f"fixed:{other}"},
        },
        headers=ADMIN,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "routing.default_policy"
    r = httpx.post(
        f"{gw.url}/admin/keys",
        json={
            "alias": f"f-{secrets.token_hex(4)}",
            "routing": {"default_policy": f"fixed:{other}"},
        },
        headers=ADMIN,
    )
    assert r.status_code == 201, r.text
    url = f"{gw.url}/admin/keys/{r.json()['key_id']}"
    r = httpx.patch(url, json={"allowed_models": [MODEL]}, headers=ADMIN)
    assert r.status_code == 400 and r.json()["error"]["param"] == "routing.default_policy"
    assert httpx.patch(url, json={"allowed_models": [other]}, headers=ADMIN).status_code == 200


def test_models_need_a_key(gw: Gateway) -> None:
    for path in ("/models", "/models/xrouter"):
        r = httpx.get(f"{gw.base_url}{path}")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
