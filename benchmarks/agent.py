"""The agent's control API and its time to a ready iperf3 server, on loopback.

Measured against a real ``iepm agent`` process (started as a user starts it, on a free loopback
port, with a throwaway agent.toml and state directory):

* ``control_api``: requests per second of ``GET /v1/usage`` (authenticated: token hash look-up,
  limits) from --clients concurrent httpx clients, one keep-alive connection each. Baseline:
  ``GET /v1/health`` on the same server in the same run (same stack, no authentication).
* ``slot_ready``: time from the monitor's ``POST /v1/slots`` to the answer that carries a
  listening iperf3 server (the agent waits for "Server listening" before answering), then
  ``DELETE`` to release — --slots times, median and p99. Also the agent's own view (server
  start to listening, ``ready_ms``). Baseline: plain ``iperf3 -s -1`` start-to-listening on a
  free port, measured the same way (stdout line), same run.

    .venv/bin/python benchmarks/agent.py [--requests 2000] [--clients 8] [--slots 50]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from iepm.remote.trust import new_token, token_digest
from testkit.net import free_port


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_agent(tmp: Path, token: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    (tmp / "agent.toml").write_text(
        f'[agent]\nstate_dir = "{tmp / "state"}"\nserver_ports = [41000, 41100]\n'
        'server_bind = "127.0.0.1"\nslot_grace_s = 5\n\n'
        f'[[monitors]]\nname = "bench"\ntoken_sha256 = "{token_digest(token)}"\n'
        "[monitors.limits]\nmax_duration_s = 10\ntests_per_hour = 3600\n"
    )
    argv = [sys.executable, "-m", "iepm.cli", "agent", "--listen", f"127.0.0.1:{port}"]
    argv += ["--config", str(tmp / "agent.toml"), "--log-level", "warning"]
    log = (tmp / "agent.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    stop(proc)
    raise SystemExit(f"agent did not start: {(tmp / 'agent.log').read_text()}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


async def rate(url: str, path: str, token: str, requests: int, clients: int) -> float:
    per_client = requests // clients

    async def client() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http:
            for _ in range(per_client):
                response = await http.get(path)
                response.raise_for_status()

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return per_client * clients / (time.perf_counter() - t0)


def slot_times(url: str, token: str, slots: int) -> tuple[list[float], list[float]]:
    total, agent_side = [], []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10) as http:
        for _ in range(slots):
            t0 = time.perf_counter()
            response = http.post("/v1/slots", json={"duration_s": 1})
            elapsed = (time.perf_counter() - t0) * 1000
            response.raise_for_status()
            grant = response.json()
            with socket.create_connection(("127.0.0.1", grant["port"]), timeout=2):
                pass  # the server really listens when the answer arrives
            total.append(elapsed)
            agent_side.append(float(grant["ready_ms"]))
            http.delete(f"/v1/slots/{grant['slot_id']}").raise_for_status()
    return total, agent_side


def bare_iperf3_ready(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        argv = ["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", str(free_port()), "--forceflush"]
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert proc.stdout is not None
            while b"Server listening" not in proc.stdout.readline():
                pass
            times.append((time.perf_counter() - t0) * 1000)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    return times


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values), 2),
        "p99_ms": round(quantile(values, 0.99), 2),
        "n": len(values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--slots", type=int, default=50)
    args = parser.parse_args()
    token = new_token()
    with tempfile.TemporaryDirectory(prefix="iepm-bench-agent-") as name:
        proc, url = start_agent(Path(name), token)
        try:
            asyncio.run(rate(url, "/v1/health", token, 200, args.clients))  # warm-up
            health_rps = asyncio.run(rate(url, "/v1/health", token, args.requests, args.clients))
            usage_rps = asyncio.run(rate(url, "/v1/usage", token, args.requests, args.clients))
            total, agent_side = slot_times(url, token, args.slots)
        finally:
            stop(proc)
    bare = bare_iperf3_ready(args.slots)
    slot = summary(total)
    baseline = summary(bare)
    report: dict[str, Any] = {
        "benchmark": "agent",
        "cpu_count": os.cpu_count(),
        "control_api": {
            "endpoint": "GET /v1/usage (authenticated)",
            "requests_per_s": round(usage_rps, 1),
            "baseline_endpoint": "GET /v1/health (no auth, same server)",
            "baseline_requests_per_s": round(health_rps, 1),
            "ratio_to_baseline": round(usage_rps / health_rps, 3),
            "clients": args.clients,
            "requests": args.requests,
        },
        "slot_ready": {
            "what": "POST /v1/slots until the answer with a listening iperf3 server",
            **slot,
            "agent_side_ready": summary(agent_side),
            "baseline": {"what": "plain iperf3 -s -1 start to 'Server listening'", **baseline},
            "ratio_median_to_baseline": round(slot["median_ms"] / baseline["median_ms"], 2),
            "ratio_p99_to_baseline": round(slot["p99_ms"] / baseline["p99_ms"], 2),
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
