"""The file watcher against a real Services: config edits reload once the files settle,
also when a deploy switches checkpoints in the same poll."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from gateway.services import Services
from gateway.settings import load_settings
from gateway.watch import FileWatcher
from router.checkpoint import packaged_checkpoint_path
from tests.support.gateway import DEMO_MODELS, gateway_config

DROPPED = DEMO_MODELS[-1]


def write(path: Path, cfg: dict[str, Any]) -> None:
    # Written whole and renamed into place, as editors and config management do.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(cfg))
    tmp.replace(path)


async def until(predicate: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_a_config_edit_during_a_checkpoint_switch_is_still_reloaded(
    tmp_path: Path,
) -> None:
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1", router={"watch_files": True})
    path = tmp_path / "xrouter.yaml"
    write(path, cfg)
    services = Services(load_settings(path), CollectorRegistry())
    services.prepare()
    ckpt = tmp_path / "ckpt"
    shutil.copytree(packaged_checkpoint_path("demo-rl"), ckpt)
    watcher = FileWatcher(services, path, interval_s=0.5)
    watcher.start()
    try:
        await asyncio.sleep(0.6)  # the watcher has its first fingerprint
        # In one poll interval: the config loses a model, and a deploy switches the served
        # checkpoint (so the set of watched paths changes at the next poll).
        cfg["pool"] = [m for m in cfg["pool"] if m["name"] != DROPPED]
        write(path, cfg)
        await services.deploy(str(ckpt))
        assert DROPPED in services.runtime.pool  # type: ignore[union-attr]
        await until(lambda: DROPPED not in services.runtime.pool)  # type: ignore[union-attr]
    finally:
        await watcher.stop()


async def test_files_still_changing_are_not_loaded_until_they_settle(tmp_path: Path) -> None:
    cfg = gateway_config(tmp_path, "http://127.0.0.1:9/v1", router={"watch_files": True})
    path = tmp_path / "xrouter.yaml"
    write(path, cfg)
    services = Services(load_settings(path), CollectorRegistry())
    services.prepare()
    first = services.runtime
    watcher = FileWatcher(services, path, interval_s=0.3)
    watcher.start()
    try:
        await asyncio.sleep(0.4)
        # Rewritten at every poll for a while (a slow copy): no reload meanwhile.
        cfg["pool"] = [m for m in cfg["pool"] if m["name"] != DROPPED]
        for i in range(20):
            cfg["server"] = {"keep_alive_s": 60 + i}
            write(path, cfg)
            await asyncio.sleep(0.05)
            assert services.runtime is first, f"reloaded while the file was changing ({i})"
        await until(lambda: services.runtime is not first)
        assert DROPPED not in services.runtime.pool  # type: ignore[union-attr]
    finally:
        await watcher.stop()


# -- reloads and deploys racing the deployment poller ---------------------------------


class _GatedBuilds:
    """``build_runtime`` held at its start until released: a reload or deploy caught
    mid-build, as a slow checkpoint load leaves it, while the deployment poller runs."""

    def __init__(self) -> None:
        from gateway.runtime import build_runtime

        self._real = build_runtime
        self.entered = threading.Event()
        self.release = threading.Event()
        self.armed = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.armed:
            self.armed = False
            self.entered.set()
            assert self.release.wait(30)
        return self._real(*args, **kwargs)


async def _services_with_ledger(tmp_path: Path) -> Services:
    from gateway.ledger.deployments import DeploymentRepository
    from gateway.ledger.store import open_ledger_engine

    path = tmp_path / "xrouter.yaml"
    write(path, gateway_config(tmp_path, "http://127.0.0.1:9/v1"))
    services = Services(load_settings(path), CollectorRegistry())
    services.engine = await open_ledger_engine(services.settings.ledger.url)
    services.reloader.deployments = DeploymentRepository(services.engine)
    services.prepare()
    return services


def _copy(name: str, to: Path) -> str:
    shutil.copytree(packaged_checkpoint_path(name), to)
    return str(to)


async def test_a_reload_racing_the_poller_records_no_deployment_it_did_not_build(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """An admin (or file) reload is building the deployed checkpoint A when the poller takes
    up another replica's newer deployment B: the reload must not record B's path with A's
    version (a deployment no replica could load), and B is served once both are done."""
    from router.checkpoint import load_checkpoint

    services = await _services_with_ledger(tmp_path)
    gate = _GatedBuilds()
    monkeypatch.setattr("gateway.reload.build_runtime", gate)
    try:
        a, b = _copy("demo-rl", tmp_path / "a"), _copy("demo", tmp_path / "b")
        version_b = load_checkpoint(b).version
        await services.deploy(a)  # deployment 1, served here
        assert services.reloader.deployments is not None
        newer = await services.reloader.deployments.record(b, version_b, None)  # another replica's
        gate.armed = True
        reloading = asyncio.create_task(services.reload())
        await asyncio.to_thread(gate.entered.wait, 30)
        following = asyncio.create_task(services.reloader._follow_deployment())
        await asyncio.sleep(0.3)  # the poller has read deployment 2 and waits for the lock
        gate.release.set()
        await reloading
        await following
        latest = await services.reloader.deployments.latest()
        assert latest is not None and latest.id == newer.id  # nothing recorded meanwhile
        assert services.current().checkpoint_info["version"] == version_b
        assert services.active_deployment is not None
        assert services.active_deployment.id == newer.id
    finally:
        gate.release.set()
        await services.ledger_engine().dispose()


async def test_a_deploy_racing_the_poller_keeps_the_newer_deployment(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The poller takes up another replica's deployment 1 while this worker's own deploy of
    B (deployment 2) is building: deployment 1 is older than what this worker then serves,
    so it is not loaded over it, and the worker keeps saying it serves deployment 2 (a later
    reload builds on it, not on a deployment it forgot)."""
    from router.checkpoint import load_checkpoint

    services = await _services_with_ledger(tmp_path)
    gate = _GatedBuilds()
    monkeypatch.setattr("gateway.reload.build_runtime", gate)
    try:
        a, b = _copy("demo-rl", tmp_path / "a"), _copy("demo", tmp_path / "b")
        assert services.reloader.deployments is not None
        await services.reloader.deployments.record(a, load_checkpoint(a).version, None)
        version_b = load_checkpoint(b).version
        gate.armed = True
        deploying = asyncio.create_task(services.deploy(b))
        await asyncio.to_thread(gate.entered.wait, 30)
        following = asyncio.create_task(services.reloader._follow_deployment())
        await asyncio.sleep(0.3)  # the poller has read deployment 1 and waits for the lock
        gate.release.set()
        mine = await deploying
        await following
        assert mine.checkpoint_info["version"] == version_b
        assert services.current() is mine
        assert services.active_deployment is not None and services.active_deployment.id == 2
        await services.reload()
        assert services.current().checkpoint_info["version"] == version_b
    finally:
        gate.release.set()
        await services.ledger_engine().dispose()
