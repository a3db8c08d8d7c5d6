"""The xRouter policy: a router model with tool calling decides, turn by turn, to answer
itself, call downstream models (in parallel), select an answer, or synthesize one.

The router model is any OpenAI-compatible chat endpoint with tool calling; in production,
vLLM with a tool parser (see deploy/vllm/). Its tokens are priced and count in the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from pricing import ModelPrice, TokenUsage
from router.outcomes import conversation_text
from router.policy import (
    Answer,
    Call,
    CallOutcome,
    LoopState,
    Policy,
    RouteContext,
    Select,
    Step,
    ToolCall,
)
from router.pool import PoolModel
from router.providers.base import Provider
from router.providers.errors import ProviderError, retry_delay, waits_too_long
from router.providers.usage import prompt_tokens_estimate
from router.tools import (
    MAX_TEMPERATURE,
    SELECT_TOOL,
    router_tools,
    tool_map,
    tool_result_text,
)

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = """You are xRouter, a cost-aware router. You can answer the user yourself or \
call downstream models through tools; every call costs money (prices are in the tool descriptions).
- Answer trivial queries (greetings, simple facts, short arithmetic) yourself, without tools.
- Otherwise call the cheapest model that is adequate for the task.
- Call several models in parallel only when the task is hard or high-stakes and comparing \
answers pays for the extra cost.
- When a model's answer is good, return it with select_response(tool_call_id) instead of \
rewriting it. Write your own final answer only to combine or correct answers.
- Never copy the user's query into a model's system_prompt: the model receives the full \
conversation already."""


def cost_weight_line(cost_weight: float) -> str:
    """The system-prompt line that tells a λ-conditioned router model the request's
    trade-off. A router trained on verl (``training.verl``) sees it in every training
    prompt, with λ drawn per prompt, so one checkpoint serves every trade-off; serve it with
    ``router.llm.cost_weight_in_prompt: true`` so it sees the same line."""
    # + 0.0 turns -0.0 (a valid request value, being >= 0) into 0.0: "-0" is not a λ the
    # router was trained on.
    return (
        f"Cost weight for this request: lambda = {cost_weight + 0.0:g}. The reward is the answer's "
        "quality minus lambda times its normalized cost: with a higher lambda, spend less."
    )


def router_system_prompt(
    cost_weight: float | None, system_prompt: str = DEFAULT_SYSTEM_PROMPT
) -> str:
    """The router's system message; with a cost weight, ends with ``cost_weight_line``."""
    if cost_weight is None:
        return system_prompt
    return f"{system_prompt}\n\n{cost_weight_line(cost_weight)}"


