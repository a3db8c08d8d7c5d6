"""Hot reload of the pool config, by admin endpoint and by file watch, without dropping
in-flight requests."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from router.checkpoint import load_checkpoint
from tests.gateway.conftest import Upstream
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
SLOW = "llama-3.3-70b-instruct"


def model_ids(url: str) -> set[str]:
    return {m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]}


def test_reload_by_admin_and_by_file_watch_keeps_in_flight_requests(
    upstream: Upstream, tmp_path: Path, demo_table: list
) -> None:
    cfg = gateway_config(tmp_path, upstream.base_url, router={"watch_files": True})
    gw = start_gateway(tmp_path, cfg)
    try:
        assert "gemma-2-9b-it" in model_ids(gw.url)
        # A slow streamed answer is in flight while the pool changes under it.
        rec = max(
            (r for r in demo_table if SLOW in r.outcomes),
            key=lambda r: len(r.outcomes[SLOW].response or ""),
        )
        result: dict[str, object] = {}

        def slow() -> None:
            with httpx.stream(
                "POST",
                f"{gw.base_url}/chat/completions",
                timeout=30,
                json={
                    "model": SLOW,
                    "stream": True,
                    "messages": [{"role": "user", "content": rec.text}],
                },
            ) as r:
                result["status"] = r.status_code
                result["body"] = "".join(r.iter_text())

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.2)
        cfg["pool"] = [m for m in cfg["pool"] if m["name"] != "gemma-2-9b-it"]
        gw.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(f"{gw.url}/admin/reload", headers=ADMIN)
        assert r.status_code == 200 and "gemma-2-9b-it" not in r.json()["pool"]
        assert "gemma-2-9b-it" not in model_ids(gw.url)
        t.join()
        assert (
            result["status"] == 200
            and '"usage"' in str(result["body"])
            and "[DONE]" in str(result["body"])
        )
        # A broken config is refused and the old one keeps serving.
        gw.config_path.write_text("pool: [{name: 'bad name!'}]")
        r = httpx.post(f"{gw.url}/admin/reload", headers=ADMIN)
        assert r.status_code == 400 and r.json()["error"]["code"] == "reload_failed"
        assert SLOW in model_ids(gw.url)
        # File watch: restore gemma by editing the file only.
        cfg["pool"].append(
            {
                "name": "gemma-2-9b-it",
                "model": "openai/gemma-2-9b-it",
                "api_base": upstream.base_url,
            }
        )
        gw.config_path.write_text(yaml.safe_dump(cfg))
        deadline = time.monotonic() + 15
        while "gemma-2-9b-it" not in model_ids(gw.url):
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.2)
        assert (
            httpx.post(
                f"{gw.base_url}/chat/completions",
                json={"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "hi"}]},
            ).status_code
            == 200
        )
    finally:
        gw.stop()


def test_admin_reload_needs_the_admin_key(gateway: Gateway) -> None:
    assert httpx.post(f"{gateway.url}/admin/reload").status_code == 401


@pytest.mark.parametrize("checkpoint", ["", "  "])
def test_a_deploy_of_no_path_is_refused_and_records_nothing(
    gateway: Gateway, checkpoint: str
) -> None:
    r = _deploy(gateway.url, checkpoint)
    assert r.status_code == 400 and r.json()["error"]["param"] == "checkpoint", r.text
    assert _serving(gateway.url)["deployment"] is None


@pytest.mark.parametrize("path", ["/admin/keys", "/admin/spend", "/admin/pricing", "/admin/router"])
def test_admin_endpoints_need_the_admin_key(gateway: Gateway, path: str) -> None:
    r = httpx.get(f"{gateway.url}{path}", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_serve_builds_the_runtime_once_and_a_reload_once_more(
    upstream: Upstream, tmp_path: Path
) -> None:
    gw = start_gateway(tmp_path, gateway_config(tmp_path, upstream.base_url))
    try:
        # The one-line pre-check of `xrouter serve` builds the snapshot the server uses.
        assert gw.log().count("runtime built:") == 1
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN).status_code == 200
        assert gw.log().count("runtime built:") == 2
    finally:
        gw.stop()


def _serving(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/admin/router", headers=ADMIN, timeout=10)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _deploy(url: str, checkpoint: str) -> httpx.Response:
    return httpx.post(
        f"{url}/admin/reload", headers=ADMIN, json={"checkpoint": checkpoint}, timeout=30
    )


def test_a_deploy_holds_across_file_reloads_and_restarts_until_the_config_changes(
    upstream: Upstream, tmp_path: Path
) -> None:
    rl = load_checkpoint("packaged:demo-rl")
    default = load_checkpoint("packaged:demo")
    cfg = gateway_config(tmp_path, upstream.base_url, router={"watch_files": True})
    gw = start_gateway(tmp_path, cfg)
    try:
        assert _serving(gw.url)["checkpoint"]["version"] == default.version
        r = _deploy(gw.url, str(rl.path))
        assert r.status_code == 200 and r.json()["deployment"]["version"] == rl.version
        # The file watcher notices the deployed checkpoint's directory and reloads; a
        # plain admin reload re-reads the config. Neither undoes the deploy.
        time.sleep(5)
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN).status_code == 200
        state = _serving(gw.url)
        assert state["checkpoint"]["version"] == rl.version, gw.log()
        assert state["deployment"]["checkpoint"] == str(rl.path)
        page = httpx.get(f"{gw.url}/dashboard").text
        assert rl.version in page and f"(deployment {state['deployment']['id']}, " in page
        builds = gw.log().count("runtime built:")
    finally:
        gw.stop()
    # A restart starts on the deployed checkpoint (same config, same ledger database),
    # built once: the config's own checkpoint is not loaded first.
    gw = start_gateway(tmp_path, cfg)
    try:
        assert _serving(gw.url)["checkpoint"]["version"] == rl.version
        assert gw.log().count("runtime built:") == builds + 1, gw.log()  # the log goes on
        # Editing the config's own checkpoint is a newer decision: it wins.
        cfg["router"] = {**cfg["router"], "checkpoint": str(default.path)}
        gw.config_path.write_text(yaml.safe_dump(cfg))
        deadline = time.monotonic() + 15
        while (state := _serving(gw.url))["checkpoint"]["version"] != default.version:
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.2)
        assert state["deployment"] is None
        # A checkpoint that does not load is refused, and nothing is recorded.
        r = _deploy(gw.url, str(tmp_path / "missing"))
        assert r.status_code == 400 and r.json()["error"]["code"] == "reload_failed"
        assert _serving(gw.url)["checkpoint"]["version"] == default.version
        # Said in the gateway's log too, where operators look (only the client was told).
        assert f"admin deploy of {tmp_path / 'missing'} refused" in gw.log()
    finally:
        gw.stop()


def test_a_restart_needs_only_the_deployed_checkpoint(upstream: Upstream, tmp_path: Path) -> None:
    """The checkpoint a deploy replaced may be deleted: the restarted gateway starts on the
    deployed one without loading the config's. If the deployed one is gone instead, the
    config's serves and the failure is logged."""
    import shutil

    demo, rl = load_checkpoint("packaged:demo"), load_checkpoint("packaged:demo-rl")
    assert demo.path is not None and rl.path is not None
    replaced, deployed = tmp_path / "v1", tmp_path / "v2"
    shutil.copytree(demo.path, replaced)
    shutil.copytree(rl.path, deployed)
    cfg = gateway_config(tmp_path, upstream.base_url, router={"checkpoint": str(replaced)})
    gw = start_gateway(tmp_path, cfg)
    try:
        assert _deploy(gw.url, str(deployed)).status_code == 200
    finally:
        gw.stop()
    shutil.rmtree(replaced)
    gw = start_gateway(tmp_path, cfg)
    try:
        state = _serving(gw.url)
        assert state["checkpoint"]["version"] == rl.version, gw.log()
        assert state["deployment"]["checkpoint"] == str(deployed)
    finally:
        gw.stop()
    shutil.copytree(demo.path, replaced)
    shutil.rmtree(deployed)
    gw = start_gateway(tmp_path, cfg)
    try:
        state = _serving(gw.url)
        assert state["checkpoint"]["version"] == demo.version and state["deployment"] is None
        assert "could not load the deployed router checkpoint (deployment 1," in gw.log()
    finally:
        gw.stop()


