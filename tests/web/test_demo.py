"""`iepm demo` as a user runs it: the lab demo serves its dashboard while measuring and Ctrl-C
removes the lab and every server it started; the loopback fallback measures for --cycles and
stops its servers."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from iepm.lab.netns import list_netns
from iepm.lab.testing import unique_lab_name
from iepm.store import Archive
from tests.helpers import free_port

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
        pids = [int(p) for p in demo.wait_for(r"PIDs ([\d, ]+)\n", 60).group(1).split(", ")]
        assert len(pids) == 6  # one iperf3 -s per site
        url = demo.wait_for(r"dashboard at (http://\S+)", 30).group(1)
        assert url == f"http://127.0.0.1:{port}/"
        # The first site's results arrive within one site's probes (~5 s).
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}api/v1/results?probe=iperf3", timeout=10).json()["total"] == 0:
            assert time.monotonic() < deadline, "no iperf3 result within 60 s"
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
    assert "stopped; servers and lab removed" in out
    assert not [ns for ns in list_netns() if ns.startswith(f"{name}-")]
    assert not [pid for pid in pids if psutil.pid_exists(pid)]
    assert not Path(f"/run/iepm-lab/{name}.json").exists()
    assert (tmp_path / "archive.db").exists()


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
