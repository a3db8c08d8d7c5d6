"""An outcome table as verl's RL dataset for the LLM router.

``xrouter verl-data`` writes what ``verl.trainer.main_ppo`` reads for a multi-turn GRPO run
of the router model (``training/verl/README.md`` has the command):

- ``train.parquet``, ``validation.parquet``, ``test.parquet``, split by a hash of the id as
  everywhere else (``training.datasets.splits``). Each row is one prompt: the router's
  system prompt ending with a cost-weight line (λ drawn per prompt, so one checkpoint
  serves every trade-off, as the compact policy's λ-sampling does), the user's
  conversation, the recorded outcome of every model — the replayed answer in the
  ``tools_kwargs`` verl hands the tools, score and cost in ``reward_model.ground_truth``
  for the reward function — and ``extra_info.tool_selection``, the tools of the models
  that have an outcome for this prompt;
- ``tools.yaml``: verl's tool config, one ``RecordedModelTool`` per pool model with the
  schema the gateway's router sees (``router.tools``), and ``select_response``;
- ``train_grpo.sh``: the ``verl.trainer.main_ppo`` command (``training.verl.launch``).

Nothing here imports verl: the files can be made wherever the table is and copied to the
GPU machine.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from pricing import estimate_tokens
from router.outcomes import OutcomeRecord
from router.policies.llm import router_system_prompt
from router.pool import ModelPool
from router.reward import RewardConfig
from router.tools import SELECT_TOOL, call_tool_schema, select_tool_schema, tool_name
from training.datasets.splits import SPLIT_NAMES, split_records
from training.evaluation.loop_router import pool_for
from training.verl.launch import GrpoRun, grpo_script

log = logging.getLogger(__name__)

DATA_SOURCE = "xrouter"
AGENT_NAME = "tool_agent"  # verl's multi-turn agent loop that executes tool calls
TOOLS_MODULE = "training.verl.tools"
# The λ grid drawn from when none is given: no cost pressure to strong pressure, in the
# units of the default cost scale (USD 0.001 = one unit of normalized cost).
DEFAULT_LAMBDAS = (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)


@dataclass(frozen=True, slots=True)
class VerlDataConfig:
    lambdas: tuple[float, ...] = DEFAULT_LAMBDAS
    reward: RewardConfig = field(default_factory=RewardConfig)
    # A model whose cost on the same prompt normalizes cost (C̃ = C / its cost); None: the
    # reward's fixed cost_scale.
    reference_model: str | None = None
    split_seed: int = 0
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)
    seed: int = 0  # of the per-prompt λ draw
    # The router's own tokens, USD per 1M (input, output): they count in the trajectory's
    # cost as they do in the gateway (router.llm.price). Free: a self-hosted router.
    router_price: tuple[float, float] = (0.0, 0.0)

    def __post_init__(self) -> None:
        if not self.lambdas or any(lam < 0 for lam in self.lambdas):
            raise ValueError("lambdas must be non-empty and non-negative")
        if len(self.router_price) != 2 or any(p < 0 for p in self.router_price):
            raise ValueError("router_price is two non-negative prices (input, output)")


def draw_lambda(record_id: str, lambdas: Sequence[float], seed: int = 0) -> float:
    """The prompt's cost weight: uniform over the grid, fixed by the id (reproducible, and
    independent of the split, which hashes the id with another salt)."""
    digest = hashlib.sha256(f"verl-lambda:{seed}:{record_id}".encode()).digest()
    return float(lambdas[int.from_bytes(digest[:8], "big") % len(lambdas)])


def conversation(record: OutcomeRecord) -> list[dict[str, str]]:
    """The record's turns as role/text pairs (parquet needs one type per column; the router
    reads text)."""
    if not record.messages:
        return [{"role": "user", "content": record.prompt or ""}]
    turns = []
    for m in record.messages:
        content = m.get("content")
        if not isinstance(content, str):
            parts = content if isinstance(content, list) else []
            content = "\n".join(
                str(p.get("text", "")) for p in parts if isinstance(p, dict) and p.get("text")
            )
        turns.append({"role": str(m.get("role", "user")), "content": content})
    return turns


def ground_truth(record: OutcomeRecord, reference_model: str | None) -> dict[str, Any]:
    """What the reward function needs to score a trajectory: each model's recorded score
    and cost, and the reference cost if the table has the reference model here."""
    ref = record.outcomes.get(reference_model) if reference_model else None
    return {
        "outcomes": {
            m: {"score": o.score, "cost_usd": o.cost_usd or 0.0}
            for m, o in sorted(record.outcomes.items())
        },
        "reference_cost_usd": ref.cost_usd if ref is not None else None,
    }


def verl_row(
    record: OutcomeRecord,
    split: str,
    index: int,
    config: VerlDataConfig,
    tool_schemas: dict[str, Any] | None = None,
) -> dict[str, Any]:
    cost_weight = draw_lambda(record.id, config.lambdas, config.seed)
    prompt = [
        {"role": "system", "content": router_system_prompt(cost_weight)},
        *(m for m in conversation(record) if m.get("role") != "system"),
    ]
    # Replayed answers travel with the row: verl passes them to the tool it calls, so the
    # rollout workers need no copy of the table.
    tools_kwargs = {
        tool_name(m): {
            "create_kwargs": {
                "model": m,
                "response": o.response or "",
                "score": o.score,
                "cost_usd": o.cost_usd or 0.0,
            }
        }
        for m, o in sorted(record.outcomes.items())
    }
    offered = [*tools_kwargs, SELECT_TOOL]
    # What the router reads before its first word: the prompt and the offered tools'
    # schemas (the chat template renders them into the system turn).
    schemas = [tool_schemas[t] for t in offered if tool_schemas and t in tool_schemas]
    prompt_tokens = estimate_tokens(orjson.dumps([prompt, schemas]).decode())
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": prompt,
        "ability": record.task or "chat",
        "reward_model": {
            "style": "rule",
            # JSON text: the models a row has outcomes for differ from row to row, which a
            # parquet struct column would pad with nulls.
            "ground_truth": orjson.dumps(ground_truth(record, config.reference_model)).decode(),
        },
        "extra_info": {
            "id": record.id,
            "split": split,
            "index": index,
            "cost_weight": cost_weight,
            "reward": orjson.dumps(_reward_dict(config)).decode(),
            "tools_kwargs": tools_kwargs,
            "tool_selection": offered,
            "prompt_tokens": prompt_tokens,
        },
    }


def _reward_dict(config: VerlDataConfig) -> dict[str, Any]:
    cfg = config.reward
    return {
        "form": cfg.form,
        "K": cfg.K,
        "c_max": cfg.c_max,
        "cost_scale": cfg.cost_scale,
        "router_price": list(config.router_price),
    }


def tool_config(pool: ModelPool) -> dict[str, Any]:
    """verl's tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``)."""
    tools = [
        {
            "class_name": f"{TOOLS_MODULE}.RecordedModelTool",
            "config": {"type": "native"},
            "tool_schema": call_tool_schema(m),
        }
        for m in pool
    ]
    tools.append(
        {
            "class_name": f"{TOOLS_MODULE}.SelectResponseTool",
            "config": {"type": "native"},
            "tool_schema": select_tool_schema(),
        }
    )
    return {"tools": tools}


