"""The pages in chromium with data measured in a WAN lab: the demo's six sites measured by the
real scheduler for two cycles, cern's route switched to the backup path between them. Every
number checked on a page is computed here again from the archive."""

from __future__ import annotations

import asyncio
import csv
import io
import itertools
import statistics
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from iepm.demo import TOPOLOGY, Demo
from iepm.export import format_number
from iepm.lab.testing import lab_unavailable, unique_lab_name
from iepm.results import Result
from iepm.store import Archive
from iepm.web.server import serve_in_background
from iepm.web.tables import human
from testkit.browser import PAINTED, series_count, shoot
from testkit.net import free_port

pytestmark = [pytest.mark.lab, pytest.mark.browser]

HEADLINE = {"iperf3.throughput_bps", "ping.rtt_avg_ms", "ping.loss_percent"}


@dataclass
class LabRun:
    url: str  # the archive
    server: str  # the dashboard
    sites: list[str]
    addresses: dict[str, str]
    results: list[Result]

    def of(self, probe: str, target: str) -> list[Result]:
        return [r for r in self.results if r.probe == probe and r.target == target]


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory: pytest.TempPathFactory, _stale_labs_swept: Any) -> Iterator[LabRun]:
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    topology = tomllib.loads(TOPOLOGY.read_text(encoding="utf-8"))
    # The route change is applied between the two cycles rather than at its scheduled time, so
    # that exactly one change falls between cern's two traceroutes.
    (switch,) = topology.pop("events")
    workdir = tmp_path_factory.mktemp("lab-demo")
    addresses = {h["name"]: h["address"] for h in topology["hosts"]}
    sites = [h["name"] for h in topology["hosts"] if h["role"] == "target"]
    with Demo.start(
        workdir, topology=topology, lab_name=unique_lab_name("webui"), say=lambda _: None
    ) as demo:
        assert demo.mode == "lab"
        scheduler = demo.open()

        async def measure() -> None:
            await scheduler.run_cycle()
            await asyncio.to_thread(demo.lab.apply, switch)
            await scheduler.run_cycle()

        asyncio.run(measure())
        url = demo.config.monitor.archive
    # The lab is down: the pages are read while the CPUs are free again.
    with Archive.open(url) as archive:
        results = list(archive.results())
    handle = serve_in_background(url, "127.0.0.1", free_port())
    try:
        yield LabRun(url, handle.url.rstrip("/"), sites, addresses, results)
    finally:
        handle.stop()


def page_cells(page: Any, table: str) -> list[dict[str, tuple[str, str | None]]]:
    """A page table's rows: per column the text shown and the raw value the cell carries
    (``data-value``: the download's text of a number written for people; None elsewhere)."""
    heads = page.locator(f"#table-{table} thead th").all_inner_texts()
    rows = page.evaluate(
        "t => [...document.querySelectorAll(`#table-${t} tbody tr`)].map(tr =>"
        " [...tr.cells].map(td => [td.innerText, td.dataset.value ?? null]))",
        table,
    )
    return [{h: (text, raw) for h, (text, raw) in zip(heads, row, strict=True)} for row in rows]


def page_rows(page: Any, table: str) -> list[dict[str, str]]:
    """A page table's rows as its download has them: each cell's raw value, else its text."""
    return [
        {h: text if raw is None else raw for h, (text, raw) in row.items()}
        for row in page_cells(page, table)
    ]


# lab_run comes before page in every test: it runs asyncio, which Playwright's sync API (a
# running loop) would forbid once the browser is up.


