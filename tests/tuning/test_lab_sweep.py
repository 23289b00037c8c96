"""The windows × streams sweep on a lab path whose BDP exceeds the target's window limit.

The target's namespace limits its receive window: ``net.ipv4.tcp_rmem`` caps the autotuned
window at 32 KB and ``net.ipv4.tcp_window_scaling = 0`` caps any window, even one asked for
with ``-w``, at 64 KB. (``net.core.rmem_max`` would be the usual cap for ``-w``, but on this
kernel it is read-only inside a child namespace.) The path: 44 Mbit/s, 50 ms RTT, so
BDP = 275 KB, about four 64 KB windows: one stream cannot fill it, several can.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from iepm.cli import app
from iepm.config import load_config_text
from iepm.lab.testing import LabFactory
from iepm.probes.base import ProbeContext
from iepm.scheduler import Scheduler
from iepm.store import Archive
from iepm.tuned import load_tuned
from iepm.tuning.store import list_studies, load_study
from iepm.tuning.sweep import SweepPlan, run_sweep

# Timing: throughput levels and the unloaded RTT against the path the lab was told.
pytestmark = [pytest.mark.lab, pytest.mark.timing]

RATE_MBIT = 44
TOPOLOGY = {
    "lab": {"name": "x", "seed": 3},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {
            "name": "tgt",
            "role": "target",
            "sysctl": {"net.ipv4.tcp_rmem": "4096 16384 32768", "net.ipv4.tcp_window_scaling": 0},
        },
    ],
    "links": [
        {"name": "wan", "a": "mon", "b": "tgt", "delay_ms": 25, "rate_mbit": RATE_MBIT,
         "queue_ms": 60},
    ],
}  # fmt: skip


def _scheduler_throughput(config_text: str, archive: Archive) -> float:
    config = load_config_text(config_text)
    report = asyncio.run(Scheduler(config, archive).run(cycles=1))
    assert report is not None
    result = next(r for r in report.results if r.probe == "iperf3")
    assert result.succeeded, result.error
    return float(result.data["throughput_bps"])


def test_sweep_finds_streams_and_makes_iepm_run_faster(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    lab = lab_factory(TOPOLOGY, prefix="tune")
    server = lab.popen("tgt", ["iperf3", "-s", "-B", lab.address("tgt")])
    lab.wait_listening("tgt")
    config_text = f"""
[monitor]
name = "labmon"
archive = "sqlite:///{tmp_path / "archive.db"}"
log_dir = "{tmp_path / "raw"}"
netns = "{lab.netns("mon")}"
cycle_interval_s = 600

[defaults.ping]
count = 3
interval_s = 0.2

[defaults.iperf3]
duration_s = 2

[[targets]]
name = "tgt"
address = "{lab.address("tgt")}"
probes = ["ping", "iperf3"]
"""
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as archive:
        untuned = _scheduler_throughput(config_text, archive)

        ctx = ProbeContext(
            target="tgt", address=lab.address("tgt"), monitor="labmon", netns=lab.netns("mon")
        )
        plan = SweepPlan(
            windows=["16K", "256K"],
            # 1 stream cannot fill the path, 4 nearly, 6 and 8 can (one of them is the best).
            streams=[1, 4, 6, 8],
            duration_s=2,
            pings_during=10,
            pings_after=10,
            after_interval_s=0.05,
        )
        routine = archive.count(target="tgt")
        study = asyncio.run(run_sweep(archive, ctx, plan))
        assert not study.partial
        s = study.summary
        points = study.points
        assert len(points) == plan.n_points() == 9
        assert all(p["succeeded"] for p in points), [p["error"] for p in points]
        # Non-monotonic visiting order (after the baseline).
        grid_streams = [p["streams"] for p in points if not p["baseline"]]
        assert grid_streams != sorted(grid_streams)

        chosen, best, baseline = s["chosen"], s["best"], s["baseline"]
        assert chosen["streams"] > 1, s  # one stream cannot fill this path
        assert chosen["throughput_bps"] >= 0.8 * best["throughput_bps"]
        assert chosen["streams"] < best["streams"], s
        assert best["throughput_bps"] == max(p["throughput_bps"] for p in points)

        # The recorded improvement is what the stored measurements say.
        studied = archive.results(probe="iperf3", target="tgt", purpose="study")
        stored = {r.id: r for r in studied}
        assert archive.count(target="tgt") == routine  # study runs stay out of routine series
        base_tp = stored[baseline["iperf3_result_id"]].data["throughput_bps"]
        chosen_tp = stored[chosen["iperf3_result_id"]].data["throughput_bps"]
        assert baseline["streams"] == 1 and baseline["window"] is None
        assert s["improvement"] == pytest.approx(chosen_tp / base_tp)
        assert s["improvement"] > 3  # a window-limited path: the tuning matters

        # Pings during and after every transfer were stored as results too.
        assert archive.count(probe="ping", target="tgt", purpose="study") >= 2 * len(points)
        assert all(len(p["rtt_after_ms"]) >= 9 for p in points)
        assert s["rtt_unloaded_median_ms"] == pytest.approx(50, abs=5)

        # The choice is the path's tuned iperf3 parameters, with the study that justified it.
        assert load_tuned(archive, monitor="labmon", target="tgt", probe="iperf3") == {
            "window": chosen["window"],
            "streams": chosen["streams"],
        }
        assert load_study(archive, study.id[:12]) is not None
        assert [x.id for x in list_studies(archive, kind="sweep")] == [study.id]

        tuned = _scheduler_throughput(config_text, archive)
    lab.stop(server)

    # The sweep as a table and as the seeds' Figure 4 (one line per window), from the archive.
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    svg = tmp_path / "sweep.svg"
    shown = CliRunner().invoke(app, ["study", "show", study.id, "--db", url, "--plot", str(svg)])
    assert shown.exit_code == 0, shown.output
    assert "improvement over 1 stream × default window" in shown.output
    text = svg.read_text()
    assert text.count("<polyline") == 2 and "window 16K" in text and "window 256K" in text
    tsv = CliRunner().invoke(app, ["study", "show", study.id, "--db", url, "--format", "tsv"])
    lines = tsv.output.splitlines()
    assert lines[0].startswith("# sweep study") and len(lines) == 2 + len(points)
    # `iepm run` (the scheduler) on that path is faster with the chosen parameters.
    assert tuned > 2 * untuned, (untuned, tuned)
