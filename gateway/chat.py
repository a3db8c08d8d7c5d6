"""The chat-completions service: validate, resolve the policy, admit, answer from the cache
or run the loop, respond (``gateway.render``).

The routes (chat, and the Responses and Messages APIs' translations) are thin shells over
``ChatService.handle``. Everything a request costs is known here, so this is where it is
handed to the hooks that write the ledger row and the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.responses import Response

from gateway.cache import AnswerCache, CachedAnswer
from gateway.errors import (
    APIError,
    bad_request,
    forbidden,
    from_provider_error,
    internal_error,
    loc_to_param,
    not_found,
    upstream_error,
)
from gateway.hooks import KeyBudgetGuard, RequestHooks, RequestLog
from gateway.ledger.records import end_user
from gateway.render import Renderer, id_headers, streamed_text_only
from gateway.runtime import POLICY_PREFIX, ROUTER_MODEL, Runtime
from gateway.schemas import ChatCompletionRequest
from pricing import usd_to_micros
from router.loop import NoAnswer, RequestTimeout, RouteResult
from router.modalities import request_modalities
from router.policy import (
    Call,
    Decision,
    LoopState,
    Policy,
    RouteContext,
    Select,
    Step,
    ToolCall,
)
from router.providers.errors import ProviderError

log = logging.getLogger(__name__)

_KNOWN_FIELDS = frozenset(ChatCompletionRequest.model_fields)
# Fields that shape routing or the gateway's response, never forwarded as model parameters.
_NOT_PARAMS = frozenset({"model", "messages", "tools", "stream", "stream_options", "xrouter"})


class PassThrough(Policy):
    """``model: <pool model>``: call exactly that model (with its configured fallbacks)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.name = "passthrough"

    async def step(self, ctx: RouteContext, state: LoopState) -> Step:
        if state.turn == 0:
            state.decision.record(self.model, 1.0)
            return Call((ToolCall(id="call_0", model=self.model),), final=True)
        ok = state.successful()
        return Select(ok[0].call.id) if ok else Call(())


@dataclass(slots=True)
class Principal:
    """Who is calling: an API key, or nobody when auth is off."""

    key_id: str | None = None
    alias: str | None = None
    allowed_models: list[str] | None = None
    allowed_policies: list[str] | None = None
    limits: Any = None
    expires_at: float | None = None  # Unix time after which the key is refused
    # The key's routing defaults: what its requests get when they do not say.
    default_policy: str | None = None
    cost_weight: float | None = None
    max_cost_micros: int | None = None


@dataclass(slots=True)
class Resolved:
    policy: Policy
    policy_name: str
    passthrough: bool
    pool_names: list[str] = field(default_factory=list)


# orjson reads JSON nested up to 1,024 levels deep but writes at most 254: a body read at
# 300 levels could not be forwarded, logged or cached, and failed as a 500 once routed.
# Bodies are refused (400) past what can be written back with this many levels to spare
# for what the gateway wraps around a request's values (a ledger row, a cache key).
_WRAP_LEVELS = 16
_MAX_DEPTH = 254 - _WRAP_LEVELS
# How the depth is checked: writing the body back costs time in proportion to its bytes
# (~1 µs per KB: 4.6 ms for a 5 MB base64 image), walking its arrays and objects in
# proportion to how many there are (~1 µs each: 1.5 ms for 50 tools' schemas, 10 µs for
# the image). Small bodies are written back; a large one is walked — most of a large body
# is one long string — up to this many containers, then written back.
_WALK_FROM_BYTES = 256 * 1024
_WALK_CONTAINERS = 5_000


def _written_back_fits(data: Any) -> bool:
    wrapped: Any = data
    for _ in range(_WRAP_LEVELS):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except TypeError:  # orjson's "Recursion limit reached": nothing else it read can fail
        return False
    return True


def _walked_fits(data: Any) -> bool | None:
    """Whether no array or object lies deeper than ``_MAX_DEPTH``; None past
    ``_WALK_CONTAINERS`` containers (undecided)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    seen = 0
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return False
        seen += 1
        if seen > _WALK_CONTAINERS:
            return None
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return True


def decode_json(raw: bytes) -> Any:
    """A request body's JSON, or the 400 ``invalid_json`` error (every JSON endpoint's)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict | list):
        return data
    fits = _walked_fits(data) if len(raw) >= _WALK_FROM_BYTES else None
    if fits is None:
        fits = _written_back_fits(data)
    if not fits:
        raise bad_request(
            "request body is nested too deeply (arrays and objects within each other)",
            code="invalid_json",
        )
    return data


