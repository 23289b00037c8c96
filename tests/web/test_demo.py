"""`iepm demo` as a user runs it: the lab demo serves its dashboard while measuring and Ctrl-C
removes the lab and every agent, server and flow process it started; a short lab demo stores
copy results and flow records and leaves nothing behind; the loopback fallback measures for
--cycles and stops its servers."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from iepm import demo as demo_module
from iepm.config import load_config_text
from iepm.flows.compare import match
from iepm.flows.store import read_flows
from iepm.lab.netns import list_netns
from iepm.lab.testing import unique_lab_name
from iepm.lab.topology import load_topology
from iepm.lab.topology import plan as topology_plan
from iepm.probes import PROBES
from iepm.store import Archive
from testkit.net import free_port

IEPM = [sys.executable, "-m", "iepm.cli"]
ROOT = Path(__file__).resolve().parents[2]


class Demo:
    """``iepm demo`` in its own process group, its output collected by a thread."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [*IEPM, "demo", *argv],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output)
            if found:
                return found
            if self.proc.poll() is not None:
                self.reader.join(5)
                if not re.search(pattern, self.output):
                    break
            time.sleep(0.1)
        self.kill()
        pytest.fail(f"no {pattern!r} in the demo's output:\n{self.output}")

    def finish(self, timeout_s: float) -> str:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"iepm demo did not end within {timeout_s} s:\n{self.output}")
        self.reader.join(5)
        return self.output

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@pytest.mark.lab
def test_lab_demo_serves_and_ctrl_c_removes_everything(tmp_path: Path) -> None:
    name = unique_lab_name("webdemo")
    port = free_port()
    demo = Demo(["--workdir", str(tmp_path), "--lab-name", name, "--listen", f"127.0.0.1:{port}"])
    try:
        found = demo.wait_for(r"agents PIDs ([\d, ]+) \(", 90).group(1)
        pids = [int(p) for p in found.split(", ")]
        assert len(pids) == 6  # one agent per site
        flows = demo.wait_for(r"into the archive: PIDs ([\d, ]+)\n", 30).group(1)
        pids += [int(p) for p in flows.split(", ")]  # the collector and softflowd
        url = demo.wait_for(r"dashboard at (http://\S+)", 30).group(1)
        assert url == f"http://127.0.0.1:{port}/"
        # The first iperf3 result arrives within the first few tests through the agents.
        deadline = time.monotonic() + 90
        while httpx.get(f"{url}api/v1/results?probe=iperf3", timeout=10).json()["total"] == 0:
            assert time.monotonic() < deadline, "no iperf3 result within 90 s"
            time.sleep(1)
        result = httpx.get(f"{url}api/v1/results?probe=iperf3", timeout=10).json()["results"][0]
        assert result["monitor"] == f"{name}-mon" and result["succeeded"], result
        assert result["target_address"].startswith("198.18.")
        assert httpx.get(url, timeout=30).status_code == 200
        assert "iepm_archive_write_failures_total 0.0" in httpx.get(f"{url}metrics").text
        assert all(psutil.pid_exists(pid) for pid in pids)
        assert [ns for ns in list_netns() if ns.startswith(f"{name}-")]
    finally:
        if demo.proc.poll() is None:
            demo.proc.send_signal(signal.SIGINT)
    out = demo.finish(60)
    assert demo.proc.returncode == 0, out
    assert "stopped; agents, servers, flow exporter and lab removed" in out
    assert not [ns for ns in list_netns() if ns.startswith(f"{name}-")]
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    assert not Path(f"/run/iepm-lab/{name}.json").exists()
    assert (tmp_path / "archive.db").exists()


# Two of the demo's sites, as examples/lab/demo.toml has them: a short run reaches every test.
SMALL = """
[lab]
name = "demosmall"
seed = 7
time_compression = 60.0

[[hosts]]
name = "mon"
role = "monitor"
address = "198.18.0.1"

[[hosts]]
name = "gw"
role = "router"
address = "198.18.0.2"

[[hosts]]
name = "core"
role = "router"
address = "198.18.0.3"

[[hosts]]
name = "slac"
role = "target"
address = "198.18.0.10"

[[hosts]]
name = "fnal"
role = "target"
address = "198.18.0.11"

[[links]]
name = "campus"
a = "mon"
b = "gw"
delay_ms = 0.2

[[links]]
name = "backbone"
a = "gw"
b = "core"
delay_ms = 1.0

[[links]]
name = "slac_lan"
a = "core"
b = "slac"
delay_ms = 1.4
rate_mbit = 1000

[[links]]
name = "esnet_fnal"
a = "core"
b = "fnal"
delay_ms = 24
rate_mbit = 100
"""
COPY_TOOLS = (
    "softflowd", "xrdcp", "xrootd", "globus-url-copy", "globus-gridftp-server", "rsync", "sshd",
)  # fmt: skip
COPIES = ("xrdcp_mem", "gridftp_mem", "rsync_mem")


