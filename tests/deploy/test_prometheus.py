"""deploy/prometheus: the scrape config and alerting rules are valid for Prometheus, every
alert fires on the series it is for and stays quiet on healthy ones (``promtool test
rules`` on tests/deploy/alerts_test.yml), and the Grafana dashboard's queries parse as PromQL.

promtool comes from Debian's ``prometheus`` package (``scripts/tools.sh``, run by ``make
install-dev``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


@pytest.mark.parametrize("broken", ["sum(rate(xrouter_cost_usd_total[5m])", "rate(x[5q])"])
def test_the_parser_check_can_fail(tmp_path: Path, broken: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(
        yaml.safe_dump({"groups": [{"name": "g", "rules": [{"record": "r:x", "expr": broken}]}]})
    )
    assert run("check", "rules", path).returncode != 0