class LLMRouterPolicy(Policy):
    name = "llm"

    def __init__(
        self,
        provider: Provider,
        router_model: PoolModel,
        *,
        temperature: float = 0.0,
        system_prompt: str | None = None,
        cost_weight_in_prompt: bool = False,
        on_query_copy: Any = None,
        empty_answer_falls_back: bool = True,
    ) -> None:
        self.provider = provider
        # Serving: an empty answer from the router — or a last turn with no call it can
        # make — is replaced by the best answer bought (or the cheapest model's), since a
        # client asked for one. Training: it must earn nothing, or a router that learns to
        # say nothing is paid the fallback's reward.
        self.empty_answer_falls_back = empty_answer_falls_back
        self.router_model = router_model
        self.temperature = temperature
        # Greedy decoding picks its tools deterministically: each choice has probability 1.
        # Sampled, the probability of a tool choice is not what the server returns (a token
        # sequence's is not its action's), so it is logged as unknown and the export leaves
        # such requests out of off-policy data rather than claim 1.0.
        self._propensity: float | None = 1.0 if temperature == 0 else None
        self.system_prompt = system_prompt or DEFAULT_SYSTEM_PROMPT
        self.cost_weight_in_prompt = cost_weight_in_prompt
        self._on_query_copy = on_query_copy

    @property
    def price(self) -> ModelPrice:
        return self.router_model.price

    def _report_results(self, state: LoopState) -> None:
        """Append a message for every call result the router has not seen yet."""
        seen: set[str] = state.notes.setdefault("reported", set())
        for o in state.outcomes:
            if o.call.id not in seen:
                seen.add(o.call.id)
                state.transcript.append(_result_message(state, o))
        for bad in state.notes.pop("select_errors", []):
            state.transcript.append(
                {
                    "role": "user",
                    "content": f"select_response failed: {bad!r} is not a successful tool call. Choose another or answer yourself.",
                }
            )

    def _start_transcript(self, ctx: RouteContext, state: LoopState) -> None:
        if not state.transcript:
            weight = ctx.cost_weight if self.cost_weight_in_prompt else None
            system = router_system_prompt(weight, self.system_prompt)
            state.transcript.append({"role": "system", "content": system})
            state.transcript.extend(ctx.messages)

    def _router_tool_call(self, state: LoopState) -> ToolCall:
        return ToolCall(id=f"router_{state.turn}", model=self.router_model.name)

    def router_call(self, ctx: RouteContext, state: LoopState) -> tuple[ToolCall, int] | None:
        # The next turn's transcript as the step will send it (minus tool results not yet
        # reported: their text is in the outcomes), counted high like every budget estimate:
        # 3 bytes a token over the JSON of the messages and the tool schemas.
        self._start_transcript(ctx, state)
        chars = len(orjson.dumps(state.transcript)) + len(orjson.dumps(router_tools(ctx.pool)))
        reported: set[str] = state.notes.get("reported", set())
        chars += sum(
            len(orjson.dumps(_result_message(state, o)))
            for o in state.outcomes
            if o.call.id not in reported
        )
        prompt = chars // 3 + 8
        worst = self.price.worst_case_micros(prompt, self.router_model.max_output_tokens)
        return self._router_tool_call(state), worst

    async def _call_router(
        self, ctx: RouteContext, state: LoopState
    ) -> tuple[dict[str, Any], str] | None:
        """The router model's message this turn (its content as text) and why it ended;
        None when the router failed (recorded in ``state.router_calls`` either way)."""
        body = {
            "model": self.router_model.upstream_model,
            "messages": state.transcript,
            "tools": router_tools(ctx.pool),
            "tool_choice": "auto",
            "temperature": self.temperature,
            # The turn's output is capped where its budget hold assumed it would be.
            "max_tokens": self.router_model.max_output_tokens,
        }
        call = self._router_tool_call(state)
        started = time.perf_counter()

        def failed(error: str, kind: str, attempts: int) -> CallOutcome:
            # With how long it ran, as a failed downstream call has.
            out = CallOutcome.failed(call, state.turn, started, error, kind, attempts, "router")
            state.router_calls.append(out)
            return out

        # The router model's transient failures (a reset connection, a 503 while vLLM
        # restarts, a 429) are retried as a pool model's are, up to its max_retries: each
        # turn it fails on ends the routing (see step(): the last answer, or the cheapest).
        retries = self.router_model.max_retries
        for attempt in range(retries + 1):
            try:
                resp = await self.provider.complete(self.router_model, body)
                break
            except ProviderError as err:
                # A server that asked for a longer wait than the backoff's cap is not called
                # again in this turn, as a pool model is not (DownstreamClient).
                if not (err.retryable and attempt < retries) or waits_too_long(err):
                    failed(err.message, err.kind, attempt + 1)
                    return None
                delay = retry_delay(attempt, err)
            except asyncio.CancelledError:
                # The request ended (client gone, deadline) with the router's turn in
                # flight: it was made, so it is in the row all the same, and charged its
                # prompt as a downstream call cut in flight is (router.loop._abandoned):
                # the router's server read it, and bills it at the router's price.
                error, kind = state.abandoned()
                cut = failed(f"{error}; usage estimated from the prompt sent", kind, attempt + 1)
                cut.usage = TokenUsage(prompt_tokens=prompt_tokens_estimate(body))
                cut.cost_micros = self.price.cost_micros(cut.usage)
                state.spent_micros += cut.cost_micros
                raise
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                # Cut between attempts: nothing was with the server (a failed attempt is
                # not charged), but the turn was made and its failure is in the row.
                failed(*state.abandoned(), attempt + 1)
                raise
        cost = self.price.cost_micros(resp.usage)
        choices = resp.body.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        msg = first.get("message") if isinstance(first, dict) else None
        # Paid for either way; without a message a turn can be read from (no choices,
        # content that is neither text nor text parts) the router failed this turn.
        message = (
            dict(msg, content=_text(msg.get("content")))
            if isinstance(msg, dict) and _well_formed(msg)
            else None
        )
        usable = message is not None
        state.router_calls.append(
            CallOutcome(
                call=call,
                turn=state.turn,
                ok=usable,
                role="router",
                model=self.router_model.name,
                message=message,
                response=resp.body,
                usage=resp.usage,
                cost_micros=cost,
                latency_ms=resp.latency_ms,
                attempts=attempt + 1,
                error=None if usable else "the router model's answer holds no usable message",
                error_kind=None if usable else "bad_response",
            )
        )
        state.spent_micros += cost
        if message is None:
            return None
        assert isinstance(first, dict)  # a message came from it
        # Cut by its token cap: said as OpenAI says it, if this turn's text is the answer.
        finish = "length" if first.get("finish_reason") == "length" else "stop"
        return message, finish

    async def step(self, ctx: RouteContext, state: LoopState) -> Step:
        self._start_transcript(ctx, state)
        self._report_results(state)
        turn = await self._call_router(ctx, state)
        if turn is None:
            return self._fallback(ctx, state)
        msg, finish = turn
        raw_calls = msg.get("tool_calls")
        tool_calls = _unique_ids(state, raw_calls if isinstance(raw_calls, list) else [])
        text: str = msg["content"]
        refusal = msg.get("refusal") if isinstance(msg.get("refusal"), str) else None
        if not tool_calls and not text.strip() and not refusal and self.empty_answer_falls_back:
            # An empty answer answers nothing: the best answer bought so far, else the
            # cheapest model, as when the router fails.
            return self._fallback(ctx, state)
        state.transcript.append(
            {"role": "assistant", "content": text}
            | ({"tool_calls": tool_calls} if tool_calls else {})
        )
        if not tool_calls:
            state.decision.record("router", self._propensity)
            return Answer(
                text,
                synthesized=bool(state.outcomes),
                finish_reason=finish,
                refusal=refusal,
            )
        return self._parse_tool_calls(ctx, state, tool_calls)

    @staticmethod
    def _fallback(ctx: RouteContext, state: LoopState) -> Step:
        """The router failed (or gave nothing): the best answer so far, else the cheapest
        model's."""
        ok = state.successful()
        if ok:
            return Select(ok[-1].call.id)
        cheapest = ctx.pool.cheapest().name
        state.decision.record(cheapest, 1.0)
        used = _ids_in_use(state)
        call_id, n = f"fallback_{state.turn}", 1
        while call_id in used:  # the router named a call of its own so
            call_id, n = f"fallback_{state.turn}.{n}", n + 1
        state.notes.setdefault("fallback_calls", set()).add(call_id)
        return Call((ToolCall(id=call_id, model=cheapest),), final=True)

    def _parse_tool_calls(
        self, ctx: RouteContext, state: LoopState, tool_calls: list[dict[str, Any]]
    ) -> Step:
        tools = tool_map(ctx.pool)
        calls: list[ToolCall] = []
        query = conversation_text(ctx.messages).strip()
        for tc in tool_calls:
            tc_id = tc.get("id") or f"tc_{state.turn}_{len(calls)}"
            fn = tc.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str):
                self._tool_error(
                    state, tc_id, "invalid_tool_call", "a tool call needs function.name (a string)"
                )
                continue
            assert isinstance(fn, dict)
            raw = fn.get("arguments") or "{}"
            try:
                if not isinstance(raw, str):
                    raise ValueError
                args = orjson.loads(raw)
                if not isinstance(args, dict):
                    raise ValueError
            except (orjson.JSONDecodeError, ValueError):
                self._tool_error(
                    state, tc_id, "invalid_arguments", "arguments must be a JSON object"
                )
                continue
            if name == SELECT_TOOL:
                target = args.get("tool_call_id")
                if not isinstance(target, str):
                    self._tool_error(
                        state, tc_id, "missing_argument", "select_response needs tool_call_id"
                    )
                    continue
                chosen = state.outcome(target)
                if chosen is None or not chosen.ok:
                    self._tool_error(
                        state, tc_id, "not_selectable", f"{target!r} is not a successful call"
                    )
                    continue
                state.decision.record(f"select:{chosen.model}", self._propensity)
                return Select(target)
            model = tools.get(name)
            if model is None:
                self._tool_error(state, tc_id, "unknown_tool", f"no tool named {name!r}")
                continue
            system_prompt = args.get("system_prompt")
            if not isinstance(system_prompt, str):
                self._tool_error(
                    state, tc_id, "missing_argument", f"{name} needs system_prompt (a string)"
                )
                continue
            if query and len(query) >= 20 and query in system_prompt:
                # The seed's router pasted the query into the system prompt, doubling input cost.
                state.notes["query_copies"] = state.notes.get("query_copies", 0) + 1
                if self._on_query_copy is not None:
                    self._on_query_copy()
            temperature = _num(args.get("temperature"), 0.0, MAX_TEMPERATURE)
            max_tokens = _int(args.get("max_tokens"), 1, ctx.pool[model].max_output_tokens)
            calls.append(
                ToolCall(
                    id=tc_id,
                    model=model,
                    system_prompt=system_prompt,
                    temperature=temperature,
                    max_tokens=max_tokens,
                )
            )
        last = state.turn >= ctx.max_turns - 1
        if not calls and last and self.empty_answer_falls_back and not state.successful():
            # The last turn asked for nothing that can be made (every call malformed or
            # unknown), and nothing was bought: the loop would end with no answer — a 502
            # blaming the upstreams, which were never called. Served as an empty answer is
            # (in training it earns nothing, as an empty answer does).
            return self._fallback(ctx, state)
        # Recorded once they are made: a select_response later in the same message ends the
        # loop, and calls listed before it are never made (no action of the decision).
        for call in calls:
            state.decision.record(call.model, self._propensity)
        return Call(tuple(calls))

    @staticmethod
    def _tool_error(state: LoopState, tc_id: str, kind: str, message: str) -> None:
        state.notes.setdefault("reported", set()).add(tc_id)
        state.transcript.append(
            {
                "role": "tool",
                "tool_call_id": tc_id,
                "content": orjson.dumps({"error": kind, "message": message}).decode(),
            }
        )
        state.notes.setdefault("tool_errors", []).append(kind)


