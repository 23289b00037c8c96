"""Agent and SSH targets in the WAN lab: an ``iepm agent`` runs inside one target's namespace,
a private sshd inside another's; the monitors' cycles run in their own namespaces."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from iepm.config import Config, load_config_text
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.remote.protocol import SlotRequest
from iepm.remote.ssh import connect
from iepm.results import Result
from iepm.scheduler import Scheduler
from iepm.store import Archive
from testkit.agent import RunningAgent, running_agent
from testkit.net import wait_until
from testkit.sshd import Sshd, private_sshd

pytestmark = pytest.mark.lab

TOPOLOGY = {
    "lab": {"name": "rm", "seed": 5},
    "hosts": [
        {"name": "mon1", "role": "monitor"},
        {"name": "mon2", "role": "monitor"},
        {"name": "r1", "role": "router"},
        {"name": "tagent", "role": "target"},
        {"name": "tssh", "role": "target"},
    ],
    "links": [
        {"a": "mon1", "b": "r1", "delay_ms": 1.0},
        {"a": "mon2", "b": "r1", "delay_ms": 1.0},
        {"a": "r1", "b": "tagent", "delay_ms": 4.0, "rate_mbit": 40},
        {"a": "r1", "b": "tssh", "delay_ms": 6.0, "rate_mbit": 30},
    ],
}
AGENT_PORT = 8700
SSH_PORT = 2222
IPERF3 = {"duration_s": 3, "omit_s": 1, "streams": 2, "window": "256K"}


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Lab:
    lab = module_lab_factory(TOPOLOGY, prefix="rm")
    for monitor in ("mon1", "mon2"):  # neighbours resolved before the first measurement
        lab.wait_reachable(monitor, ["tagent", "tssh"])
    return lab


@pytest.fixture(scope="module")
def agent(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    with running_agent(
        tmp_path_factory.mktemp("labagent"),
        address=lab.address("tagent"),
        port=AGENT_PORT,
        netns=lab.netns("tagent"),
        grace_s=3.0,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def sshd(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with private_sshd(
        tmp_path_factory.mktemp("labsshd"), lab.address("tssh"), SSH_PORT, lab.netns("tssh")
    ) as server:
        yield server


def monitor_config(
    lab: Lab, monitor: str, tmp: Path, agent: RunningAgent, sshd: Sshd | None, probes: list[str]
) -> Config:
    text = f"""
[monitor]
name = "{monitor}"
cycle_interval_s = 600
archive = "sqlite:///{tmp}/{monitor}.db"
log_dir = "{tmp}/{monitor}-raw"
netns = "{lab.netns(monitor)}"

[defaults.ping]
count = 20
interval_s = 0.05

[defaults.iperf3]
{chr(10).join(f"{k} = {json.dumps(v)}" for k, v in IPERF3.items())}

[[targets]]
name = "tagent"
address = "{lab.address("tagent")}"
mode = "agent"
probes = {json.dumps(probes)}
[targets.agent]
url = "{agent.url}"
credential_file = "{agent.token_file(monitor)}"
slot_wait_s = 12
"""
    if sshd is not None:
        # The test's own work directory on the target (the namespaces share this file system):
        # what it leaves there is its own, whatever else runs on this host.
        (tmp / "sshwork").mkdir(exist_ok=True)
        text += f"""
[[targets]]
name = "tssh"
address = "{lab.address("tssh")}"
mode = "ssh"
probes = {json.dumps(probes)}
[targets.ssh]
user = "root"
key_file = "{sshd.client_key}"
port = {sshd.port}
known_hosts = "{sshd.known_hosts}"
server_port = 5333
work_dir = "{tmp}/sshwork"
"""
    return load_config_text(text)


def run_cycle(config: Config) -> list[Result]:
    with Archive.open(config.monitor.archive) as archive:
        report = asyncio.run(Scheduler(config, archive).run_cycle())
    return report.results


def iperf3_pids(lab: Lab, node: str) -> list[int]:
    """iperf3 processes inside a node's namespace (what "nothing left on the target" means)."""
    out = subprocess.run(
        ["ip", "netns", "pids", lab.netns(node)], capture_output=True, text=True, timeout=10
    ).stdout
    pids = []
    for pid in out.split():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "iperf3":
                pids.append(int(pid))
    return pids