@pytest.mark.lab
@pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in COPY_TOOLS),
    reason=f"one of {', '.join(COPY_TOOLS)} is not installed",
)
def test_lab_demo_stores_copies_and_flow_records_and_leaves_nothing(tmp_path: Path) -> None:
    name = unique_lab_name("democp")
    topology = tmp_path / "small.toml"
    topology.write_text(SMALL, encoding="utf-8")
    work = tmp_path / "work"
    argv = ["--workdir", str(work), "--lab-name", name, "--topology", str(topology)]
    # Two 30 s cycles reach every copy (the scheduler runs one test at a time, earliest due
    # first): one cycle left gridftp_mem out; three took 30 s more for nothing.
    demo = Demo([*argv, "--cycles", "2", "--no-serve"])
    agents = demo.wait_for(r"agents PIDs ([\d, ]+) \(", 120).group(1)
    sshds = demo.wait_for(r"sshd PIDs ([\d, ]+) \(", 60).group(1)
    flows = demo.wait_for(r"into the archive: PIDs ([\d, ]+)\n", 60).group(1)
    pids = [int(p) for p in f"{agents}, {sshds}, {flows}".split(", ")]
    assert len(pids) == 2 + 2 + 2  # an agent and an sshd per site; the collector, a softflowd
    out = demo.finish(420)
    assert demo.proc.returncode == 0, out

    with Archive.open(f"sqlite:///{work / 'archive.db'}") as archive:
        copies = [r for r in archive.results() if r.probe in COPIES]
        shown = [(r.target, r.probe, r.outcome.value, r.error) for r in copies]
        done = {r.probe for r in copies if r.succeeded and r.data["throughput_bps"] > 0}
        assert done == set(COPIES), shown
        # Through the agents, and rsync over SSH to each site's private sshd (<site>-ssh).
        assert {r.target for r in copies if r.probe == "rsync_mem"} <= {"slac-ssh", "fnal-ssh"}
        # Sized from the lab: ~3 s of each path's narrowest link, at most 64M.
        assert {r.params["size"] for r in copies if r.target.startswith("fnal")} <= {"37M"}
        assert not [r for r in copies if r.probe == "xrdcp_mem" and r.data["page_checksums"]]
        iperf = [r for r in archive.results(probe="iperf3") if r.succeeded]
        assert iperf, out
        # The seed's tuned test: 4 streams for 8 s, each stream's window from its path's BDP,
        # through the agent and over SSH alike.
        tuned = {
            (r.target.removesuffix("-ssh"), r.params["streams"], r.params["window"]) for r in iperf
        }
        assert tuned <= {("slac", 4, "256K"), ("fnal", 4, "256K")}, tuned
        assert {r.data["stream_count"] for r in iperf} == {4}
        assert {r.params["duration_s"] for r in iperf} == {8}
        records = list(read_flows(archive))
        assert records, (work / "logs" / "collector.log").read_text()
        # The comparison page has data: tests matched to their own flows (address, port, time).
        matched, _ = match(iperf, records)
        assert matched, [(r.target, r.started_at, r.params.get("port")) for r in iperf]

    # Nothing is left: namespaces, agents, their servers, softflowd, the collector, scratch.
    assert not [ns for ns in list_netns() if ns.startswith(f"{name}-")]
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(name in arg for arg in proc.info["cmdline"] or []):
            left.append((proc.info["pid"], proc.info["cmdline"]))
    assert not left
    assert not [p for d in ("/var/tmp", "/dev/shm") for p in Path(d).glob(f"iepm-demo-{name}-*")]
    assert not Path(f"/run/iepm-lab/{name}.json").exists()


@pytest.mark.servers  # iperf3 servers on 127.0.0.x
def test_loopback_demo_runs_its_cycles(tmp_path: Path) -> None:
    demo = Demo(["--workdir", str(tmp_path), "--loopback", "--cycles", "1", "--no-serve"])
    out = demo.finish(120)
    assert demo.proc.returncode == 0, out
    assert "measuring loopback targets 127.0.0.x instead" in out
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as archive:
        iperf = {r.target: r for r in archive.results(probe="iperf3")}
        assert sorted(iperf) == ["loop-a", "loop-b", "loop-c-no-server"]
        assert iperf["loop-a"].succeeded and iperf["loop-a"].data["throughput_bps"] > 0
        assert not iperf["loop-c-no-server"].succeeded
        assert archive.count(probe="ping") == 3
    # Every server the demo started was stopped: nothing listens on the measured ports.
    for target in ("loop-a", "loop-b"):
        port = iperf[target].params["port"]
        listening = [
            c
            for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        ]
        assert not listening


