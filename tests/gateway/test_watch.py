"""The file watcher against a real Services: config edits reload once the files settle,
also when a deploy switches checkpoints in the same poll."""

from __future__ import annotations

import asyncio
import shutil
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
