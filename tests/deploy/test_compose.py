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


def test_the_gateway_starts_once_its_database_and_redis_answer() -> None:
    """The gateway migrates its ledger at startup and exits if the database does not answer:
    started merely after the containers (PostgreSQL's first start initializes its data
    directory on a server that takes no TCP connections, then restarts), it would die on a
    fresh `docker compose up`; before Redis answers, its limits would refuse requests."""
    compose = yaml.safe_load((REPO_ROOT / "deploy/compose/docker-compose.yml").read_text())
    services = compose["services"]
    gateway = services["xrouter"]
    for dependency in ("postgres", "redis"):
        assert gateway["depends_on"][dependency] == {"condition": "service_healthy"}
        check = services[dependency]["healthcheck"]["test"]
        assert check[0] == "CMD"
    # Over TCP, as the gateway connects: the initializing server answers on its socket only.
    pg_check = services["postgres"]["healthcheck"]["test"]
    assert "pg_isready" in pg_check and pg_check[pg_check.index("-h") + 1] == "127.0.0.1"
    assert services["redis"]["healthcheck"]["test"][1:] == ["redis-cli", "ping"]
    # A gateway that exits later (a crash, an OOM kill) comes back.
    assert gateway["restart"] == "unless-stopped"


def test_the_ledger_journal_outlives_the_container_and_shutdown_is_graceful() -> None:
    compose = yaml.safe_load((REPO_ROOT / "deploy/compose/docker-compose.yml").read_text())
    gateway = compose["services"]["xrouter"]
    config = yaml.safe_load((REPO_ROOT / "deploy/compose/config.yaml").read_text())
    spill = config["ledger"]["spill_dir"]
    mounts = dict(reversed(v.split(":")[:2]) for v in gateway["volumes"])
    assert mounts[spill] in compose["volumes"]  # a named volume, not the container's layer
    # The image makes that directory the gateway user's: a fresh named volume copies it.
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert f"install -d -o xrouter -g xrouter {spill}" in dockerfile
    # Longer than the gateway's 30 s graceful shutdown: Docker's 10 s default cut streams.
    assert gateway["stop_grace_period"].endswith("s")
    assert int(gateway["stop_grace_period"][:-1]) > 30