def login_s(lab: Lab, sshd: Sshd) -> float:
    """Seconds one good log-in from mon1 to tssh takes now."""

    async def once() -> float:
        t0 = time.monotonic()
        conn = await connect(sshd.access(), lab.address("tssh"), lab.netns("mon1"))
        conn.close()
        await conn.wait_closed()
        return time.monotonic() - t0

    return asyncio.run(once())


def by(results: list[Result], target: str, probe: str) -> Result:
    return next(r for r in results if r.target == target and r.probe == probe)


@pytest.mark.timing  # RTT and throughput against what the lab was told
def test_full_cycle_to_agent_and_ssh_targets_matches_ground_truth(
    lab: Lab, agent: RunningAgent, sshd: Sshd, tmp_path: Path
) -> None:
    config = monitor_config(lab, "mon1", tmp_path, agent, sshd, ["ping", "traceroute", "iperf3"])
    results = run_cycle(config)
    assert len(results) == 6
    for target in ("tagent", "tssh"):
        truth = lab.ground_truth("mon1", target)
        ping = by(results, target, "ping")
        assert ping.succeeded, ping.error
        # One-sided: netem never delivers early, timers and scheduling only add (up to ~1 ms a
        # round trip on a busy 2-core VM: 15.0 ms for 14 in one whole-suite run).
        assert truth["rtt_ms"] - 0.5 <= ping.data["rtt_avg_ms"] <= truth["rtt_ms"] + 2.0, ping.data
        trace = by(results, target, "traceroute")
        assert trace.succeeded, trace.error
        assert [h["address"] for h in trace.data["hops"]] == [*truth["hops"], lab.address(target)]
        bw = by(results, target, "iperf3")
        assert bw.succeeded, (bw.error, bw.diags)
        mbit = bw.data["throughput_bps"] / 1e6
        assert 0.80 * truth["rate_mbit"] <= mbit <= 1.02 * truth["rate_mbit"], (target, mbit)
        assert bw.data["stream_count"] == 2
        # The server was picked and started by the target's side, not the default port.
        assert bw.params["port"] != 5201
        assert ("[agent " if target == "tagent" else "[ssh ") in bw.diags
    # Nothing left behind: no server, no work directory.
    assert wait_until(lambda: not iperf3_pids(lab, "tagent") and not iperf3_pids(lab, "tssh"), 20.0)
    assert list((agent.dir / "state" / "work").iterdir()) == []
    assert not list((tmp_path / "sshwork").glob("iepm-????????"))


def test_two_monitors_share_an_agent_target_and_never_overlap(
    lab: Lab, agent: RunningAgent, tmp_path: Path
) -> None:
    configs = [monitor_config(lab, m, tmp_path, agent, None, ["iperf3"]) for m in ("mon1", "mon2")]

    async def both() -> list[list[Result]]:
        async def one(config: Config) -> list[Result]:
            with Archive.open(config.monitor.archive) as archive:
                await Scheduler(config, archive).run_cycle()
                # Read back what was recorded, not what the scheduler returned.
                return list(archive.results(probe="iperf3"))

        return await asyncio.gather(*(one(c) for c in configs))

    recorded = [r for results in asyncio.run(both()) for r in results]
    assert {r.monitor for r in recorded} == {"mon1", "mon2"}
    assert all(r.succeeded for r in recorded), [(r.monitor, r.error) for r in recorded]
    first, second = sorted(recorded, key=lambda r: r.started_at)
    first_end = first.started_at + timedelta(seconds=first.duration_s)
    assert first_end <= second.started_at, (first_end, second.started_at)