def test_a_deployed_checkpoint_rewritten_in_place_is_recorded_when_it_is_reloaded(
    upstream: Upstream, tmp_path: Path
) -> None:
    """Retraining into the deployed directory and reloading (the file watcher, or an admin
    reload) serves the new content: it is recorded as the deployment, so a restart starts
    on it rather than refusing it as a stale copy and falling back to the config's."""
    import shutil

    demo, rl = load_checkpoint("packaged:demo"), load_checkpoint("packaged:demo-rl")
    assert demo.path is not None and rl.path is not None
    deployed = tmp_path / "run"
    shutil.copytree(demo.path, deployed)
    cfg = gateway_config(tmp_path, upstream.base_url)
    gw = start_gateway(tmp_path, cfg)
    try:
        assert _deploy(gw.url, str(deployed)).status_code == 200
        shutil.rmtree(deployed)
        shutil.copytree(rl.path, deployed)  # retrained in place
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN).status_code == 200
        state = _serving(gw.url)
        assert state["checkpoint"]["version"] == rl.version
        assert state["deployment"]["id"] == 2 and state["deployment"]["version"] == rl.version
        assert state["deployment"]["checkpoint"] == str(deployed)
        # Said as a warning: it went live with no `xrouter deploy`.
        assert "WARNING" in next(x for x in gw.log().splitlines() if "changed in place" in x)
        # Reloading again changes nothing: the content is the recorded one.
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN).status_code == 200
        assert _serving(gw.url)["deployment"]["id"] == 2
    finally:
        gw.stop()
    gw = start_gateway(tmp_path, cfg)
    try:
        state = _serving(gw.url)
        assert state["checkpoint"]["version"] == rl.version, gw.log()
        assert state["deployment"]["id"] == 2
        # The restart says it serves the deployment, not the config's checkpoint.
        assert f"serving the router checkpoint of deployment 2 ({deployed}" in gw.log()
    finally:
        gw.stop()