def test_overview_grid_and_route_map(lab_run: LabRun, page: Any) -> None:
    page.goto(f"{lab_run.server}/")
    assert page.locator("#grid a.chip").count() == 3 * len(lab_run.sites)
    # The latest value of every path and headline metric, as the archive has it.
    rows = page_rows(page, "paths")
    assert {(r["target"], r["metric"]) for r in rows} == {
        (s, m) for s in lab_run.sites for m in HEADLINE
    }
    for row in rows:
        probe, key = row["metric"].split(".")
        latest = max(lab_run.of(probe, row["target"]), key=lambda r: r.started_at)
        assert row["outcome"] == latest.outcome.value
        expected = format_number(latest.data[key]) if latest.succeeded else ""
        assert row["value"] == expected, row
    # Route map: the hops of each site's latest traceroute, shared links drawn once.
    links: set[tuple[str, str]] = set()
    for site in lab_run.sites:
        trace = max(lab_run.of("traceroute", site), key=lambda r: r.started_at)
        assert trace.data["reached"], trace.diags
        hops = [h["address"] or "*" for h in trace.data["hops"]]
        chain = [trace.monitor, *hops[:-1], site]  # the last hop is the site itself
        links |= set(itertools.pairwise(chain))
    drawn = page.locator("svg.routemap line.link")
    got = {
        (drawn.nth(i).get_attribute("data-from"), drawn.nth(i).get_attribute("data-to"))
        for i in range(drawn.count())
    }
    assert got == links
    assert drawn.count() == len(links)
    assert page.locator("svg.routemap g.node.target").count() == len(lab_run.sites)
    # After the switch cern is reached through the backup router.
    assert (lab_run.addresses["backup"], "cern") in got
    assert (lab_run.addresses["euro"], "desy") in got
    # Each site labelled with its mean throughput (the downloadable table has the number).
    means = {
        r["target"]: r["throughput_bps_mean"]
        for r in csv.DictReader(
            io.StringIO(httpx.get(f"{lab_run.server}/tables/route_paths", timeout=30).text)
        )
    }
    for site in lab_run.sites:
        ok = [r.data["throughput_bps"] for r in lab_run.of("iperf3", site) if r.succeeded]
        assert means[site] == format_number(statistics.fmean(ok)), site
    shoot(page, "lab-overview")


def test_target_page_charts_route_change_and_zoom(lab_run: LabRun, page: Any) -> None:
    page.goto(f"{lab_run.server}/targets/cern")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.rtt")
    for chart, n in {"rtt": 3, "loss": 1, "throughput": 3, "hops": 1, "cdf": 1}.items():
        assert series_count(page, chart) == n, chart
        assert page.evaluate(PAINTED, chart) > 500, f"{chart} canvas is empty"
    routes = [
        " ".join(h["address"] or "*" for h in r.data["hops"])
        for r in sorted(lab_run.of("traceroute", "cern"), key=lambda r: r.started_at)
    ]
    assert len(routes) == 2 and routes[0] != routes[1]
    events = page.evaluate(
        "JSON.parse(document.querySelector('#fig-rtt script').textContent).events.length"
    )
    assert events == 1
    stats = {r["metric"]: r for r in page_rows(page, "stats")}
    rtts = [r.data["rtt_avg_ms"] for r in lab_run.of("ping", "cern") if r.succeeded]
    assert stats["ping.rtt_avg_ms"]["median"] == format_number(statistics.median(rtts))
    # Shown for people ("20.4 ms", "38.1 Mbit/s"), the raw number on the cell.
    shown = {r["metric"][0]: r for r in page_cells(page, "stats")}
    assert shown["ping.rtt_avg_ms"]["median"] == (
        human(statistics.median(rtts), "rtt_avg_ms"),
        format_number(statistics.median(rtts)),
    )
    assert stats["ping.rtt_avg_ms"]["count"] == str(len(rtts))
    thr = [r.data["throughput_bps"] for r in lab_run.of("iperf3", "cern") if r.succeeded]
    assert stats["iperf3.throughput_bps"]["mean"] == format_number(statistics.fmean(thr))
    assert shown["iperf3.throughput_bps"]["mean"][0] == human(statistics.fmean(thr), "x_bps")
    assert shown["iperf3.throughput_bps"]["mean"][0].endswith(" Mbit/s")
    shoot(page, "lab-target")
    chart = "window.iepmCharts.throughput.scales.x"
    before = page.evaluate(f"[{chart}.min, {chart}.max]")
    page.locator("#chart-throughput").scroll_into_view_if_needed()  # stacked: below the fold
    over = page.locator("#chart-throughput .u-over").bounding_box()
    y = over["y"] + over["height"] / 2
    page.mouse.move(over["x"] + over["width"] * 0.2, y)
    page.mouse.down()
    page.mouse.move(over["x"] + over["width"] * 0.6, y, steps=8)
    page.mouse.up()
    after = page.evaluate(f"[{chart}.min, {chart}.max]")
    assert before[0] < after[0] < after[1] < before[1]
    page.locator("#chart-throughput .u-over").dblclick()
    assert page.evaluate(f"[{chart}.min, {chart}.max]") == before


