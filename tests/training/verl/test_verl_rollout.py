"""Router trajectories through the gateway's loop as verl's agent loop: ``XRouterAgentLoop``
instantiated from ``agent_loops.yaml`` the way verl's agent-loop worker does (Hydra), fed
rows read by verl's ``RLHFDataset``, generating with verl's Hermes tool parser through a
scripted router model behind verl's ``LLMServerClient``. Checked: what the router sees,
which tokens are trained on, and the reward with every term."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
)
from verl.utils.dataset.rl_dataset import RLHFDataset

from router.policies.llm import cost_weight_line
from router.reward import RewardConfig
from router.tools import tool_result_text
from tests.conftest import ScriptedRouter
from tests.support.routes import trajectories
from tests.support.verl import (
    RESULT_HEADER as HEADER,
)
from tests.support.verl import (
    ScriptedRouterModel,
    Turn,
    build_agent_loop,
    hermes_tokenizer,
    rollout_config,
)
from tests.support.verl import (
    hermes_call as call,
)
from tests.support.verl import (
    select_by_model as select,
)
from training.evaluation.registry import LoadContext, default_registry
from training.verl.agent_loop import XRouterAgentLoop
from training.verl.data import VerlDataConfig, write_verl_dataset

from .conftest import small_table


def dataset_item(verl_dir: Path, record_id: str, tmp_path: Path) -> dict[str, Any]:
    config = OmegaConf.create(
        {"prompt_key": "prompt", "filter_overlong_prompts": False, "cache_dir": str(tmp_path)}
    )
    for split in ("train", "validation", "test"):
        # verl annotates the tokenizer as transformers' slow (Python) one; it takes any.
        data = RLHFDataset([str(verl_dir / f"{split}.parquet")], hermes_tokenizer(), config)  # type: ignore[arg-type]
        for i in range(len(data)):
            if data[i]["extra_info"]["id"] == record_id:
                return data[i]
    raise KeyError(record_id)


async def rollout(
    verl_dir: Path,
    record_id: str,
    turns: list[Turn],
    tmp_path: Path,
    response_length: int = 8192,
    prompt_length: int = 8192,
) -> tuple[AgentLoopOutput, ScriptedRouterModel, dict[str, Any]]:
    tokenizer = hermes_tokenizer()
    model = ScriptedRouterModel(tokenizer, turns)
    loop = build_agent_loop(verl_dir, model, rollout_config(response_length, prompt_length))
    assert isinstance(loop, XRouterAgentLoop)
    item = dataset_item(verl_dir, record_id, tmp_path)
    out = await loop.run({"temperature": 1.0}, **item)
    return out, model, item


def terms(out: AgentLoopOutput) -> dict[str, float]:
    return out.extra_fields["reward_extra_info"]


def generated_runs(out: AgentLoopOutput) -> list[tuple[int, int]]:
    """(offset, length) of each run of model-generated tokens in the response."""
    runs, start = [], None
    for i, m in enumerate([*out.response_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i - start))
            start = None
    return runs


async def test_call_two_cheap_models_and_select_the_right_answer(
    verl_dir: Path, tmp_path: Path
) -> None:
    # q0: cheap answers "B" (right, $0.0001), mid answers "B" (right, $0.001).
    out, model, item = await rollout(
        verl_dir,
        "q0",
        [
            call("call_cheap", system_prompt="Answer with a letter.")
            + call("call_mid", system_prompt="Answer with a letter."),
            select("cheap"),
        ],
        tmp_path,
    )
    lam = item["extra_info"]["cost_weight"]
    # The router saw the served system prompt with its λ, then both answers with their ids.
    assert cost_weight_line(lam) in model.prompts[0]
    ids = dict((m, i) for i, m in HEADER.findall(model.prompts[1]))
    assert tool_result_text(ids["cheap"], "cheap", "B") in model.prompts[1]
    assert ids["cheap"].startswith("chatcmpl-tool-")
    # verl trains on exactly the tokens the model generated: the mask marks both turns.
    tokens = out.response_ids
    runs = generated_runs(out)
    assert [tokens[o : o + n] for o, n in runs] == model.generated
    assert len(out.prompt_ids) + len(out.response_ids) > len(out.prompt_ids) + sum(
        n for _, n in runs
    )  # the tool results are in the context, masked out
    t = terms(out)
    assert t["quality"] == 1.0 and t["calls"] == 2.0 and t["own_answer"] == 0.0
    assert t["cost_usd"] == pytest.approx(0.0011) and t["router_cost_usd"] == 0.0
    # gated reward, cost scale $0.001: 1 · (1 − min(λ · 1.1, 1))
    assert out.reward_score == pytest.approx(1.0 - min(lam * 1.1, 1.0)) == t["score"]
    # verl turns the score into the trajectory's reward at its last token.
    assert out.as_dict()["rm_scores"][-1] == pytest.approx(out.reward_score)


async def test_an_answer_of_its_own_earns_nothing(verl_dir: Path, tmp_path: Path) -> None:
    out, _, _ = await rollout(
        verl_dir,
        "q1",
        [call("call_dear_model_v1", system_prompt="Letter only."), "It is B, I am sure."],
        tmp_path,
    )
    t = terms(out)
    # As `xrouter eval` scores it: the router's own text has no recorded score.
    assert t["own_answer"] == 1.0 and t["quality"] == 0.0 and out.reward_score == 0.0
    assert t["cost_usd"] == pytest.approx(0.01)
    assert t["best_single_call_reward"] > 0  # what calling one model would have earned


async def test_bad_calls_get_the_gateways_errors(verl_dir: Path, tmp_path: Path) -> None:
    out, model, _ = await rollout(
        verl_dir,
        "q5",  # mid has no outcome for q5: its tool is not offered
        [
            call("call_mid", system_prompt="x")
            + call("call_cheap")
            + call("select_response", tool_call_id="call_9"),
            "I give up.",
        ],
        tmp_path,
    )
    seen = model.prompts[1]
    assert '"name": "call_mid"' not in model.prompts[0].split("</tools>")[0]
    assert "no tool named 'call_mid'" in seen
    assert "call_cheap needs system_prompt (a string)" in seen
    assert "'call_9' is not a successful call" in seen
    assert terms(out)["calls"] == 0.0 and terms(out)["cost_usd"] == 0.0


async def test_the_routers_own_tokens_cost_what_they_read_and_write(tmp_path: Path) -> None:
    verl_dir = tmp_path / "priced"
    config = VerlDataConfig(lambdas=(0.0,), router_price=(1.0, 2.0))
    write_verl_dataset(small_table(), verl_dir, config)
    out, _, _ = await rollout(
        verl_dir,
        "q0",
        [call("call_cheap", system_prompt="Letter."), select("cheap")],
        tmp_path,
    )
    # Each turn reads the whole context before it and writes its own tokens.
    runs = generated_runs(out)
    read = sum(len(out.prompt_ids) + offset for offset, _ in runs)
    written = sum(n for _, n in runs)
    t = terms(out)
    assert t["router_cost_usd"] == pytest.approx((read * 1.0 + written * 2.0) / 1e6)
    assert t["cost_usd"] == pytest.approx(0.0001 + t["router_cost_usd"])


async def test_a_trajectory_out_of_room_ends_and_earns_nothing(
    verl_dir: Path, tmp_path: Path
) -> None:
    out, model, _ = await rollout(
        verl_dir,
        "q0",
        [call("call_cheap", system_prompt="Letter."), select("cheap")],
        tmp_path,
        response_length=60,
    )
    assert len(model.prompts) == 1  # the second turn never ran
    assert terms(out)["truncated"] == 1.0 and out.reward_score == 0.0
    assert len(out.response_ids) <= 60 and len(out.response_mask) == len(out.response_ids)


async def test_a_turn_cut_off_at_the_response_limit_is_not_acted_on(
    verl_dir: Path, tmp_path: Path
) -> None:
    # A turn ran past response_length and its select_response still picked the answer and
    # earned the reward, though the tokens that chose it were cut from what verl trains.
    chosen = select("cheap")
    assert callable(chosen)

    def pondered(prompt: str) -> str:
        return "Let me think. " * 20 + chosen(prompt)

    turns: list[Turn] = [call("call_cheap", system_prompt="Letter."), pondered]
    full, model, _ = await rollout(verl_dir, "q0", list(turns), tmp_path)
    assert (full.reward_score or 0) > 0 and terms(full)["truncated"] == 0.0
    limit = len(full.response_ids) - len(model.generated[1]) // 2  # room for half of turn 2
    out, model, _ = await rollout(verl_dir, "q0", list(turns), tmp_path, response_length=limit)
    # Turn 2 was asked for no more than the room left, and cut there.
    room = model.sampling[1]["max_tokens"]
    assert room == limit - (len(out.response_ids) - len(model.generated[1]))
    assert len(out.response_ids) == limit
    assert terms(out)["truncated"] == 1.0 and out.reward_score == 0.0
    assert terms(out)["calls"] == 1.0  # call_cheap ran (and is paid for); nothing was selected


async def test_a_prompt_verl_would_cut_is_not_rolled_out(
    verl_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # verl cut it from the left to rollout.prompt_length, system prompt, tools and λ line
    # first, and the router was trained on what it said without them.
    turns: list[Turn] = [call("call_cheap", system_prompt="Letter."), select("cheap")]
    full, _, _ = await rollout(verl_dir, "q0", list(turns), tmp_path)
    assert terms(full)["prompt_too_long"] == 0.0
    with caplog.at_level("WARNING"):
        out, model, _ = await rollout(
            verl_dir, "q0", list(turns), tmp_path, prompt_length=len(full.prompt_ids) - 1
        )
    assert model.prompts == []  # nothing generated
    t = terms(out)
    assert t["prompt_too_long"] == 1.0 and out.reward_score == 0.0 and t["cost_usd"] == 0.0
    assert out.response_ids == [] and "record q0: its prompt" in caplog.text


async def test_a_trajectory_with_no_answer_still_pays_for_its_turns(tmp_path: Path) -> None:
    # It ended in NoAnswer, scored as costing nothing: useless turns earned more than a
    # cheap answer under the additive reward. `xrouter eval` charges them; so does this.
    verl_dir = tmp_path / "priced"
    config = VerlDataConfig(
        lambdas=(1.0,), router_price=(1.0, 2.0), reward=RewardConfig(form="additive")
    )
    write_verl_dataset(small_table(), verl_dir, config)
    # Every turn a call to no tool, up to max_turns: no call succeeded and no answer came.
    out, model, _ = await rollout(
        verl_dir, "q0", [call("call_nobody", system_prompt="x")] * 4, tmp_path
    )
    assert len(model.prompts) == 4
    t = terms(out)
    assert t["quality"] == 0.0 and t["own_answer"] == 0.0 and t["calls"] == 0.0
    runs = generated_runs(out)
    read = sum(len(out.prompt_ids) + offset for offset, _ in runs)
    written = sum(n for _, n in runs)
    assert t["router_cost_usd"] == pytest.approx((read * 1.0 + written * 2.0) / 1e6)
    assert t["router_cost_usd"] > 0
    assert (out.reward_score or 0) < 0


async def test_the_router_reads_the_same_prompt_in_training_and_serving(
    verl_dir: Path, tmp_path: Path, scripted_router: ScriptedRouter
) -> None:
    """The policy served over HTTP (here through `xrouter eval`'s `llm:` loader, the same
    policy and loop the gateway runs) and the verl rollout put the same text in front of
    the router model: rendered with one chat template, the first prompt is identical, and
    the tool result of the second differs only in the call id."""
    record = next(r for r in small_table() if r.id == "q0")
    _, model, item = await rollout(
        verl_dir, "q0", [call("call_cheap", system_prompt="Letter."), select("cheap")], tmp_path
    )
    lam = item["extra_info"]["cost_weight"]
    first = {"id": "t1", "name": "call_cheap", "arguments": {"system_prompt": "Letter."}}
    pick = {"id": "s1", "name": "select_response", "arguments": {"tool_call_id": "t1"}}
    scripted_router.script({"tool_calls": [first]}, {"tool_calls": [pick]})
    spec = f"llm:{scripted_router.base_url}#router#lambda"
    router = default_registry().load(spec, LoadContext(train=small_table()))
    (routed,) = trajectories(await asyncio.to_thread(router.route, [record], lam))
    assert routed.final_model == "cheap"
    served = scripted_router.requests()[-2:]
    tokenizer = hermes_tokenizer()

    def render(request: dict[str, Any]) -> str:
        return str(
            tokenizer.apply_chat_template(
                request["messages"],
                tools=request["tools"],
                add_generation_prompt=True,
                tokenize=False,
            )
        )

    assert render(served[0]) == model.prompts[0]
    served_result = render(served[1]).rsplit("<tool_response>", 1)[1]
    trained_result = model.prompts[1].rsplit("<tool_response>", 1)[1]
    header = HEADER.search(trained_result)
    assert header is not None
    trained_id = header.group(1)
    assert served_result == trained_result.replace(trained_id, "t1")
