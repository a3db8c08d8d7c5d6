"""``/openapi.json`` describes the API the server really serves: every endpoint is in it,
the bodies real clients send are valid under it, and schemathesis, generating requests from
it against a live gateway, finds no server error and no answer the document does not
describe (status, content type, body)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import jsonschema
import openai
import orjson
import pytest
import schemathesis
from fastapi import APIRouter
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families
from schemathesis import GenerationMode
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import positive_data_acceptance
from starlette.routing import Route

import gateway.routes as gateway_routes
from gateway.app import create_app
from gateway.settings import load_settings
from tests.support.gateway import ADMIN_KEY, Gateway

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def document(gateway: Gateway) -> dict[str, Any]:
    r = httpx.get(f"{gateway.url}/openapi.json", timeout=10)
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


def _served(gateway: Gateway) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves and means to publish, as the document
    spells paths (``{model_id:path}`` → ``{model_id}``): the plain routes the app factory
    mounts, and every APIRouter of ``gateway.routes``' modules (a new module is found)."""
    app = create_app(load_settings(gateway.config_path, env={}))
    routes: list[Any] = [r for r in app.routes if isinstance(r, Route)]
    for info in pkgutil.iter_modules(gateway_routes.__path__):
        router = getattr(importlib.import_module(f"gateway.routes.{info.name}"), "router", None)
        if isinstance(router, APIRouter):
            routes += [r for r in router.routes if isinstance(r, APIRoute) and r.include_in_schema]
    out = set()
    for route in routes:
        if route.path == app.openapi_url:
            continue
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        # Starlette adds HEAD to a plain route's GET by itself; FastAPI's routes say theirs.
        heads = isinstance(route, APIRoute)
        out |= {(m.lower(), path) for m in route.methods or () if m != "HEAD" or heads}
    return out


def test_every_endpoint_is_in_the_document(gateway: Gateway, document: dict[str, Any]) -> None:
    documented = {(m, p) for p, item in document["paths"].items() for m in item}
    served = _served(gateway)
    # The chat, Responses and Messages endpoints are plain Starlette routes, which FastAPI
    # alone leaves out.
    assert ("post", "/v1/chat/completions") in served
    assert served == documented


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_every_reference_resolves_and_errors_are_documented(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    refs = set(_refs(document))
    assert refs, "the document references no schemas"
    for ref in refs:
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), "operation ids must be unique (OpenAPI 3.1)"
    for path, item in document["paths"].items():
        for method, op in item.items():
            # FastAPI's 422 is never sent: a bad request is a 400 in the one error shape.
            assert "422" not in op["responses"], (method, path)
            error = op["responses"]["default"]["content"]["application/json"]["schema"]
            want = "AnthropicError" if path.startswith("/v1/messages") else "Error"
            assert error == {"$ref": f"#/components/schemas/{want}"}, (method, path)


def _validator(document: dict[str, Any], path: str) -> jsonschema.Draft202012Validator:
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    root = {**body["schema"], "components": document["components"]}
    return jsonschema.Draft202012Validator(root)


def _capture(sent: list[bytes], client: Any = httpx.Client) -> Any:
    """An HTTP client for an SDK that keeps the body of every POST it sends."""

    def keep(request: Any) -> None:
        if request.method == "POST":
            sent.append(request.read())

    return client(event_hooks={"request": [keep]})


def test_the_bodies_real_clients_send_are_valid_under_the_document(
    gateway: Gateway, document: dict[str, Any]
) -> None:
    sent: list[bytes] = []
    client = OpenAI(base_url=gateway.base_url, api_key="unused", http_client=_capture(sent))
    tool: Any = {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "who founded el pollo loco"}]},
    ]
    client.chat.completions.create(
        model="xrouter",
        messages=messages,
        tools=[tool],
        temperature=0.2,
        max_completion_tokens=64,
        stream_options={"include_usage": True},
        stream=True,
        extra_body={"xrouter": {"cost_weight": 1.0}},
    ).close()
    client.responses.create(model="xrouter", input="who founded el pollo loco", store=False)
    anthropic.Anthropic(
        base_url=gateway.url, api_key="unused", http_client=_capture(sent, httpx2.Client)
    ).messages.create(
        model="xrouter",
        max_tokens=64,
        system="Be brief.",
        messages=[{"role": "user", "content": "who founded el pollo loco"}],
    )
    chat, response, message = (orjson.loads(b) for b in sent)
    assert not list(_validator(document, "/v1/chat/completions").iter_errors(chat))
    assert not list(_validator(document, "/v1/responses").iter_errors(response))
    assert not list(_validator(document, "/v1/messages").iter_errors(message))
    # And the document is not so loose that it takes anything.
    assert list(_validator(document, "/v1/chat/completions").iter_errors({"model": "x"}))


def _answer_schema(document: dict[str, Any], method: str, path: str, status: int) -> Any:
    op = document["paths"][path][method.lower()]
    documented = op["responses"].get(str(status)) or op["responses"]["default"]
    return {
        **documented["content"]["application/json"]["schema"],
        "components": document["components"],
    }


