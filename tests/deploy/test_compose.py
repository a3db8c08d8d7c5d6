"""The compose stack's Redis keeps what the budgets need, as the README asks of any Redis
the gateway's limits use."""

from __future__ import annotations

import yaml

from tests.support.replay import REPO_ROOT


def test_compose_redis_persists_and_never_evicts() -> None:
    compose = yaml.safe_load((REPO_ROOT / "deploy/compose/docker-compose.yml").read_text())
    redis = compose["services"]["redis"]
    args = redis["command"]
    flags = dict(zip(args[1::2], args[2::2], strict=True))
    assert flags["--appendonly"] == "yes"
    assert flags["--maxmemory-policy"] == "noeviction"
    volume = redis["volumes"][0].split(":")
    assert volume[1] == "/data" and volume[0] in compose["volumes"]
