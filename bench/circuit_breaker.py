"""What a circuit breaker saves during an upstream outage (prints figures).

    .venv/bin/python bench/circuit_breaker.py [--requests 40] [--timeout-s 2] [--port 18301]

Starts the replay upstream and two gateways on the demo pool — circuit breakers off
(``router.circuit_breaker.failures: 0``, on ``--port``) and on (the default, 5 failures,
30 s, on the next port) — makes the cheapest model hang (every call to it times out after
``--timeout-s``, one retry), and sends the same sequential requests to ``xrouter/cheapest``
through each. Without a breaker every request pays the dead model's timeouts before the
loop's next turn asks another model; with one, the first requests pay them, then routing
leaves the model out. Prints latency percentiles and how many calls went to the dead model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from xrouter_serve import REPO, start_gateway

DEAD = "llama-3.2-3b-instruct"  # the demo pool's cheapest model
MODELS = [
    "llama-3.2-3b-instruct",
    "gemma-2-9b-it",
    "mistral-small-24b-instruct-2501-bf16",
]


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=log.parent, env=env, stdout=out, stderr=subprocess.STDOUT)


def gateway(
    tmp: Path, upstream: str, port: int, failures: int, timeout_s: float
) -> subprocess.Popen[bytes]:
    config: dict[str, Any] = {
        "auth": {"enabled": False},
        "ledger": {
            "url": f"sqlite+aiosqlite:///{tmp}/ledger-{port}.db",
            "spill_dir": str(tmp / f"spill-{port}"),
        },
        "router": {"watch_files": False, "circuit_breaker": {"failures": failures}},
        "pool": [
            {
                "name": m,
                "model": f"openai/{m}",
                "api_base": upstream,
                "timeout_s": timeout_s,
                "max_retries": 1,
            }
            for m in MODELS
        ],
    }
    path = tmp / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    return start_gateway(tmp, port, args=["--config", str(path)])


def run(port: int, n: int, control: httpx.Client) -> tuple[list[float], int]:
    before = control.get("/_replay/stats").json()["requests"].get(DEAD, 0)
    times = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=120) as c:
        for _ in range(n):
            t = time.perf_counter()
            r = c.post(
                "/chat/completions",
                json={"model": "xrouter/cheapest", "messages": [{"role": "user", "content": "hi"}]},
            )
            times.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text
    return times, control.get("/_replay/stats").json()["requests"].get(DEAD, 0) - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--timeout-s", type=float, default=2.0)
    parser.add_argument("--port", type=int, default=18301, help="the first gateway's (then +1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xrouter-cb-") as d:
        tmp = Path(d)
        port_file = tmp / "replay.port"
        up = start(
            [
                sys.executable,
                "-m",
                "gateway.replay",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--port-file",
                str(port_file),
            ],
            tmp / "replay.log",
        )
        procs = [up]
        try:
            deadline = time.monotonic() + 60
            while not port_file.exists():
                # A replay upstream that died (its table, its port) writes no port file.
                if up.poll() is not None or time.monotonic() > deadline:
                    log = (tmp / "replay.log").read_text()
                    raise SystemExit(f"the replay upstream did not start:\n{log}")
                time.sleep(0.02)
            root = f"http://127.0.0.1:{int(port_file.read_text())}"
            control = httpx.Client(base_url=root, timeout=10)
            results = {}
            for label, failures, port in (
                ("breaker off", 0, args.port),
                ("breaker on (default)", 5, args.port + 1),
            ):
                procs.append(gateway(tmp, root + "/v1", port, failures, args.timeout_s))
                control.delete("/_replay/faults")
                control.post(
                    "/_replay/faults", json={"model": DEAD, "fault": "timeout=600", "count": 100000}
                )
                results[label] = run(port, args.requests, control)
            print(
                f"{args.requests} sequential requests to xrouter/cheapest while {DEAD} hangs "
                f"(timeout {args.timeout_s:g} s, 1 retry):"
            )
            print(f"{'':<22}{'p50':>9}{'p90':>9}{'max':>9}{'total':>9}  calls to the dead model")
            for label, (times, dead_calls) in results.items():
                q = statistics.quantiles(times, n=10)
                print(
                    f"{label:<22}{statistics.median(times):>8.2f}s{q[8]:>8.2f}s{max(times):>8.2f}s"
                    f"{sum(times):>8.1f}s  {dead_calls}"
                )
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
