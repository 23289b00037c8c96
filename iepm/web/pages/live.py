"""The live pages' first picture: what the archive holds for their window when they open.
From then on iepm/web/static/live.js follows ``/live/events`` (iepm.web.live) and extends it.

Each page is a ``spec`` (JSON for the script: series, the stream's starting ids) plus a few
figures for the template. The EWMA of the bandwidth page is computed here for the first picture
and continued by the script with the same formula.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from iepm.analysis import normalise
from iepm.probes import PROBES, ping
from iepm.store import live
from iepm.store.archive import Archive
from iepm.store.filters import result_conditions
from iepm.store.schema import results as RESULTS
from iepm.web.places import NOWHERE, Places, sort_key

# avg_i = (1 − w)·avg_{i−1} + w·y_i: ABwE's live view smoothed its per-minute estimates so.
EWMA_WEIGHT = 0.3
# The estimator's figure when its probe is not registered here (a plug-in of another host).
ABW_DEFAULT_KEY = "available_mbps"
# The normalised estimate (fitted to iperf3 by the estimator's side) is stored beside the raw
# one under this prefix: "normalised_available_mbps".
NORMALISED_PREFIX = "normalised_"
PING_METRIC = "rtt_ms"
# PingWorld coloured the latest RTTs by size: up to 50 ms, up to 150 ms, more.
RTT_BANDS_MS = (50.0, 150.0)
INTERFACE_PROBE = "interface"
INTERFACE_METRICS = ("rx_mbps", "tx_mbps")
INTERFACE_WINDOW_S = 120.0
UNGROUPED = "(no group)"


def running_rows(running: Sequence[live.Running]) -> list[dict[str, Any]]:
    """The tests running now as the page shows them, with their probe's tool."""
    return [
        {"monitor": r.monitor, "probe": r.probe, "target": r.target, "params": r.params,
         "started_s": r.started_s,
         "tool": PROBES[r.probe].TOOL if r.probe in PROBES else r.probe}
        for r in running
    ]  # fmt: skip


def ewma(values: Sequence[float], weight: float) -> list[float]:
    """avg_0 = y_0, avg_i = (1 − w)·avg_{i−1} + w·y_i."""
    out: list[float] = []
    for y in values:
        out.append(y if not out else (1.0 - weight) * out[-1] + weight * y)
    return out


@dataclass
class LivePage:
    title: str
    spec: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _start(rows: Sequence[tuple[int, live.LiveSample]], before: int) -> int:
    """Where the page's stream starts: after the newest sample drawn, or (none drawn) after
    the newest id there was before the window was read — never a sample lost between them."""
    return max([before, *(i for i, _ in rows)])


def default_metric(probe: str) -> str:
    module = PROBES.get(probe)
    if module is None:
        return ABW_DEFAULT_KEY
    higher = [m.key for m in module.METRICS if m.better == "higher"]
    return higher[0] if higher else (module.METRICS[0].key if module.METRICS else ABW_DEFAULT_KEY)