def _parse(raw: bytes) -> tuple[dict[str, Any], ChatCompletionRequest]:
    return _validate(decode_json(raw))


def _validate(data: Any) -> tuple[dict[str, Any], ChatCompletionRequest]:
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = loc_to_param(err["loc"])
        raise bad_request(f"{param}: {err['msg']}" if param else err["msg"], param=param) from None
    unknown = data.keys() - _KNOWN_FIELDS
    if unknown:
        log.debug("tolerating unknown request fields: %s", sorted(unknown)[:10])
    _check_messages(req)
    if not req.tools:
        data = _without_tool_settings(data, req)
    return data, req


# Roles whose message is nothing without its content (an assistant's may be only tool calls
# or a refusal; a legacy function result's may be null).
_CONTENT_REQUIRED = frozenset({"system", "developer", "user", "tool"})


def _check_messages(req: ChatCompletionRequest) -> None:
    """What OpenAI's API requires of each message beyond its types: a provider refuses a
    user message without content or a tool result without the call it answers, and its 400
    would reach the client as a 502."""
    for i, m in enumerate(req.messages):
        if (m.content is None or m.content == []) and m.role in _CONTENT_REQUIRED:
            raise bad_request(
                f"messages[{i}].content: a {m.role} message needs its content",
                param=f"messages[{i}].content",
            )
        if m.role == "tool" and not m.tool_call_id:
            raise bad_request(
                f"messages[{i}].tool_call_id: a tool message answers a call: name it",
                param=f"messages[{i}].tool_call_id",
            )


def _without_tool_settings(data: dict[str, Any], req: ChatCompletionRequest) -> dict[str, Any]:
    """A request without tools, without what only tools give meaning to. Chat APIs refuse
    ``tool_choice``, ``parallel_tool_calls`` and an empty ``tools`` list without a tool to
    call (OpenAI's is a 400; here it was a 502, which the SDKs retry), and clients send them
    anyway (an agent's settings, with its tools left out). ``auto``, ``none`` and
    ``parallel_tool_calls`` then say what no tools says, and are dropped (as the Responses
    translation drops them); a choice that forces a call is the client's error."""
    choice = req.tool_choice
    if choice is not None and choice not in ("auto", "none"):
        raise bad_request(
            "tool_choice: a tool call is required but the request offers no tools",
            param="tool_choice",
        )
    dropped = ("tools", "tool_choice", "parallel_tool_calls")
    return {k: v for k, v in data.items() if k not in dropped}


def _resolve(rt: Runtime, req: ChatCompletionRequest, who: Principal) -> Resolved:
    name = req.model
    if name == ROUTER_MODEL or name.startswith(POLICY_PREFIX):
        default = who.default_policy or rt.default_policy
        policy_name = default if name == ROUTER_MODEL else name[len(POLICY_PREFIX) :]
        policy = rt.policy(policy_name)
        if policy is None:
            raise not_found(
                f"unknown router policy {policy_name!r}; available: {', '.join(rt.policy_names)}"
            )
        if who.allowed_policies is not None and policy_name not in who.allowed_policies:
            raise forbidden(f"this key may not use policy {policy_name!r}", "policy_not_allowed")
        return Resolved(policy, policy_name, passthrough=False)
    if name not in rt.pool:
        raise not_found(
            f"the model {name!r} does not exist; GET /v1/models lists the available ones"
        )
    if who.allowed_models is not None and name not in who.allowed_models:
        raise forbidden(f"this key may not use model {name!r}", "model_not_allowed")
    return Resolved(PassThrough(name), "passthrough", passthrough=True, pool_names=[name])