@dataclass(frozen=True, slots=True)
class VerlDataset:
    out_dir: Path
    rows: dict[str, int]  # split -> rows written
    models: tuple[str, ...]


def write_verl_dataset(
    records: Sequence[OutcomeRecord],
    out_dir: Path,
    config: VerlDataConfig | None = None,
    run: GrpoRun | None = None,
) -> VerlDataset:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = config or VerlDataConfig()
    if not records:
        raise ValueError("the outcome table is empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    splits = split_records(records, cfg.fractions, seed=cfg.split_seed)
    pool = pool_for(records)
    config_tools = tool_config(pool)["tools"]
    schemas = {t["tool_schema"]["function"]["name"]: t["tool_schema"] for t in config_tools}
    counts: dict[str, int] = {}
    for split in SPLIT_NAMES:
        rows = [verl_row(r, split, i, cfg, schemas) for i, r in enumerate(splits.get(split))]
        counts[split] = len(rows)
        if rows:
            pq.write_table(pa.Table.from_pylist(rows), out_dir / f"{split}.parquet")
    (out_dir / "tools.yaml").write_text(yaml.safe_dump({"tools": config_tools}, sort_keys=False))
    script = out_dir / "train_grpo.sh"
    script.write_text(grpo_script(out_dir.resolve(), run))
    script.chmod(0o755)
    log.info("verl dataset in %s: %s rows; %d model tools", out_dir, counts, len(pool))
    return VerlDataset(out_dir, counts, tuple(m.name for m in pool))
