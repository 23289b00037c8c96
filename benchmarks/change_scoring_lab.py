"""Change detection scored against the truth in the lab: a seeded script of rate steps and route
switches on one path, the real scheduler measuring it with iperf3 and the alert watcher raising
throughput alerts. A detection within 3 cycles of an event is a true positive (issue 15's goal:
precision ≥ 0.9 and recall ≥ 0.9).

Events are applied between cycles (``Lab.apply``), so the truth is known in cycles, whatever the
load on the machine makes a cycle last. Every event changes the path's bottleneck by ≥ 2.4×
(levels 6, 15 and 36 Mbit/s), well above the alerting floor (15% of the throughput).

The study: 10 events (~100 cycles of 1-s iperf3 tests, about two minutes). The suite
(``tests/analysis/test_lab_change_scoring.py``) runs the same code on a two-event script.

``--quiet 200``: instead, 200 cycles of ping, traceroute and iperf3 (on the adaptive cadence) on
a path without change, where every alert is a false one (the suite expects none; it runs fewer
cycles in ``tests/analysis/test_lab_analysis.py``). JSON: ``alerts``,
``false_alerts_per_100_cycles``, ``ok_runs``, ``iperf3_deferred``, ``iperf3_share_run``.

Needs root. Prints JSON: ``precision``, ``recall``, ``events``, ``alerts``, ``true_positives``,
``cycles``, ``seconds``, ``detection_cycles`` (per event, or null) and ``events_scored`` (kind,
Mbit/s before and after, cycles to the alert, its direction).

    .venv/bin/python benchmarks/change_scoring_lab.py [--seed 15] [--events 10] [--quiet 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.analysis.alerts import Alert, load_alerts
from iepm.config import load_config_text
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.scheduler import CycleReport, Scheduler
from iepm.store import Archive
from testkit.net import iperf3_server

SEED = 15
RATES_MBIT = (6.0, 15.0, 36.0)
EVENTS = 10
WARMUP_CYCLES = 10  # cycles before the first event: the detector's warm-up and a level
GAP_CYCLES = (8, 11)  # cycles between events, drawn per event (inclusive)
WITHIN_CYCLES = 3
PATHS = {"main": ["mon", "r1", "r2", "tgt"], "backup": ["mon", "r1", "r3", "tgt"]}
PORT = 5201

SCORED = {
    "lab": {"name": "sc", "seed": SEED},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "r1", "role": "router"},
        {"name": "r2", "role": "router"},
        {"name": "r3", "role": "router"},
        {"name": "tgt", "role": "target"},
    ],
    "links": [
        {"name": "access", "a": "mon", "b": "r1", "delay_ms": 1},
        {"name": "main", "a": "r1", "b": "r2", "delay_ms": 5, "rate_mbit": RATES_MBIT[2]},
        {"name": "main_tail", "a": "r2", "b": "tgt", "delay_ms": 1},
        {"name": "backup", "a": "r1", "b": "r3", "delay_ms": 12, "rate_mbit": RATES_MBIT[0]},
        {"name": "backup_tail", "a": "r3", "b": "tgt", "delay_ms": 1},
    ],
    "routes": [{"path": PATHS["main"], "symmetric": True}],
}


@dataclass(frozen=True)
class Scripted:
    cycle: int  # applied just before this cycle (0-based) starts
    event: dict[str, Any]
    mbit_before: float
    mbit_after: float

    @property
    def direction(self) -> str:
        return "up" if self.mbit_after > self.mbit_before else "down"


def script(
    seed: int = SEED,
    events: int = EVENTS,
    warmup: int = WARMUP_CYCLES,
    gaps: tuple[int, int] = GAP_CYCLES,
) -> list[Scripted]:
    """A seeded sequence of route switches and rate steps, each changing the bottleneck: the
    first before cycle ``warmup``, then one every ``gaps`` cycles (drawn, inclusive)."""
    rng = np.random.default_rng(seed)
    rate = {"main": RATES_MBIT[2], "backup": RATES_MBIT[0]}
    active = "main"
    cycle = warmup
    out: list[Scripted] = []
    for _ in range(events):
        other = "backup" if active == "main" else "main"
        before = rate[active]
        if rate[other] != before and rng.random() < 0.5:
            event: dict[str, Any] = {"action": "route", "path": PATHS[other]}
            active = other
        else:
            new = float(rng.choice([r for r in RATES_MBIT if r != before]))
            event = {"action": "link", "link": active, "rate_mbit": new}
            rate[active] = new
        out.append(Scripted(cycle, event, before, rate[active]))
        cycle += int(rng.integers(gaps[0], gaps[1] + 1))
    return out


def score(
    applied: list[float], reports: list[CycleReport], alerts: list[Alert]
) -> tuple[int, list[tuple[int, Alert] | None]]:
    """(true detections, per event the cycle of its detection and the alert, or None).

    An alert is a true positive when it is raised within the first ``WITHIN_CYCLES`` cycles that
    started after an event was applied, and that event is not detected yet (one alert per event
    counts; a second is a false positive).
    """
    starts = [r.started_at.timestamp() for r in reports]
    found: list[tuple[int, Alert] | None] = [None] * len(applied)
    true = 0
    for alert in sorted(alerts, key=lambda a: a.detected_at):
        detected = alert.detected_at.timestamp()
        for k, at in enumerate(applied):
            cycles = sum(1 for s in starts if at <= s <= detected)
            if found[k] is None and 1 <= cycles <= WITHIN_CYCLES:
                found[k] = (cycles, alert)
                true += 1
                break
    return true, found


def config_text(
    lab: Lab,
    tmp: Path,
    *,
    probes: list[str],
    extra_monitor: str = "",
    target: str = "tgt",
    ping_s: float = 0.1,
) -> str:
    """A monitor in the lab's ``mon`` measuring ``target`` with short probes (1-s iperf3 on
    ``PORT``, three pings ``ping_s`` apart); ``extra_monitor`` goes into ``[monitor]``."""
    return f"""
