"""An outcome table as verl's RL dataset for the LLM router.

``xrouter verl-data`` writes what ``verl.trainer.main_ppo`` reads for a multi-turn GRPO run
of the router model (``training/verl/README.md`` has the command):

- ``train.parquet``, ``validation.parquet``, ``test.parquet``, split by a hash of the id as
  everywhere else (``training.datasets.splits``). Each row is one prompt: the user's
  conversation, its cost weight λ (drawn per prompt, so one checkpoint serves every
  trade-off, as the compact policy's λ-sampling does), the reward settings and the whole
  outcome record — every model's recorded answer, tokens, cost and score — which the agent
  loop replays;
- ``pool.json``: the pool's models and prices (the router's tool descriptions);
- ``agent_loops.yaml``: registers ``training.verl.agent_loop.XRouterAgentLoop`` with verl
  as ``xrouter``, the agent every row names;
- ``train_grpo.sh``: the ``verl.trainer.main_ppo`` command (``training.verl.launch``).

Nothing here imports verl: the files can be made wherever the table is and copied to the
GPU machine (they name it by absolute path: keep the directory at the same path there).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import yaml

from pricing import ModelPrice
from router.outcomes import OutcomeRecord, content_text
from router.reward import RewardConfig
from router.tools import check_tool_names
from training.datasets.splits import SPLIT_NAMES, split_records
from training.evaluation.loop_router import pool_for
from training.verl.launch import GrpoRun, grpo_script
from training.verl.pool import pool_to_json

log = logging.getLogger(__name__)

DATA_SOURCE = "xrouter"
AGENT_NAME = "xrouter"  # training.verl.agent_loop.XRouterAgentLoop
AGENT_LOOP = "training.verl.agent_loop.XRouterAgentLoop"
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
        # NaN passes a `< 0` test: it would make every reward of its prompts NaN (and an
        # infinite λ a free model's penalty, 0 · ∞), silently poisoning the run.
        if not self.lambdas or any(not math.isfinite(lam) or lam < 0 for lam in self.lambdas):
            raise ValueError("lambdas must be non-empty, finite and non-negative")
        if len(self.router_price) != 2 or any(
            not math.isfinite(p) or p < 0 for p in self.router_price
        ):
            raise ValueError("router_price is two finite, non-negative prices (input, output)")


def draw_lambda(record_id: str, lambdas: Sequence[float], seed: int = 0) -> float:
    """The prompt's cost weight: uniform over the grid, fixed by the id (reproducible, and
    independent of the split, which hashes the id with another salt)."""
    digest = hashlib.sha256(f"verl-lambda:{seed}:{record_id}".encode()).digest()
    return float(lambdas[int.from_bytes(digest[:8], "big") % len(lambdas)])


def conversation(record: OutcomeRecord) -> list[dict[str, str]]:
    """The record's turns as role/text pairs (parquet needs one type per column; the router
    reads text)."""
    return [
        {"role": str(m.get("role", "user")), "content": content_text(m.get("content"))}
        for m in record.chat_messages()
    ]


def verl_row(
    record: OutcomeRecord, split: str, index: int, config: VerlDataConfig
) -> dict[str, Any]:
    cost_weight = draw_lambda(record.id, config.lambdas, config.seed)
    return {
        "data_source": DATA_SOURCE,
        "agent_name": AGENT_NAME,
        # The client's conversation as the gateway receives it; the policy puts the
        # router's own system prompt in front, as when it serves.
        "prompt": conversation(record),
        "ability": record.task or "chat",
        "reward_model": {
            "style": "rule",
            # The scores, for verl's bookkeeping; the agent loop computes the reward.
            "ground_truth": orjson.dumps({m: o.score for m, o in record.outcomes.items()}).decode(),
        },
        "extra_info": {
            "id": record.id,
            "split": split,
            "index": index,
            "cost_weight": cost_weight,
            "reward": orjson.dumps(reward_settings(config)).decode(),
            # JSON text: the models a row has outcomes for differ from row to row, which a
            # parquet struct column would pad with nulls.
            "record": record.model_dump_json(exclude_none=True),
        },
    }


def reward_settings(config: VerlDataConfig) -> dict[str, Any]:
    cfg = config.reward
    price_in, price_out = config.router_price
    router_price = ModelPrice(
        input=Decimal(str(price_in)), output=Decimal(str(price_out)), source="router"
    )
    return {
        "form": cfg.form,
        "K": cfg.K,
        "c_max": cfg.c_max,
        "cost_scale": cfg.cost_scale,
        "reference_model": config.reference_model,
        "router_price": router_price.model_dump(mode="json"),
    }


def agent_loop_config(pool_path: Path, max_turns: int) -> list[dict[str, Any]]:
    """``actor_rollout_ref.rollout.agent.agent_loop_config_path``: verl instantiates the
    entry with Hydra, passing these fields to the constructor."""
    return [
        {
            "name": AGENT_NAME,
            "_target_": AGENT_LOOP,
            "pool_path": str(pool_path),
            "max_turns": max_turns,
        }
    ]


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
    run = run or GrpoRun()
    if not records:
        raise ValueError("the outcome table is empty")
    logged = sum(r.logged is not None for r in records)
    if logged:
        # A rollout replays whichever model the router calls; logged traffic holds the
        # outcome of the one model that was called on each prompt, so nearly every other
        # call would have nothing to replay (a missing outcome replays as a failed call).
        raise ValueError(
            f"{logged} of the {len(records)} records are logged traffic (`logged`: one model's "
            "outcome per prompt): verl-data needs research data with every model's recorded "
            "outcome on each prompt; train the compact router on logged traffic with "
            "`xrouter train --offpolicy`"
        )
    splits = split_records(records, cfg.fractions, seed=cfg.split_seed)
    rows = {
        split: [verl_row(r, split, i, cfg) for i, r in enumerate(splits.get(split))]
        for split in SPLIT_NAMES
    }
    counts = {split: len(split_rows) for split, split_rows in rows.items()}
    if not counts["train"] or not counts["validation"]:
        # train_grpo.sh hands verl both files: without one it would fail on the GPUs, or
        # read a file an earlier run left in the directory.
        raise ValueError(
            f"the {len(records)} records split into {counts} rows (by id hash, "
            "--split-seed): verl needs training and validation rows"
        )
    pool = pool_for(records)
    if len(pool) < 2:
        # As `xrouter train` refuses it: with one model the router's only rewarded move is
        # to call it on every prompt, so the GPU run would learn no routing at all.
        raise ValueError(
            f"the table has outcomes of one model only ({pool.names[0]!r}): "
            "a router chooses between at least two models"
        )
    check_tool_names(pool.names)  # the router calls each model by its tool's name
    out_dir.mkdir(parents=True, exist_ok=True)
    out_dir = out_dir.resolve()
    for split, split_rows in rows.items():
        path = out_dir / f"{split}.parquet"
        if split_rows:
            pq.write_table(pa.Table.from_pylist(split_rows), path)
        else:
            # Not another table's rows from an earlier run into the same directory.
            path.unlink(missing_ok=True)
    (out_dir / "pool.json").write_bytes(
        orjson.dumps(pool_to_json(pool), option=orjson.OPT_INDENT_2)
    )
    loops = agent_loop_config(out_dir / "pool.json", run.max_turns)
    (out_dir / "agent_loops.yaml").write_text(yaml.safe_dump(loops, sort_keys=False))
    script = out_dir / "train_grpo.sh"
    script.write_text(grpo_script(out_dir, run))
    script.chmod(0o755)
    log.info("verl dataset in %s: %s rows; %d models", out_dir, counts, len(pool))
    return VerlDataset(out_dir, counts, tuple(m.name for m in pool))