def test_a_config_that_names_another_checkpoint_records_no_deployment(
    upstream: Upstream, tmp_path: Path
) -> None:
    """The config's checkpoint changed after a deploy: the config's serves and nothing is
    recorded. A reload recorded the config's checkpoint version under the deployed path,
    as if that checkpoint had been rewritten in place — a deployment nobody made, which
    the other workers and the next restart then refused as a stale copy, logging errors."""
    import shutil
    import sqlite3

    demo, rl = load_checkpoint("packaged:demo"), load_checkpoint("packaged:demo-rl")
    assert demo.path is not None and rl.path is not None
    deployed, other = tmp_path / "a", tmp_path / "b"
    shutil.copytree(demo.path, deployed)
    shutil.copytree(rl.path, other)
    cfg = gateway_config(tmp_path, upstream.base_url)
    gw = start_gateway(tmp_path, cfg)
    try:
        assert _deploy(gw.url, str(deployed)).status_code == 200
        cfg["router"] = {**cfg["router"], "checkpoint": str(other)}
        gw.config_path.write_text(yaml.safe_dump(cfg))
        for _ in range(2):
            assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN).status_code == 200
        state = _serving(gw.url)
        assert state["checkpoint"]["version"] == rl.version and state["deployment"] is None
        db = sqlite3.connect(tmp_path / "ledger.db")
        try:
            rows = db.execute("SELECT checkpoint, version FROM router_deployments").fetchall()
        finally:
            db.close()
        assert rows == [(str(deployed), demo.version)]
        assert "changed in place" not in gw.log()
    finally:
        gw.stop()