def test_real_answers_are_valid_under_the_document(secured: Gateway) -> None:
    """Every endpoint's real answer, success or error, against what the document says it
    answers: the response models describe the dicts the routes write, so this is where
    they would drift apart."""
    doc = httpx.get(f"{secured.url}/openapi.json", timeout=10).json()
    checked: list[str] = []

    def check(method: str, path: str, r: httpx.Response, status: int) -> Any:
        assert r.status_code == status, (method, path, r.text)
        schema = _answer_schema(doc, method, path, status)
        errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(r.json())]
        assert not errors, (method, path, errors)
        checked.append(f"{method} {path} {status}")
        return r.json()

    with httpx.Client(base_url=secured.url, timeout=30) as http:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        created = check(
            "POST",
            "/admin/keys",
            http.post("/admin/keys", headers=admin, json={"alias": "doc", "budget_usd": 1}),
            201,
        )
        kid, user = created["key_id"], {"authorization": f"Bearer {created['key']}"}
        prompt = "who is the founder of el pollo loco"
        chat = check(
            "POST",
            "/v1/chat/completions",
            http.post(
                "/v1/chat/completions",
                headers=user,
                json={"model": "xrouter", "messages": [{"role": "user", "content": prompt}]},
            ),
            200,
        )
        check(
            "POST",
            "/v1/responses",
            http.post("/v1/responses", headers=user, json={"model": "xrouter", "input": prompt}),
            200,
        )
        anthropic_body = {
            "model": "xrouter",
            "max_tokens": 32,
            "messages": [{"role": "user", "content": prompt}],
        }
        check(
            "POST",
            "/v1/messages",
            http.post("/v1/messages", headers=user, json=anthropic_body),
            200,
        )
        check(
            "POST",
            "/v1/messages/count_tokens",
            http.post("/v1/messages/count_tokens", headers=user, json=anthropic_body),
            200,
        )
        # Errors, in each API's shape.
        check("POST", "/v1/messages", http.post("/v1/messages", headers=user, json={}), 400)
        check("POST", "/v1/chat/completions", http.post("/v1/chat/completions", json={}), 401)
        check("GET", "/v1/models", http.get("/v1/models", headers=user), 200)
        check("GET", "/v1/models/{model_id}", http.get("/v1/models/xrouter", headers=user), 200)
        rid = chat["xrouter"]["request_id"]
        check(
            "POST",
            "/v1/feedback",
            http.post("/v1/feedback", headers=user, json={"request_id": rid, "score": 1}),
            200,
        )
        check(
            "GET",
            "/v1/generation",
            http.get("/v1/generation", headers=user, params={"id": rid}),
            200,
        )
        check("GET", "/v1/key", http.get("/v1/key", headers=user), 200)
        check("GET", "/admin/keys", http.get("/admin/keys", headers=admin), 200)
        check("GET", "/admin/keys/{key_id}", http.get(f"/admin/keys/{kid}", headers=admin), 200)
        check(
            "PATCH",
            "/admin/keys/{key_id}",
            http.patch(f"/admin/keys/{kid}", headers=admin, json={"rpm": 100}),
            200,
        )
        check(
            "POST",
            "/admin/keys/{key_id}/rotate",
            http.post(f"/admin/keys/{kid}/rotate", headers=admin),
            200,
        )
        check(
            "GET",
            "/admin/spend",
            http.get("/admin/spend", headers=admin, params={"group_by": "key,model"}),
            200,
        )
        check("GET", "/admin/pricing", http.get("/admin/pricing", headers=admin), 200)
        check("GET", "/admin/router", http.get("/admin/router", headers=admin), 200)
        check("DELETE", "/admin/cache", http.delete("/admin/cache", headers=admin), 409)
        check("POST", "/admin/reload", http.post("/admin/reload", headers=admin), 200)
        check(
            "DELETE", "/admin/keys/{key_id}", http.delete(f"/admin/keys/{kid}", headers=admin), 200
        )
        check("GET", "/healthz", http.get("/healthz"), 200)
        check("GET", "/readyz", http.get("/readyz"), 200)
    # Every JSON operation of the document was answered at least once.
    json_ops = {
        f"{m.upper()} {p}"
        for p, item in doc["paths"].items()
        for m, op in item.items()
        # (HEAD answers carry no body to check)
        if m != "head" and "application/json" in next(iter(op["responses"].values()))["content"]
    }
    assert json_ops <= {c.rsplit(" ", 1)[0] for c in checked}


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("POST", "/admin/pricing", "GET"),
        # Two routes on one path: both methods, not only the first route's.
        ("OPTIONS", "/admin/keys", "GET, POST"),
        ("PUT", "/admin/keys/key_x", "GET, PATCH, DELETE"),
    ],
)
def test_a_wrong_method_is_a_405_that_names_the_allowed_ones(
    gateway: Gateway, method: str, path: str, allowed: str
) -> None:
    r = httpx.request(method, f"{gateway.url}{path}", headers=ADMIN, timeout=10)
    assert r.status_code == 405
    assert r.headers["allow"] == allowed
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert allowed in error["message"] and path in error["message"]