def _route_pool(
    rt: Runtime,
    req: ChatCompletionRequest,
    who: Principal,
    resolved: Resolved,
    messages: list[dict[str, Any]],
) -> list[str]:
    if resolved.passthrough:
        return _capable(rt, resolved.pool_names, messages)
    names = rt.pool.names
    if who.allowed_models is not None:
        names = [n for n in names if n in who.allowed_models]
    if req.xrouter and req.xrouter.models:
        unknown = [m for m in req.xrouter.models if m not in rt.pool]
        if unknown:
            raise bad_request(
                f"xrouter.models names unknown models: {unknown}", param="xrouter.models"
            )
        names = [n for n in names if n in req.xrouter.models]
    if not names:
        raise forbidden(
            "no pool model is allowed for this request", "no_allowed_models", "xrouter.models"
        )
    names = _capable(rt, names, messages)
    # Policies choose among models whose circuit is not open (router.health). If every one
    # is open, leave them all: the calls fail fast and the client gets a 503 at once.
    return rt.client.breakers.available(names) or names


def _capable(rt: Runtime, names: list[str], messages: list[dict[str, Any]]) -> list[str]:
    """``names`` without the models that cannot read the request's input (images, audio)."""
    needed = request_modalities(messages)
    if needed == {"text"}:
        return names
    capable = [n for n in names if rt.pool[n].accepts(needed)]
    if not capable:
        kinds = " and ".join(sorted(needed - {"text"}))
        who = f"model {names[0]!r} does not" if len(names) == 1 else "no model it may use does"
        raise bad_request(
            f"the request carries {kinds} input, which {who} accept (input_modalities of the "
            "pool models)",
            param="messages",
            code="unsupported_input",
        )
    return capable


def _max_turns(rt: Runtime, resolved: Resolved) -> int:
    if resolved.passthrough:
        return 1
    if resolved.policy_name == "llm":
        return rt.settings.router.llm.max_turns
    return rt.settings.router.max_turns


def build_context(
    rt: Runtime,
    data: dict[str, Any],
    req: ChatCompletionRequest,
    who: Principal,
    resolved: Resolved,
    request_id: str,
) -> RouteContext:
    controls = req.xrouter
    pool = rt.subset(_route_pool(rt, req, who, resolved, data["messages"]))
    # The request's own controls, else its key's defaults, else the gateway's. A key's cap
    # is a ceiling: a request may ask for less, never more.
    cost_weight = next(
        w
        for w in (
            controls.cost_weight if controls else None,
            who.cost_weight,
            rt.settings.router.cost_weight,
        )
        if w is not None
    )
    caps = [
        usd_to_micros(controls.max_cost_usd) if controls and controls.max_cost_usd else None,
        who.max_cost_micros,
    ]
    max_cost = min((c for c in caps if c is not None), default=None)
    params = {k: v for k, v in data.items() if k not in _NOT_PARAMS}
    return RouteContext(
        request_id=request_id,
        messages=data["messages"],
        pool=pool,
        cost_weight=cost_weight,
        max_cost_micros=max_cost,
        max_turns=_max_turns(rt, resolved),
        tools=data.get("tools"),
        request_params=params,
    )


def _beyond_text_stream(choice: dict[str, Any]) -> bool:
    message = choice.get("message") or {}
    return bool(choice.get("logprobs") or message.get("function_call") or message.get("audio"))


def _from_cache(rlog: RequestLog, ctx: RouteContext, hit: CachedAnswer) -> RouteResult:
    """A cached answer as the loop's result: no calls, nothing spent, no decision made."""
    state = LoopState(decision=Decision(policy=rlog.policy, cost_weight=ctx.cost_weight))
    response = None
    if hit.model is not None:
        response = {
            "object": "chat.completion",
            "created": int(rlog.created_at),
            "choices": hit.choices,
        }
    return RouteResult(
        state=state,
        message=hit.message,
        response=response,
        final_model=hit.model,
        finish_reason=hit.finish_reason,
        extras={"cache": hit},
    )