def test_a_deploy_reaches_every_worker(upstream: Upstream, tmp_path: Path) -> None:
    rl = load_checkpoint("packaged:demo-rl")
    cfg = gateway_config(tmp_path, upstream.base_url, router={"deployment_poll_s": 0.2})
    gw = start_gateway(tmp_path, cfg, workers=2)
    try:
        assert _deploy(gw.url, "packaged:demo-rl").status_code == 200
        # Each request below may reach either worker; both must end up on the new checkpoint.
        on_new: set[int] = set()
        deadline = time.monotonic() + 30
        while len(on_new) < 2:
            assert time.monotonic() < deadline, (on_new, gw.log())
            with httpx.Client() as fresh:  # a new connection each time
                state = fresh.get(f"{gw.url}/admin/router", headers=ADMIN).json()
            if state["checkpoint"]["version"] == rl.version:
                on_new.add(state["worker"])
            time.sleep(0.05)
        # The metrics say so too: one series per worker, at 1 for the deployed version.
        text = httpx.get(f"{gw.url}/metrics").text
        serving = [
            line
            for line in text.splitlines()
            if line.startswith("xrouter_router_checkpoint_info{") and line.endswith(" 1.0")
        ]
        assert len(serving) == 2 and all(f'version="{rl.version}"' in ln for ln in serving), text
    finally:
        gw.stop()


def _record_deployment(ledger_db: Path, checkpoint: str, version: str | None = None) -> int:
    """Record a deployment as another replica's ``xrouter deploy`` does (same database)."""
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine

    from gateway.ledger.deployments import DeploymentRepository

    async def record() -> int:
        engine = create_async_engine(f"sqlite+aiosqlite:///{ledger_db}")
        try:
            return (await DeploymentRepository(engine).record(checkpoint, version, None)).id
        finally:
            await engine.dispose()

    return asyncio.run(record())


def test_a_deployment_whose_checkpoint_is_not_here_yet_is_retried_until_it_loads(
    upstream: Upstream, tmp_path: Path
) -> None:
    """Another replica deployed a checkpoint this one cannot read yet (a volume still
    syncing): it keeps serving its router, logs the failure, and loads the checkpoint once
    it arrives, without a newer deployment."""
    import shutil

    rl = load_checkpoint("packaged:demo-rl")
    assert rl.path is not None
    default = load_checkpoint("packaged:demo")
    cfg = gateway_config(tmp_path, upstream.base_url, router={"deployment_poll_s": 0.1})
    gw = start_gateway(tmp_path, cfg)
    try:
        arriving = tmp_path / "shared-volume" / "rl"
        deployment = _record_deployment(tmp_path / "ledger.db", str(arriving))
        deadline = time.monotonic() + 15
        while "could not load the deployed router checkpoint" not in gw.log():
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        state = _serving(gw.url)
        assert state["checkpoint"]["version"] == default.version
        assert state["deployment"] is None
        # Backed off: a handful of attempts in a second, not one per 0.1 s poll.
        time.sleep(1.0)
        attempts = gw.log().count("could not load the deployed router checkpoint")
        assert 1 <= attempts <= 5, gw.log()
        shutil.copytree(rl.path, arriving)
        deadline = time.monotonic() + 15
        while (state := _serving(gw.url))["checkpoint"]["version"] != rl.version:
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        assert state["deployment"]["id"] == deployment
    finally:
        gw.stop()


def test_a_follower_refuses_a_checkpoint_that_is_not_the_deployed_version(
    upstream: Upstream, tmp_path: Path
) -> None:
    """Another replica deployed a checkpoint that, at the same path here, holds other
    content (a stale copy): this one keeps serving its router until the right file is
    there, as for a checkpoint not there yet."""
    import shutil

    demo, rl = load_checkpoint("packaged:demo"), load_checkpoint("packaged:demo-rl")
    assert demo.path is not None and rl.path is not None
    volume = tmp_path / "shared-volume" / "run"
    shutil.copytree(demo.path, volume)  # the stale copy
    cfg = gateway_config(tmp_path, upstream.base_url, router={"deployment_poll_s": 0.1})
    gw = start_gateway(tmp_path, cfg)
    try:
        _record_deployment(tmp_path / "ledger.db", str(volume), rl.version)
        deadline = time.monotonic() + 15
        while f"not version {rl.version} as deployment 1 recorded" not in gw.log():
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        assert _serving(gw.url)["deployment"] is None
        shutil.rmtree(volume)
        shutil.copytree(rl.path, volume)
        deadline = time.monotonic() + 15
        while (state := _serving(gw.url))["checkpoint"]["version"] != rl.version:
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        assert state["deployment"]["id"] == 1
    finally:
        gw.stop()


