"""``iepm demo``: measure a few targets end to end and show the results live.

Runs on loopback targets (127.0.0.0/8), one of them with no iperf3 server so that a failure is
shown too. Every server the demo starts is stopped by its PID when the demo ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.live import Live

from iepm.config import load_config_text
from iepm.console import LiveTable
from iepm.errors import IepmError, ToolNotFound
from iepm.results import Result
from iepm.scheduler import Scheduler
from iepm.store import Archive


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def iperf3_server(host: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """An ``iperf3 -s`` bound to host:port, killed (with its group) on exit."""
    if shutil.which("iperf3") is None:
        raise ToolNotFound("iperf3 is not installed (Debian: apt-get install iperf3)")
    proc = subprocess.Popen(
        ["iperf3", "-s", "-B", host, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                sock.settimeout(0.2)
                if sock.connect_ex((host, port)) == 0:
                    break
            time.sleep(0.05)
        else:
            raise IepmError(f"iperf3 server on {host}:{port} did not start within 5 s")
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=3)


def loopback_config(workdir: Path, ports: dict[str, int]) -> str:
    return f"""
[monitor]
name = "demo-monitor"
cycle_interval_s = 30
archive = "sqlite:///{(workdir / "archive.db").resolve()}"
log_dir = "{(workdir / "raw").resolve()}"

[defaults.ping]
count = 5
interval_s = 0.2

[defaults.iperf3]
duration_s = 3

[[targets]]
name = "site-a"
address = "127.0.0.1"
site = "loopback"
[targets.iperf3]
port = {ports["site-a"]}

[[targets]]
name = "site-b"
address = "127.0.0.2"
site = "loopback"
[targets.iperf3]
port = {ports["site-b"]}
streams = 4

[[targets]]
name = "site-c-no-server"
address = "127.0.0.3"
site = "loopback"
[targets.iperf3]
port = {ports["site-c-no-server"]}
"""


def run_demo(console: Console, *, cycles: int, workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    ports = {"site-a": free_port(), "site-b": free_port("127.0.0.2"), "site-c-no-server": 9}
    config = load_config_text(loopback_config(workdir, ports), workdir / "targets.toml")
    (workdir / "targets.toml").write_text(loopback_config(workdir, ports), encoding="utf-8")
    table = LiveTable("iepm demo: latest result per target and probe")
    with (
        iperf3_server("127.0.0.1", ports["site-a"]),
        iperf3_server("127.0.0.2", ports["site-b"]),
        Archive.open(config.monitor.archive) as archive,
        Live(table.render(), console=console, refresh_per_second=4) as live,
    ):

        def on_result(result: Result) -> None:
            table.update(result)
            live.update(table.render())

        scheduler = Scheduler(config, archive, on_result=on_result)
        reports = asyncio.run(scheduler.run(cycles=cycles))
    for report in reports:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items()))
        console.print(f"cycle {report.number}: {outcomes} in {report.duration_s:.1f} s")
    console.print(
        f"archive: {config.monitor.archive}\nraw logs: {config.monitor.log_dir}\n"
        f"try: iepm export --config {workdir / 'targets.toml'} --probe iperf3 --format tsv"
    )
