"""A sweep interrupted by Ctrl-C, or by its target dying, keeps its points and says partial.

Loopback iperf3 servers on free ports; transfers paced at 100 Mbit/s to stay light.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.store import Archive
from iepm.tuned import load_tuned
from iepm.tuning.store import list_studies
from iepm.tuning.sweep import SweepPlan, run_sweep
from testkit.net import free_port, iperf3_server, stop, wait_listening

pytestmark = pytest.mark.servers  # real iperf3 servers/tools (or iepm processes) on loopback


def test_ctrl_c_keeps_points_and_marks_partial(tmp_path: Path) -> None:
    db = tmp_path / "archive.db"
    with iperf3_server() as port:
        config = tmp_path / "targets.toml"
        config.write_text(
            f"""
[monitor]
name = "mon"
archive = "sqlite:///{db}"
log_dir = "{tmp_path / "raw"}"

[[targets]]
name = "loop"
address = "127.0.0.1"
[targets.iperf3]
port = {port}
rate = "100M"
"""
        )
        argv = [sys.executable, "-m", "iepm.cli", "tune", "loop", "--config", str(config)]
        argv += ["--windows", "default,64K", "--streams", "1,2,3", "--duration", "1"]
        argv += ["--pings-during", "3", "--pings-after", "3", "--ping-interval", "0.1"]
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 60
            measured = 0
            while measured < 2 and time.monotonic() < deadline:
                time.sleep(0.3)
                if db.exists():
                    with Archive.open(f"sqlite:///{db}") as archive:
                        found = list_studies(archive)
                        measured = len(found[0].points) if found else 0
            assert measured >= 2, "the sweep never got going"
            os.kill(proc.pid, signal.SIGINT)  # what Ctrl-C sends
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                stop(proc)  # type: ignore[arg-type]
    assert proc.returncode == 130, err.decode()
    assert b"marked partial" in err
    with Archive.open(f"sqlite:///{db}") as archive:
        (study,) = list_studies(archive)
        assert study.partial and study.finished_at is not None
        assert "interrupted after" in study.summary["partial_reason"]
        assert 2 <= len(study.points) < 7
        ids = {r.id for r in archive.results(probe="iperf3", target="loop", purpose="study")}
        assert {p["iperf3_result_id"] for p in study.points} <= ids
        # A partial sweep chooses nothing for the scheduler.
        assert load_tuned(archive, monitor="mon", target="loop", probe="iperf3") == {}


def test_target_dying_stops_the_sweep_as_partial(archive: Archive) -> None:
    port = free_port()
    server = subprocess.Popen(
        ["iperf3", "-s", "-B", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_listening("127.0.0.1", port, timeout_s=30)
    except TimeoutError:
        stop(server)
        raise
    ctx = ProbeContext(target="loop", address="127.0.0.1", monitor="mon")

    def on_point(point: dict[str, Any], done: int, total: int) -> None:
        if done == 2:
            stop(server)  # the target dies after two points

    plan = SweepPlan(
        windows=[None, "128K"], streams=[1, 2, 4], duration_s=1, pings_during=0, pings_after=0
    )
    try:
        study = asyncio.run(
            run_sweep(
                archive,
                ctx,
                plan,
                base=iperf3.Spec(port=port, rate="100M", connect_timeout_ms=500),
                on_point=on_point,
            )
        )
    finally:
        stop(server)
    assert study.partial
    assert "stopped answering" in study.summary["partial_reason"]
    ok = [p for p in study.points if p["succeeded"]]
    failed = [p for p in study.points if not p["succeeded"]]
    assert len(ok) == 2 and len(failed) == 2
    assert "nothing listening" in failed[-1]["error"]
    assert archive.count(probe="iperf3", target="loop", purpose="study") == 4
    assert load_tuned(archive, monitor="mon", target="loop", probe="iperf3") == {}