def test_a_ledger_database_outage_is_logged_once_by_the_deployment_poller(
    upstream: Upstream, tmp_path: Path
) -> None:
    import sqlite3

    default = load_checkpoint("packaged:demo")
    cfg = gateway_config(tmp_path, upstream.base_url, router={"deployment_poll_s": 0.05})
    gw = start_gateway(tmp_path, cfg)
    db = sqlite3.connect(tmp_path / "ledger.db")
    try:
        assert _serving(gw.url)["deployment"] is None
        # The deployments table disappears, as with a database that stopped answering:
        # every poll fails (about 30 polls below).
        db.execute("ALTER TABLE router_deployments RENAME TO router_deployments_away")
        db.commit()
        deadline = time.monotonic() + 10
        while "reading router deployments failed" not in gw.log():
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.05)
        time.sleep(1.0)  # about 20 more failed polls, none of them logged
        assert gw.log().count("reading router deployments failed") == 1, gw.log()
        # A deploy that cannot be recorded changes nothing, and says why.
        r = _deploy(gw.url, "packaged:demo-rl")
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "database_unavailable", r.text
        assert _serving(gw.url)["checkpoint"]["version"] == default.version
        db.execute("ALTER TABLE router_deployments_away RENAME TO router_deployments")
        db.commit()
        deadline = time.monotonic() + 10
        while "reading router deployments again" not in gw.log():
            assert time.monotonic() < deadline, gw.log()
            time.sleep(0.1)
        assert gw.log().count("reading router deployments failed") == 1
        # It follows deployments again.
        assert _deploy(gw.url, "packaged:demo-rl").status_code == 200
    finally:
        db.close()
        gw.stop()


def test_a_reload_reads_the_config_off_the_event_loop(upstream: Upstream, tmp_path: Path) -> None:
    # The config becomes a named pipe that nobody writes yet: reading it blocks until a
    # writer comes, as a config on a stuck network filesystem would. The worker must keep
    # serving meanwhile, as it does while the file watcher reads the config.
    gw = start_gateway(tmp_path, gateway_config(tmp_path, upstream.base_url))
    text = gw.config_path.read_text()
    gw.config_path.unlink()
    os.mkfifo(gw.config_path)
    reloaded: dict[str, httpx.Response] = {}
    reloading = threading.Thread(
        target=lambda: reloaded.setdefault(
            "r", httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30)
        )
    )
    reloading.start()
    try:
        time.sleep(0.5)  # the reload is waiting on the pipe
        assert httpx.get(f"{gw.url}/healthz", timeout=5).status_code == 200
        assert "gemma-2-9b-it" in model_ids(gw.url)
    finally:
        with gw.config_path.open("w") as pipe:  # the writer the reader waits for
            pipe.write(text)
        reloading.join(30)
        gw.stop()
    assert reloaded["r"].status_code == 200, reloaded["r"].text


def test_a_reload_that_fails_half_way_changes_nothing(upstream: Upstream, tmp_path: Path) -> None:
    # The new config's circuit breaker settings are fine, its checkpoint is not: the reload
    # is refused, and the circuit breakers must go on as the previous config set them (off
    # here), not take up the settings of a config that never served.
    cfg = gateway_config(tmp_path, upstream.base_url)
    gw = start_gateway(tmp_path, cfg)
    try:
        cfg["router"] = {
            **cfg["router"],
            "circuit_breaker": {"failures": 1, "cooldown_s": 60},
            "checkpoint": str(tmp_path / "no-such-checkpoint"),
        }
        gw.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "reload_failed", r.text
        upstream.fault("gemma-2-9b-it", "status=500", count=2)  # both attempts fail
        body = {"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30).is_error
        router = httpx.get(f"{gw.url}/admin/router", headers=ADMIN, timeout=10).json()
        assert router["circuits"] == {}
        r = httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        # Once the config loads, its breaker settings do serve.
        del cfg["router"]["checkpoint"]
        gw.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30)
        assert r.status_code == 200, r.text
        upstream.fault("gemma-2-9b-it", "status=500", count=2)
        assert httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30).is_error
        router = httpx.get(f"{gw.url}/admin/router", headers=ADMIN, timeout=10).json()
        assert router["circuits"] == {"gemma-2-9b-it": "open"}
    finally:
        gw.stop()


