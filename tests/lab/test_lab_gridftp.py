"""GridFTP in the lab against ground truth: a globus-url-copy memory-to-memory copy through the
target's agent against tuned iperf3 on the same path (goal: at least 90%), and a disk-to-disk
copy onto a target whose disk is slower than its network, which — the server having no commit
at the end — reports the page cache's rate, far above the disk's (a plain dd's) on the same
file system."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil
import pytest

from iepm.config import AgentAccess
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import gridftp_disk, gridftp_mem, iperf3, rsync_mem, xrdcp_mem
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from iepm.results import Result
from testkit.agent import RunningAgent, running_agent
from testkit.copylab import agent_context, lab_agent
from testkit.net import wait_until
from testkit.slowdisk import slow_disk

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        shutil.which("globus-gridftp-server") is None or shutil.which("globus-url-copy") is None,
        reason="globus-gridftp-server-progs / globus-gass-copy-progs missing",
    ),
]

RATE_MBIT = 200
TOPOLOGY = {
    "lab": {"name": "gftp", "seed": 13},
    "hosts": [{"name": "mon", "role": "monitor"}, {"name": "tx", "role": "target"}],
    # The same path as tests/lab/test_lab_transfers.py: 200 Mbit/s, 10 ms RTT.
    "links": [{"a": "mon", "b": "tx", "delay_ms": 5.0, "rate_mbit": RATE_MBIT}],
}
AGENT_PORT = 8701


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Lab:
    return module_lab_factory(TOPOLOGY, prefix="gf")


@pytest.fixture(scope="module")
def agent(lab: Lab) -> Iterator[RunningAgent]:
    with lab_agent(lab, "tx", AGENT_PORT, ("iperf3", "gridftp"), "gf") as running:
        yield running


def context(lab: Lab, agent: RunningAgent) -> ProbeContext:
    return agent_context(agent, "tx", lab.address("tx"), lab.netns("mon"))


def test_gridftp_memory_copy_against_tuned_iperf3(lab: Lab, agent: RunningAgent) -> None:
    ctx = context(lab, agent)
    tuned = iperf3.Spec(duration_s=8, omit_s=1, streams=4, window="1M")
    # ~8 s of the path's rate, 4 streams and a 1M window as iperf3's.
    copy = gridftp_mem.Spec(size="192M", streams=4, window="1M", duration_s=25)
    ratios = []
    for _ in range(3):
        reference = asyncio.run(iperf3.run(tuned, ctx))
        assert reference.succeeded, reference.error
        result = asyncio.run(gridftp_mem.run(copy, ctx))
        # The diags without -dbg's two lines per data block: the control channel's dialogue.
        shown = [ln for ln in result.diags.splitlines() if "buffer 0x" not in ln]
        assert result.succeeded, f"{result.error}\n" + "\n".join(shown)[-6000:]
        ratio = result.data["throughput_bps"] / reference.data["throughput_bps"]
        ratios.append(ratio)
        print(
            f"path mon->tx {RATE_MBIT} Mbit/s 10 ms RTT: iperf3 "
            f"{reference.data['throughput_bps'] / 1e6:.1f} Mbit/s, gridftp memory copy "
            f"{result.data['throughput_bps'] / 1e6:.1f} Mbit/s over the transfer "
            f"(globus-url-copy says {result.data['tool_throughput_bps'] / 1e6:.1f}; "
            f"{result.data['end_to_end_throughput_bps'] / 1e6:.1f} end to end, setup "
            f"{result.data['setup_s']:.3f} s): ratio {ratio:.3f}"
        )
        # The tool's own figure (the server's markers) and ours measure the same transfer.
        assert result.data["tool_throughput_bps"] == pytest.approx(
            result.data["throughput_bps"], rel=0.15
        )
        if ratio >= 0.9:
            break  # else another pair: the first may have met a busy moment of the cores
    assert max(ratios) >= 0.9, ratios
    # The slot ends with the copy: no server, no file.
    memory = Path(agent.dir) / "state" / "work"
    assert wait_until(lambda: not list(memory.glob("*")), 10.0)


# bytes/s, the loop device's write throttle (as tests/lab/test_lab_transfers.py).
DISK_RATE = 4 * 1024**2


def test_gridftp_disk_copy_reports_the_page_cache_rate_not_the_disks(tmp_path: Path) -> None:
    """GridFTP cannot commit at the end (the server closes without a sync): the disk copy's
    rate is the cache's, many times the disk's proven by dd on the same file system."""
    with (
        slow_disk(DISK_RATE) as disk,
        running_agent(disk.mount / "agent", kinds=("gridftp",)) as ag,
    ):
        for path in (disk.mount / "agent", disk.mount / "agent" / "state"):
            path.chmod(0o755)
        disk_bps = disk.dd_rate(64 << 20, "conv=fsync") * 8
        access = AgentAccess(url=ag.url, credential_file=str(ag.token_file("mon1")))
        ctx = ProbeContext(target="slow", address="127.0.0.1", servers=server_source(access))
        spec = gridftp_disk.Spec(size="64M", streams=2, duration_s=30, source_dir=str(tmp_path))
        result = asyncio.run(gridftp_disk.run(spec, ctx))
        assert result.succeeded, f"{result.error}\n{result.diags[-2000:]}"
        cache = result.data["throughput_bps"]
        # A copy shorter than the server's first performance marker may get no -vb line.
        tool = result.data["tool_throughput_bps"]
        print(
            f"disk (dd conv=fsync) {disk_bps / 1e6:.1f} Mbit/s; gridftp_disk 64M (commit none: "
            f"the server cannot) {cache / 1e6:.1f} Mbit/s over the transfer (globus-url-copy "
            f"says {'-' if tool is None else f'{tool / 1e6:.1f}'}), close "
            f"{result.data['commit_s']:.3f} s"
        )
        assert disk_bps <= DISK_RATE * 8 * 1.1  # the throttle holds
        assert cache > 2 * disk_bps
        # Removing the copy waits for the write-back under way (64M at 4 MiB/s: up to 16 s).
        assert wait_until(lambda: not list((ag.dir / "state" / "work").glob("*")), 40.0)


# --- the seed's comparison: iperf3 against each copy tool, per path ------------------------------

# name: (one-way delay ms, rate Mbit/s); modest rates, the delay lines share two busy cores.
PATHS = {"near": (5.0, 200), "far": (20.0, 100)}
COMPARE = {
    "lab": {"name": "gcmp", "seed": 14},
    "hosts": [{"name": "mon", "role": "monitor"}]
    + [{"name": name, "role": "target"} for name in PATHS],
    "links": [
        {"a": "mon", "b": name, "delay_ms": delay, "rate_mbit": rate}
        for name, (delay, rate) in PATHS.items()
    ],
}
# What a copy must reach of tuned iperf3 here to count as working: a floor that catches a
# broken copy, not the load of two shared cores (one run measured xrdcp at 0.63 on the near
# path). The goal, 0.9, is asserted, with retries, by test_gridftp_memory_copy_against_tuned_iperf3
# and tests/lab/test_lab_transfers.py; one SSH connection falls behind under load (README).
FLOORS = {"xrdcp_mem": 0.5, "gridftp_mem": 0.5, "rsync_mem": 0.3}
# The processes of each tool, client and server, whose CPU time a run is charged.
TOOL_PROCESSES = {
    "iperf3": {"iperf3"},
    "xrdcp_mem": {"xrdcp", "xrootd"},
    "gridftp_mem": {"globus-url-copy", "globus-gridftp-server", "globus-gridftp-"},
    "rsync_mem": {"rsync", "ssh", "sshd"},
}


class CpuMeter:
    """CPU seconds of this test's process tree (the agents' servers, sshd and the tools are
    its descendants), by process name, sampled every 0.1 s from /proc: a process's last 0.1 s
    before it exits may be missed. The delay line is counted on its own."""

    def __init__(self, delay_line: int) -> None:
        self.delay_line = delay_line
        self.seen: dict[tuple[int, float], tuple[str, float]] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        me = psutil.Process(os.getpid())
        while not self.done.wait(0.1):
            try:
                procs = [*me.children(recursive=True), psutil.Process(self.delay_line)]
            except psutil.Error:
                continue
            for proc in procs:
                try:
                    with proc.oneshot():
                        times = proc.cpu_times()
                        name = "delay line" if proc.pid == self.delay_line else proc.name()
                        key = (proc.pid, proc.create_time())
                except psutil.Error:
                    continue
                self.seen[key] = (name, times.user + times.system)

    def run(self, step: Callable[[], Result]) -> tuple[Result, dict[str, float]]:
        """``step``'s result and the CPU seconds each process name used meanwhile."""
        before = dict(self.seen)
        result = step()
        self.done.wait(0.3)  # two more samples
        used: dict[str, float] = {}
        for key, (name, total) in dict(self.seen).items():
            spent = total - before.get(key, (name, 0.0))[1]
            if spent > 0:
                used[name] = used.get(name, 0.0) + spent
        return result, used

    def close(self) -> None:
        self.done.set()
        self.thread.join()