def _text(content: Any) -> str:
    """An assistant message's content as text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _well_formed(msg: dict[str, Any]) -> bool:
    """Whether a router message can be read: its content text, text parts or nothing."""
    content = msg.get("content")
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
    )


def _unique_ids(state: LoopState, tool_calls: list[Any]) -> list[dict[str, Any]]:
    """The router model's tool calls, each with an id no other call of this request has.

    Small router models reuse ids (``call_0`` every turn, or twice in one turn), and holds,
    settles, results and ``select_response`` are all keyed by the id; a reused or missing
    one is renamed here, before the transcript records it, so the router reads the results
    under the ids it is then shown."""
    used = _ids_in_use(state)
    out: list[dict[str, Any]] = []
    for i, tc in enumerate(tool_calls):
        if not isinstance(tc, dict):
            continue
        given = tc.get("id")
        tc_id = given if isinstance(given, str) and given else f"tc_{state.turn}_{i}"
        base, n = tc_id, 1
        while tc_id in used:
            tc_id, n = f"{base}~{state.turn}.{n}", n + 1
        used.add(tc_id)
        out.append(tc if tc_id == given else {**tc, "id": tc_id})
    return out


def _result_message(state: LoopState, o: CallOutcome) -> dict[str, Any]:
    """The message that reports a call's result to the router: a tool message answering its
    call, or for a fallback the gateway made after a failed router turn (one that answered
    ended the request), a note. The router made no such call, and a tool message answering
    a call no assistant message holds is a 400 on strict servers: every later turn would
    fail, and fall back again."""
    model = o.model or o.call.model
    if o.call.id in state.notes.get("fallback_calls", ()):
        return {
            "role": "user",
            "content": f"The gateway called {model} itself after a failed turn, and that call "
            f"failed ({o.error_kind or 'failed'}): it cannot be selected. Call a model or "
            "answer yourself.",
        }
    if o.ok:
        content = tool_result_text(o.call.id, model, o.text)
    else:
        content = orjson.dumps(
            {"error": o.error_kind or "failed", "message": o.error, "selectable": False}
        ).decode()
    return {"role": "tool", "tool_call_id": o.call.id, "content": content}


def _ids_in_use(state: LoopState) -> set[Any]:
    """The ids of this request's calls: the router's (its transcript's) and the gateway's
    own fallbacks (in no transcript)."""
    return {
        tc.get("id")
        for m in state.transcript
        if m.get("role") == "assistant"
        for tc in (m.get("tool_calls") or ())
        if isinstance(tc, dict)
    } | {o.call.id for o in state.outcomes}


def _num(v: Any, lo: float, hi: float) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return max(lo, min(float(v), hi))
    return None


def _int(v: Any, lo: int, hi: int) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return max(lo, min(v, hi))
    return None