def test_a_reload_prices_savings_anew_and_refuses_a_broken_catalog(
    upstream: Upstream, tmp_path: Path
) -> None:
    model, reference = "gemma-2-9b-it", "llama-3.3-70b-instruct"
    cfg = gateway_config(tmp_path, upstream.base_url, metrics={"reference_model": reference})
    gw = start_gateway(tmp_path, cfg)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}

    def savings_of_one_request() -> float:
        def total() -> float:
            text = httpx.get(f"{gw.url}/metrics", timeout=10).text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("xrouter_savings_usd_total{")
            )

        before = total()
        r = httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return total() - before

    try:
        cheap = savings_of_one_request()
        # The reference model's price goes up 1000-fold: the same request saves far more.
        cfg["pricing"] = {"overrides": {reference: {"input": 1000, "output": 1000}}}
        gw.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30)
        assert r.status_code == 200 and r.json()["worker"] > 0, r.text
        assert savings_of_one_request() > 100 * cheap > 0
        # A catalog that is not YAML, or holds no mapping of models: a 400 that says why,
        # and the config before it keeps serving.
        for text in ("models: [\n  - {", "models: [1, 2]\n"):
            (tmp_path / "catalog.yaml").write_text(text)
            cfg["pricing"] = {"catalog": str(tmp_path / "catalog.yaml")}
            gw.config_path.write_text(yaml.safe_dump(cfg))
            r = httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "reload_failed" and "catalog" in r.text
        assert "Traceback" not in gw.log()
    finally:
        gw.stop()


def test_a_reload_that_turns_auth_off_keeps_requests_to_their_keys(
    upstream: Upstream, tmp_path: Path
) -> None:
    # The auth section is read at start: keys are still asked for after such a reload, and
    # one key still may not read another's requests.
    cfg = gateway_config(tmp_path, upstream.base_url, auth={"enabled": True})
    gw = start_gateway(tmp_path, cfg)
    try:
        keys = [
            httpx.post(f"{gw.url}/admin/keys", json={"alias": a}, headers=ADMIN).json()["key"]
            for a in ("a", "b")
        ]
        body = {"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(
            f"{gw.base_url}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {keys[0]}"},
            timeout=30,
        )
        rid = r.headers["x-request-id"]
        cfg["auth"] = {**cfg["auth"], "enabled": False}
        gw.config_path.write_text(yaml.safe_dump(cfg))
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30).status_code == 200
        for key, status in ((keys[1], 404), (keys[0], 200)):
            got = httpx.get(
                f"{gw.base_url}/generation",
                params={"id": rid},
                headers={"Authorization": f"Bearer {key}"},
                timeout=10,
            )
            assert got.status_code == status, got.text
    finally:
        gw.stop()


def test_sections_read_at_start_stay_as_started_and_a_reload_says_so(
    upstream: Upstream, tmp_path: Path
) -> None:
    """A reload took the file's `server.max_body_bytes` (a section the README says is read
    at start) and reported the file's values for the others, while a changed
    `ledger.log_content` went on logging prompts as before without a word. Now the running
    services' sections stay as they started, and the reload logs which changes need a
    restart."""
    cfg = gateway_config(tmp_path, upstream.base_url, router={"watch_files": False})
    cfg["server"] = {**cfg.get("server", {}), "max_body_bytes": 65536}
    gw = start_gateway(tmp_path, cfg)
    try:
        # The file as it started: nothing to warn of, whatever serve's own flags set.
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30).status_code == 200
        assert "a restart" not in gw.log()
        cfg["server"]["max_body_bytes"] = 2048
        cfg["ledger"]["log_content"] = (
            "none" if cfg["ledger"].get("log_content") == "full" else "full"
        )
        gw.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30)
        assert r.status_code == 200, r.text
        body = {"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "x" * 5000}]}
        assert (
            httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30).status_code == 200
        )
        deadline = time.monotonic() + 5
        while "take a restart" not in gw.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "the server, ledger sections are read at start" in gw.log(), gw.log()[-2000:]
    finally:
        gw.stop()


