"""A change at the target's end, in the WAN lab: an ``iepm agent`` runs in the target's
namespace, the monitor's scheduler measures it (ping, the monitor's load, the target's facts
through the agent, iperf3 against a server the agent starts), and mid-run the target's TCP
receive buffer limit is lowered (``net.ipv4.tcp_rmem`` in its namespace only).

Why the buffer limit and not the NIC rate: the lab's links are shaped by its delay lines, not by
the interfaces' speed, so a "NIC rate" change in the lab is invisible to what a host reports as
its NIC speed (``/sys/class/net/*/speed``, psutil). ``tcp_rmem`` is per network namespace, a
real fact of the target host that the agent reads and that really limits the throughput.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from iepm.analysis.alerts import load_alerts
from iepm.analysis.changes import OnlineDetector
from iepm.config import load_config_text
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.scheduler import Scheduler
from iepm.store import Archive
from testkit.agent import RunningAgent, running_agent

pytestmark = [pytest.mark.lab, pytest.mark.timing]

# 40 Mbit/s over ~20 ms RTT (a 100 KB window fills it); a 32 KB receive buffer limit allows
# well under half of that.
TOPOLOGY = {
    "lab": {"name": "tf", "seed": 3},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "r1", "role": "router"},
        {"name": "tgt", "role": "target"},
    ],
    "links": [
        {"a": "mon", "b": "r1", "delay_ms": 1.0},
        {"a": "r1", "b": "tgt", "delay_ms": 9.0, "rate_mbit": 40},
    ],
}
SMALL_RMEM = [4096, 16384, 32768]
# The detector's warm-up and one cycle it judges (where a false alert would show).
CALM_CYCLES = OnlineDetector().warmup + 1
AFTER_CYCLES = 4  # the alert must come within 3 of them


def config_text(lab: Lab, tmp: Path, agent: RunningAgent) -> str:
    return f"""
[monitor]
name = "mon1"
cycle_interval_s = 60
archive = "sqlite:///{tmp}/archive.db"
log_dir = "{tmp}/raw"
netns = "{lab.netns("mon")}"

[defaults.ping]
count = 3
interval_s = 0.1

[defaults.iperf3]
duration_s = 1
omit_s = 0

[[targets]]
name = "tgt"
address = "{lab.address("tgt")}"
mode = "agent"
probes = ["ping", "load", "facts", "iperf3"]
[targets.agent]
url = "{agent.url}"
credential_file = "{agent.token_file("mon1")}"
slot_wait_s = 10
"""


def test_a_lowered_buffer_limit_at_the_target_is_an_alert_naming_the_targets_host(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    lab = lab_factory(TOPOLOGY, prefix="tf")
    lab.wait_reachable("mon", ["tgt"])
    with running_agent(
        tmp_path / "agent", address=lab.address("tgt"), netns=lab.netns("tgt")
    ) as agent:
        config = load_config_text(config_text(lab, tmp_path, agent))
        with Archive.open(config.monitor.archive) as archive:
            scheduler = Scheduler(config, archive)
            alert_cycle: list[int] = []

            async def run() -> None:
                for _ in range(CALM_CYCLES):
                    await scheduler.run_cycle()
                assert load_alerts(archive) == [], [a.summary for a in load_alerts(archive)]
                done = await lab.aexec(
                    "tgt",
                    ["sysctl", "-q", "-w", f"net.ipv4.tcp_rmem={' '.join(map(str, SMALL_RMEM))}"],
                    10,
                )
                assert done.returncode == 0, done.stderr
                for n in range(1, AFTER_CYCLES + 1):
                    await scheduler.run_cycle()
                    if load_alerts(archive):
                        alert_cycle.append(n)
                        break
                await asyncio.to_thread(scheduler.close)

            asyncio.run(run())
            facts = list(archive.results(probe="facts"))
            throughputs = [r.data.get("throughput_bps") for r in archive.results(probe="iperf3")]
            alerts = load_alerts(archive)
    assert scheduler.health.watcher_errors == 0
    # The target's facts were read through its agent each cycle, and saw the new limit.
    assert facts and all(r.succeeded for r in facts), [r.error for r in facts]
    assert {r.data["via"] for r in facts} == {"agent"}
    assert facts[0].data["tcp_rmem_bytes"] != SMALL_RMEM
    assert facts[-1].data["tcp_rmem_bytes"] == SMALL_RMEM
    assert alert_cycle and alert_cycle[0] <= 3, (alert_cycle, throughputs)
    assert len(alerts) == 1, [a.summary for a in alerts]
    (alert,) = alerts
    assert (alert.probe, alert.metric, alert.direction) == ("iperf3", "throughput_bps", "down")
    assert alert.cause == "host", alert.details
    host = alert.details["host"]
    # The target's end, not the monitor's: its load facts did not move.
    assert host["end"] == "target" and host["probe"] == "facts", host
    assert host["changed"]["tcp_rmem_bytes"][1] == SMALL_RMEM, host
    assert alert.details["causes"] == ["host"]