def test_a_copy_whose_tools_are_missing_is_left_out_with_a_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = shutil.which
    missing = ("xrootd", "globus-url-copy")
    monkeypatch.setattr(shutil, "which", lambda name: None if name in missing else real(name))
    said: list[str] = []
    names = [m.NAME for m in demo_module.copy_probes(said.append)]
    assert "xrdcp_mem" not in names and "gridftp_mem" not in names
    assert (
        "iepm demo: no xrdcp_mem copies: its server xrootd "
        "(Debian: apt-get install xrootd-server) not installed" in said
    )
    assert "iepm demo: no gridftp_mem copies: its client globus-url-copy not installed" in said


def test_copies_over_ssh_without_sshd_are_left_out_with_a_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if "sshd" in name else real(name))
    said: list[str] = []
    assert demo_module.ssh_copy_probes(said.append) == []
    assert said == [
        "iepm demo: no rsync_mem copies: /usr/sbin/sshd (Debian: openssh-server) not installed"
    ]


def test_copies_are_sized_from_the_demo_lab_paths() -> None:
    plan = topology_plan(load_topology(demo_module.TOPOLOGY))
    sizes = {
        site: demo_module.copy_params(
            PROBES["xrdcp_mem"], demo_module.expected_mbit(plan, "mon", site)
        )
        for site in ("slac", "fnal", "cern", "desy", "kek", "ihep")
    }
    # ~3 s of the narrowest link: slac's 1 Gbit/s capped at 64M; cern at its backup route's
    # 30 Mbit/s (the event's); the lossy desy and ihep at their links' 50 and 10 Mbit/s.
    assert {site: p["size"] for site, p in sizes.items()} == {
        "slac": "64M", "fnal": "37M", "cern": "11M", "desy": "18M", "kek": "37M", "ihep": "3M",
    }  # fmt: skip
    # Tuned as the demo's iperf3 is: 4 streams, and xrdcp without its per-page CRC32C.
    assert all(
        (p["streams"], p["duration_s"], p["page_checksums"]) == (4, 30, False)
        for p in sizes.values()
    )
    # A copy over SSH as sites run it: rsync's default spec, one connection.
    rsync = demo_module.copy_params(PROBES["rsync_mem"], 100.0)
    assert rsync == {"size": "37M", "duration_s": 30, "connect_timeout_s": 15}


def test_iperf3_is_tuned_from_the_demo_lab_paths() -> None:
    plan = topology_plan(load_topology(demo_module.TOPOLOGY))
    params = {
        site: demo_module.iperf3_params(demo_module.bdp_bytes(plan, "mon", site))
        for site in ("slac", "fnal", "cern", "desy", "kek", "ihep")
    }
    # Each of 4 streams gets a power of two at or above its quarter of the path's bandwidth-delay
    # product: slac 1 Gbit/s × 5.2 ms = 650 kB; cern 200 Mbit/s × 148 ms = 3.7 MB (its primary
    # route, above the backup's 30 Mbit/s × 192 ms); kek 100 Mbit/s × 110 ms = 1.4 MB; ihep
    # 10 Mbit/s × 290 ms = 363 kB, at the 128K floor.
    assert {site: p["window"] for site, p in params.items()} == {
        "slac": "256K", "fnal": "256K", "cern": "1M", "desy": "256K", "kek": "512K", "ihep": "128K",
    }  # fmt: skip
    assert all(p["streams"] == 4 and p["duration_s"] == 8 for p in params.values())
    assert demo_module.iperf3_params(4 * 1024 * 1024 + 1)["window"] == "2M"


def test_demo_config_gives_each_target_its_iperf3_parameters(tmp_path: Path) -> None:
    agent = {"url": "http://198.18.0.12:8700", "credential_file": str(tmp_path / "cern.token")}
    targets = [
        {"name": "cern", "address": "198.18.0.12", "site": "cern", "agent": agent,
         "params": {"iperf3": demo_module.iperf3_params(3_710_000)}},
        {"name": "plain", "address": "198.18.0.11", "site": "fnal", "port": 5201,
         "params": {"iperf3": {"streams": 2}}},
    ]  # fmt: skip
    text = demo_module.demo_config(
        tmp_path, targets, monitor="mon", netns=None, schedule={"iperf3": 120.0}
    )
    config = load_config_text(text, tmp_path / "targets.toml")
    # The target's own table overrides the demo's quick 2 s default.
    cern = config.spec_for(config.target("cern"), "iperf3").model_dump()
    assert (cern["streams"], cern["window"], cern["duration_s"]) == (4, "1M", 8)
    plain = config.spec_for(config.target("plain"), "iperf3").model_dump()
    assert (plain["port"], plain["streams"], plain["duration_s"]) == (5201, 2, 2)