def bandwidth_page(
    archive: Archive, probe: str, metric: str | None, weight: float, window_s: float
) -> LivePage:
    key = metric or default_metric(probe)
    normalised = NORMALISED_PREFIX + key
    now_s = time.time()
    results_after_ms = int(now_s * 1000)
    since = datetime.fromtimestamp(now_s - window_s, UTC)
    query = (
        select(RESULTS.c.target, RESULTS.c.started_at, RESULTS.c.data)
        .where(*result_conditions(probe=probe, since=since, outcome="ok"))
        .order_by(RESULTS.c.started_at)
    )
    with archive.reading("cannot read the estimates") as conn:
        rows = conn.execute(query).all()
    # The estimator's fit to the path's iperf3 runs (analysis/normalise.py), where it has one.
    fits = (
        normalise.estimator_fits(archive, datetime.fromtimestamp(now_s, UTC))
        if (probe, key) == normalise.ESTIMATOR
        else {}
    )
    targets: dict[str, dict[str, list[float | None]]] = {}
    for target, started_at, data in rows:
        value = data.get(key) if isinstance(data, dict) else None
        if not isinstance(value, int | float):
            continue
        norm = data.get(normalised)
        path_fit = fits.get(str(target))
        if not isinstance(norm, int | float) and path_fit is not None:
            norm = path_fit.normalised(float(value))
        series = targets.setdefault(str(target), {"t": [], "raw": [], "norm": []})
        series["t"].append(started_at.timestamp())
        series["raw"].append(float(value))
        series["norm"].append(float(norm) if isinstance(norm, int | float) else None)
    for series in targets.values():
        series["ewma"] = list(ewma([v for v in series["raw"] if v is not None], weight))
    spec = {
        "kind": "bandwidth",
        "probe": probe,
        "metric": key,
        "normalised": normalised,
        "weight": weight,
        "window_s": window_s,
        "results_after": results_after_ms,
        "targets": dict(sorted(targets.items())),
        "fits": {t: {"slope": f.slope, "r2": f.r2, "n": f.n} for t, f in sorted(fits.items())},
    }
    notes = []
    if probe not in PROBES:
        notes.append(f"probe {probe!r} is not registered in this server; its stored results show")
    return LivePage(f"Available bandwidth ({probe}.{key})", spec, notes)


def ping_page(archive: Archive, places: Places, window_s: float) -> LivePage:
    before = live.latest_id(archive)
    rows = live.read_window(archive, time.time() - window_s, probe=ping.NAME)
    series: dict[str, list[tuple[float, float | None]]] = {}
    for _i, s in rows:
        if s.metric == PING_METRIC:
            series.setdefault(s.target, []).append((s.t_s, s.value))
    names = sorted(set(series) | set(places), key=lambda t: sort_key(places, t))
    groups: dict[str, list[str]] = {}
    for name in names:
        place = places.get(name, NOWHERE)
        groups.setdefault(place.group or place.site or UNGROUPED, []).append(name)
    spec = {
        "kind": "ping",
        "probe": ping.NAME,
        "metric": PING_METRIC,
        "window_s": window_s,
        "after": _start(rows, before),
        "bands_ms": list(RTT_BANDS_MS),
        "groups": [{"name": g, "targets": t} for g, t in groups.items()],
        "series": {t: [list(p) for p in points] for t, points in series.items()},
    }
    return LivePage("Ping, live", spec)


def interface_page(archive: Archive) -> LivePage:
    before = live.latest_id(archive)
    now_s = time.time()
    rows = live.read_window(archive, now_s - INTERFACE_WINDOW_S, probe=INTERFACE_PROBE)
    # Its stream also brings pings: the RTT column of the running tests.
    series: dict[str, dict[str, list[list[float | None]]]] = {}
    for _i, s in rows:
        if s.metric in INTERFACE_METRICS:
            series.setdefault(s.target, {m: [] for m in INTERFACE_METRICS})[s.metric].append(
                [s.t_s, s.value]
            )
    # The latest RTT to each target (its live pings), shown beside a test running to it.
    rtts = live.read_window(archive, now_s - INTERFACE_WINDOW_S, probe=ping.NAME)
    rtt_ms = {s.target: s.value for _i, s in rtts if s.metric == PING_METRIC}
    spec = {
        "kind": "interface",
        "probe": f"{INTERFACE_PROBE},ping",
        "metrics": list(INTERFACE_METRICS),
        "window_s": INTERFACE_WINDOW_S,
        "after": _start(rows, before),
        "series": dict(sorted(series.items())),
        "running": running_rows(live.running(archive)),
        "rtt_ms": rtt_ms,
        "rtt_metric": PING_METRIC,
        "now_s": now_s,
    }
    return LivePage("Interface and running tests, live", spec)
