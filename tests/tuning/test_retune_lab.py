"""Re-tuning as a routine mode on a lab path, run by the real scheduler: the first cycle tunes the
never-tuned path, a quiet cycle does not, and a route switch (a lab event) makes it tune again
within a few cycles; no two bandwidth tests ever overlap. The sweeps and tests are as short as
the scheduler allows (1 s, a grid of two points): the test is of when re-tuning happens, not of
what it finds (tests/tuning/test_lab_sweep.py)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from iepm.config import load_config_text
from iepm.lab.testing import LabFactory
from iepm.results import Purpose, Result
from iepm.scheduler import CycleReport, Scheduler
from iepm.store import Archive
from iepm.tuned import load_tuned
from iepm.tuning.store import load_study

pytestmark = pytest.mark.lab

# mon reaches dst via ra (RTT 10 ms) until the route is switched via rb (RTT 60 ms).
TOPOLOGY = {
    "lab": {"name": "rt", "seed": 5},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "ra", "role": "router"},
        {"name": "rb", "role": "router"},
        {"name": "dst", "role": "target"},
    ],
    "links": [
        {"name": "mon_ra", "a": "mon", "b": "ra", "delay_ms": 2, "rate_mbit": 40},
        {"name": "ra_dst", "a": "ra", "b": "dst", "delay_ms": 3, "rate_mbit": 40},
        {"name": "mon_rb", "a": "mon", "b": "rb", "delay_ms": 10, "rate_mbit": 20},
        {"name": "rb_dst", "a": "rb", "b": "dst", "delay_ms": 20, "rate_mbit": 20},
    ],
}  # fmt: skip
# Cycles after the switch within which the re-tune must come.
WITHIN_CYCLES = 3


def no_overlap(runs: list[Result]) -> None:
    spans = sorted(
        (r.started_at.timestamp(), r.started_at.timestamp() + r.duration_s) for r in runs
    )
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.05, f"bandwidth tests overlap: one ends {end}, next starts {start}"


def test_scheduler_tunes_then_retunes_after_a_route_switch(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    lab = lab_factory(TOPOLOGY, prefix="retune")
    lab.popen("dst", ["iperf3", "-s", "-B", lab.address("dst")])
    lab.wait_listening("dst")
    config = load_config_text(f"""
[monitor]
name = "labmon"
archive = "sqlite:///{tmp_path / "archive.db"}"
log_dir = "{tmp_path / "raw"}"
netns = "{lab.netns("mon")}"
cycle_interval_s = 600
live = false
retune = true
retune_windows = ["default"]
retune_streams = [1, 4]
retune_duration_s = 1
retune_gap_h = 0

[defaults.ping]
count = 3
interval_s = 0.2

[defaults.traceroute]
wait_s = 1

[defaults.iperf3]
duration_s = 1

[[targets]]
name = "dst"
address = "{lab.address("dst")}"
probes = ["ping", "traceroute", "iperf3"]
""")
    with Archive.open(config.monitor.archive) as archive:
        scheduler = Scheduler(config, archive)
        reports: list[CycleReport] = []

        async def cycles(n: int) -> None:
            for _ in range(n):
                reports.append(await scheduler.run_cycle())

        asyncio.run(cycles(2))
        # The first cycle tunes the never-tuned path; the second has no reason to.
        assert [len(r.retuned) for r in reports] == [1, 0], [r.retuned for r in reports]
        _, first_id, reasons = reports[0].retuned[0]
        assert reasons == ["never tuned (no complete sweep)"]
        first = load_study(archive, first_id)
        assert first is not None and not first.partial and first.summary["tuned_saved"]
        hops_before = first.params["route"]
        assert hops_before is not None and lab.address("ra") in hops_before

        lab.switch_route(["mon", "rb", "dst"])
        switched_at = len(reports)
        while len(reports) < switched_at + WITHIN_CYCLES and not reports[-1].retuned:
            asyncio.run(cycles(1))
        after = [r.retuned for r in reports[switched_at:]]
        assert after[-1], f"no re-tune within {WITHIN_CYCLES} cycles of the route switch"
        _, second_id, reasons = after[-1][0]
        assert any(r.startswith("route changed since the last sweep") for r in reasons), reasons
        second = load_study(archive, second_id)
        assert second is not None and not second.partial and second.summary["tuned_saved"]
        assert lab.address("rb") in second.params["route"]
        assert scheduler.health.retune_sweeps == 2 and scheduler.health.retune_failures == 0

        # The routine tests after each sweep used what it chose.
        tuned = load_tuned(archive, monitor="labmon", target="dst", probe="iperf3")
        assert tuned == second.summary["tuned"]
        routine = [r for r in reports[-1].results if r.probe == "iperf3"]
        assert len(routine) == 1 and routine[0].succeeded, routine[0].error
        assert (routine[0].params["window"], routine[0].params["streams"]) == (
            tuned["window"],
            tuned["streams"],
        )
        runs = list(archive.results(probe="iperf3", purpose=None))
        studies = [r for r in runs if r.purpose == Purpose.STUDY]
        # Each sweep: the baseline and default window × 1, 4 streams.
        assert len(studies) == len(first.points) + len(second.points) == 6
        no_overlap(runs)
