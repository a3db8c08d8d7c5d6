"""A router trajectory through verl's real multi-turn rollout (``ToolAgentLoop`` with the
Hermes tool parser), our tools replaying the table, and verl's reward manager calling our
reward function, loaded the way ``main_ppo`` loads it. The router model is scripted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, DictConfigWrap, ToolListWrap
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.tools.tool_registry import initialize_tools_from_config
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.dataset.rl_dataset import RLHFDataset

from router.policies.llm import cost_weight_line
from router.tools import tool_result_text

from .conftest import ScriptedRouterModel, hermes_tokenizer, rollout_config


def call(tool: str, **arguments: Any) -> str:
    return (
        "<tool_call>\n"
        + orjson.dumps({"name": tool, "arguments": arguments}).decode()
        + "\n</tool_call>"
    )


def row_for(verl_dir: Path, record_id: str) -> dict[str, Any]:
    for split in ("train", "validation", "test"):
        for row in pq.read_table(verl_dir / f"{split}.parquet").to_pylist():
            if row["extra_info"]["id"] == record_id:
                return row
    raise KeyError(record_id)


async def rollout(
    verl_dir: Path, record_id: str, turns: list[str]
) -> tuple[AgentLoopOutput, ScriptedRouterModel, dict[str, Any], Any]:
    tokenizer = hermes_tokenizer()
    model = ScriptedRouterModel(tokenizer, turns)
    loop = ToolAgentLoop(
        trainer_config=DictConfigWrap(rollout_config()),
        server_manager=model,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(OmegaConf.create({})),
        tools=ToolListWrap(initialize_tools_from_config(str(verl_dir / "tools.yaml"))),
    )
    row = row_for(verl_dir, record_id)
    out = await loop.run(
        {"temperature": 1.0},
        raw_prompt=row["prompt"],
        tools_kwargs=row["extra_info"]["tools_kwargs"],
        extra_info=row["extra_info"],
    )
    return out, model, row, tokenizer


async def reward(out: AgentLoopOutput, row: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """What verl's reward loop worker does with a finished trajectory."""
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://training.verl.reward",
                    "name": "compute_score",
                }
            }
        }
    )
    manager = NaiveRewardManager(config, tokenizer, get_custom_reward_fn(config))
    prompts = torch.tensor([out.prompt_ids])
    responses = torch.tensor([out.response_ids])
    data = DataProto(
        batch=TensorDict(
            {
                "prompts": prompts,
                "responses": responses,
                "attention_mask": torch.ones(
                    1, prompts.shape[1] + responses.shape[1], dtype=torch.int64
                ),
            },
            batch_size=1,
        ),
        non_tensor_batch={
            "data_source": np.array([row["data_source"]]),
            "reward_model": np.array([row["reward_model"]], dtype=object),
            "extra_info": np.array([dict(row["extra_info"])], dtype=object),
            "tool_extra_fields": np.array([out.extra_fields], dtype=object),
            "__num_turns__": np.array([out.num_turns]),
        },
    )
    return await manager.run_single(data)


@pytest.mark.parametrize("record_id", ["q0"])
async def test_call_two_then_select_the_cheap_right_answer(verl_dir: Path, record_id: str) -> None:
    # q0: cheap answers B (right), mid answers B (right), dear is right too.
    out, model, row, tokenizer = await rollout(
        verl_dir,
        record_id,
        [
            call("call_cheap", system_prompt="Answer with a letter.")
            + call("call_mid", system_prompt="Answer with a letter."),
            call("select_response", tool_call_id="call_1"),
            "Done.",
        ],
    )
    lam = row["extra_info"]["cost_weight"]
    # What the router saw: its λ line, then both answers with the ids to select them by.
    assert cost_weight_line(lam) in model.prompts[0]
    assert tool_result_text("call_1", "cheap", "B") in model.prompts[1]
    assert tool_result_text("call_2", "mid", "B") in model.prompts[1]
    assert [c["model"] for c in out.extra_fields["xrouter_calls"]] == ["cheap", "mid"]
    assert out.extra_fields["xrouter_selected"] == "call_1"

    result = await reward(out, row, tokenizer)
    info = result["reward_extra_info"]
    assert info["quality"] == 1.0 and info["selected"] == 1.0
    assert info["cost_usd"] == pytest.approx(0.0011)
    # gated reward, cost scale $0.001: 1 · (1 − min(λ · 1.1, 1))
    assert result["reward_score"] == pytest.approx(1.0 - min(lam * 1.1, 1.0))


async def test_a_rewrite_that_keeps_a_models_answer_earns_its_score(verl_dir: Path) -> None:
    # q1: cheap says A (wrong), dear says "The answer is B." (right).
    out, _, row, tokenizer = await rollout(
        verl_dir,
        "q1",
        [
            call("call_cheap", system_prompt="Letter only.")
            + call("call_dear_model_v1", system_prompt="Letter only."),
            "Both answered; the better reasoned answer is B.",
        ],
    )
    info = (await reward(out, row, tokenizer))["reward_extra_info"]
    assert info["quality"] == 1.0 and info["selected"] == 0.0 and info["own_answer"] == 0.0
    assert info["calls"] == 2.0


async def test_answering_alone_scores_nothing_and_costs_nothing(verl_dir: Path) -> None:
    out, _, row, tokenizer = await rollout(verl_dir, "q2", ["B"])
    result = await reward(out, row, tokenizer)
    assert result["reward_score"] == 0.0
    assert result["reward_extra_info"]["own_answer"] == 1.0
    assert result["reward_extra_info"]["cost_usd"] == 0.0
    # The best single call at this prompt's λ is still reported, as the trajectory's regret.
    assert result["reward_extra_info"]["best_single_call_reward"] > 0


async def test_bad_calls_get_the_gateways_errors_and_cost_nothing(verl_dir: Path) -> None:
    out, model, row, tokenizer = await rollout(
        verl_dir,
        "q5",  # mid has no outcome here: its tool is not offered
        [
            call("call_mid", system_prompt="x")
            + call("call_cheap")
            + call("select_response", tool_call_id="call_9"),
            "I give up.",
        ],
    )
    seen = model.prompts[1]
    assert "Unknown function 'call_mid'" in seen
    assert "call_cheap needs system_prompt (a string)" in seen
    assert "'call_9' is not a successful call" in seen
    assert out.extra_fields.get("xrouter_calls", []) == []
    result = await reward(out, row, tokenizer)
    assert result["reward_score"] == 0.0 and result["reward_extra_info"]["cost_usd"] == 0.0
