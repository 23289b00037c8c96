"""``kill -9`` of ``iepm run`` mid-cycle loses nothing that finished and corrupts nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from iepm.store import Archive
from testkit.net import iperf3_server

pytestmark = pytest.mark.servers  # real iperf3 servers/tools (or iepm processes) on loopback

RESULT_LINE = re.compile(r"^\S+ (\S+) (\S+) (ok|failed|timeout|skipped): .* \[([0-9a-f]{32})\]$")


def write_config(tmp_path: Path, archive_url: str, port: int) -> Path:
    path = tmp_path / "targets.toml"
    path.write_text(
        f"""
[monitor]
name = "kill9-mon"
cycle_interval_s = 60
archive = "{archive_url}"
log_dir = "{tmp_path}/raw"

[defaults.ping]
count = 4
interval_s = 0.2

[defaults.iperf3]
duration_s = 2
port = {port}

[[targets]]
name = "a"
address = "127.0.0.1"
probes = ["ping", "iperf3"]

[[targets]]
name = "b"
address = "127.0.0.1"
probes = ["ping", "iperf3"]
"""
    )
    return path


def iepm(*args: str) -> list[str]:
    return [sys.executable, "-m", "iepm.cli", *args]


def test_kill_9_mid_cycle_then_restart(tmp_path: Path, archive_url: str) -> None:
    with iperf3_server("127.0.0.1") as port:
        config = write_config(tmp_path, archive_url, port)
        proc = subprocess.Popen(
            iepm("run", "--config", str(config), "--cycles", "3", "--no-live"),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        finished: set[str] = set()
        tools: list[psutil.Process] = []
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 60
            # Wait until some results are stored and a bandwidth test is in flight.
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if match := RESULT_LINE.match(line.strip()):
                    finished.add(match[4])
                if len(finished) >= 3:
                    time.sleep(0.5)
                    tools = psutil.Process(proc.pid).children(recursive=True)
                    if tools:
                        break
            assert tools, "no probe was in flight when we meant to kill"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        # The tool in flight dies with the monitor (it would otherwise be orphaned).
        _, alive = psutil.wait_procs(tools, timeout=5)
        assert not alive, f"orphaned tools: {[p.pid for p in alive]}"

        with Archive.open(archive_url) as archive:
            assert archive.integrity_check() == "ok"
            stored = {r.id for r in archive.results()}
            assert finished <= stored

        # The monitor restarts on the same archive and carries on.
        again = subprocess.run(
            iepm("run", "--config", str(config), "--once", "--no-live"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0, again.stderr
        with Archive.open(archive_url) as archive:
            assert archive.integrity_check() == "ok"
            assert archive.count() >= len(stored) + 4
