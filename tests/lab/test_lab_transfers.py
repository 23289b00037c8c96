"""Application transfers in the lab against ground truth: an xrdcp memory-to-memory copy through
the target's agent reaches at least 90% of what tuned iperf3 reaches on the same path."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.config import AgentAccess
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import iperf3, xrdcp_mem
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from tests.remote.conftest import RunningAgent, running_agent, wait_until

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(shutil.which("xrootd") is None, reason="xrootd-server missing"),
]

RATE_MBIT = 200
TOPOLOGY = {
    "lab": {"name": "xfer", "seed": 12},
    "hosts": [{"name": "mon", "role": "monitor"}, {"name": "tx", "role": "target"}],
    # One delay line per direction: 200 Mbit/s stays cheap on two busy cores.
    "links": [{"a": "mon", "b": "tx", "delay_ms": 5.0, "rate_mbit": RATE_MBIT}],
}
AGENT_PORT = 8700


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Lab:
    return module_lab_factory(TOPOLOGY, prefix="xf")


@pytest.fixture(scope="module")
def agent(lab: Lab) -> Iterator[RunningAgent]:
    base = Path(tempfile.mkdtemp(prefix="iepm-xf-", dir="/var/tmp"))
    memory = Path(tempfile.mkdtemp(prefix="iepm-xf-mem-", dir="/dev/shm"))
    for path in (base, memory):
        path.chmod(0o755)  # the agent runs xrootd as nobody, who must reach the slots
    try:
        with running_agent(
            base,
            address=lab.address("tx"),
            port=AGENT_PORT,
            netns=lab.netns("tx"),
            settings={"memory_dir": str(memory / "slots")},
            kinds=("iperf3", "xrootd"),
        ) as running:
            (base / "state").chmod(0o755)
            yield running
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(memory, ignore_errors=True)


def context(lab: Lab, agent: RunningAgent) -> ProbeContext:
    access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("mon1")))
    return ProbeContext(
        target="tx",
        address=lab.address("tx"),
        monitor="mon1",
        netns=lab.netns("mon"),
        servers=server_source(access),
    )


def test_memory_copy_reaches_90_percent_of_tuned_iperf3(lab: Lab, agent: RunningAgent) -> None:
    ctx = context(lab, agent)
    tuned = iperf3.Spec(duration_s=8, omit_s=1, streams=4, window="1M")
    # ~8 s of the path's rate, so that set-up and slow start weigh as little as in iperf3's.
    copy = xrdcp_mem.Spec(size="192M", streams=4, duration_s=25)
    ratios = []
    for _ in range(2):
        reference = asyncio.run(iperf3.run(tuned, ctx))
        assert reference.succeeded, reference.error
        result = asyncio.run(xrdcp_mem.run(copy, ctx))
        assert result.succeeded, f"{result.error}\n{result.diags[-2000:]}"
        ratio = result.data["throughput_bps"] / reference.data["throughput_bps"]
        ratios.append(ratio)
        print(
            f"path mon->tx {RATE_MBIT} Mbit/s 10 ms RTT: iperf3 "
            f"{reference.data['throughput_bps'] / 1e6:.1f} Mbit/s, xrdcp memory copy "
            f"{result.data['throughput_bps'] / 1e6:.1f} Mbit/s over the transfer "
            f"({result.data['end_to_end_throughput_bps'] / 1e6:.1f} end to end, setup "
            f"{result.data['setup_s']:.3f} s): ratio {ratio:.3f}"
        )
        if ratio >= 0.9:
            break  # else a second pair: the first may have met a busy moment of the cores
    assert max(ratios) >= 0.9, ratios
    # The slot ends with the copy: no server, no file.
    assert wait_until(lambda: not list((Path(agent.dir) / "state" / "work").glob("*")), 10.0)
