from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from router.outcomes import OutcomeRecord, load_outcome_table, write_outcome_table
from training.datasets.splits import split_records
from training.evaluation.baselines import SingleModelRouter
from training.evaluation.cli import add_eval_arguments, main, run_eval
from training.evaluation.registry import LoadContext, RouterRegistry

DEMO = Path(__file__).resolve().parents[3] / "router" / "assets" / "demo_outcomes.jsonl"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_eval_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture
def table(tmp_path: Path, table_factory) -> Path:
    path = tmp_path / "table.jsonl"
    write_outcome_table(table_factory(300, seed=21), path)
    return path


def test_eval_without_matplotlib_writes_metrics_and_report(
    table: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A base install (no train extra) ran the whole evaluation, then died on the plot's
    # import with a traceback and no report.md.
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    out = tmp_path / "report"
    with caplog.at_level("WARNING"):
        code = main(["--table", str(table), "--policy", "knn:k=10", "--out", str(out)])
    assert code == 0
    assert {p.name for p in out.iterdir()} == {"metrics.json", "report.md"}
    assert "no curve.png: matplotlib is not installed" in caplog.text


def test_eval_writes_metrics_plot_and_report(table: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "report"
    code = main(
        [
            "--table",
            str(table),
            "--policy",
            "knn:k=10",
            "--strong",
            "strong",
            "--weak",
            "cheap",
            "--lambdas",
            "0,0.05,0.2,1,5",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert {p.name for p in out.iterdir()} == {"metrics.json", "curve.png", "report.md"}
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    metrics = json.loads((out / "metrics.json").read_text())
    comp = metrics["comparison"]
    names = [r["name"] for r in comp["routers"]]
    assert names[:3] == ["single:cheap", "single:mid", "single:strong"]
    assert {"oracle", "random", "knn", "mf", "cascade", "knn:k=10"} <= set(names)
    policy = next(r for r in comp["routers"] if r["name"] == "knn:k=10")
    assert policy["kind"] == "policy" and [p["param"] for p in policy["points"]] == [
        0,
        0.05,
        0.2,
        1,
        5,
    ]
    oracle = next(r for r in comp["routers"] if r["name"] == "oracle")
    assert oracle["aiq"] > comp["no_routing_aiq"]
    assert comp["best_single_model"]["name"] == "strong"
    assert metrics["meta"]["n_evaluated"] + metrics["meta"]["n_train"] <= 300

    two = metrics["two_model"]
    assert two["models"] == ["cheap", "strong"]
    assert two["pgr_pair"] == {"strong": "strong", "weak": "cheap"}
    random_row = next(r for r in two["routers"] if r["name"] == "random")
    assert 0.3 < random_row["apgr"] < 0.7
    assert next(r for r in two["routers"] if r["name"] == "single:strong")["apgr"] is None

    report = (out / "report.md").read_text()
    assert "| knn:k=10 | policy |" in report and "APGR" in report
    assert "training.evaluation.cli --table" in report
    assert "no-routing AIQ" in capsys.readouterr().out


def test_two_model_table_gets_pgr_in_the_main_comparison(tmp_path: Path, table_factory) -> None:
    path = tmp_path / "two.jsonl"
    write_outcome_table(table_factory(200, seed=22, models={"cheap": 1e-4, "strong": 2e-3}), path)
    out = tmp_path / "out"
    assert (
        run_eval(parse(["--table", str(path), "--baselines", "random,oracle", "--out", str(out)]))
        == 0
    )
    metrics = json.loads((out / "metrics.json").read_text())
    comp = metrics["comparison"]
    assert comp["pgr_pair"] == {"strong": "strong", "weak": "cheap"}
    # The oracle calls the strong model exactly where only it is right (a share x), which
    # recovers the whole gap there: PGR goes (0, 0) -> (x, 1) -> (1, 1), area 1 - x / 2.
    test = split_records(load_outcome_table(path), (0.6, 0.2, 0.2), "0").test
    assert len(test) == comp["n_records"]
    x = np.mean([r.outcomes["strong"].score > r.outcomes["cheap"].score for r in test])
    oracle = next(r for r in comp["routers"] if r["name"] == "oracle")
    assert oracle["apgr"] == pytest.approx(1 - x / 2)
    assert oracle["cpt"]["50"] == pytest.approx(x / 2)


def test_registered_loader_is_used(table: Path, tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []

    def load(spec: str, ctx: LoadContext) -> SingleModelRouter:
        seen.append((spec, len(ctx.train)))
        return SingleModelRouter(spec.removeprefix("const:"))

    registry = RouterRegistry()
    registry.register("const:", load)
    out = tmp_path / "out"
    args = parse(
        ["--table", str(table), "--policy", "const:mid", "--baselines", "none", "--out", str(out)]
    )
    assert run_eval(args, registry) == 0
    assert seen and seen[0][0] == "const:mid" and seen[0][1] > 100
    names = [
        r["name"] for r in json.loads((out / "metrics.json").read_text())["comparison"]["routers"]
    ]
    assert names[-1] == "single:mid"


def test_unknown_policy_and_bad_table_exit_with_an_error(
    table: Path, tmp_path: Path, capsys
) -> None:
    base = ["--table", str(table), "--baselines", "none", "--out", str(tmp_path / "o")]
    assert run_eval(parse([*base, "--policy", "nonsense"]), RouterRegistry()) == 2
    assert "unknown policy 'nonsense'" in capsys.readouterr().err
    # A checkpoint path with a typo is said to be one, not only "unknown policy".
    assert run_eval(parse([*base, "--policy", str(tmp_path / "runs" / "nope")])) == 2
    assert "no such checkpoint: nothing is at that path" in capsys.readouterr().err
    args = parse([*base, "--policy", "knn:q=3"])
    assert run_eval(args, RouterRegistry()) == 2
    assert "unknown parameter(s) q" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "x"}\n')
    assert run_eval(parse(["--table", str(broken), "--out", str(tmp_path / "o")])) == 2
    assert "broken.jsonl:1" in capsys.readouterr().err


class _Fixed:
    """A deterministic policy for the logged-table path."""

    name = "fixed-strong"

    def route(self, records: Sequence[OutcomeRecord], cost_weight: float) -> list[str]:
        return ["strong" if cost_weight < 1 else "cheap"] * len(records)


def eval_logged(rows: list[OutcomeRecord], tmp_path: Path, *argv: str) -> dict:
    """Write ``rows`` as a logged table, evaluate ``--policy fixed`` (``_Fixed``) on all of
    it with ``argv`` added, and return metrics.json (report.md is beside it in tmp/out)."""
    path = tmp_path / "logged.jsonl"
    write_outcome_table(rows, path)
    registry = RouterRegistry()
    registry.register("fixed", lambda spec, ctx: _Fixed())
    out = tmp_path / "out"
    args = parse(
        ["--table", str(path), "--split", "all", "--policy", "fixed", *argv, "--out", str(out)]
    )
    assert run_eval(args, registry) == 0
    return dict(json.loads((out / "metrics.json").read_text()))


def test_logged_table_is_evaluated_off_policy(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(600):
        action = "strong" if rng.random() < 0.3 else "cheap"
        p = 0.3 if action == "strong" else 0.7
        score = float(rng.random() < (0.9 if action == "strong" else 0.5))
        rows.append(
            OutcomeRecord.model_validate(
                {
                    "id": f"l{i}",
                    "prompt": "hello",
                    "outcomes": {
                        action: {
                            "score": score,
                            "cost_usd": 0.002 if action == "strong" else 0.0001,
                        }
                    },
                    "logged": {"action": action, "propensity": p},
                }
            )
        )
    out = tmp_path / "out"
    metrics = eval_logged(rows, tmp_path, "--lambdas", "0,2")
    assert metrics["comparison"] is None
    rows_out = {(r["router"], r["param"]): r["estimates"] for r in metrics["off_policy"]}
    strong = rows_out[("fixed-strong", 0.0)]["score"]["snips"]
    assert abs(strong["value"] - 0.9) < 3 * strong["stderr"] + 0.01
    assert rows_out[("fixed-strong", 2.0)]["cost_usd"]["snips"]["value"] == pytest.approx(0.0001)
    assert ("single:cheap", 0.0) in rows_out
    report = (out / "report.md").read_text()
    assert "Off-policy estimates" in report
    # The propensities are right: every router's weights average about 1, and no note.
    for r in metrics["off_policy"]:
        assert abs(r["mean_weight"] - 1.0) < 3 * r["mean_weight_stderr"] + 0.05, r
        mean = f"| {r['mean_weight']:.2f} ± {r['mean_weight_stderr']:.2f} |"
        assert mean in report
    assert "off-policy propensities" not in report


def test_logged_traffic_with_cascades_and_named_models_is_evaluated_off_policy(
    tmp_path: Path,
) -> None:
    """An export mixes explored router decisions, a cascade's multi-call trajectories and
    requests that named their model (propensity 1). The cascades are skipped; where a
    router picks a model that a propensity-1 record gave no chance, it is counted."""
    rows = []
    for i in range(200):
        action, p = ("strong", 0.3) if i % 3 == 0 else ("cheap", 0.7)
        logged: dict[str, object] = {"action": action, "propensity": p}
        if i % 10 == 1:  # a cascade: cheap, then strong
            logged = {"action": "cheap", "propensity": 1.0, "actions": ["cheap", "strong"]}
        elif i % 10 == 2:  # the request named the cheap model
            logged = {"action": "cheap", "propensity": 1.0, "policy": "passthrough"}
        action = str(logged["action"])
        rows.append(
            OutcomeRecord.model_validate(
                {
                    "id": f"m{i}",
                    "prompt": f"hello {i}",
                    "outcomes": {action: {"score": 1.0, "cost_usd": 0.001}},
                    "logged": logged,
                }
            )
        )
    out = tmp_path / "out"
    metrics = eval_logged(rows, tmp_path, "--policy", "single:cheap", "--lambdas", "0,2")
    got = {(r["router"], r["param"]): r for r in metrics["off_policy"]}
    # 20 cascades skipped; 20 named-model records, all on the cheap model.
    assert got[("fixed-strong", 0.0)]["estimates"]["score"]["snips"]["n"] == 180
    assert got[("fixed-strong", 0.0)]["unsupported"] == 20
    assert got[("fixed-strong", 2.0)]["unsupported"] == 0  # it picks cheap there
    assert got[("single:cheap", 0.0)]["unsupported"] == 0
    assert got[("single:strong", 0.0)]["unsupported"] == 20
    # `--policy single:cheap` is the single-model row, not a second one.
    assert sum(r["router"] == "single:cheap" for r in metrics["off_policy"]) == 1
    notes = " ".join(metrics["notes"])
    assert "20 of 200 logged records are multi-call" in notes
    assert "fixed-strong 20" in notes and "single:strong 20" in notes
    assert "| 20 of 180 |" in (out / "report.md").read_text()


def test_learned_escalation_is_available_by_name(table: Path, tmp_path: Path) -> None:
    out = tmp_path / "esc"
    argv = [
        "--table",
        str(table),
        "--policy",
        "escalation:max_cheap=2,l2=10",
        "--baselines",
        "none",
    ]
    assert main([*argv, "--bootstrap", "0", "--out", str(out)]) == 0
    rows = {
        r["name"]: r
        for r in json.loads((out / "metrics.json").read_text())["comparison"]["routers"]
    }
    esc = rows["escalation:max_cheap=2,l2=10"]
    # A multi-call policy: some of its points call more than one model per prompt.
    assert any(sum(p["calls"].values()) > 1.0 for p in esc["points"])
    assert main([*argv[:3], "escalation:nope=1", "--out", str(out)]) == 2


def test_records_without_a_logged_prompt_are_flagged(tmp_path: Path) -> None:
    rows = [
        OutcomeRecord.model_validate(
            {
                "id": f"b{i}",
                "prompt": "[content not logged]",
                "content_logged": "none" if i % 2 else "full",
                "outcomes": {"cheap": {"score": 1.0, "cost_usd": 0.0001}},
                "logged": {"action": "cheap", "propensity": 0.5},
            }
        )
        for i in range(40)
    ]
    notes = eval_logged(rows, tmp_path)["notes"]
    assert any(n.startswith("20 of the 40 evaluated records carry no prompt") for n in notes)


def test_an_unwritable_output_directory_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "t.jsonl"
    write_outcome_table(load_outcome_table(DEMO)[:60], table)
    args = parse(["--table", str(table), "--baselines", "none", "--bootstrap", "0",
                  "--out", str(table / "out")])  # fmt: skip
    assert run_eval(args) == 2
    assert "cannot write the report" in capsys.readouterr().err


def test_a_router_that_must_be_fitted_on_full_outcomes_is_refused_on_logged_traffic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        OutcomeRecord.model_validate(
            {
                "id": f"k{i}",
                "prompt": f"q {i}",
                "outcomes": {("a", "b")[i % 2]: {"score": 1.0, "cost_usd": 0.001}},
                "logged": {"action": ("a", "b")[i % 2], "propensity": 0.5},
            }
        )
        for i in range(60)
    ]
    path = tmp_path / "logged.jsonl"
    write_outcome_table(rows, path)
    assert main(["--table", str(path), "--policy", "knn", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "is logged traffic" in err and "xrouter train --offpolicy" in err
    assert "Traceback" not in err


def test_an_export_of_one_model_s_traffic_is_evaluated_off_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every record holds the one model's outcome, as a full table would, but only because
    # the gateway sent every prompt there: the estimates are off-policy, not a sweep that
    # scores a router as if it had had every model's outcome.
    rows = [
        OutcomeRecord.model_validate(
            {
                "id": f"k{i}",
                "prompt": f"q {i}",
                "outcomes": {"a": {"score": float(i % 2), "cost_usd": 0.001}},
                "logged": {"action": "a", "propensity": 1.0, "policy": "passthrough"},
            }
        )
        for i in range(60)
    ]
    path = tmp_path / "one.jsonl"
    write_outcome_table(rows, path)
    out = tmp_path / "o"
    assert main(["--table", str(path), "--policy", "single:a", "--bootstrap", "0",
                 "--split", "all", "--out", str(out)]) == 0  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["comparison"] is None  # no sweep over outcomes the table does not hold
    estimates = {(r["router"], r["param"]): r["estimates"] for r in metrics["off_policy"]}
    (ips,) = [e["score"]["ips"] for (name, _), e in estimates.items() if name == "single:a"]
    assert ips["value"] == pytest.approx(0.5) and ips["n"] == 60


def test_bad_policies_and_cost_weights_are_refused_in_one_line(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "o")
    base = ["--table", str(table), "--baselines", "none", "--bootstrap", "0", "--out", out]
    assert main([*base, "--policy", "single:nope"]) == 2
    assert (
        "the table has no model 'nope' (its models: cheap, mid, strong)" in capsys.readouterr().err
    )
    for bad in ("-1", "0,nan"):
        with pytest.raises(SystemExit) as exc:
            main([*base, "--policy", "knn", "--lambdas", bad])
        assert exc.value.code == 2
        assert "expected comma-separated non-negative numbers" in capsys.readouterr().err
    # A fixed model the table lacks: refused, as single: is, not evaluated as the cheapest.
    for spec in ("fixed:nope", "policy:fixed:nope"):
        assert main([*base, "--policy", spec]) == 2
        assert "the table has no model 'nope'" in capsys.readouterr().err
    # A single (or fixed) model outside the two-model slice is a row of the full comparison
    # only.
    for spec in ("single:mid", "policy:fixed:mid"):
        assert main([*base, "--policy", spec, "--strong", "strong", "--weak", "cheap"]) == 0
        metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
        assert spec in {r["name"] for r in metrics["comparison"]["routers"]}
        assert spec not in {r["name"] for r in metrics["two_model"]["routers"]}
    # The same model twice is no two-model slice: refused, not a section without PGR.
    assert main([*base, "--policy", "knn", "--strong", "mid", "--weak", "mid"]) == 2
    err = capsys.readouterr().err
    assert "error: --strong and --weak must be two models, got 'mid' twice" in err


def test_one_bootstrap_resample_is_refused_not_a_zero_width_interval(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One resample's 95% percentile interval is that resample's value: it printed
    # "(1 resamples, 95% percentile intervals)" over intervals of width 0.
    base = ["--table", str(table), "--baselines", "none", "--out", str(tmp_path / "o")]
    assert main([*base, "--bootstrap", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --bootstrap must be 0 (no intervals) or at least 2 resamples, got 1"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", ["1e-310", "0", "-1", "inf", "nan", "1e308"])
def test_a_cost_scale_that_cannot_give_finite_figures_is_a_bad_argument(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # 1e-310 (subnormal) and 1e308 ran to the end (the λ grid past float's range: numpy's
    # overflow warnings, and figures only as finite as the table's costs happened to keep
    # them); 0, inf and nan were refused only once the table was read, and not as arguments.
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as exc:
        main(
            ["--table", str(table), "--bootstrap", "0", "--out", str(out), f"--cost-scale={value}"]
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --cost-scale: must be between 1e-12 and 1e+12" in err, err
    assert "Traceback" not in err and not out.exists()


def test_the_cost_scale_s_bounds_are_accepted() -> None:
    for bound in (1e-12, 1e12):
        assert (
            parse(["--table", "t", "--out", "o", "--cost-scale", repr(bound)]).cost_scale == bound
        )


def test_a_password_in_an_llm_router_s_url_is_never_written_or_shown(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It was in the console note, metrics.json (the router's name, the policies, the
    # command) and report.md.
    out = tmp_path / "o"
    spec = "llm:http://u:s3cretpw@127.0.0.1:9/v1#m"
    base = ["--table", str(table), "--baselines", "none", "--bootstrap", "0", "--out", str(out)]
    assert main([*base, "--policy", spec, "--policy", "single:mid"]) == 0
    shown = capsys.readouterr()
    assert "s3cretpw" not in shown.out + shown.err
    assert "llm:http://u:***@127.0.0.1:9/v1#m: not evaluated" in shown.out + shown.err
    for name in ("metrics.json", "report.md"):
        text = (out / name).read_text()
        assert "s3cretpw" not in text and "u:***@127.0.0.1" in text, name
    # A base URL that is not http(s) is refused at once, not tried on every prompt.
    assert main([*base, "--policy", "llm:not-a-url"]) == 2
    assert "the router's base URL must be http(s)://" in capsys.readouterr().err


def test_a_table_with_repeated_ids_or_a_missing_outcome_is_refused_by_name(
    tmp_path: Path, table_factory, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = table_factory(60, seed=4)
    path = tmp_path / "t.jsonl"
    out = ["--baselines", "none", "--policy", "single:mid", "--out", str(tmp_path / "o")]
    # The same prompt twice would be counted (and weigh) twice.
    write_outcome_table([*rows, rows[3]], path)
    assert main(["--table", str(path), *out]) == 2
    assert f"t.jsonl:61: duplicate id {rows[3].id!r}" in capsys.readouterr().err
    # A research table with one gap is neither full-information nor logged traffic.
    gap = [r.model_copy(deep=True) for r in rows]
    del gap[5].outcomes["strong"]
    write_outcome_table(gap, path)
    assert main(["--table", str(path), *out]) == 2
    err = capsys.readouterr().err
    assert f"record {gap[5].id!r} has no outcome for model(s) 'strong'" in err
    assert "cannot evaluate off-policy" not in err


def test_a_cost_no_prompt_ever_had_is_refused_by_its_line_not_overflowed(
    tmp_path: Path, table_factory, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was numpy's "overflow encountered in divide" (the cost normalization) and then
    # "error: Geometric sequence cannot include zero" (the λ grid), exit 2.
    rows = table_factory(60, seed=4)
    rows[3].outcomes["strong"].cost_usd = 1e308
    path = tmp_path / "t.jsonl"
    write_outcome_table(rows, path)
    assert main(["--table", str(path), "--split", "all", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "t.jsonl:4: outcomes.strong.cost_usd: Input should be less than or equal to" in err
    assert "overflow" not in err and "Geometric" not in err, err
    assert not (tmp_path / "o").exists()


def test_a_checkpoint_or_gateway_policy_is_named_as_an_operator_would(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--policy` takes a checkpoint path (its directory, its checkpoint.json, the run
    directory), `packaged:<name>`, or a policy name as a client puts it in `model`, besides
    the prefixed specs."""
    import shutil

    from router.checkpoint import load_checkpoint

    run = tmp_path / "run"
    demo = load_checkpoint("packaged:demo")
    assert demo.path is not None
    shutil.copytree(demo.path, run / "checkpoint")
    version = demo.version
    base = ["--table", str(DEMO), "--baselines", "none", "--bootstrap", "0"]
    for i, spec in enumerate(
        [str(run), str(run / "checkpoint"), str(run / "checkpoint" / "checkpoint.json"),
         "packaged:demo", "compact"]
    ):  # fmt: skip
        out = tmp_path / f"o{i}"
        assert main([*base, "--policy", spec, "--out", str(out)]) == 0, spec
        names = {r["name"] for r in json.loads((out / "metrics.json").read_text())["comparison"]["routers"]}  # fmt: skip
        assert f"compact-knn[{version}]" in names, (spec, names)
    # Named twice (the packaged default, and `compact`, which means it): one row.
    out = tmp_path / "twice"
    assert main([*base, "--policy", "packaged:demo", "--policy", "compact", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    named = [r["name"] for r in metrics["comparison"]["routers"]]
    assert named.count(f"compact-knn[{version}]") == 1
    out = tmp_path / "p"
    assert main([*base, "--policy", "cheapest", "--out", str(out)]) == 0
    names = {r["name"] for r in json.loads((out / "metrics.json").read_text())["comparison"]["routers"]}  # fmt: skip
    assert "policy:cheapest" in names
    assert main([*base, "--policy", "llm", "--out", str(out)]) == 2
    assert "llm:BASE_URL" in capsys.readouterr().err
    assert main([*base, "--policy", str(tmp_path), "--out", str(out)]) == 2
    assert "a checkpoint path or packaged:<name>" in capsys.readouterr().err


def test_a_policy_is_also_estimated_at_the_cost_weights_the_traffic_asked_for(
    tmp_path: Path,
) -> None:
    """Half the logged requests asked for λ = 0, half for λ = 2: `fixed-strong` (strong
    below λ = 1, cheap above) would have served the first half strong and the rest cheap."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(600):
        action = "strong" if rng.random() < 0.3 else "cheap"
        cost = 0.002 if action == "strong" else 0.0001
        rows.append(
            OutcomeRecord.model_validate(
                {
                    "id": f"w{i}",
                    "prompt": f"hello {i}",
                    "outcomes": {action: {"score": 1.0, "cost_usd": cost}},
                    "logged": {
                        "action": action,
                        "propensity": 0.3 if action == "strong" else 0.7,
                        "cost_weight": 0.0 if i % 2 == 0 else 2.0,
                    },
                }
            )
        )
    out = tmp_path / "out"
    metrics = eval_logged(rows, tmp_path)
    got = {(r["router"], r["param"]): r["estimates"] for r in metrics["off_policy"]}
    assert got[("fixed-strong", 0.0)]["cost_usd"]["snips"]["value"] == pytest.approx(0.002)
    mixed = got[("fixed-strong", None)]["cost_usd"]["snips"]["value"]
    assert mixed == pytest.approx((0.002 + 0.0001) / 2, rel=0.15)
    assert ("single:cheap", None) not in got  # a fixed model has no cost weight to follow
    assert "| fixed-strong | as logged |" in (out / "report.md").read_text()


def test_a_checkpoint_evaluated_on_a_table_with_models_it_was_not_trained_on(
    tmp_path: Path,
) -> None:
    """It routes among the models it knows, never the others, and the report says so."""
    rows = []
    for r in load_outcome_table(DEMO)[:120]:
        data = r.model_dump(exclude_none=True)
        data["outcomes"]["house-model"] = {"score": 1.0, "cost_usd": 1e-7, "response": "right"}
        rows.append(OutcomeRecord.model_validate(data))
    path = tmp_path / "table.jsonl"
    write_outcome_table(rows, path)
    out = tmp_path / "out"
    argv = ["--table", str(path), "--split", "all", "--baselines", "none", "--bootstrap", "0",
            "--policy", "packaged:demo-rl", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    [note] = [n for n in metrics["comparison"]["notes"] if "not trained on house-model" in n]
    assert note.startswith("compact[") and note in (out / "report.md").read_text()
    [router] = [r for r in metrics["comparison"]["routers"] if r["name"].startswith("compact[")]
    assert all(p["shares"].get("house-model", 0) == 0 for p in router["points"])


def test_a_free_best_model_is_matched_at_a_price_not_never(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a free best model there is no share of its cost to print: the cost to match it
    is said in dollars (it is reached), never "never"."""
    scores = {"free": (1, 1, 1, 0), "paid": (1, 1, 0, 0)}
    records = [
        OutcomeRecord.model_validate(
            {
                "id": f"p{i}",
                "prompt": f"question {i}",
                "outcomes": {
                    "free": {"score": scores["free"][i], "cost_usd": 0.0},
                    "paid": {"score": scores["paid"][i], "cost_usd": 0.01},
                },
            }
        )
        for i in range(4)
    ]
    path = tmp_path / "free.jsonl"
    write_outcome_table(records, path)
    argv = ["--table", str(path), "--split", "all", "--bootstrap", "0", "--baselines", "oracle"]
    assert run_eval(parse([*argv, "--out", str(tmp_path / "out")])) == 0
    oracle = next(line for line in capsys.readouterr().out.splitlines() if "oracle" in line)
    assert oracle.endswith("cost to match best $0.000000"), oracle


@pytest.mark.parametrize("paid_cost", [0.01, 0.0])
def test_free_models_are_drawn_on_the_cost_quality_plot(paid_cost: float) -> None:
    """A free (local) model used to vanish from curve.png: its cost 0 has no place on a log
    axis, and with every model free the plot was empty."""
    from matplotlib.figure import Figure

    from training.evaluation.compare import compare
    from training.evaluation.report import _plot_comparison

    records = [
        OutcomeRecord.model_validate(
            {
                "id": f"p{i}",
                "prompt": f"question {i}",
                "outcomes": {
                    "local": {"score": float(i % 2), "cost_usd": 0.0},
                    "paid": {"score": 1.0, "cost_usd": paid_cost},
                },
            }
        )
        for i in range(6)
    ]
    comp = compare([], records)
    ax = Figure().add_subplot()
    _plot_comparison(ax, comp)
    assert ax.get_xscale() != "log"
    lo, hi = ax.get_xlim()
    assert lo <= 0.0 <= paid_cost <= hi
    # Every single model's point is drawn where it is, at a finite place on the axes.
    drawn = {(float(x), float(y)) for c in ax.collections for x, y in np.asarray(c.get_offsets())}
    assert {(0.0, 0.5), (paid_cost, 1.0)} <= drawn
    assert np.isfinite(ax.transData.transform([(0.0, 0.5), (paid_cost, 1.0)])).all()


def test_outcomes_with_tokens_but_no_cost_are_priced_as_train_prices_them(
    tmp_path: Path, table_factory
) -> None:
    """The outcome-table format lets a cost be derived from tokens and a price table: eval
    prices such outcomes (``--prices``, else the packaged catalog), and evaluates the table
    exactly as the same table with those costs written out."""
    prices: dict[str, dict[str, float]] = {
        "cheap": {"input": 0.1, "output": 0.4},
        "mid": {"input": 0.5, "output": 2},
        "strong": {"input": 3, "output": 12},
    }  # USD per million tokens
    (tmp_path / "prices.json").write_text(json.dumps(prices))
    priced: list[OutcomeRecord] = []
    tokens_only: list[OutcomeRecord] = []
    for i, r in enumerate(table_factory(240, seed=5)):
        with_cost: dict[str, object] = {}
        without: dict[str, object] = {}
        for m, o in r.outcomes.items():
            p, c = 200 + i, 30 + 7 * (i % 5)
            usd = (p * prices[m]["input"] + c * prices[m]["output"]) / 1e6
            base = {
                "score": o.score,
                "response": o.response,
                "prompt_tokens": p,
                "completion_tokens": c,
            }
            with_cost[m] = {**base, "cost_usd": usd}
            without[m] = base
        priced.append(OutcomeRecord.model_validate({**r.model_dump(), "outcomes": with_cost}))
        tokens_only.append(OutcomeRecord.model_validate({**r.model_dump(), "outcomes": without}))
    write_outcome_table(priced, tmp_path / "a.jsonl")
    write_outcome_table(tokens_only, tmp_path / "b.jsonl")

    def aiqs(table: str, *extra: str) -> dict[str, float]:
        out = tmp_path / f"out-{table}"
        argv = ["--table", str(tmp_path / table), "--policy", "knn:k=10", "--out", str(out)]
        assert main([*argv, "--baselines", "oracle,random", *extra]) == 0
        rows = json.loads((out / "metrics.json").read_text())["comparison"]["routers"]
        return {r["name"]: r["aiq"] for r in rows}

    expected = aiqs("a.jsonl")
    assert aiqs("b.jsonl", "--prices", str(tmp_path / "prices.json")) == pytest.approx(expected)
    # A price table that cannot be read is an error even for a table it would not price.
    argv = ["--table", str(tmp_path / "a.jsonl"), "--policy", "knn:k=10", "--baselines", "none"]
    for bad in (tmp_path / "missing.json", tmp_path / "a.jsonl"):
        assert main([*argv, "--out", str(tmp_path / "o-bad"), "--prices", str(bad)]) == 2


def test_an_outcome_that_cannot_be_priced_is_named(tmp_path: Path, capsys) -> None:
    rec = {
        "id": "r1",
        "prompt": "hi",
        "outcomes": {
            "in-house-model": {"score": 1, "prompt_tokens": 10, "completion_tokens": 5},
            "other": {"score": 0, "cost_usd": 0.001},
        },
    }
    (tmp_path / "t.jsonl").write_text(json.dumps(rec) + "\n")
    assert (
        main(["--table", str(tmp_path / "t.jsonl"), "--split", "all", "--out", str(tmp_path / "o")])
        == 2
    )
    err = capsys.readouterr().err
    assert "'in-house-model' has no cost_usd and no price in the packaged price catalog" in err
    assert "--prices" in err and "Traceback" not in err


def test_the_split_seed_is_a_number_as_train_takes_it(table: Path, tmp_path: Path) -> None:
    # The split hashes the seed's text: read as text, "01" was another split than the one a
    # checkpoint trained with --split-seed 01 (the integer 1) held out.
    def evaluated(seed: str) -> list[object]:
        out = tmp_path / f"o{seed}"
        argv = ["--table", str(table), "--baselines", "oracle", "--out", str(out)]
        assert main([*argv, "--split-seed", seed]) == 0
        return [json.loads((out / "metrics.json").read_text())["meta"]["split_seed"]]

    assert evaluated("01") == evaluated("1") == [1]
    with pytest.raises(SystemExit):
        parse(["--table", str(table), "--split-seed", "one", "--out", str(tmp_path)])


def test_a_policy_on_logged_traffic_routes_among_every_model_of_the_table(
    tmp_path: Path,
) -> None:
    """The cheapest model was explored only on prompts of the training part. Evaluated on
    the test part, the policy still routes among every model of the table, so it picks that
    model, is estimated without support there (IPS 0) and gets a note saying so. It used to
    route among the test part's models alone and was estimated as a policy it is not (here:
    the next cheapest); then it got no estimate at all, only a note."""
    ids = [f"r{i}" for i in range(300)]
    parts = split_records([OutcomeRecord.model_validate(
        {"id": i, "prompt": "x", "outcomes": {"a": {"score": 1.0, "cost_usd": 0.001}}}
    ) for i in ids])  # fmt: skip
    train = {r.id for r in parts.train}
    rows = []
    for n, i in enumerate(ids):
        action = "rare" if i in train and n % 4 == 0 else ("a" if n % 2 else "b")
        cost = {"rare": 0.00001, "a": 0.001, "b": 0.0001}[action]
        rows.append(OutcomeRecord.model_validate({
            "id": i, "prompt": f"q {n}",
            "outcomes": {action: {"score": float(n % 3 == 0), "cost_usd": cost}},
            "logged": {"action": action, "propensity": 0.25 if action == "rare" else 0.375},
        }))  # fmt: skip
    path = tmp_path / "logged.jsonl"
    write_outcome_table(rows, path)
    out = tmp_path / "out"
    argv = ["--table", str(path), "--policy", "policy:cheapest", "--bootstrap", "0"]
    assert main([*argv, "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    (row,) = [r for r in metrics["off_policy"] if r["router"] == "policy:cheapest"]
    assert row["estimates"]["score"]["ips"]["value"] == 0.0
    assert any(
        "choose a model no record here logged (at most: policy:cheapest" in n
        for n in metrics["notes"]
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mf:dim=abc", "dim takes an integer, got 'abc'"),
        ("mf:lr=abc", "lr takes a number, got 'abc'"),
        ("mf:dim=0", "need dim >= 1"),
        ("knn:k=abc", "k takes an integer, got 'abc'"),
        ("cascade:quorums=2|x", "quorums takes an integer"),
        ("escalation:first=typo", "first takes an integer, got 'typo'"),
        ("escalation:combine_final=maybe", "combine_final takes true or false, got 'maybe'"),
        ("escalation:plans=abc", "plans cannot be given in a --policy spec"),
    ],
)
def test_a_parameter_of_the_wrong_type_is_named(
    spec: str, message: str, table: Path, tmp_path: Path, capsys
) -> None:
    # Each was a traceback from inside fitting, a comparison's message, or (for a boolean
    # "false") silently true.
    base = ["--table", str(table), "--baselines", "none", "--out", str(tmp_path / "o")]
    assert run_eval(parse([*base, "--policy", spec]), RouterRegistry()) == 2
    assert f"{spec!r}: {message}" in capsys.readouterr().err


def test_boolean_parameters_take_true_and_false() -> None:
    from training.evaluation.escalation import EscalationRouter
    from training.evaluation.registry import _construct

    for raw, want in (("false", False), ("FALSE", False), ("0", False), ("true", True)):
        router = _construct(
            EscalationRouter, f"escalation:combine_final={raw}", f"combine_final={raw}"
        )
        assert router.combine_final is want
    assert _construct(EscalationRouter, "e", "final=7").final == "7"  # a name stays a name


def test_an_out_path_that_is_a_file_is_refused_before_the_evaluation(
    table: Path, tmp_path: Path, capsys
) -> None:
    class Counting(RouterRegistry):
        loads = 0

        def load(self, spec, ctx):
            Counting.loads += 1
            return super().load(spec, ctx)

    taken = tmp_path / "taken.jsonl"
    taken.write_text("")
    args = parse(
        ["--table", str(table), "--policy", "knn", "--baselines", "none", "--out", str(taken)]
    )
    assert run_eval(args, Counting()) == 2
    assert "is a file; the report goes in a directory" in capsys.readouterr().err
    assert Counting.loads == 0


def test_on_logged_traffic_too_the_report_says_which_models_a_checkpoint_never_chooses(
    tmp_path: Path,
) -> None:
    rows = []
    for i, r in enumerate(load_outcome_table(DEMO)[:120]):
        data = r.model_dump(exclude_none=True)
        action = "house-model" if i % 4 == 0 else list(data["outcomes"])[i % 8]
        outcome = {"score": 1.0, "cost_usd": 1e-7} if action == "house-model" else None
        data["outcomes"] = {action: outcome or data["outcomes"][action]}
        data["logged"] = {"action": action, "propensity": 0.25}
        rows.append(OutcomeRecord.model_validate(data))
    path = tmp_path / "logged.jsonl"
    write_outcome_table(rows, path)
    out = tmp_path / "out"
    argv = ["--table", str(path), "--split", "all", "--policy", "packaged:demo-rl",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    [note] = [n for n in metrics["notes"] if "not trained on house-model" in n]
    assert note.startswith("compact[") and note in (out / "report.md").read_text()
