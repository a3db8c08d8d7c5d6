"""The provisioned Grafana dashboard (deploy/grafana) asks only for series a running gateway
exports, with the labels they have, and its provisioning fits deploy/compose."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from tests.support.gateway import Gateway, gateway_config, start_gateway
from tests.support.replay import REPO_ROOT, start_replay_upstream, stop_replay_upstream

GRAFANA = REPO_ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "xrouter.json"
SERIES = re.compile(r"\bxrouter_[a-z_]+\b")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")
LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def dashboard() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return body


def targets() -> list[dict[str, Any]]:
    return [t for p in dashboard()["panels"] for t in p.get("targets", [])]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("grafana")
    proc, base = start_replay_upstream(tmp)
    gw = start_gateway(tmp, gateway_config(tmp, base))
    yield gw
    gw.stop()
    stop_replay_upstream(proc)


def exported(gw: Gateway) -> dict[str, str]:
    """Metric family name -> type, as a running gateway exposes them after a request."""
    r = httpx.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "xrouter", "messages": [{"role": "user", "content": "hello"}]},
        timeout=30,
    )
    assert r.status_code == 200
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def label_names() -> dict[str, set[str]]:
    """Each gateway metric family's label names, from the class the gateway builds them with."""
    metrics = GatewayMetrics(CollectorRegistry(), models=["m"], policies=["p"])
    out: dict[str, set[str]] = {}
    # Every registered metric, by every name it exposes (the family's and its samples').
    for collector, names in metrics.registry._collector_to_names.items():
        for name in names:
            out[name] = set(getattr(collector, "_labelnames", ()))
    return out


def family_of(series: str, families: dict[str, str]) -> tuple[str, str]:
    """The family a series name in a query belongs to, and its type."""
    if series in families:
        return series, families[series]
    for kind, suffixes in SUFFIXES.items():
        for suffix in suffixes:
            base = series.removesuffix(suffix)
            if series.endswith(suffix) and families.get(base) == kind:
                return base, kind
    raise AssertionError(f"the dashboard queries {series!r}, which the gateway does not export")


def test_every_query_uses_exported_series_and_their_labels(gateway: Gateway) -> None:
    families = exported(gateway)
    labels = label_names()
    queried: set[str] = set()
    for t in targets():
        expr = t["expr"]
        bases = [family_of(s, families) for s in SERIES.findall(expr)]
        assert bases, f"query without an xrouter series: {expr}"
        queried.update(b for b, _ in bases)
        allowed = set().union(*(labels[b] for b, _ in bases))
        if any(kind == "histogram" for _, kind in bases):
            allowed.add("le")
        used = {x.strip() for group in BY.findall(expr) for x in group.split(",") if x.strip()}
        used |= {
            m.split("=")[0].strip()
            for group in MATCHERS.findall(expr)
            for m in group.split(",")
            if m.strip()
        }
        used |= set(LEGEND.findall(t.get("legendFormat", "")))
        assert used <= allowed, f"{expr}: labels {sorted(used - allowed)} do not exist"
    # The dashboard covers the operators' essentials.
    for family in ("xrouter_cost_usd", "xrouter_savings_usd", "xrouter_key_budget_remaining_usd",
                   "xrouter_routing_decisions", "xrouter_request_duration_seconds",
                   "xrouter_upstream_errors", "xrouter_ledger_queue_depth"):  # fmt: skip
        assert family in queried


def test_layout_ids_and_datasource_are_consistent() -> None:
    body = dashboard()
    panels = body["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] != "row":
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"])
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (ds,) = datasources["datasources"]
    assert {p["datasource"]["uid"] for p in panels if "datasource" in p} == {ds["uid"]}
    # The datasource points at compose's Prometheus, whose scrape interval it declares.
    prometheus = yaml.safe_load((REPO_ROOT / "deploy/prometheus/prometheus.yml").read_text())
    assert ds["url"] == "http://prometheus:9090"
    assert ds["jsonData"]["timeInterval"] == prometheus["global"]["scrape_interval"]


def test_stat_panels_of_info_series_show_the_labels_they_exist_for() -> None:
    # An *_info series is always 1 (or a count of workers): a stat panel in Grafana's default
    # text mode shows just that number, without the version its legend names.
    for p in dashboard()["panels"]:
        if p["type"] != "stat" or not any("_info" in t["expr"] for t in p["targets"]):
            continue
        assert all("{{" in t.get("legendFormat", "") for t in p["targets"]), p["title"]
        assert p.get("options", {}).get("textMode") in ("name", "value_and_name"), p["title"]


def test_compose_mounts_the_provisioning_where_grafana_reads_it() -> None:
    compose_dir = REPO_ROOT / "deploy" / "compose"
    compose = yaml.safe_load((compose_dir / "docker-compose.yml").read_text())
    mounts = dict(
        v.removesuffix(":ro").split(":", 1) for v in compose["services"]["grafana"]["volumes"]
    )
    by_target = {target: (compose_dir / source).resolve() for source, target in mounts.items()}
    assert by_target["/etc/grafana/provisioning"] == (GRAFANA / "provisioning").resolve()
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/xrouter.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    assert by_target[path] == DASHBOARD.parent.resolve()
