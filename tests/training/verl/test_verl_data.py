"""The outcome table as verl's dataset: rows, λ draws, splits and the tool config, read back
through verl's own ``RLHFDataset`` and tool registry."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from verl.tools.tool_registry import initialize_tools_from_config
from verl.utils.dataset.rl_dataset import RLHFDataset

from gateway.cli import main as xrouter
from router.outcomes import write_outcome_table
from router.policies.llm import router_system_prompt
from router.tools import router_tools
from training.datasets.splits import split_of
from training.evaluation.loop_router import pool_for
from training.verl.data import VerlDataConfig, draw_lambda, verl_row
from training.verl.tools import RecordedModelTool, SelectResponseTool

from .conftest import hermes_tokenizer, small_table


def rows(verl_dir: Path, split: str) -> list[dict]:
    return pq.read_table(verl_dir / f"{split}.parquet").to_pylist()


def test_every_record_lands_once_in_its_hash_split(verl_dir: Path) -> None:
    seen = {}
    for split in ("train", "validation", "test"):
        for row in rows(verl_dir, split):
            assert row["extra_info"]["split"] == split
            seen[row["extra_info"]["id"]] = split
    assert seen == {r.id: split_of(r.id) for r in small_table()}


def test_a_row_carries_prompt_outcomes_and_the_tools_it_may_call(verl_dir: Path) -> None:
    table = {r.id: r for r in small_table()}
    for row in [r for s in ("train", "validation", "test") for r in rows(verl_dir, s)]:
        record = table[row["extra_info"]["id"]]
        lam = row["extra_info"]["cost_weight"]
        assert lam in (0.0, 0.5) and lam == draw_lambda(record.id, (0.0, 0.5))
        # The system prompt is the served λ-conditioned router's, for this λ.
        assert row["prompt"] == [
            {"role": "system", "content": router_system_prompt(lam)},
            {"role": "user", "content": record.prompt},
        ]
        assert row["agent_name"] == "tool_agent" and row["data_source"] == "xrouter"
        truth = orjson.loads(row["reward_model"]["ground_truth"])
        assert truth["outcomes"] == {
            m: {"score": o.score, "cost_usd": o.cost_usd} for m, o in record.outcomes.items()
        }
        kwargs = {k: v for k, v in row["extra_info"]["tools_kwargs"].items() if v is not None}
        assert {v["create_kwargs"]["model"] for v in kwargs.values()} == set(record.outcomes)
        assert kwargs["call_dear_model_v1"]["create_kwargs"]["response"] == "The answer is B."
        # Only models with an outcome for this prompt are offered.
        expected = {"call_cheap", "call_dear_model_v1", "select_response"}
        if record.id != "q5":
            expected.add("call_mid")
        assert set(row["extra_info"]["tool_selection"]) == expected


def test_lambda_draws_cover_the_grid() -> None:
    draws = Counter(draw_lambda(f"q{i}", (0.0, 0.1, 1.0)) for i in range(600))
    assert set(draws) == {0.0, 0.1, 1.0} and min(draws.values()) > 150
    assert draw_lambda("q1", (0.0, 0.1, 1.0), seed=0) == draw_lambda("q1", (0.0, 0.1, 1.0))


def test_reference_cost_is_the_reference_models_cost_here() -> None:
    record = small_table()[0]
    row = verl_row(record, "train", 0, VerlDataConfig(reference_model="dear/model:v1"))
    assert orjson.loads(row["reward_model"]["ground_truth"])["reference_cost_usd"] == 0.01
    row = verl_row(record, "train", 0, VerlDataConfig())
    assert orjson.loads(row["reward_model"]["ground_truth"])["reference_cost_usd"] is None


def test_bad_lambdas_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        VerlDataConfig(lambdas=(0.1, -1.0))
    with pytest.raises(ValueError, match="non-empty"):
        VerlDataConfig(lambdas=())


def test_the_tool_config_is_the_gateways_tools_and_verl_loads_it(verl_dir: Path) -> None:
    tools = initialize_tools_from_config(str(verl_dir / "tools.yaml"))
    served = router_tools(pool_for(small_table()))
    assert [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools] == [
        orjson.loads(orjson.dumps(s)) for s in served
    ]
    assert [type(t) for t in tools] == [RecordedModelTool] * 3 + [SelectResponseTool]


def test_verls_dataset_reads_the_rows(verl_dir: Path, tmp_path: Path) -> None:
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 100_000,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "tool_config_path": str(verl_dir / "tools.yaml"),
            "cache_dir": str(tmp_path),
        }
    )
    data = RLHFDataset([str(verl_dir / "train.parquet")], hermes_tokenizer(), config)
    assert len(data) == len(rows(verl_dir, "train"))
    item = data[0]
    assert item["agent_name"] == "tool_agent"
    assert item["raw_prompt"][0]["content"].startswith(router_system_prompt(None))
    assert item["tools_kwargs"]["call_cheap"]["create_kwargs"]["model"] == "cheap"


def test_the_cli_writes_the_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "table.jsonl"
    write_outcome_table(small_table(), table)
    out = tmp_path / "verl"
    args = ["--lambdas", "0,0.2", "--reward", "additive", "--reference-model", "dear/model:v1"]
    args += ["--router-price", "0.1,0.4"]
    code = xrouter(["verl-data", "--table", str(table), "--out", str(out), *args])
    assert code == 0
    assert {p.name for p in out.iterdir()} == {
        "train.parquet",
        "validation.parquet",
        "test.parquet",
        "tools.yaml",
        "train_grpo.sh",
    }
    row = rows(out, "train")[0]
    assert orjson.loads(row["extra_info"]["reward"])["form"] == "additive"
    assert orjson.loads(row["extra_info"]["reward"])["router_price"] == [0.1, 0.4]
    assert row["extra_info"]["prompt_tokens"] > len(row["prompt"][0]["content"]) // 4
    assert row["extra_info"]["cost_weight"] in (0.0, 0.2)
    printed = capsys.readouterr().out
    assert "tools for 3 models" in printed and "train_grpo.sh" in printed


def test_the_cli_names_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "table.jsonl"
    write_outcome_table(small_table(), table)
    out = str(tmp_path / "o")
    assert xrouter(["verl-data", "--table", str(tmp_path / "none.jsonl"), "--out", out]) == 2
    assert "cannot read" in capsys.readouterr().err
    args = ["verl-data", "--table", str(table), "--out", out, "--reference-model", "gpt-9"]
    assert xrouter(args) == 2
    assert "no record has an outcome for 'gpt-9'" in capsys.readouterr().err
    assert xrouter(["verl-data", "--table", str(table), "--out", out, "--lambdas", "-1"]) == 2
    assert "non-negative" in capsys.readouterr().err
    assert xrouter(["verl-data", "--table", str(table), "--out", out, "--router-price", "1"]) == 2
    assert "router_price is two" in capsys.readouterr().err