class ChatService:
    def __init__(
        self, get_runtime: Any, hooks: RequestHooks, cache: AnswerCache | None = None
    ) -> None:
        self._runtime = get_runtime
        self.hooks = hooks
        self.cache = cache
        self.render = Renderer(hooks, self._remember)

    async def handle(
        self, raw: bytes | dict[str, Any], who: Principal, api: str = "chat"
    ) -> Response:
        """Answer a chat request: its body as sent, or already decoded (the Responses API
        hands over the chat request it translated to, with ``api="responses"`` for the
        ledger; it is validated all the same)."""
        t0 = time.perf_counter()
        request_id = secrets.token_hex(16)
        rt: Runtime = self._runtime()
        rlog = RequestLog(
            request_id=request_id, created_at=time.time(), principal=who, t0=t0, api=api
        )
        try:
            data, req = _validate(raw) if isinstance(raw, dict) else _parse(raw)
            rlog.requested_model = req.model
            resolved = _resolve(rt, req, who)
            rlog.policy = resolved.policy_name
            ctx = build_context(rt, data, req, who, resolved, request_id)
            rlog.messages = data["messages"]
            rlog.stream = req.stream
            rlog.end_user = end_user(req.user)
            rlog.tags = req.xrouter.tags if req.xrouter is not None else None
            guard: KeyBudgetGuard | None = await self.hooks.admit(rlog, ctx)
            # request_timeout_s bounds the whole request (a relayed stream's deadline counts
            # from t0 too): time spent waiting for an identical request's answer is taken
            # from what the routing has left, else a follower would route afresh after the
            # wait and outlast its timeout (its stream cut at the deadline, the call paid).
            timeout_s = rt.settings.server.request_timeout_s
            if self.cache is not None and not (req.stream and req.n > 1):
                left_s = timeout_s - (time.perf_counter() - t0)
                hit = await self._lookup(rt, data, req, who, resolved, rlog, ctx, left_s)
                if hit is not None:
                    return await self._answer_from_cache(req, rlog, ctx, hit)
            # The run's state is the request's from the start: whatever ends the run (an
            # error, a cancellation), the calls it made reach the ledger row.
            rlog.result_state = rt.orchestrator.new_state(resolved.policy, ctx)
            try:
                result = await rt.orchestrator.run(
                    resolved.policy,
                    ctx,
                    stream=req.stream,
                    guard=guard,
                    timeout_s=max(timeout_s - (time.perf_counter() - t0), 0.0),
                    state=rlog.result_state,
                )
            except NoAnswer as exc:
                if isinstance(exc, RequestTimeout):
                    # Named by the configured timeout, not by what was left of it.
                    raise upstream_error(
                        "timeout", f"the request did not finish within {timeout_s:g} s"
                    ) from None
                last = exc.last_failure
                if last is not None and last.error_kind == "budget":
                    raise self.hooks.budget_error(
                        rlog, last.error or "budget exceeded", guard
                    ) from None
                raise upstream_error(
                    exc.error_kind, last.error if last and last.error else str(exc)
                ) from None
            except ProviderError as err:
                raise from_provider_error(err) from None
        except APIError as err:
            await self._refused(rlog, err)
            # The rate-limit headers too: a request refused after admission counted in the
            # key's window, and the client paces itself by them.
            return err.response({**rlog.extra_headers, **id_headers(request_id)})
        except asyncio.CancelledError:
            # The server gave up on the request (a shutdown past its grace period): no one
            # reads the answer, but the calls already made were paid for.
            rlog.status = 499
            await self.hooks.finish(rlog, None)
            raise
        except Exception:
            log.exception("request %s failed", request_id)
            failure = internal_error()
            rlog.status, rlog.error_type = failure.status, failure.code
            await self.hooks.finish(rlog, None)
            return failure.response(id_headers(request_id))
        rlog.result = result
        if result.stream is not None:
            return self.render.stream(req, rlog, result, rt.settings.server.request_timeout_s)
        if req.stream:
            return self.render.text_stream(req, rlog, result)
        return await self.render.json(rlog, result)

    def check(self, data: dict[str, Any], who: Principal) -> None:
        """Refuse ``data`` (a decoded chat request) as ``handle`` refuses it before routing
        it: its validation, the model or policy it names and whether the key may use it,
        the pool it may be routed to (``xrouter.models``, the models that read its input).
        Nothing is routed, called, admitted against the key's limits or written to the
        ledger: for ``POST /v1/messages/count_tokens``, which answers the same body as
        ``POST /v1/messages`` without asking a model."""
        rt: Runtime = self._runtime()
        data, req = _validate(data)
        _route_pool(rt, req, who, _resolve(rt, req, who), data["messages"])

    async def refused(self, err: APIError, who: Principal, api: str) -> str:
        """Account for a request refused before it became a chat request (a Responses or
        Messages request its translation refused) as ``handle`` accounts for one it refuses:
        a ledger row and the request metrics, with the error. The request id, for the
        response's ``x-xrouter-request-id``."""
        rlog = RequestLog(
            request_id=secrets.token_hex(16),
            created_at=time.time(),
            principal=who,
            t0=time.perf_counter(),
            api=api,
        )
        await self._refused(rlog, err)
        return rlog.request_id

    async def _refused(self, rlog: RequestLog, err: APIError) -> None:
        rlog.status = err.status
        rlog.error_type = err.code or err.type
        await self.hooks.finish(rlog, None)

    async def _lookup(
        self,
        rt: Runtime,
        data: dict[str, Any],
        req: ChatCompletionRequest,
        who: Principal,
        resolved: Resolved,
        rlog: RequestLog,
        ctx: RouteContext,
        max_wait_s: float,
    ) -> CachedAnswer | None:
        assert self.cache is not None
        ticket = rlog.cache = self.cache.ticket(
            data,
            key_id=who.key_id,
            policy=resolved.policy_name,
            # A deployed router must not answer with its predecessor's choices.
            checkpoint=None if resolved.passthrough else rt.checkpoint_info.get("version"),
            controls=req.xrouter.cache if req.xrouter is not None else None,
            routing={
                "cost_weight": ctx.cost_weight,
                "max_cost_micros": ctx.max_cost_micros,
                # The models the routing could choose from: a key's allow-list, and the
                # circuits open right now. An answer routed around a failing model must not
                # outlive its recovery, nor one routed for a narrower key reach a wider one.
                "pool": ctx.pool.names,
            },
        )

        def usable(answer: CachedAnswer) -> bool:
            # The answering model must still be one this request may use: an operator who
            # removes a model from the pool, or from a key, removes its cached answers too.
            m = answer.model
            allowed = who.allowed_models
            if m is not None and (m not in rt.pool or (allowed is not None and m not in allowed)):
                return False
            # A stream re-rendered from a stored answer carries its text and tool calls: an
            # answer with more (logprobs, a legacy function_call, audio) is served as JSON
            # only, and a stream asking for it is routed afresh.
            return not req.stream or not any(_beyond_text_stream(c) for c in answer.choices)

        # A relayed stream is stored only when its whole answer is text: a streamed request
        # with more (tools, logprobs) would keep identical ones waiting for nothing.
        may_lead = not req.stream or streamed_text_only(req)
        hit = await self.cache.lookup(ticket, usable, may_lead=may_lead, max_wait_s=max_wait_s)
        # A coalesced answer is a hit to the client: another request's answer, for nothing.
        shown = {"error": "miss", "coalesced": "hit"}
        rlog.extra_headers["x-xrouter-cache"] = shown.get(ticket.result, ticket.result)
        return hit

    async def _answer_from_cache(
        self, req: ChatCompletionRequest, rlog: RequestLog, ctx: RouteContext, hit: CachedAnswer
    ) -> Response:
        result = _from_cache(rlog, ctx, hit)
        rlog.result = result
        rlog.cached_from = hit.request_id
        if self.hooks.metrics is not None:
            self.hooks.metrics.cache_saved(rlog.policy, hit.cost_micros)
        if req.stream:
            return self.render.text_stream(req, rlog, result)
        return await self.render.json(rlog, result)

    def _remember(
        self,
        rlog: RequestLog,
        result: RouteResult,
        model: str | None,
        choices: list[dict[str, Any]],
    ) -> None:
        """Offer a served answer to the cache (in the background): only an answer the
        routing gave freely. One it settled for — a call refused by a budget, a failed model
        or its fallback standing in, the best answer at the turn limit — would outlive the
        condition that made it (a raised budget, a recovered model)."""
        if self.cache is None or rlog.cache is None:
            return
        if result.fallback_used or any(
            not o.ok or o.fallback_from is not None
            for o in (*result.state.router_calls, *result.state.outcomes)
        ):
            return
        usage = result.usage().to_openai()
        answer = CachedAnswer(
            rlog.request_id, rlog.created_at, model, choices, usage, result.cost_micros
        )
        self.cache.store(rlog.cache, answer)