[monitor]
name = "labmon"
cycle_interval_s = 60
archive = "sqlite:///{tmp}/archive.db"
log_dir = "{tmp}/raw"
netns = "{lab.netns("mon")}"
{extra_monitor}

[defaults.ping]
# An interval above the longest RTT: with -w, iputils ping sends until `count` replies came,
# so with pipelined requests it reports the unanswered extra ones as lost.
count = 3
interval_s = {ping_s}

[defaults.traceroute]
max_hops = 6
wait_s = 1
method = "icmp"

[defaults.iperf3]
duration_s = 1
port = {PORT}

[[targets]]
name = "{target}"
address = "{lab.address(target)}"
probes = {probes!r}
"""


@dataclass
class Scored:
    events: list[Scripted]
    reports: list[CycleReport]
    alerts: list[Alert]  # throughput alerts
    true: int
    found: list[tuple[int, Alert] | None]
    watcher_errors: int
    seconds: float

    @property
    def recall(self) -> float:
        return self.true / len(self.events)

    @property
    def precision(self) -> float:
        return self.true / len(self.alerts) if self.alerts else 0.0

    def summary(self) -> list[tuple[str, float, float, int | None]]:
        """Per event: the link stepped (or "route"), Mbit/s before and after, cycles to alert."""
        return [
            (e.event.get("link") or "route", e.mbit_before, e.mbit_after, hit and hit[0])
            for e, hit in zip(self.events, self.found, strict=True)
        ]


def run_scored(
    factory: LabFactory, tmp: Path, events: list[Scripted], tail: int, *, prefix: str = "ansc"
) -> Scored:
    """Run the script in a new lab (``tail`` cycles after the last event) and score its alerts."""
    t0 = time.monotonic()
    total_cycles = events[-1].cycle + tail
    lab: Lab = factory(SCORED, prefix=prefix)
    config = load_config_text(config_text(lab, tmp, probes=["iperf3"]))
    applied: list[float] = []
    by_cycle = {e.cycle: e for e in events}

    async def go(scheduler: Scheduler) -> list[CycleReport]:
        reports: list[CycleReport] = []
        try:
            for k in range(total_cycles):
                if k in by_cycle:
                    lab.apply(by_cycle[k].event)
                    applied.append(time.time())
                reports.append(await scheduler.run_cycle())
        finally:
            await asyncio.to_thread(scheduler.close)
        return reports

    with (
        iperf3_server(lab.address("tgt"), PORT, netns=lab.netns("tgt")),
        Archive.open(config.monitor.archive) as archive,
    ):
        scheduler = Scheduler(config, archive)
        reports = asyncio.run(go(scheduler))
        alerts = [a for a in load_alerts(archive) if a.metric == "throughput_bps"]
    true, found = score(applied, reports, alerts)
    return Scored(
        events, reports, alerts, true, found, scheduler.health.watcher_errors,
        time.monotonic() - t0,
    )  # fmt: skip


# A quiet path (jitter, a little random loss, a fixed bottleneck): no change, so every alert on
# it is a false one.
QUIET = {
    "lab": {"name": "qt", "seed": 11, "time_compression": 60},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "r1", "role": "router"},
        {"name": "tgt", "role": "target"},
    ],
    "links": [
        {"name": "access", "a": "mon", "b": "r1", "delay_ms": 1},
        {
            "name": "wan",
            "a": "r1",
            "b": "tgt",
            "delay_ms": 9,
            "jitter_ms": 0.3,
            "loss_percent": 0.2,
            "rate_mbit": 30,
        },
    ],
}
QUIET_CYCLES = 200
QUIET_MAX_FACTOR = 8  # bandwidth tests at least every 8th cycle on the adaptive cadence


@dataclass
class Quiet:
    reports: list[CycleReport]
    alerts: list[Alert]  # all of them, any metric
    ok: dict[str, int]  # probe → results that succeeded
    watcher_errors: int
    seconds: float

    @property
    def deferred(self) -> int:
        return sum(len(r.deferred) for r in self.reports)


def run_quiet(factory: LabFactory, tmp: Path, cycles: int, *, prefix: str = "anqt") -> Quiet:
    """``cycles`` cycles of ping, traceroute and iperf3 on the quiet path, the bandwidth tests
    on the adaptive cadence (every cycle while the forecast is unsure, then up to every 8th)."""
    t0 = time.monotonic()
    lab: Lab = factory(QUIET, prefix=prefix)
    extra = f"adaptive = true\nadaptive_max_factor = {QUIET_MAX_FACTOR}"
    text = config_text(
        lab, tmp, probes=["ping", "traceroute", "iperf3"], extra_monitor=extra, ping_s=0.05
    )
    config = load_config_text(text)

    async def go(scheduler: Scheduler) -> list[CycleReport]:
        try:
            return [await scheduler.run_cycle() for _ in range(cycles)]
        finally:
            await asyncio.to_thread(scheduler.close)

    with (
        iperf3_server(lab.address("tgt"), PORT, netns=lab.netns("tgt")),
        Archive.open(config.monitor.archive) as archive,
    ):
        scheduler = Scheduler(config, archive)
        reports = asyncio.run(go(scheduler))
        alerts = load_alerts(archive)
        ok = {p: archive.count(probe=p, outcome="ok") for p in ("ping", "traceroute", "iperf3")}
    return Quiet(reports, alerts, ok, scheduler.health.watcher_errors, time.monotonic() - t0)


def quiet_main(cycles: int) -> None:
    with tempfile.TemporaryDirectory(prefix="iepm-bench-qt-") as tmp, LabFactory() as factory:
        run = run_quiet(factory, Path(tmp), cycles, prefix="bqt")
    print(
        json.dumps(
            {
                "figure": "false alerts on a quiet lab path (ping, traceroute, adaptive iperf3)",
                "cycles": len(run.reports),
                "alerts": len(run.alerts),
                "false_alerts_per_100_cycles": 100 * len(run.alerts) / len(run.reports),
                "alert_summaries": [a.summary for a in run.alerts],
                "ok_runs": run.ok,
                "iperf3_deferred": run.deferred,
                "iperf3_share_run": run.ok["iperf3"] / len(run.reports),
                "watcher_errors": run.watcher_errors,
                "seconds": round(run.seconds, 1),
            },
            indent=1,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--events", type=int, default=EVENTS)
    parser.add_argument(
        "--quiet",
        type=int,
        metavar="CYCLES",
        help=f"instead: a quiet path's false alerts (e.g. {QUIET_CYCLES})",
    )
    args = parser.parse_args()
    if args.quiet:
        quiet_main(args.quiet)
        return
    events = script(args.seed, args.events)
    with tempfile.TemporaryDirectory(prefix="iepm-bench-sc-") as tmp, LabFactory() as factory:
        run = run_scored(factory, Path(tmp), events, tail=GAP_CYCLES[0], prefix="bsc")
    print(
        json.dumps(
            {
                "figure": "throughput alerts vs scripted lab events (within 3 cycles)",
                "seed": args.seed,
                "events": len(events),
                "alerts": len(run.alerts),
                "true_positives": run.true,
                "precision": run.precision,
                "recall": run.recall,
                "cycles": len(run.reports),
                "cycles_ok": sum(1 for r in run.reports if r.outcomes.get("ok", 0) >= 1),
                "watcher_errors": run.watcher_errors,
                "seconds": round(run.seconds, 1),
                "detection_cycles": [hit and hit[0] for hit in run.found],
                "events_scored": [
                    {
                        "kind": e.event["action"],
                        "mbit_before": e.mbit_before,
                        "mbit_after": e.mbit_after,
                        "cycles_to_alert": hit and hit[0],
                        "direction_right": None if hit is None else hit[1].direction == e.direction,
                    }
                    for e, hit in zip(events, run.found, strict=True)
                ],
                "false_alerts": [
                    a.summary for a in run.alerts if all(h is None or h[1] != a for h in run.found)
                ],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