def test_monitor_killed_mid_test_the_agent_kills_the_server_at_the_deadline(
    lab: Lab, agent: RunningAgent
) -> None:
    # The monitor takes a slot and dies (kill -9) before its client connects: the server would
    # wait for it forever. duration 2 s + grace 3 s = deadline at +5 s.
    script = (
        "import asyncio, json, sys, time\n"
        "from iepm.remote.client import AgentClient\n"
        "from iepm.remote.trust import read_token\n"
        "c = AgentClient(sys.argv[1], read_token(sys.argv[2]))\n"
        "from iepm.remote.protocol import SlotRequest\n"
        "slot = asyncio.run(c.acquire(SlotRequest(duration_s=2)))\n"
        "print(slot.model_dump_json(), flush=True)\n"
        "time.sleep(120)\n"
    )
    argv = [sys.executable, "-c", script, agent.url, str(agent.token_file("mon1"))]
    monitor = subprocess.Popen(
        lab.command("mon1", argv), stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert monitor.stdout is not None
        grant = json.loads(monitor.stdout.readline())
        assert iperf3_pids(lab, "tagent"), "the slot's server should be running"
    finally:
        os.killpg(monitor.pid, signal.SIGKILL)
        monitor.wait(timeout=10)
    assert wait_until(lambda: not iperf3_pids(lab, "tagent"), grant["deadline_s"] + 3)
    state = asyncio.run(agent.client("mon1", netns=lab.netns("mon1")).slot(grant["slot_id"]))
    assert state.state == "killed_at_deadline"
    assert list((agent.dir / "state" / "work").iterdir()) == []


def test_agent_restarted_mid_slot_the_next_test_still_works(
    lab: Lab, agent: RunningAgent, tmp_path: Path
) -> None:
    client = agent.client("mon2", netns=lab.netns("mon2"))
    slot = asyncio.run(client.acquire(SlotRequest(duration_s=20)))
    assert iperf3_pids(lab, "tagent")
    agent.kill9()
    agent.start()
    # The old server died with the agent; its slot is gone; limits' counts survived.
    assert wait_until(lambda: not iperf3_pids(lab, "tagent"), 20.0)
    assert agent.state()["servers"] == []
    with pytest.raises(Exception, match="404"):
        asyncio.run(client.slot(slot.slot_id))
    config = monitor_config(lab, "mon2", tmp_path, agent, None, ["iperf3"])
    (result,) = run_cycle(config)
    assert result.succeeded, (result.error, result.diags)
    usage = asyncio.run(client.usage())
    assert usage.tests_last_hour >= 2


def test_ssh_target_with_a_revoked_key_fails_within_the_deadline(
    lab: Lab, sshd: Sshd, agent: RunningAgent, tmp_path: Path
) -> None:
    # At once: never a password prompt, never a hang — 7 s on a quiet host, or three good
    # log-ins' time where one takes longer (timing fidelity: a busy host); the step deadline
    # (longer) did not end it, the refusal did (the error says so).
    limit_s = max(7.0, 3 * login_s(lab, sshd))
    saved = sshd.authorized_keys.read_text()
    sshd.revoke()
    try:
        config = monitor_config(lab, "mon1", tmp_path, agent, sshd, ["iperf3"])
        config.targets = [t for t in config.targets if t.name == "tssh"]
        t0 = time.monotonic()
        (result,) = run_cycle(config)
        elapsed = time.monotonic() - t0
    finally:
        sshd.authorized_keys.write_text(saved)
    assert not result.succeeded
    assert "refused this monitor's key" in (result.error or "")
    assert elapsed < limit_s, f"{elapsed:.1f} s for a refused key; at once here: {limit_s:.1f} s"
    # sshd writes its log line after the client has gone: wait for it (bounded).
    assert wait_until(
        lambda: "Failed publickey" in sshd.log() or "Connection closed" in sshd.log(), 10
    ), sshd.log()
    assert not iperf3_pids(lab, "tssh")