def test_csv_download_has_every_run(lab_run: LabRun, page: Any, tmp_path: Path) -> None:
    page.goto(f"{lab_run.server}/targets/ihep")
    with page.expect_download() as info:
        page.locator('#table-ping a.dl[data-format="csv"]').click()
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    pings = sorted(lab_run.of("ping", "ihep"), key=lambda r: r.started_at)
    assert [r["rtt_avg_ms"] for r in rows] == [
        format_number(p.data["rtt_avg_ms"]) if p.succeeded else "" for p in pings
    ]
    assert [r["loss_percent"] for r in rows] == [
        format_number(p.data["loss_percent"]) if p.succeeded else "" for p in pings
    ]


def test_compare_page_fit(lab_run: LabRun, page: Any) -> None:
    # Through the origin when asked for (the default fit no longer assumes y grows with x).
    page.goto(f"{lab_run.server}/compare?x=ping.rtt_avg_ms&y=iperf3.throughput_bps&fit=origin")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.scatter")
    assert series_count(page, "scatter") == 2  # the points and the fit
    assert page.evaluate(PAINTED, "scatter") > 500
    x, y = [], []
    for site in sorted(lab_run.sites):
        x.append(statistics.median(r.data["rtt_avg_ms"] for r in lab_run.of("ping", site)))
        y.append(statistics.median(r.data["throughput_bps"] for r in lab_run.of("iperf3", site)))
    xs, ys = np.array(x), np.array(y)
    slope = float(xs @ ys / (xs @ xs))
    r2 = 1 - float(((ys - slope * xs) ** 2).sum()) / float(((ys - ys.mean()) ** 2).sum())
    (fit,) = page_rows(page, "fit")
    assert fit["n"] == str(len(lab_run.sites))
    assert fit["slope"] == format_number(slope)
    assert fit["r_squared"] == format_number(r2)
    assert f"R² = {r2:.3f}" in page.locator("#note-scatter").inner_text()
    shoot(page, "lab-compare")


def test_aggregation_view(lab_run: LabRun, page: Any) -> None:
    page.goto(f"{lab_run.server}/aggregate/kek?view=last7&metric=ping.rtt_avg_ms")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.agg")
    assert series_count(page, "agg") == 1
    assert page.evaluate(PAINTED, "agg") > 200
    pings = [r for r in lab_run.of("ping", "kek") if r.succeeded]
    points = page_rows(page, "points")
    assert [p["ping.rtt_avg_ms"] for p in points] == [
        format_number(r.data["rtt_avg_ms"]) for r in sorted(pings, key=lambda r: r.started_at)
    ]
    by_day: dict[str, list[float]] = {}
    for r in pings:
        by_day.setdefault(r.started_at.strftime("%Y-%m-%d"), []).append(r.data["rtt_avg_ms"])
    days = page_rows(page, "days")
    assert {d["period_start"][:10]: d["rtt_avg_ms_mean"] for d in days} == {
        day: format_number(statistics.fmean(v)) for day, v in by_day.items()
    }
    shoot(page, "lab-aggregate")
