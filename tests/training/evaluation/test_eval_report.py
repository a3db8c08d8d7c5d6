"""What `xrouter eval`'s report and console summary show: every off-policy estimator with
its interval, the logging policy's own figures, and each checkpoint's origin."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from router.outcomes import OutcomeRecord, write_outcome_table
from tests.training.evaluation.test_eval_cli import DEMO, eval_logged, parse
from training.evaluation.cli import main, run_eval
from training.evaluation.registry import RouterRegistry


def _logged_rows(n: int = 400, seed: int = 3) -> list[OutcomeRecord]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        action = "strong" if rng.random() < 0.3 else "cheap"
        rows.append(
            OutcomeRecord.model_validate(
                {
                    "id": f"l{i}",
                    "prompt": "hello",
                    "outcomes": {
                        action: {
                            "score": float(rng.random() < (0.9 if action == "strong" else 0.5)),
                            "cost_usd": 0.002 if action == "strong" else 0.0001,
                        }
                    },
                    "logged": {"action": action, "propensity": 0.3 if action == "strong" else 0.7},
                }
            )
        )
    return rows


def test_the_report_shows_ips_snips_and_dr_with_intervals_and_the_logging_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = _logged_rows()
    metrics = eval_logged(rows, tmp_path, "--lambdas", "0")
    report = (tmp_path / "out" / "report.md").read_text()
    [row] = [r for r in metrics["off_policy"] if r["router"] == "fixed-strong"]
    score = row["estimates"]["score"]
    line = next(x for x in report.splitlines() if x.startswith("| fixed-strong |"))
    for name in ("ips", "snips", "dr"):
        e = score[name]
        assert f"{e['value']:.4f} [{e['ci_low']:.4f}, {e['ci_high']:.4f}]" in line, name
    assert "score IPS | score SNIPS | score DR" in report
    # The logging policy's own figures: the plain mean of what it logged, with an interval.
    base = metrics["logging_policy"]
    mean = float(np.mean([next(iter(r.outcomes.values())).score for r in rows]))
    assert base["n"] == len(rows)
    assert base["score"]["value"] == pytest.approx(mean)
    assert base["score"]["ci_low"] < mean < base["score"]["ci_high"]
    cost = float(np.mean([next(iter(r.outcomes.values())).cost_usd for r in rows]))
    assert base["cost_usd"]["value"] == pytest.approx(cost)
    s = base["score"]
    expected = f"score {s['value']:.4f} [{s['ci_low']:.4f}, {s['ci_high']:.4f}]"
    assert f"Logging policy on these {len(rows)} logs" in report and expected in report
    out = capsys.readouterr().out
    assert f"logging policy {expected}" in out
    assert "fixed-strong  λ 0  score (SNIPS)" in out


def test_checkpoints_are_named_by_where_they_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's name carries its content version alone: two runs in a report were
    told apart by mapping versions to runs by hand."""
    from router.checkpoint import load_checkpoint

    demo = load_checkpoint("packaged:demo")
    assert demo.path is not None
    shutil.copytree(demo.path, tmp_path / "runs" / "night-1" / "checkpoint")
    deep = tmp_path / ("x" * 60) / "y" / "run-2"
    shutil.copytree(demo.path, deep / "checkpoint")
    monkeypatch.chdir(tmp_path)
    name = f"compact-knn[{demo.version}]"
    base = ["--table", str(DEMO), "--baselines", "none", "--bootstrap", "0", "--lambdas", "0,1"]
    assert main([*base, "--policy", "runs/night-1", "--out", "a"]) == 0
    out = capsys.readouterr().out
    assert f"  {name} (runs/night-1)  AIQ" in out
    assert f"| {name} (runs/night-1) | policy |" in Path("a/report.md").read_text()
    meta = json.loads(Path("a/metrics.json").read_text())["meta"]
    assert meta["sources"] == {name: "runs/night-1"}
    # A path too long to read is cut to its last components; a shipped one by its name.
    assert main([*base, "--policy", str(deep / "checkpoint"), "--out", "b"]) == 0
    assert f"{name} (…/y/run-2)" in capsys.readouterr().out
    assert main([*base, "--policy", "packaged:demo", "--out", "c"]) == 0
    assert f"{name} (packaged:demo)" in Path("c/report.md").read_text()


class _Zigzag:
    """A policy whose cost rises with λ at some steps: the cheap model at even λ, the
    strong one at odd λ."""

    name = "zigzag"

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[str]:
        return ["strong" if int(cost_weight) % 2 else "cheap"] * len(records)


class _Thrifty(_Zigzag):
    """Spends less as λ grows."""

    name = "thrifty"

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[str]:
        return ["strong" if cost_weight < 2 else "mid" if cost_weight < 4 else "cheap"] * len(
            records
        )


def test_a_sweep_whose_cost_rises_with_lambda_is_flagged(
    tmp_path: Path, table_factory, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "table.jsonl"
    write_outcome_table(table_factory(120, seed=8), table)
    registry = RouterRegistry()
    registry.register("zigzag", lambda spec, ctx: _Zigzag())
    registry.register("thrifty", lambda spec, ctx: _Thrifty())
    out = tmp_path / "out"
    args = parse(["--table", str(table), "--policy", "zigzag", "--policy", "thrifty",
                  "--baselines", "none", "--bootstrap", "0", "--lambdas", "0,1,2,3,4,5",
                  "--out", str(out)])  # fmt: skip
    assert run_eval(args, registry) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    rises = metrics["cost_rises_with_lambda"]
    assert set(rises) == {"zigzag"}  # the thrifty one spends less as λ grows
    z = rises["zigzag"]
    assert (z["steps"], z["of"]) == (3, 5)  # 0→1, 2→3, 4→5
    [curve] = [c for c in metrics["comparison"]["routers"] if c["name"] == "zigzag"]
    cost = {p["param"]: p["cost_usd"] for p in curve["points"]}
    largest = max(cost[b] - cost[a] for a, b in ((0, 1), (2, 3), (4, 5)))
    assert z["largest_rise_usd"] == pytest.approx(largest)
    note = "zigzag: average cost rose with λ at 3 of its 5 steps of increasing λ"
    assert note in (out / "report.md").read_text() and note in capsys.readouterr().out
    assert "thrifty: average cost rose" not in (out / "report.md").read_text()


def test_one_logged_record_reports_an_unbounded_cost_interval_not_inf(tmp_path: Path) -> None:
    # One record says nothing of the spread: the cost interval has no upper end (costs have
    # no ceiling). The report must say so in words, not print "$inf".
    metrics = eval_logged(_logged_rows(n=1), tmp_path, "--lambdas", "0")
    assert metrics["logging_policy"]["cost_usd"]["ci_high"] is None
    report = (tmp_path / "out" / "report.md").read_text()
    line = next(x for x in report.splitlines() if x.startswith("Logging policy on these 1 logs"))
    assert "inf" not in line
    assert ", unbounded]." in line