def test_settings_only_the_start_reads_stay_as_started_and_a_reload_says_so(
    upstream: Upstream, tmp_path: Path
) -> None:
    """A reload took `metrics.enabled`, the deployment poll interval, the watcher switch and
    the circuit sharing settings into its settings without a word, while the services built
    from them at start went on as before."""
    cfg = gateway_config(tmp_path, upstream.base_url, router={"watch_files": False})
    gw = start_gateway(tmp_path, cfg)
    try:
        cfg["metrics"] = {**cfg.get("metrics", {}), "enabled": False}
        cfg["router"] = {
            **cfg["router"],
            "deployment_poll_s": 7,
            "circuit_breaker": {"shared": False},
        }
        gw.config_path.write_text(yaml.safe_dump(cfg))
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30).status_code == 200
        deadline = time.monotonic() + 5
        while "a restart" not in gw.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (
            "metrics.enabled, router.deployment_poll_s, router.circuit_breaker.shared are "
            "read at start" in gw.log()
        ), gw.log()[-2000:]
        assert httpx.get(f"{gw.url}/metrics", timeout=10).status_code == 200
    finally:
        gw.stop()


def test_a_deploy_keeps_the_sections_read_at_start_too(upstream: Upstream, tmp_path: Path) -> None:
    """A deploy re-reads the config as a reload does, but applied the file's restart-only
    sections on that worker: a `server.max_body_bytes` lowered in the file refused bodies
    the running server was started to take, without a warning."""
    cfg = gateway_config(tmp_path, upstream.base_url, router={"watch_files": False})
    cfg["server"] = {**cfg.get("server", {}), "max_body_bytes": 65536}
    gw = start_gateway(tmp_path, cfg)
    try:
        cfg["server"]["max_body_bytes"] = 2048
        gw.config_path.write_text(yaml.safe_dump(cfg))
        r = _deploy(gw.url, "packaged:demo-rl")
        assert r.status_code == 200, r.text
        body = {"model": "gemma-2-9b-it", "messages": [{"role": "user", "content": "x" * 5000}]}
        r = httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 5
        while "a restart" not in gw.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "the server section is read at start" in gw.log(), gw.log()[-2000:]
    finally:
        gw.stop()


# With several workers too: the supervisor passed its host and port to the workers in the
# environment, which overrides the file, so a reload never saw the file's host change.
@pytest.mark.parametrize("workers", [1, 2])
def test_a_reload_warns_of_a_server_setting_the_file_changed_unless_serve_set_it(
    upstream: Upstream, tmp_path: Path, workers: int
) -> None:
    """serve's --port and --workers (given here) run, not the file's: changing them in the
    file is no change. But `host`, which the command line did not set, is the file's: a
    reload once ignored a changed host (or port, without --port) without a word."""
    cfg = gateway_config(tmp_path, upstream.base_url, router={"watch_files": False})
    cfg["server"] = {**cfg.get("server", {}), "host": "127.0.0.1", "port": 1, "workers": 1}
    gw = start_gateway(tmp_path, cfg, workers=workers)
    try:
        cfg["server"]["port"] = 2
        cfg["server"]["workers"] = 2
        gw.config_path.write_text(yaml.safe_dump(cfg))
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30).status_code == 200
        assert "a restart" not in gw.log(), gw.log()[-2000:]
        cfg["server"]["host"] = "0.0.0.0"
        gw.config_path.write_text(yaml.safe_dump(cfg))
        assert httpx.post(f"{gw.url}/admin/reload", headers=ADMIN, timeout=30).status_code == 200
        deadline = time.monotonic() + 10
        while "a restart" not in gw.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "the server section is read at start" in gw.log(), gw.log()[-2000:]
    finally:
        gw.stop()