def test_an_endpoint_the_gateway_does_not_serve_is_a_404_naming_it(gateway: Gateway) -> None:
    """An SDK call the gateway has no route for (embeddings) says what was asked for, and
    carries a request id as every other answer does."""
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="xrouter", input="hello")
    assert "POST /v1/embeddings is not served" in err.value.message
    assert err.value.request_id
    assert isinstance(err.value.body, dict) and err.value.body["type"] == "not_found_error"


def _chat_requests(gateway: Gateway) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "xrouter_requests_total" and sample.labels.get("api") == "chat"
    )


def test_the_api_is_served_at_the_root_too(gateway: Gateway) -> None:
    """An OpenAI client given the gateway's root (as LiteLLM proxy's quick start writes its
    address, and its ``litellm_proxy/`` provider takes it) is served as under ``/v1``: it
    was a 404. The request is the ``/v1`` endpoint's to every middleware: counted as one."""
    root = OpenAI(base_url=gateway.url, api_key="unused", max_retries=0)
    before = _chat_requests(gateway)
    answer = root.chat.completions.create(
        model="xrouter", messages=[{"role": "user", "content": "x"}]
    )
    assert answer.choices[0].message.content
    assert "xrouter" in {m.id for m in root.models.list()}
    assert root.models.retrieve("xrouter").id == "xrouter"
    assert root.responses.create(model="xrouter", input="x").output_text
    chunks = list(
        root.chat.completions.create(
            model="xrouter", messages=[{"role": "user", "content": "x"}], stream=True
        )
    )
    assert chunks and chunks[-1].usage is not None
    assert _chat_requests(gateway) == before + 2  # the chat API's, as under /v1
    # Only the API's own segments: the root's other paths are as they were.
    for path in ("/v1", "/chat", "/healthz/x", "/admin/keys/x/y"):
        r = httpx.post(f"{gateway.url}{path}", timeout=10)
        assert r.status_code in (401, 403, 404, 405), (path, r.status_code)
        assert "/v1/healthz" not in r.text and "/v1/admin" not in r.text


def test_a_wrong_base_url_is_a_404_that_names_the_right_one(gateway: Gateway) -> None:
    """The two base URLs clients are given by mistake — an Anthropic client at ``/v1``, an
    OpenRouter-style ``/api/v1`` — each say which path was meant and which base URL to
    give, in the meant API's error shape; a path no base URL makes served stays plain."""
    claude = anthropic.Anthropic(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as aerr:
        claude.messages.create(
            model="xrouter", max_tokens=16, messages=[{"role": "user", "content": "x"}]
        )
    assert isinstance(aerr.value.body, dict) and aerr.value.body["type"] == "error"
    assert "POST /v1/messages is: the base URL has /v1 twice" in aerr.value.message

    openrouter = OpenAI(base_url=f"{gateway.url}/api/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        openrouter.chat.completions.create(
            model="xrouter", messages=[{"role": "user", "content": "x"}]
        )
    assert "POST /v1/chat/completions is" in err.value.message and "/api/v1" in err.value.message

    # Nothing served at the meant path (for this method): the plain 404, no advice.
    for method, path in [("POST", "/embeddings"), ("GET", "/api/v1/nope"), ("GET", "/nope")]:
        r = httpx.request(method, f"{gateway.url}{path}", timeout=10)
        assert r.status_code == 404
        assert r.json()["error"]["message"] == f"{method} {path} is not served by this gateway"


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions/", "openai"), ("/v1/messages/", "anthropic"), ("/healthz/", "openai")],
)
def test_a_trailing_slash_is_a_404_naming_the_path_not_a_redirect(
    gateway: Gateway, path: str, shape: str
) -> None:
    r = httpx.post(f"{gateway.url}{path}", json={}, headers={"host": "elsewhere.example"})
    assert r.status_code == 404 and "location" not in r.headers
    error = r.json()["error"]
    assert error["type"] == "not_found_error" and f"POST {path}" in error["message"]
    assert (r.json().get("type") == "error") == (shape == "anthropic")


def test_the_server_answers_as_the_document_says(gateway: Gateway) -> None:
    """schemathesis generates requests from the document — valid ones, and invalid ones
    that must be refused with a 4xx — for every operation, against the live gateway."""
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
    results = list(schema.get_all_operations())
    assert all(isinstance(r, Ok) for r in results), [r for r in results if not isinstance(r, Ok)]
    operations = [r.ok() for r in results if isinstance(r, Ok)]
    assert len(operations) >= 20
    for operation in operations:
        strategy = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(
            GenerationMode.NEGATIVE
        )

        @given(case=strategy)
        # Derandomized: the same requests on every run, so CI is repeatable; a wider
        # search is the CLI command in the README.
        @settings(
            max_examples=20,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def answers_as_documented(case: Any) -> None:
            # Every check but one: a request valid under the schema may still be refused
            # for a rule a schema cannot state (an ``after`` cursor naming no key, a tool
            # message with no content), and is then a documented 400.
            case.call_and_validate(headers=ADMIN, excluded_checks=[positive_data_acceptance])

        try:
            answers_as_documented()
        except Exception as exc:
            raise AssertionError(f"{operation.label}: {exc}") from exc
