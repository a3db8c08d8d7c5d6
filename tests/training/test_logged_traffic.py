"""The whole loop on logged traffic: a gateway routes with exploration and logs every
decision with its propensity, clients send feedback, the ledger is exported as an outcome
table with partial feedback, a compact router (the policy network, then a kNN router) is
retrained off-policy from it, and the new checkpoint is deployed to the running gateway."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from router.checkpoint import default_checkpoint_path, load_checkpoint
from router.outcomes import OutcomeRecord, load_outcome_table
from tests.support.gateway import ADMIN_KEY, Gateway, gateway_config, start_gateway
from tests.support.replay import REPO_ROOT, start_replay_upstream, stop_replay_upstream

DEMO = REPO_ROOT / "router" / "assets" / "demo_outcomes.jsonl"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path]]:
    tmp = tmp_path_factory.mktemp("logged")
    proc, base = start_replay_upstream(tmp)
    cfg = gateway_config(
        tmp,
        base,
        router={"watch_files": False, "epsilon": 0.5},
        ledger={"log_content": "full"},
        auth={"enabled": False, "admin_key": ADMIN_KEY},
    )
    gw = start_gateway(tmp, cfg)
    yield gw, tmp
    gw.stop()
    stop_replay_upstream(proc)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_export_retrain_off_policy_and_deploy(gateway: tuple[Gateway, Path]) -> None:
    gw, tmp = gateway
    table: list[OutcomeRecord] = load_outcome_table(DEMO)[::4]
    with httpx.Client(base_url=gw.base_url, timeout=30) as c:
        for i, rec in enumerate(table):
            # Mostly the explored compact router; some cascades (multi-call trajectories)
            # and requests that name their model (propensity 1), as real traffic mixes them.
            model = "xrouter/compact"
            # (About 120 explored compact decisions, as many as every model needs to be logged
            # a few times for the retraining below, which asks for the whole pool.)
            if i % 8 == 7:
                model = "xrouter/cascade"
            elif i % 9 == 8:
                model = next(iter(rec.outcomes))
            r = c.post(
                "/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": rec.text}],
                    "xrouter": {"cost_weight": 1.0},
                },
            )
            assert r.status_code == 200
            body = r.json()
            # The client grades the answer; here, with the score recorded for that model.
            score = rec.outcomes[body["model"]].score
            assert (
                c.post(
                    "/feedback", json={"request_id": body["xrouter"]["request_id"], "score": score}
                ).status_code
                == 200
            )
    out = tmp / "traffic.jsonl"
    res = run("export", "--config", str(gw.config_path), "--out", str(out))
    assert res.returncode == 0, res.stderr
    logged = load_outcome_table(out)
    assert len(logged) == len(table)
    assert all(r.logged is not None and len(r.outcomes) == 1 for r in logged)
    props = [r.logged.propensity for r in logged if r.logged]
    assert min(props) < 1.0  # exploration: some actions were not the greedy one
    assert all(0 < p <= 1 for p in props)
    # Exported as each request was first scored instead: the same records, each once.
    scored = tmp / "scored.jsonl"
    argv = ("--scored", "--cursor", str(tmp / "scored.cursor"), "--settle-seconds", "0")
    res = run("export", "--config", str(gw.config_path), "--out", str(scored), *argv)
    assert res.returncode == 0, res.stderr
    by_id = {r.id: r for r in logged}
    assert sorted(by_id) == sorted(r.id for r in load_outcome_table(scored))
    assert all(r == by_id[r.id] for r in load_outcome_table(scored))

    run_dir = tmp / "run"
    pool = ",".join(load_checkpoint(default_checkpoint_path()).pool)
    res = run(
        "train",
        "--table",
        str(out),
        "--offpolicy",
        "--pool",
        pool,
        "--steps",
        "30",
        "--eval-every",
        "10",
        "--out",
        str(run_dir),
        "--no-progress",
        "--threads",
        "1",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    ckpt = load_checkpoint(run_dir / "checkpoint")
    assert ckpt.pool == pool.split(",")
    assert ckpt.metadata.training["command"].startswith(f"xrouter train --table {out}")

    res = run("deploy", str(run_dir / "checkpoint"), "--url", gw.url, "--admin-key", ADMIN_KEY)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["checkpoint"]["version"] == ckpt.version
    r = httpx.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "xrouter", "messages": [{"role": "user", "content": table[0].text}]},
    )
    assert r.status_code == 200 and r.json()["xrouter"]["decision"]["policy"] == "compact"

    # The same traffic builds the default checkpoint's kind: a kNN router over the logged
    # prompts, storing doubly-robust estimates of every model's outcome on each.
    knn_dir = tmp / "knn"
    res = run("train", "--table", str(out), "--offpolicy", "--knn", "10,25,50", "--pool", pool,
              "--out", str(knn_dir), "--no-progress", "--threads", "1")  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    knn = load_checkpoint(knn_dir / "checkpoint")
    assert knn.architecture.kind == "knn" and knn.pool == pool.split(",")
    assert knn.metadata.training["stored_outcomes"] == "doubly_robust"
    assert knn.architecture.n_examples == len(knn.weights["scores"]) > 0
    # Evaluated off-policy on the same logs: the new checkpoint chooses over the whole pool
    # (not the one logged model per prompt), so it gets its own estimate.
    ev = tmp / "eval"
    res = run("eval", "--table", str(out), "--split", "all", "--policy",
              f"compact:{knn_dir / 'checkpoint'}", "--policy", "policy:cascade", "--out", str(ev))  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = json.loads((ev / "metrics.json").read_text())
    rows = {r["router"]: r["estimates"]["score"] for r in metrics["off_policy"]}
    mine = rows[f"compact-knn[{knn.version}]"]
    assert {"ips", "snips", "dr"} <= set(mine) and 0 <= mine["snips"]["value"] <= 1
    assert any(n.startswith("policy:cascade: no off-policy estimate") for n in metrics["notes"])
    cascades = sum(1 for r in logged if r.logged and r.logged.multi_call)
    assert cascades > 0 and mine["snips"]["n"] == len(logged) - cascades
    assert any(f"{cascades} of {len(logged)} logged records are multi-call" in n
               for n in metrics["notes"])  # fmt: skip
    # It was trained on this export (its default split): the evaluated prompts it has seen
    # are counted; nothing was fitted by the eval itself.
    assert any(n.startswith(f"compact-knn[{knn.version}]: ") and "were in its training" in n
               for n in metrics["notes"])  # fmt: skip
    assert not any("which the routers were fitted on" in n for n in metrics["notes"])
    # Named-model requests gave the other models no chance: a single-model row that picks
    # another model has no data on them.
    assert max(r["unsupported"] for r in metrics["off_policy"]) > 0
    res = run("deploy", str(knn_dir / "checkpoint"), "--url", gw.url, "--admin-key", ADMIN_KEY)
    assert res.returncode == 0, res.stderr
    r = httpx.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "xrouter", "messages": [{"role": "user", "content": table[1].text}]},
    )
    assert r.status_code == 200
    assert r.json()["xrouter"]["decision"]["checkpoint"] == knn.version


def test_a_model_added_to_the_pool_is_explored_logged_and_learned(tmp_path: Path) -> None:
    """A model added after the checkpoint was trained: the serving checkpoint never picks it
    itself, but exploration logs it, so retraining on the export learns it and the deployed
    checkpoint routes over the whole pool."""
    proc, base = start_replay_upstream(tmp_path)
    house, twin = "house-model", "gemma-2-9b-it"  # the new model serves gemma's answers
    cfg = gateway_config(
        tmp_path,
        base,
        router={"watch_files": False, "epsilon": 1.0},
        ledger={"log_content": "full"},
        auth={"enabled": False, "admin_key": ADMIN_KEY},
    )
    cfg["pool"].append(
        {"name": house, "model": f"openai/{twin}", "api_base": base,
         "price": {"input": 0.02, "output": 0.02}}
    )  # fmt: skip
    gw = start_gateway(tmp_path, cfg)
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        serving = httpx.get(f"{gw.url}/admin/router", headers=admin).json()["checkpoint"]
        assert serving["untrained_models"] == [house]
        table = load_outcome_table(DEMO)[:135]
        with httpx.Client(base_url=gw.base_url, timeout=30) as c:
            for rec in table:
                body = c.post(
                    "/chat/completions",
                    json={"model": "xrouter", "messages": [{"role": "user", "content": rec.text}]},
                ).json()
                answered = twin if body["model"] == house else body["model"]
                score = rec.outcomes[answered].score
                fb = {"request_id": body["xrouter"]["request_id"], "score": score}
                assert c.post("/feedback", json=fb).status_code == 200
        out = tmp_path / "traffic.jsonl"
        res = run("export", "--config", str(gw.config_path), "--out", str(out))
        assert res.returncode == 0, res.stderr
        logged = load_outcome_table(out)
        on_house = [r for r in logged if house in r.outcomes]
        # Uniform over 9 models: ~15 of 135; none at all has probability (8/9)^135 < 1e-6.
        assert on_house and all(r.logged and r.logged.propensity == 1 / 9 for r in on_house)

        knn_dir = tmp_path / "knn"
        res = run("train", "--table", str(out), "--offpolicy", "--knn", "10,25",
                  "--out", str(knn_dir), "--no-progress", "--threads", "1")  # fmt: skip
        assert res.returncode == 0, res.stderr[-2000:]
        knn = load_checkpoint(knn_dir / "checkpoint")
        assert house in knn.pool and len(knn.pool) == 9
        res = run("deploy", str(knn_dir / "checkpoint"), "--url", gw.url, "--admin-key", ADMIN_KEY)
        assert res.returncode == 0, res.stderr
        serving = httpx.get(f"{gw.url}/admin/router", headers=admin).json()["checkpoint"]
        assert serving["version"] == knn.version and serving["untrained_models"] == []
    finally:
        gw.stop()
        stop_replay_upstream(proc)
