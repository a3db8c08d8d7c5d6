"""deploy/prometheus: the scrape config and alerting rules are valid for Prometheus, every
alert fires on the series it is for and stays quiet on healthy ones (``promtool test
rules`` on tests/deploy/alerts_test.yml), and the Grafana dashboard's queries parse as PromQL.

promtool comes from Debian's ``prometheus`` package (``scripts/tools.sh``, run by ``make
install-dev``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from tests.support.replay import REPO_ROOT

PROMETHEUS = REPO_ROOT / "deploy" / "prometheus"
HERE = Path(__file__).resolve().parent


def promtool() -> str:
    beside_python = Path(sys.executable).parent / "promtool"
    found = str(beside_python) if beside_python.exists() else shutil.which("promtool")
    assert found, "promtool is missing: run scripts/tools.sh (make install-dev does)"
    return found


def run(*args: str | Path, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_alerting_rules_are_valid() -> None:
    res = run("check", "rules", PROMETHEUS / "alerts.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    n = sum(len(g["rules"]) for g in rules["groups"])
    assert f"SUCCESS: {n} rules found" in res.stdout


def test_every_alert_fires_when_it_should_and_only_then() -> None:
    res = run("test", "rules", "alerts_test.yml", cwd=HERE)
    assert res.returncode == 0, res.stdout + res.stderr
    # Every alert of the rules file has at least one case.
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    cases = yaml.safe_load((HERE / "alerts_test.yml").read_text())
    tested = {c["alertname"] for t in cases["tests"] for c in t["alert_rule_test"]}
    assert alerts <= tested, f"alerts without a test case: {sorted(alerts - tested)}"


# A counter an alert takes increase() or rate() of, with the matchers it selects.
COUNTED = re.compile(r"\b(?:increase|rate)\((xrouter_[a-z_]+)(?:\{([^}]*)\})?\[")
# Label values only known at run time (a model, a policy, a key): their series are born with
# the traffic they count, and alerts on them are about sustained rates.
RUNTIME_LABELS = {"model", "policy", "key_alias"}


def test_alerts_see_the_first_event_their_counters_count() -> None:
    """increase() and rate() need two samples of a series: a counter whose series is born
    at 1 (its first event) shows no increase, so an alert on a rare event (the limit store
    losing the budgets, a ledger write error) would never fire for it. Every series such an
    alert counts must be exported at 0 from the start."""
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    registry = CollectorRegistry()
    GatewayMetrics(registry, models=["m"], policies=["p"])
    samples = [(s.name, s.labels, s.value) for f in registry.collect() for s in f.samples]
    label_names = {
        name: set(getattr(collector, "_labelnames", ()))
        for collector, names in registry._collector_to_names.items()
        for name in names
    }
    checked = set()
    for expr in exprs:
        for name, matchers in COUNTED.findall(expr):
            if RUNTIME_LABELS & label_names[name]:
                continue
            wanted = [
                re.fullmatch(r'\s*(\w+)\s*(!?=)\s*"([^"]*)"\s*', m).groups()  # type: ignore[union-attr]
                for m in matchers.split(",")
                if m.strip()
            ]
            found = [
                (labels, value)
                for n, labels, value in samples
                if n == name and all((labels.get(k) == v) == (op == "=") for k, op, v in wanted)
            ]
            assert found, f"{expr}: no {name}{{{matchers}}} series until its first event"
            assert all(value == 0 for _, value in found)
            checked.add(name)
    assert "xrouter_budget_restores_total" in checked  # XrouterLimitStoreLostBudgets
    assert "xrouter_ledger_write_errors_total" in checked  # XrouterLedgerWriteErrors


def test_scrape_config_loads_the_rules(tmp_path: Path) -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    # In compose the rules are mounted at this path; point it at the repository's copy.
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    config["rule_files"] = [str(PROMETHEUS / "alerts.yml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    res = run("check", "config", path)
    assert res.returncode == 0, res.stdout + res.stderr


def test_dashboard_queries_parse_as_promql(tmp_path: Path) -> None:
    """Each query of the Grafana dashboard, as a recording rule (Grafana's
    ``$__rate_interval`` replaced by a duration), must pass promtool's PromQL parser."""
    dashboard = json.loads((REPO_ROOT / "deploy/grafana/dashboards/xrouter.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": e.replace("$__rate_interval", "1m")}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    res = run("check", "rules", path)
    assert res.returncode == 0, res.stdout + res.stderr


def panel_expr(title: str) -> str:
    dashboard = json.loads((REPO_ROOT / "deploy/grafana/dashboards/xrouter.json").read_text())
    (expr,) = [t["expr"] for p in dashboard["panels"] if p["title"] == title for t in p["targets"]]
    return str(expr)


@pytest.mark.parametrize(
    ("series", "net"),
    [
        # Every request cheaper than the reference: no overspend series at all.
        ({"xrouter_savings_usd_total": "0+0.5x60"}, 30.0),
        ({"xrouter_overspend_usd_total": "0+0.25x60"}, -15.0),
        (
            {"xrouter_savings_usd_total": "0+0.5x60", "xrouter_overspend_usd_total": "0+0.25x60"},
            15.0,
        ),
        ({}, None),  # no metrics.reference_model: no data, not a made-up 0
    ],
)
def test_the_net_savings_panel_shows_either_side_alone(
    tmp_path: Path, series: dict[str, str], net: float | None
) -> None:
    """The panel subtracts two counters that exist only once a request saved (or overspent):
    a gateway that only ever saved must show its savings, not "No data"."""
    expr = panel_expr("Net savings vs the reference model, last 24 h")
    cases = {
        "rule_files": [str(PROMETHEUS / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f'{name}{{policy="compact"}}', "values": values}
                    for name, values in series.items()
                ]
                or [{"series": 'up{job="xrouter"}', "values": "1x60"}],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "60m",
                        "exp_samples": [] if net is None else [{"labels": "{}", "value": net}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "net_savings_test.yml"
    path.write_text(yaml.safe_dump(cases))
    res = run("test", "rules", path)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("broken", ["sum(rate(xrouter_cost_usd_total[5m])", "rate(x[5q])"])
def test_the_parser_check_can_fail(tmp_path: Path, broken: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "r:x", "expr": broken}]}]})
    )
    assert run("check", "rules", path).returncode != 0
