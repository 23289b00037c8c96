"""An archive filled with results shaped like real ones, for the web tests.

Three targets measured every 90 minutes for 35 days by one monitor (``slac-mon``), and one of
them also by a second monitor (``fnal-mon``): ping (RTT level per target, noise, occasional
loss), iperf3 (throughput with its window and streams), traceroute (one route change on
``cern-1`` 10 days before the end), a few failed, timed-out and skipped runs, load facts and
cycles (two overran). Deterministic: the same ``end`` gives the same archive.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from iepm.results import Outcome, Result, format_time, new_result_id
from iepm.store import Archive, Cycle, schema
from iepm.tuning.store import Study, StudyRecorder

END = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
STEP = timedelta(minutes=90)
DAYS = 35
TARGETS = {
    # name: (rtt ms, throughput bit/s, loss probability per packet)
    "cern-1": (150.0, 450e6, 0.002),
    "bnl-2": (70.0, 900e6, 0.0),
    "kek-3": (110.0, 120e6, 0.01),
}
ROUTE_CHANGE = END - timedelta(days=10)


def _ping(rng: random.Random, monitor: str, target: str, when: datetime) -> Result:
    rtt, _thr, loss_p = TARGETS[target]
    rtts = [round(rtt + rng.expovariate(1 / 2.0), 3) for _ in range(10)]
    received = [r for r in rtts if rng.random() >= loss_p]
    data: dict[str, Any] = {
        "packets_sent": 10,
        "packets_received": len(received),
        "duplicates": 0,
        "loss_percent": 100.0 * (10 - len(received)) / 10,
        "rtt_min_ms": min(received),
        "rtt_avg_ms": round(sum(received) / len(received), 3),
        "rtt_max_ms": max(received),
        "rtt_mdev_ms": 0.5,
        "rtts_ms": received,
    }
    return _result("ping", monitor, target, when, data, duration=9.0)


def _iperf3(rng: random.Random, monitor: str, target: str, when: datetime) -> Result:
    _rtt, thr, _loss = TARGETS[target]
    streams = 4 if target == "cern-1" else 1
    window = 4 * 1024 * 1024 if when.day % 2 else 2 * 1024 * 1024
    throughput = thr * rng.uniform(0.6, 1.05)
    data = {
        "throughput_bps": throughput,
        "sender_throughput_bps": throughput * 1.01,
        "retransmits": rng.randint(0, 40),
        "stream_count": streams,
        "window_bytes": window,
        "mean_rtt_ms": TARGETS[target][0] + 3,
        "streams": [{"throughput_bps": throughput / streams} for _ in range(streams)],
    }
    return _result(
        "iperf3", monitor, target, when, data, duration=10.2, params={"streams": streams}
    )


def _traceroute(monitor: str, target: str, when: datetime) -> Result:
    hops = ["192.0.2.1", "198.51.100.7", None, "203.0.113.9"]
    if target == "cern-1" and when >= ROUTE_CHANGE:
        hops = ["192.0.2.1", "198.51.100.99", "198.51.100.100", None, "203.0.113.9"]
    return traceroute(monitor, target, when, hops)


def traceroute(monitor: str, target: str, when: datetime, hops: list[str | None]) -> Result:
    """A successful traceroute as the probe stores it (None: a silent hop, printed ``*``)."""
    data = {
        "reached": True,
        "destination_address": hops[-1],
        "hop_count": len(hops),
        "silent_hops": hops.count(None),
        "hops": [
            {"ttl": i + 1, "address": a, "rtts_ms": [1.0] if a else []} for i, a in enumerate(hops)
        ],
    }
    return _result("traceroute", monitor, target, when, data, duration=3.0)


def _result(
    probe: str,
    monitor: str,
    target: str,
    when: datetime,
    data: dict[str, Any],
    *,
    duration: float,
    params: dict[str, Any] | None = None,
) -> Result:
    return Result(
        probe=probe,
        tool=probe,
        tool_version="test",
        monitor=monitor,
        target=target,
        target_address="198.18.0.1",
        started_at=when,
        duration_s=duration,
        diags=f"{probe} {target}",
        raw_token=new_result_id(),
        params=params or {},
        data=data,
    )


def _failed(result: Result, outcome: Outcome, error: str) -> Result:
    return result.model_copy(
        update={"outcome": outcome, "succeeded": False, "error": error, "data": {}}
    )


def results(end: datetime = END, seed: int = 7) -> list[Result]:
    rng = random.Random(seed)
    out: list[Result] = []
    paths = [("slac-mon", t) for t in TARGETS] + [("fnal-mon", "bnl-2")]
    n = int(timedelta(days=DAYS) / STEP)
    for i in range(n):
        when = end - (n - i) * STEP
        for monitor, target in paths:
            offset = timedelta(seconds=37 if monitor == "fnal-mon" else 0)
            ping = _ping(rng, monitor, target, when + offset)
            iperf = _iperf3(rng, monitor, target, when + offset + timedelta(seconds=20))
            if target == "kek-3" and i % 40 == 5:
                ping = _failed(ping, Outcome.TIMEOUT, "ping to kek-3 did not finish within 15 s")
                iperf = _failed(iperf, Outcome.SKIPPED, "skipped because ping to kek-3 failed")
            elif target == "kek-3" and i % 40 == 25:
                iperf = _failed(iperf, Outcome.FAILED, "iperf3: the server is busy")
            out += [ping, iperf, _traceroute(monitor, target, when + offset + timedelta(seconds=5))]
    load = _result(
        "load",
        "slac-mon",
        "cern-1",
        end - STEP,
        {
            "cpu_count": 8,
            "cpu_mhz": 2445.4,
            "kernel_release": "6.1.0-18-amd64",
            "tcp_congestion_control": "bbr",
            "rmem_max_bytes": 67108864,
            "tcp_rmem_bytes": [4096, 131072, 67108864],
            "nics": {"eth0": {"mtu_bytes": 9000, "operstate": "up", "speed_mbps": 10000}},
        },
        duration=0.05,
    )
    out.append(load)
    return out


def cycles(end: datetime = END) -> list[Cycle]:
    out = []
    n = int(timedelta(days=DAYS) / STEP)
    for i in range(n):
        start = end - (n - i) * STEP
        overran = i in (3, 100)
        out.append(
            Cycle(
                monitor="slac-mon",
                started_at=start,
                finished_at=start + (STEP * 1.1 if overran else timedelta(minutes=2)),
                interval_s=STEP.total_seconds(),
                overran=overran,
                n_results=9,
                n_failed=0,
            )
        )
    return out


def alerts(end: datetime = END) -> list[dict[str, Any]]:
    """Rows of the ``alerts`` table as the analysis layer writes them: the route change on
    cern-1 (RTT up), and two throughput drops on kek-3 (one 40 days ago: outside 28 days)."""

    def alert(n: int, target: str, metric: str, when: datetime, cause: str, **kw: Any) -> dict:
        return {
            "id": f"alert-{n}",
            "monitor": "slac-mon",
            "target": target,
            "probe": metric.split(".")[0],
            "metric": metric,
            "detected_at": when + timedelta(hours=3),
            "change_at": when,
            "delivered_at": None,
            "delivery_attempts": 0,
            **kw,
            "cause": cause,
        }

    return [
        alert(
            1,
            "cern-1",
            "ping.rtt_avg_ms",
            ROUTE_CHANGE,
            "route",
            direction="up",
            before=151.0,
            after=163.5,
            change_percent=8.3,
            details={"route_changed_at": format_time(ROUTE_CHANGE), "hops_added": 1},
        ),
        alert(
            2,
            "kek-3",
            "iperf3.throughput_bps",
            end - timedelta(days=4),
            "unknown",
            direction="down",
            before=120e6,
            after=80e6,
            change_percent=-33.3,
            details={},
        ),
        alert(
            3,
            "kek-3",
            "iperf3.throughput_bps",
            end - timedelta(days=40),
            "host",
            direction="down",
            before=130e6,
            after=90e6,
            change_percent=-30.8,
            details={"cpu_mhz": [2445.4, 1200.0]},
        ),
    ]


def studies(archive: Archive, end: datetime = END) -> None:
    """Written by the tuning layer's own writer (StudyRecorder, point by point): a finished
    window × streams sweep of cern-1 and an interrupted duration study. ``finished_at`` is
    stamped by the writer when the fixture is built."""
    points = [
        {"window": w, "window_label": w, "streams": s, "succeeded": True, "throughput_bps": 1e8 * s}
        for w in ("1M", "4M")
        for s in (1, 4)
    ]
    sweep = Study(
        "sweep",
        "slac-mon",
        "cern-1",
        {"windows": ["1M", "4M"], "streams": [1, 4]},
        started_at=end - timedelta(days=6),
    )
    recorder = StudyRecorder(archive, sweep)
    for point in points:
        recorder.add_point(point)
    recorder.finish({"window": "4M", "streams": 4}, partial=False)
    duration = Study("duration", "slac-mon", "cern-1", {}, started_at=end - timedelta(days=2))
    StudyRecorder(archive, duration).add_point(points[0])  # interrupted: never finished


def fill(url: str, end: datetime = END, extra: list[Result] | None = None) -> Archive:
    archive = Archive.open(url)
    archive.add_many(results(end) + (extra or []))
    for cycle in cycles(end):
        archive.add_cycle(cycle)
    with archive.writing("adding test alerts and studies") as conn:
        conn.execute(schema.alerts.insert(), alerts(end))
    studies(archive, end)
    return archive
