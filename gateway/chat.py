"""The chat-completions service: validate, resolve the policy, admit, answer from the cache
or run the loop, respond (``gateway.render``).

The routes (chat, and the Responses and Messages APIs' translations) are thin shells over
``ChatService.handle``. Everything a request costs is known here, so this is where it is
handed to the hooks that write the ledger row and the metrics.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from typing import Any

from starlette.responses import Response

from gateway.cache import AnswerCache, CachedAnswer, price_tag
from gateway.chat_request import parse_request, validate_request
from gateway.chat_routing import Resolved, build_context, resolve, route_pool
from gateway.disconnect import ClientGone, ClientWatch
from gateway.errors import (
    APIError,
    from_provider_error,
    internal_error,
    shutting_down,
    upstream_error,
)
from gateway.hooks import KeyBudgetGuard, RequestHooks, RequestLog
from gateway.ledger.records import end_user
from gateway.off_loop import read_sized
from gateway.principal import Principal
from gateway.render import Renderer, id_headers, streamed_text_only
from gateway.runtime import Runtime
from gateway.schemas import ChatCompletionRequest
from router.policy import Decision, LoopState, RouteContext
from router.providers.errors import ProviderError
from router.route_result import NoAnswer, RequestTimeout, RouteResult

log = logging.getLogger(__name__)


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
        self,
        get_runtime: Any,
        hooks: RequestHooks,
        cache: AnswerCache | None = None,
        *,
        request_timeout_s: float,
    ) -> None:
        self._runtime = get_runtime
        self.hooks = hooks
        self.cache = cache
        # Fixed at start, as the server section is read: the budget holds and parallel slots
        # expire request_timeout_s + 60 s after they are taken, so a reload that lengthened
        # it would let a request outlive its own slot.
        self.request_timeout_s = request_timeout_s
        self.render = Renderer(hooks, self._remember)

    async def handle(
        self,
        raw: bytes | dict[str, Any],
        who: Principal,
        api: str = "chat",
        watch: ClientWatch | None = None,
        body_bytes: int = 0,
    ) -> Response:
        """Answer a chat request: its body as sent, or already decoded (the Responses API
        hands over the chat request it translated to, with ``api="responses"`` for the
        ledger; it is validated all the same). ``watch``: the client's connection, whose
        hang-up stops the routing (:mod:`gateway.disconnect`). ``body_bytes``: the size of
        the body a decoded request came in, which decides whether it is read off the event
        loop (:mod:`gateway.off_loop`), as a raw body's own size does."""
        t0 = time.perf_counter()
        request_id = secrets.token_hex(16)
        if watch is not None:
            watch.request_id = request_id
        rt: Runtime = self._runtime()
        rlog = RequestLog(
            request_id=request_id, created_at=time.time(), principal=who, t0=t0, api=api
        )
        try:
            size = len(raw) if isinstance(raw, bytes) else body_bytes
            prepare = functools.partial(self._prepare, rt, raw, who, rlog)
            data, req, resolved, ctx = await read_sized(size, prepare)
            rlog.messages = data["messages"]
            rlog.stream = req.stream
            # The end user by either of OpenAI's names for it: `user`, else the newer
            # `safety_identifier` it recommends in its place (the Messages API's
            # metadata.user_id arrives as `user`).
            rlog.end_user = end_user(req.user) or end_user(req.safety_identifier)
            # Filed under xrouter.tags, else LiteLLM's metadata.tags (as its proxy files them).
            rlog.tags = (req.xrouter.tags if req.xrouter is not None else None) or (
                req.metadata.tags if req.metadata is not None else None
            )
            guard: KeyBudgetGuard | None = await self.hooks.admit(rlog, ctx)
            # request_timeout_s bounds the whole request (a relayed stream's deadline counts
            # from t0 too): time spent waiting for an identical request's answer is taken
            # from what the routing has left, else a follower would route afresh after the
            # wait and outlast its timeout (its stream cut at the deadline, the call paid).
            timeout_s = self.request_timeout_s
            if self.cache is not None and not (req.stream and req.n > 1):
                left_s = timeout_s - (time.perf_counter() - t0)
                # Guarded as the routing is: a request waiting for an identical one's answer
                # whose client leaves stops waiting (and is no heir to the lead any more).
                lookup = self._lookup(rt, data, req, who, resolved, rlog, ctx, left_s)
                hit = await (lookup if watch is None else watch.guard(lookup))
                if hit is not None:
                    return await self._answer_from_cache(req, rlog, ctx, hit)
            elif self.cache is not None:
                # A stream of several choices is neither looked up nor stored: said so, as
                # every answer says what the cache did while it is on.
                rlog.extra_headers["x-xrouter-cache"] = "bypass"
            # The run's state is the request's from the start: whatever ends the run (an
            # error, a cancellation), the calls it made reach the ledger row.
            rlog.result_state = rt.orchestrator.new_state(resolved.policy, ctx)
            run = rt.orchestrator.run(
                resolved.policy,
                ctx,
                stream=req.stream,
                guard=guard,
                timeout_s=max(timeout_s - (time.perf_counter() - t0), 0.0),
                state=rlog.result_state,
            )
            try:
                result = await (run if watch is None else watch.guard(run))
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
                    exc.error_kind,
                    last.error if last and last.error else str(exc),
                    transient=exc.transient,
                    retry_after_s=exc.retry_after_s,
                ) from None
            except ProviderError as err:
                raise from_provider_error(err) from None
        except APIError as err:
            await self._refused(rlog, err)
            # The rate-limit headers too: a request refused after admission counted in the
            # key's window, and the client paces itself by them.
            return err.response({**rlog.extra_headers, **id_headers(request_id)})
        except ClientGone:
            # Hung up before the answer started: booked as a stream cut short is, with the
            # calls made so far; nobody reads this response.
            rlog.status = 499
            await self.hooks.finish(rlog, None)
            return Response(status_code=499, headers=id_headers(request_id))
        except asyncio.CancelledError:
            # The server gave up on the request (a shutdown past its grace period; a client
            # that left is ClientGone): the client gets a 503 (gateway.errors), which the
            # row says, with the calls already made, which were paid for.
            failure = shutting_down()
            rlog.status, rlog.error_type = failure.status, failure.code
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
            return self.render.stream(req, rlog, result, self.request_timeout_s)
        if req.stream:
            return self.render.text_stream(req, rlog, result, self.request_timeout_s)
        return await self.render.json(rlog, result)

    @staticmethod
    def _prepare(
        rt: Runtime, raw: bytes | dict[str, Any], who: Principal, rlog: RequestLog
    ) -> tuple[dict[str, Any], ChatCompletionRequest, Resolved, RouteContext]:
        """The request read, validated and resolved to its policy and route context: CPU in
        proportion to its messages and tools, run in a worker thread for a large body
        (``gateway.off_loop``). What it learns goes on ``rlog`` as it goes, so that a
        refusal's ledger row names the model and policy it got that far with."""
        data, req = validate_request(raw) if isinstance(raw, dict) else parse_request(raw)
        rlog.requested_model = req.model
        resolved = resolve(rt, req, who)
        rlog.policy = resolved.policy_name
        return data, req, resolved, build_context(rt, data, req, who, resolved, rlog.request_id)

    def check(self, data: dict[str, Any], who: Principal) -> None:
        """Refuse ``data`` (a decoded chat request) as ``handle`` refuses it before routing
        it: its validation, the model or policy it names and whether the key may use it,
        the pool it may be routed to (``xrouter.models``, the models that read its input).
        Nothing is routed, called, admitted against the key's limits or written to the
        ledger: for ``POST /v1/messages/count_tokens``, which answers the same body as
        ``POST /v1/messages`` without asking a model."""
        rt: Runtime = self._runtime()
        data, req = validate_request(data)
        route_pool(rt, req, who, resolve(rt, req, who), data)

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
                # And, for a router, their prices in this request's snapshot: a cost-aware
                # policy decides by them, so once a reload changes them an answer routed
                # under the old ones is not served (as one routed by a checkpoint is not
                # once another is deployed). A pinned model answers the same at any price.
                "prices": None
                if resolved.pinned is not None
                else [price_tag(m.price) for m in ctx.pool],
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
            return self.render.text_stream(req, rlog, result, self.request_timeout_s)
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
