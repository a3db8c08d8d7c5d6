"""CPU cost of the gateway's loop as verl's agent loop (prints figures).

    .venv/bin/python bench/verl_agent_loop.py [--trajectories 300]

On a GPU run the router model's generation happens on the rollout servers; everything else
in a trajectory — the chat template, verl's continuous-token merges and Hermes parser, the
``llm`` policy, the orchestration loop, the replayed calls and the reward — runs in verl's
agent-loop worker processes on CPUs. This measures that part alone: ``XRouterAgentLoop``
built as verl builds it, on the demo table's prompts, with a scripted router model that
answers instantly (two calls in parallel, then ``select_response``: a two-turn trajectory).
It prints wall and CPU milliseconds per trajectory, one trajectory at a time, and the
trajectory's token counts (byte-level tokenizer: about four times a BPE tokenizer's count,
so the template and merge costs are an upper bound).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson
from omegaconf import OmegaConf
from verl.utils.dataset.rl_dataset import RLHFDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router.outcomes import load_outcome_table  # noqa: E402
from router.tools import tool_name  # noqa: E402
from tests.support.verl import (  # noqa: E402
    ScriptedRouterModel,
    Turn,
    build_agent_loop,
    hermes_call,
    hermes_tokenizer,
    rollout_config,
    select_by_model,
)
from training.verl.data import VerlDataConfig, write_verl_dataset  # noqa: E402


async def run(n: int) -> None:
    records = load_outcome_table(ROOT / "router" / "assets" / "demo_outcomes.jsonl")
    tmp = Path(tempfile.mkdtemp(prefix="xrouter-bench-verl-"))
    # verl-data needs a validation part (train_grpo.sh hands verl both): every prompt is
    # rolled out all the same, from both files.
    write_verl_dataset(records, tmp, VerlDataConfig(lambdas=(0.1,), fractions=(0.8, 0.2, 0.0)))
    tokenizer = hermes_tokenizer()
    data = RLHFDataset(
        [str(tmp / "train.parquet"), str(tmp / "validation.parquet")],
        tokenizer,  # type: ignore[arg-type]
        OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": str(tmp / "cache")}),
    )
    config = rollout_config(response_length=65536)
    config.actor_rollout_ref.rollout.prompt_length = 65536
    wall, cpu, prompt_tokens, response_tokens = [], [], [], []
    for i in range(n):
        item = data[i % len(data)]
        models = sorted(orjson.loads(item["extra_info"]["record"])["outcomes"])[:2]

        turns: list[Turn] = [
            "".join(hermes_call(tool_name(m), system_prompt="Answer briefly.") for m in models),
            select_by_model(models[0]),
        ]
        model = ScriptedRouterModel(tokenizer, turns)
        loop = build_agent_loop(tmp, model, config)
        t0, c0 = time.perf_counter(), time.process_time()
        out = await loop.run({"temperature": 1.0}, **item)
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        assert out.extra_fields["reward_extra_info"]["calls"] == 2.0
        prompt_tokens.append(len(out.prompt_ids))
        response_tokens.append(len(out.response_ids))

    def q(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1] if len(xs) > 1 else xs[0]

    print(f"{n} two-turn trajectories over {len(data)} demo prompts (8 models), one at a time")
    print(f"wall ms per trajectory: p50 {q(wall, 50):.2f}  p99 {q(wall, 99):.2f}")
    print(f"CPU ms per trajectory:  p50 {q(cpu, 50):.2f}  p99 {q(cpu, 99):.2f}")
    print(
        "tokens (byte-level): prompt p50 "
        f"{statistics.median(prompt_tokens):.0f}, response p50 {statistics.median(response_tokens):.0f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trajectories", type=int, default=300)
    args = ap.parse_args()
    asyncio.run(run(args.trajectories))


if __name__ == "__main__":
    main()
