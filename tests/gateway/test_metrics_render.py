"""Rendering /metrics (gateway.metrics_render): isolated registries in one process, and
every worker's values aggregated from the multiprocess directory, dead workers' live
gauges reaped."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from gateway.metrics_render import (
    MULTIPROC_ENV,
    arender_metrics,
    mark_process_dead,
    render_metrics,
)

MODELS = ["gpt-5-mini", "claude-haiku", "qwen3-8b"]
POLICIES = ["compact", "llm", "cheapest"]
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(registry: CollectorRegistry) -> GatewayMetrics:
    return GatewayMetrics(registry, models=MODELS, policies=POLICIES, budget_gauge_keys=2)


def test_registries_are_isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    first, second = CollectorRegistry(), CollectorRegistry()
    a = GatewayMetrics(first, models=MODELS, policies=POLICIES)
    GatewayMetrics(second, models=MODELS, policies=POLICIES)  # same names, no clash
    a.flushed(5)
    assert first.get_sample_value("xrouter_ledger_rows_total") == 5
    assert second.get_sample_value("xrouter_ledger_rows_total") == 0
    assert prometheus_client.REGISTRY.get_sample_value("xrouter_ledger_rows_total") is None


async def test_render_single_process(
    registry: CollectorRegistry, metrics: GatewayMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    metrics.observe_request("llm", "qwen3-8b", 200, 1.0, 0.001, 5)
    body, content_type = await arender_metrics(registry)
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["xrouter_requests"].samples[0].value == 1
    mark_process_dead(os.getpid())  # no-op outside multiprocess mode


_WORKER = """
import os, sys
from prometheus_client import CollectorRegistry
from gateway.metrics import GatewayMetrics

requests, depth, remaining = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
m = GatewayMetrics(CollectorRegistry(), models=["qwen3-8b"], policies=["compact"], version="9.9")
for _ in range(requests):
    m.observe_request("compact", "qwen3-8b", 200, 0.2, 0.001, 100, 300)
    m.observe_call("qwen3-8b", 100, 10, 0, 0, 100, 0.15)
m.queue_depth(depth)
m.key_budgets.remaining("team-a", remaining)
m.flushed(requests)
print(os.getpid(), flush=True)
sys.stdin.read()  # stay alive (a running worker) until the test closes stdin or kills us
"""


def test_multiprocess_aggregates_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    procs: list[subprocess.Popen[str]] = []
    pids = []
    try:
        # one after the other, so "mostrecent" has a defined answer (the second worker's value)
        for args in (("3", "4", "2000000"), ("5", "6", "1500000")):
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER, *args],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            assert proc.stdout is not None
            pids.append(int(proc.stdout.readline().strip()))

        monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))

        def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            body, _ = render_metrics(CollectorRegistry())
            return {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(body.decode())
                for s in family.samples
            }

        values = scrape()
        req = ("policy", "compact"), ("model", "qwen3-8b"), ("status_class", "2xx"), ("api", "chat")
        assert values[("xrouter_requests_total", tuple(sorted(req)))] == 8
        assert values[("xrouter_tokens_total", (("kind", "prompt"), ("model", "qwen3-8b")))] == 800
        assert values[("xrouter_savings_usd_total", (("policy", "compact"),))] == pytest.approx(
            0.0016
        )
        assert values[("xrouter_request_duration_seconds_count", (("policy", "compact"),))] == 8
        assert values[("xrouter_ledger_rows_total", ())] == 8
        assert values[("xrouter_ledger_queue_depth", ())] == 10  # livesum of both workers
        assert values[("xrouter_key_budget_remaining_usd", (("key_alias", "team-a"),))] == 1.5
        assert values[("xrouter_build_info", (("version", "9.9"),))] == 1

        # A graceful exit: the server's worker-exit hook.
        assert procs[0].stdin is not None
        procs[0].stdin.close()
        procs[0].wait(timeout=30)
        mark_process_dead(pids[0])
        values = scrape()
        assert values[("xrouter_ledger_queue_depth", ())] == 6
        assert values[("xrouter_requests_total", tuple(sorted(req)))] == 8  # counters survive

        # A worker killed outright runs no hook: the next scrape reaps its live gauges.
        procs[1].kill()
        procs[1].wait(timeout=30)
        values = scrape()
        assert values.get(("xrouter_ledger_queue_depth", ()), 0) == 0
        assert values[("xrouter_requests_total", tuple(sorted(req)))] == 8
        assert not any(f"_{pids[1]}.db" in n and "live" in n for n in os.listdir(tmp_path))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


_CIRCUIT_WORKER = """
import os, sys
from prometheus_client import CollectorRegistry
from gateway.metrics import GatewayMetrics

m = GatewayMetrics(CollectorRegistry(), models=["qwen3-8b"], policies=["compact"])
m.circuit("qwen3-8b", sys.argv[1] == "open")
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def test_a_dead_workers_open_circuit_stops_counting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    procs: list[subprocess.Popen[str]] = []
    try:
        for state in ("open", "closed"):
            proc = subprocess.Popen(
                [sys.executable, "-c", _CIRCUIT_WORKER, state],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            procs.append(proc)
            assert proc.stdout is not None
            proc.stdout.readline()
        monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))

        def circuit_open() -> float | None:
            body, _ = render_metrics(CollectorRegistry())
            for family in text_string_to_metric_families(body.decode()):
                for s in family.samples:
                    if s.name == "xrouter_circuit_open" and s.labels["model"] == "qwen3-8b":
                        return float(s.value)
            return None

        assert circuit_open() == 1  # open in one live worker: open
        # The worker that saw it open dies (OOM, a crash) with no exit hook: its reading
        # goes with it, the live worker's (closed) is what remains.
        procs[0].kill()
        procs[0].wait(timeout=30)
        assert circuit_open() == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


_FORGETTING_WORKER = """
import os, sys
from prometheus_client import CollectorRegistry
from gateway.metrics import GatewayMetrics

m = GatewayMetrics(CollectorRegistry(), models=[], policies=[], budget_gauge_keys=2)
m.key_budgets.remaining("exhausted", 0)  # out of budget, then revoked
m.key_budgets.forget("exhausted")
for i in range(10):  # keys made and revoked one after the other
    m.key_budgets.remaining(f"short-lived-{i}", 1_000_000)
    m.key_budgets.forget(f"short-lived-{i}")
print(os.getpid(), flush=True)
"""


def test_a_forgotten_key_budget_reads_nan_and_keeps_its_slot_in_multiprocess_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Series cannot be removed from the workers' files: a revoked key's last reading would
    stay (an exhausted key's XrouterKeyBudgetExhausted firing until the workers restart),
    and freeing its slot would let a stream of short-lived keys grow the series without
    bound. So the reading goes to NaN (no reading: no alert, a gap in Grafana) and the slot
    stays taken."""
    env = {**os.environ, MULTIPROC_ENV: str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run([sys.executable, "-c", _FORGETTING_WORKER], env=env, check=True, timeout=60)
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    body, _ = render_metrics(CollectorRegistry())
    remaining = {
        s.labels["key_alias"]: s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == "xrouter_key_budget_remaining_usd"
    }
    assert len(remaining) <= 2, sorted(remaining)  # budget_gauge_keys
    assert all(math.isnan(v) for v in remaining.values()), remaining
