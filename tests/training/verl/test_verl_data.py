"""The outcome table as verl's dataset: rows, λ draws, splits, the pool and the agent-loop
registration, read back through verl's own ``RLHFDataset``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
import yaml
from omegaconf import OmegaConf
from verl.utils.dataset.rl_dataset import RLHFDataset

from gateway.cli import main as xrouter
from router.outcomes import ModelOutcome, OutcomeRecord, write_outcome_table
from tests.support.verl import hermes_tokenizer
from training.datasets.splits import split_of
from training.evaluation.loop_router import pool_for
from training.verl.data import VerlDataConfig, draw_lambda, write_verl_dataset
from training.verl.pool import pool_from_json

from .conftest import small_table


def rows(verl_dir: Path, split: str) -> list[dict]:
    return pq.read_table(verl_dir / f"{split}.parquet").to_pylist()


def all_rows(verl_dir: Path) -> list[dict]:
    return [r for s in ("train", "validation", "test") for r in rows(verl_dir, s)]


def test_every_record_lands_once_in_its_hash_split(verl_dir: Path) -> None:
    seen = {row["extra_info"]["id"]: row["extra_info"]["split"] for row in all_rows(verl_dir)}
    assert seen == {r.id: split_of(r.id) for r in small_table()}


def test_a_row_carries_the_conversation_its_lambda_and_its_whole_record(verl_dir: Path) -> None:
    table = {r.id: r for r in small_table()}
    for row in all_rows(verl_dir):
        record = table[row["extra_info"]["id"]]
        lam = row["extra_info"]["cost_weight"]
        assert lam in (0.0, 0.5) and lam == draw_lambda(record.id, (0.0, 0.5))
        # The router's system prompt is added by the policy in the loop, as when serving.
        assert row["prompt"] == [{"role": "user", "content": record.prompt}]
        assert row["agent_name"] == "xrouter" and row["data_source"] == "xrouter"
        assert OutcomeRecord.model_validate_json(row["extra_info"]["record"]) == record
        settings = orjson.loads(row["extra_info"]["reward"])
        assert settings["form"] == "gated" and settings["reference_model"] is None
        assert float(settings["router_price"]["input"]) == 0.0


def test_lambda_draws_cover_the_grid() -> None:
    draws = Counter(draw_lambda(f"q{i}", (0.0, 0.1, 1.0)) for i in range(600))
    assert set(draws) == {0.0, 0.1, 1.0} and min(draws.values()) > 150
    assert draw_lambda("q1", (0.0, 0.1, 1.0), seed=1) in (0.0, 0.1, 1.0)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        VerlDataConfig(lambdas=(0.1, -1.0))
    with pytest.raises(ValueError, match="non-empty"):
        VerlDataConfig(lambdas=())
    with pytest.raises(ValueError, match="router_price"):
        VerlDataConfig(router_price=(1.0,))  # type: ignore[arg-type]
    # `--lambdas nan,inf` parses as floats: a NaN λ makes every reward NaN, an infinite
    # one makes a free model's penalty NaN (0 · ∞), and neither is a trade-off to learn.
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            VerlDataConfig(lambdas=(0.1, bad))
        with pytest.raises(ValueError, match="finite"):
            VerlDataConfig(router_price=(0.1, bad))


def test_models_whose_tools_would_share_a_name_are_refused(tmp_path: Path) -> None:
    # 'llama-3.1-8b' and 'llama-3_1-8b' were both offered as call_llama-3_1-8b: the router
    # could never call the first.
    records = small_table()
    for r in records:
        r.outcomes["llama-3_1-8b"] = r.outcomes["cheap"]
        r.outcomes["llama-3.1-8b"] = r.outcomes["cheap"]
    with pytest.raises(ValueError, match=r"'llama-3\.1-8b' and 'llama-3_1-8b' are both"):
        write_verl_dataset(records, tmp_path / "out", VerlDataConfig())
    assert not (tmp_path / "out").exists()


def test_the_pool_and_the_agent_loop_registration(verl_dir: Path) -> None:
    pool = pool_from_json(orjson.loads((verl_dir / "pool.json").read_bytes()))
    expected = pool_for(small_table())
    assert pool.names == expected.names
    assert [m.price for m in pool] == [m.price for m in expected]
    (entry,) = yaml.safe_load((verl_dir / "agent_loops.yaml").read_text())
    assert entry == {
        "name": "xrouter",
        "_target_": "training.verl.agent_loop.XRouterAgentLoop",
        "pool_path": str(verl_dir.resolve() / "pool.json"),
        "max_turns": 4,
    }


def test_verls_dataset_reads_the_rows(verl_dir: Path, tmp_path: Path) -> None:
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 4096,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "cache_dir": str(tmp_path),
        }
    )
    # verl annotates the tokenizer as transformers' slow (Python) one; it takes any.
    data = RLHFDataset([str(verl_dir / "train.parquet")], hermes_tokenizer(), config)  # type: ignore[arg-type]
    assert len(data) == len(rows(verl_dir, "train"))
    item = data[0]
    assert item["agent_name"] == "xrouter"
    assert item["raw_prompt"][0]["role"] == "user"
    assert (
        OutcomeRecord.model_validate_json(item["extra_info"]["record"]).id
        == item["extra_info"]["id"]
    )


def test_the_cli_writes_the_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "table.jsonl"
    write_outcome_table(small_table(), table)
    out = tmp_path / "verl"
    args = ["--lambdas", "0,0.2", "--reward", "additive", "--reference-model", "dear/model:v1"]
    args += ["--router-price", "0.1,0.4"]
    assert xrouter(["verl-data", "--table", str(table), "--out", str(out), *args]) == 0
    assert {p.name for p in out.iterdir()} == {
        "train.parquet",
        "validation.parquet",
        "test.parquet",
        "pool.json",
        "agent_loops.yaml",
        "train_grpo.sh",
    }
    row = rows(out, "train")[0]
    settings = orjson.loads(row["extra_info"]["reward"])
    assert settings["form"] == "additive" and settings["reference_model"] == "dear/model:v1"
    price = settings["router_price"]
    assert (float(price["input"]), float(price["output"])) == (0.1, 0.4)
    assert row["extra_info"]["cost_weight"] in (0.0, 0.2)
    printed = capsys.readouterr().out
    assert "3 models" in printed and "train_grpo.sh" in printed
    # The price as `xrouter eval --policy llm:...#price=IN/OUT` writes it works too.
    args[-1] = "0.1/0.4"
    assert xrouter(["verl-data", "--table", str(table), "--out", str(out), *args]) == 0
    price = orjson.loads(rows(out, "train")[0]["extra_info"]["reward"])["router_price"]
    assert (float(price["input"]), float(price["output"])) == (0.1, 0.4)


def test_the_cli_names_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "table.jsonl"
    write_outcome_table(small_table(), table)
    out = str(tmp_path / "o")
    assert xrouter(["verl-data", "--table", str(tmp_path / "none.jsonl"), "--out", out]) == 2
    assert "cannot read" in capsys.readouterr().err
    args = ["verl-data", "--table", str(table), "--out", out, "--reference-model", "gpt-9"]
    assert xrouter(args) == 2
    assert "--reference-model gpt-9: not a model of the table (models: " in capsys.readouterr().err
    # A reference free on one prompt: its reward there would be in --cost-scale's units.
    free = small_table()
    model = next(iter(free[0].outcomes))
    free[0].outcomes[model].cost_usd = 0.0
    write_outcome_table(free, table)
    args = ["verl-data", "--table", str(table), "--out", out, "--reference-model", model]
    assert xrouter(args) == 2
    err = capsys.readouterr().err
    assert f"reference model {model!r} has no positive cost on 1 of {len(free)} records" in err
    write_outcome_table(small_table(), table)
    # Refused with the arguments, each naming its option and what it takes.
    for option, bad, said in (
        ("--lambdas", "-1", "expected comma-separated non-negative numbers, got '-1'"),
        ("--router-price", "1", "expected two non-negative prices, IN,OUT or IN/OUT"),
        ("--router-price", "1/2/3", "expected two non-negative prices, IN,OUT or IN/OUT"),
    ):
        with pytest.raises(SystemExit) as exc:
            xrouter(["verl-data", "--table", str(table), "--out", out, option, bad])
        assert exc.value.code == 2
        assert f"argument {option}: {said}" in capsys.readouterr().err
    # A NaN cost scale would write NaN rewards into every row; 1e-310 infinite ones.
    for bad in ("nan", "1e-310"):
        with pytest.raises(SystemExit) as exc:
            xrouter(["verl-data", "--table", str(table), "--out", out, "--cost-scale", bad])
        assert exc.value.code == 2
        assert "argument --cost-scale: must be between" in capsys.readouterr().err


def test_logged_traffic_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rollout replays whichever model the router calls; a ledger export holds one model's
    outcome per prompt, so it cannot feed verl (it trains the compact router off-policy)."""
    logged = [
        OutcomeRecord.model_validate(
            {
                "id": r.id,
                "prompt": r.text,
                "outcomes": {m: o.model_dump(exclude_none=True)},
                "logged": {"action": m, "propensity": 0.5},
            }
        )
        for r in small_table()
        for m, o in list(r.outcomes.items())[:1]
    ]
    table = tmp_path / "logged.jsonl"
    write_outcome_table(logged, table)
    out = tmp_path / "o"
    assert xrouter(["verl-data", "--table", str(table), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "are logged traffic" in err and "xrouter train --offpolicy" in err
    assert not out.exists()
    # An --out that is a file is said to be one, before the table is read (it was mkdir's
    # "[Errno 17] File exists"), and the file is left alone.
    assert xrouter(["verl-data", "--table", str(table), "--out", str(table)]) == 2
    assert f"--out {table} is a file, not a directory" in capsys.readouterr().err


def test_outcomes_with_tokens_only_are_priced_as_eval_prices_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model with tokens but no cost_usd (the table format allows it) and no catalog price
    was written into pool.json at price 0 — free to every rollout — while xrouter eval and
    train refused the table; and a tokens-only outcome's cost counted 0 in the regret."""
    records = small_table()
    for r in records:
        r.outcomes["local"] = ModelOutcome(
            score=1.0, prompt_tokens=1000, completion_tokens=500, response="B"
        )
    table = tmp_path / "table.jsonl"
    write_outcome_table(records, table)
    out = tmp_path / "o"
    assert xrouter(["verl-data", "--table", str(table), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "model 'local' has no cost_usd and no price in the packaged price catalog" in err
    assert not out.exists()
    prices = tmp_path / "prices.yaml"
    prices.write_text("local: {input: 0.1, output: 0.4}\n")
    args = ["verl-data", "--table", str(table), "--out", str(out), "--prices", str(prices)]
    assert xrouter(args) == 0, capsys.readouterr().err
    exact = (1000 * 0.1 + 500 * 0.4) / 1e6  # $0.0003, not rounded to micro-dollars
    for row in all_rows(out):
        record = OutcomeRecord.model_validate_json(row["extra_info"]["record"])
        assert record.outcomes["local"].cost_usd == pytest.approx(exact, rel=1e-12)
    pool = pool_from_json(orjson.loads((out / "pool.json").read_bytes()))
    assert float(pool["local"].price.output) > 0


def test_a_run_into_an_earlier_runs_directory_leaves_none_of_its_splits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table with no test rows, written where another table's run was: its test.parquet
    stayed, and a table with no validation rows left train_grpo.sh pointing at a file
    that was not there (or was another table's)."""
    out = tmp_path / "o"
    table = tmp_path / "table.jsonl"
    write_outcome_table(small_table(), table)
    assert xrouter(["verl-data", "--table", str(table), "--out", str(out)]) == 0
    assert (out / "test.parquet").is_file()
    no_test = [r for r in small_table() if split_of(r.id) != "test"]
    write_outcome_table(no_test, table)
    assert xrouter(["verl-data", "--table", str(table), "--out", str(out)]) == 0
    assert not (out / "test.parquet").exists()
    assert len(all_rows_present(out)) == len(no_test)
    train_only = [r for r in small_table() if split_of(r.id) == "train"]
    write_outcome_table(train_only, table)
    assert xrouter(["verl-data", "--table", str(table), "--out", str(tmp_path / "t")]) == 2
    assert "verl needs training and validation rows" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def all_rows_present(verl_dir: Path) -> list[dict]:
    return [
        r
        for s in ("train", "validation", "test")
        if (verl_dir / f"{s}.parquet").exists()
        for r in rows(verl_dir, s)
    ]


def test_a_table_of_one_model_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One model leaves the router nothing to choose (its only rewarded move is to call it):
    refused in one line, as `xrouter train` refuses it, and no directory is written."""
    single = [
        OutcomeRecord(id=r.id, prompt=r.text, outcomes={"cheap": r.outcomes["cheap"]})
        for r in small_table()
    ]
    table = tmp_path / "single.jsonl"
    write_outcome_table(single, table)
    out = tmp_path / "o"
    assert xrouter(["verl-data", "--table", str(table), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: the table has outcomes of one model only ('cheap'): "
        "a router chooses between at least two models"
    ]
    assert not out.exists()