def cpu_per_gb(tool: str, used: dict[str, float], nbytes: float) -> tuple[float, float]:
    """The tool's CPU seconds (client and server) and the delay line's, per GB moved."""
    names = TOOL_PROCESSES[tool]
    mine = sum(s for name, s in used.items() if any(name.startswith(n) for n in names))
    return mine / (nbytes / 1e9), used.get("delay line", 0.0) / (nbytes / 1e9)


def moved(tool: str, run: Result, tuned: iperf3.Spec) -> float:
    """Bytes a run moved while its CPU was counted (iperf3 sends through its omitted second)."""
    if tool == "iperf3":
        seconds = tuned.duration_s + tuned.omit_s
        return float(run.data["throughput_bps"]) / 8 * seconds
    return float(run.data["bytes"])


def run_probe(module: ModuleType, spec: Any, ctx: ProbeContext) -> Result:
    return asyncio.run(module.run(spec, ctx))


def load1() -> float:
    return os.getloadavg()[0]


@pytest.mark.skipif(
    shutil.which("xrootd") is None or shutil.which("rsync") is None,
    reason="xrootd-server or rsync missing",
)
def test_seed_comparison_iperf3_against_each_copy_tool_per_path(
    module_lab_factory: LabFactory, tmp_path: Path
) -> None:
    """IEPM-BW's Fig. 8 as a table: on each lab path, tuned iperf3 and a memory-to-memory copy
    by each tool (xrdcp and GridFTP through the target's agent, rsync over SSH to a private
    sshd there), with the ratio of each copy to iperf3, each run's CPU per GB (the tool's two
    ends and the lab's user-space delay line) and the load average when it ended."""
    from testkit.net import free_port
    from testkit.sshd import private_sshd

    lab = module_lab_factory(COMPARE, prefix="gc")
    lines = {link["b"]: link["delay_line_pid"] for link in lab.status()["links"].values()}
    base = Path(tempfile.mkdtemp(prefix="iepm-gc-", dir="/var/tmp"))
    memory = Path(tempfile.mkdtemp(prefix="iepm-gc-mem-", dir="/dev/shm"))
    for path in (base, memory):
        path.chmod(0o755)
    rows = []
    try:
        for i, (name, (delay, rate)) in enumerate(PATHS.items()):
            address = lab.address(name)
            seconds = 8
            size = f"{int(rate * seconds / 8 * 1.05)}M"  # ~8 s at the path's rate
            with (
                running_agent(
                    base / name,
                    address=address,
                    port=AGENT_PORT + 1 + i,
                    netns=lab.netns(name),
                    settings={"memory_dir": str(memory / name)},
                    kinds=("iperf3", "xrootd", "gridftp"),
                ) as agent,
                private_sshd(
                    tmp_path / f"sshd-{name}", address, free_port(), lab.netns(name),
                    password_auth=False,
                ) as sshd,
            ):  # fmt: skip
                (base / name / "state").chmod(0o755)
                ctx = context_for(lab, agent, name)
                ssh_dir = memory / f"{name}-ssh"
                ssh_dir.mkdir()
                ssh_ctx = ProbeContext(
                    name, address, "mon1", netns=lab.netns("mon"),
                    servers=server_source(sshd.access(memory_dir=str(ssh_dir))),
                )  # fmt: skip
                tuned = iperf3.Spec(duration_s=8, omit_s=1, streams=4, window="1M")
                one = tuned.model_copy(update={"streams": 1, "window": None})
                xrdcp_spec = xrdcp_mem.Spec(size=size, streams=4, duration_s=30)
                gridftp = gridftp_mem.Spec(size=size, streams=4, window="1M", duration_s=30)
                rsync = rsync_mem.Spec(size=size, duration_s=60, streams=1)
                chacha = rsync.model_copy(update={"cipher": "chacha20-poly1305@openssh.com"})
                # Parallel rsync over as many SSH connections (fpsync, parsyncfp, xargs -P).
                parallel = rsync.model_copy(update={"streams": rsync_mem.DEFAULT_STREAMS})
                xrdcp_plain = xrdcp_spec.model_copy(update={"page_checksums": False})
                via_agent = partial(run_probe, ctx=ctx)
                over_ssh = partial(run_probe, ctx=ssh_ctx)
                steps: list[tuple[str, str, Callable[[], Result]]] = [
                    ("iperf3", "before", partial(via_agent, iperf3, tuned)),
                    # rsync's reference too: one connection, the window autotuned.
                    ("iperf3", "1 stream", partial(via_agent, iperf3, one)),
                    (
                        "xrdcp_mem",
                        "4 streams, page CRCs",
                        partial(via_agent, xrdcp_mem, xrdcp_spec),
                    ),
                    (
                        "xrdcp_mem",
                        "4 streams, no page CRCs",
                        partial(via_agent, xrdcp_mem, xrdcp_plain),
                    ),
                    ("gridftp_mem", "4 streams, 1M", partial(via_agent, gridftp_mem, gridftp)),
                    ("rsync_mem", "aes128-gcm", partial(over_ssh, rsync_mem, rsync)),
                    (
                        "rsync_mem",
                        f"aes128-gcm, {parallel.streams} streams",
                        partial(over_ssh, rsync_mem, parallel),
                    ),
                    ("rsync_mem", "chacha20-poly1305", partial(over_ssh, rsync_mem, chacha)),
                    ("iperf3", "after", partial(via_agent, iperf3, tuned)),
                ]
                meter = CpuMeter(lines[name])
                try:
                    runs = [(tool, how, *meter.run(step), load1()) for tool, how, step in steps]
                finally:
                    meter.close()
                for tool, how, run, _, _ in runs:
                    assert run.succeeded, f"{name} {tool} {how}: {run.error}"
                # iperf3 before and after the copies: the load of the cores moves meanwhile.
                iperf_bps = (
                    runs[0][2].data["throughput_bps"] + runs[-1][2].data["throughput_bps"]
                ) / 2
                for tool, how, run, used, load in runs:
                    ratio = run.data["throughput_bps"] / iperf_bps
                    cpu = cpu_per_gb(tool, used, moved(tool, run, tuned))
                    rows.append(
                        (name, delay * 2, rate, tool, how, iperf_bps, run, ratio, cpu, load)
                    )
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(memory, ignore_errors=True)
    print(
        "\n| path | tuned iperf3 (mean of 2) | tool | settings | copy (over the transfer) | "
        "tool's own | ratio | tool CPU s/GB | delay line CPU s/GB | load |"
    )
    for name, rtt, rate, tool, how, iperf_bps, run, ratio, cpu, load in rows:
        own = run.data.get("tool_throughput_bps")
        print(
            f"| {name} {rate} Mbit/s {rtt:.0f} ms RTT | {iperf_bps / 1e6:.1f} Mbit/s | {tool} | "
            f"{how} | {run.data['throughput_bps'] / 1e6:.1f} Mbit/s | "
            f"{'-' if own is None else f'{own / 1e6:.1f} Mbit/s'} | {ratio:.2f} | "
            f"{cpu[0]:.2f} | {cpu[1]:.1f} | {load:.1f} |"
        )
    for name, _, _, tool, how, _, _, ratio, _, _ in rows:
        if tool != "iperf3":
            assert ratio >= FLOORS[tool], (name, tool, how, ratio)


def context_for(lab: Lab, agent: RunningAgent, target: str) -> ProbeContext:
    return agent_context(agent, target, lab.address(target), lab.netns("mon"))
