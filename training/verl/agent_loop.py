"""The gateway's orchestration loop as a verl agent loop: RL rollouts of the router model run
the same code that serves it.

``XRouterAgentLoop`` is registered with verl under ``xrouter`` (``agent_loops.yaml``, written
by ``xrouter verl-data``). For each prompt it runs ``router.loop.Orchestrator`` with the
``llm`` policy (``router.policies.llm.LLMRouterPolicy``) exactly as the gateway does — the
system prompt with the prompt's cost weight, the tool schemas, argument checks and error
messages, ``select_response``, the turn limit, the fallback when turns run out — with two
parts swapped for training:

- the router model's endpoint is ``VerlRouterProvider``: the transcript rendered by the
  model's chat template, generated on verl's rollout servers (vLLM on the GPUs), the
  Hermes tool calls parsed by verl's parser; it keeps the trajectory's tokens and the mask
  of the tokens the model generated, which is what verl trains on;
- downstream calls go to ``router.executors.OutcomeExecutor``, which replays each model's
  recorded answer, tokens and cost for this prompt (the table travels in the row).

The reward is computed from the loop's result (``training.verl.reward``) and handed to verl
as the trajectory's score, with every term for its logs. There is no second copy of the
routing loop to drift from the served one (the seed release had two).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from typing import Any

import orjson
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
)
from verl.experimental.agent_loop.tool_parser import ToolParser

from pricing import ModelPrice, TokenUsage
from router.executors import OutcomeExecutor
from router.loop import Orchestrator
from router.outcomes import OutcomeRecord
from router.policies.llm import LLMRouterPolicy
from router.policy import LoopState, RouteContext
from router.pool import ModelPool, PoolModel
from router.providers.base import Provider, ProviderResponse, StreamStats
from router.route_result import NoAnswer, RouteResult
from training.evaluation.loop_router import replay_model
from training.verl.pool import pool_from_json
from training.verl.reward import trajectory_reward

logger = logging.getLogger(__name__)


class VerlRouterProvider(Provider):
    """The router model inside a rollout. One per trajectory: it holds the trajectory's
    token ids (prompt, then every generated and every appended context token), the mask of
    the generated ones and their log-probabilities."""

    def __init__(self, agent: XRouterAgentLoop, sampling_params: dict[str, Any]) -> None:
        self.agent = agent
        self.sampling_params = sampling_params
        self.request_id = uuid.uuid4().hex
        self.prompt_ids: list[int] | None = None
        self.token_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.turns = 0
        self.truncated = False
        self.prompt_too_long = False
        self._seen: list[dict[str, Any]] = []

    async def complete(self, model: PoolModel, body: dict[str, Any]) -> ProviderResponse:
        start = time.perf_counter()
        agent = self.agent
        messages, tools = body["messages"], body.get("tools") or []
        if self.prompt_ids is None:
            self.token_ids = await agent.ct_build_initial_tokens(messages, tools=tools)
            self.prompt_ids = list(self.token_ids)
            if len(self.token_ids) >= agent.prompt_length:
                # verl cuts a prompt over rollout.prompt_length from the left (its
                # warning: "left-truncating"): the system prompt, the tools and the λ line
                # go first, and a router that never saw them would be trained on that. (At
                # exactly the limit it cannot say whether it cut: taken as cut.) No turn:
                # the trajectory ends with nothing, flagged, and costs nothing.
                self.prompt_too_long = True
                return self._response({"role": "assistant", "content": ""}, 0, 0, start)
        else:
            merged, self.mask, logprobs = await agent.ct_merge_context_msg(
                self._seen, messages, self.token_ids, self.mask, self.logprobs or None, tools=tools
            )
            self.token_ids, self.logprobs = merged.token_ids, logprobs or []
        read = len(self.token_ids)
        room = agent.response_length - len(self.mask)
        if room <= 0:
            # Out of room: the trajectory ends with an empty answer (it earns nothing). No
            # turn was generated, so none is charged.
            self.truncated = True
            return self._response({"role": "assistant", "content": ""}, 0, 0, start)
        output = await agent.server_manager.generate(
            request_id=self.request_id,
            prompt_ids=self.token_ids,
            sampling_params=self._sampling(room),
        )
        self.turns += 1
        merged, self.mask, logprobs = await agent.ct_merge_assistant_token(
            self.token_ids,
            output.token_ids,
            self.mask,
            self.logprobs or None,
            assistant_logprobs=output.log_probs or None,
        )
        self.token_ids, self.logprobs = merged.token_ids, logprobs or []
        if len(self.mask) >= agent.response_length:
            # The turn filled the response (cut off, or ending right at the limit): what it
            # says is not acted on, as verl's own tool agent loop stops here. Acting on it
            # would reward a decision whose tokens are cut from what is trained. Its tokens
            # were generated, so they are charged.
            self.truncated = True
            cut: dict[str, Any] = {"role": "assistant", "content": ""}
            self._seen = [*messages, cut]
            return self._response(cut, read, len(output.token_ids), start)
        content, calls = await agent.tool_parser.extract_tool_calls(output.token_ids)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            # Ids as vLLM's OpenAI server assigns them when it serves the router.
            message["tool_calls"] = [
                {
                    "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in calls
            ]
        # The policy appends this message to its transcript; the next call's messages
        # extend exactly this list.
        self._seen = [*messages, message]
        return self._response(message, read, len(output.token_ids), start)

    def _sampling(self, room: int) -> dict[str, Any]:
        # A turn generates at most what is left of the response: verl would let it run to a
        # whole response_length, past what is trained on.
        params = dict(self.sampling_params)
        limit = params.get("max_tokens")
        params["max_tokens"] = room if limit is None else min(int(limit), room)
        stop = self.agent.tool_parser.stop_token_ids
        if stop:
            params["stop_token_ids"] = sorted(set(params.get("stop_token_ids") or []) | set(stop))
        return params

    def _response(
        self, message: dict[str, Any], read: int, written: int, start: float
    ) -> ProviderResponse:
        body = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        return ProviderResponse(
            body, TokenUsage(read, written), (time.perf_counter() - start) * 1000
        )

    def stream(self, model: PoolModel, body: dict[str, Any], stats: StreamStats) -> Any:
        raise NotImplementedError("the router model is never streamed")


@functools.lru_cache(maxsize=8)
def _pool(path: str) -> ModelPool:
    # verl builds an agent loop per trajectory, inside its event loop: read the file once.
    with open(path, "rb") as f:
        return pool_from_json(orjson.loads(f.read()))


class XRouterAgentLoop(AgentLoopBase):
    """verl's agent-loop interface around ``router.loop.Orchestrator`` (see the module)."""

    def __init__(self, *args: Any, pool_path: str, max_turns: int = 4, **kwargs: Any) -> None:
        kwargs.pop("tools", None)  # the pool's tools come from router.tools, not verl's config
        super().__init__(*args, **kwargs)
        self.pool = _pool(pool_path)
        self.max_turns = max_turns
        rollout = self.rollout_config
        self.response_length: int = rollout.response_length
        self.prompt_length: int = rollout.prompt_length
        self.tool_parser = ToolParser.get_tool_parser(rollout.multi_turn.format, self.tokenizer)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        info = kwargs.get("extra_info") or {}
        record = OutcomeRecord.model_validate(orjson.loads(info["record"]))
        settings = orjson.loads(info["reward"])
        router_price = ModelPrice.model_validate(settings.pop("router_price"))
        ctx = RouteContext(
            request_id=record.id,
            messages=list(kwargs["raw_prompt"]),
            pool=self.pool.subset(list(record.outcomes)),
            cost_weight=float(info["cost_weight"]),
            max_turns=self.max_turns,
        )
        provider = VerlRouterProvider(self, sampling_params)
        policy = LLMRouterPolicy(
            provider,
            replay_model("router", router_price),
            cost_weight_in_prompt=True,
            # Saying nothing (or running out of room) ends the trajectory with nothing.
            empty_answer_falls_back=False,
        )
        result: RouteResult | None
        state: LoopState | None = None
        try:
            result = await Orchestrator(OutcomeExecutor({record.id: record})).run(policy, ctx)
        except NoAnswer as exc:  # nothing succeeded and the router said nothing
            # Still charged its turns and calls, as `xrouter eval` charges them.
            result, state = None, exc.state
        finally:
            await policy.aclose()
        terms = trajectory_reward(result, record, ctx.cost_weight, settings, state)
        terms["truncated"] = float(provider.truncated)
        terms["prompt_too_long"] = float(provider.prompt_too_long)
        if provider.prompt_too_long:
            logger.warning(
                "record %s: its prompt with the system prompt and tools does not fit "
                "rollout.prompt_length (%d tokens): not rolled out; raise "
                "data.max_prompt_length",
                record.id,
                self.prompt_length,
            )
        prompt_ids = provider.prompt_ids or []
        response_ids = provider.token_ids[len(prompt_ids) :][: self.response_length]
        output = AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            response_mask=provider.mask[: self.response_length],
            response_logprobs=provider.logprobs[: self.response_length] or None,
            reward_score=terms["score"],
            num_turns=2 * provider.turns + 1,
            metrics=AgentLoopMetrics(),
            extra_fields={"reward_extra_info": terms},
        )
        return output
