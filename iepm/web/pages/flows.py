"""The flows page: active tests against the passive throughput of their own flow records (the
seed's Tables 2–5), and the passive measurements of every host pair, tested or not (source
``passive``); and the passive series a target page draws beside its active results.

Passive throughput is not a probe: it has no runs and no Result envelope, so it is not in the
probe registry's metrics (nor ``/metrics``, whose series are per probe run). It is read here
straight from the ``flows`` table, grouped into application instances (iepm.flows.instances) and
matched to the active results (iepm.flows.compare), as ``iepm flows instances|compare`` do.
"""

# No "from __future__ import annotations": FastAPI must see the routes' annotations as objects.

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, NamedTuple

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response

from iepm.analysis.statistics import at
from iepm.flows.compare import MIN_TESTS_FOR_R, match, over_hosts, table
from iepm.flows.instances import DEFAULT_WINDOW_S, FORMULAS, Instance, group
from iepm.flows.store import read_flows
from iepm.probes import PROBES
from iepm.results import format_time
from iepm.web.context import UNKNOWN, Until, WebContext, now_of, web
from iepm.web.queries import Queries
from iepm.web.tables import HISTORY, Chart, Series, Table, TableFormat, col, download, num, pick

Context = Annotated[WebContext, Depends(web)]
SOURCE = "passive"
# Instances smaller than this are connections, not transfers (the seed kept transfers > 1 MB).
MIN_BYTES = 1_000_000
# Flows are read this far around the active results they are matched to.
MARGIN = timedelta(minutes=1)


def transfer_probes() -> list[str]:
    """Probes whose ``throughput_bps`` is matched to flows: every registered probe that
    declares that figure (iperf3 and the copies), from the registry."""
    return [n for n, m in PROBES.items() if any(x.key == "throughput_bps" for x in m.METRICS)]


class CompareRow(NamedTuple):
    target: str
    probe: str
    formula: int
    n: int
    err_p25: float | None
    err_median: float | None
    err_p75: float | None
    r: float | None
    long_flows: int


class HostsRow(NamedTuple):
    formula: int
    hosts: int
    err_median_p25: float | None
    err_median_p75: float | None
    r_p25: float | None
    r_p75: float | None


class PassiveRow(NamedTuple):
    started_at: datetime
    src: str
    dst: str
    dport: int | None
    streams: int
    bytes: int
    f1_bps: float | None
    f2_bps: float | None
    f3_bps: float | None
    long_flows: int
    tested: str  # the active test matched to it ("probe target"), "" when none
    source: str


@dataclass
class FlowsPage:
    since: datetime
    until: datetime
    probe: str
    matched: int
    unmatched: int
    tables: dict[str, Table]
    charts: list[Chart]


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _at(ms: int) -> datetime:
    return at(ms / 1000)


def passive_rows(instances: list[Instance], tested: dict[int, str]) -> list[PassiveRow]:
    return [
        PassiveRow(
            _at(i.start_ms), i.src, i.dst, i.dport, len(i.flows), i.bytes,
            num(i.throughput_bps(1)), num(i.throughput_bps(2)), num(i.throughput_bps(3)),
            len(i.long_flows()), tested.get(id(i), ""), SOURCE,
        )
        for i in instances
        if i.bytes >= MIN_BYTES
    ]  # fmt: skip


PASSIVE_COLUMNS = [
    col("started_at", "start of the instance's first flow, UTC"),
    col("src", "source address"),
    col("dst", "destination address"),
    col("dport", "destination (server) port"),
    col("streams", "flows in the instance"),
    col("bytes", "bytes of all its flows (scaled up by the sampling rate)"),
    col("f1_bps", "formula 1: sum of each stream's bytes/time, bit/s"),
    col("f2_bps", "formula 2: total bytes / mean stream time, bit/s"),
    col("f3_bps", "formula 3: total bytes / longest stream time, bit/s"),
    col("long_flows", "streams far longer than their siblings (flagged, kept)"),
    col("tested", "the active test matched to it (probe target); empty: an untested transfer"),
    col("source", "passive: from flow records"),
]


def flows_page(
    q: Queries, now: datetime, probe: str, span: timedelta = HISTORY, by_port: bool = True
) -> FlowsPage:
    since = now - span
    archive = q.archive
    results = list(archive.results(probe=probe, since=since, until=now))
    flows = list(read_flows(archive, since_ms=_ms(since - MARGIN), until_ms=_ms(now + MARGIN)))
    matches, unmatched = match(results, flows, by_port=by_port)
    rows = table(matches, MIN_TESTS_FOR_R)
    compare_rows = [
        CompareRow(r.target, r.probe, r.formula, r.n, num(r.err_p25), num(r.err_median),
                   num(r.err_p75), num(r.r), r.long_flows)
        for r in rows
    ]  # fmt: skip
    hosts = [
        HostsRow(formula, int(s["hosts"] or 0), *(num(s[k]) for k in  # type: ignore[arg-type]
                 ("err_median_p25", "err_median_p75", "r_p25", "r_p75")))
        for formula, s in over_hosts(rows).items()
    ]  # fmt: skip
    # Every transfer seen (tested or not); a matched test's instance is named by its test.
    instances = group(f for f in flows if _ms(since) <= f.start_ms < _ms(now))
    test_of = {f: f"{m.result.probe} {m.result.target}" for m in matches for f in m.instance.flows}
    tested = {
        id(inst): next((test_of[f] for f in inst.flows if f in test_of), "") for inst in instances
    }
    passive = passive_rows(instances, tested)
    tables = {
        "compare": Table(
            "compare",
            f"{probe} against passive throughput, per target and formula",
            [
                col("target", "the active test's target"),
                col("probe", "the active probe"),
                col("formula", "1: sum of stream rates; 2: bytes / mean time; 3: bytes / max time"),
                col("n", "tests matched to their flows"),
                col("err_p25", "25th percentile of err = (passive - active) / passive"),
                col("err_median", "median err"),
                col("err_p75", "75th percentile of err"),
                col("r", f"correlation of passive and active (from {MIN_TESTS_FOR_R} tests)"),
                col("long_flows", "matched instances with a long flow"),
            ],
            compare_rows,
        ),
        "hosts": Table(
            "hosts",
            "over hosts: 25-75 percentile range of the hosts' median err and R",
            [
                col("formula", "1, 2 or 3"),
                col("hosts", "targets with matched tests"),
                col("err_median_p25", "25th percentile of the hosts' median err"),
                col("err_median_p75", "75th percentile of the hosts' median err"),
                col("r_p25", "25th percentile of the hosts' R"),
                col("r_p75", "75th percentile of the hosts' R"),
            ],
            hosts,
        ),
        "passive": Table("passive", "passive throughput of transfers", PASSIVE_COLUMNS, passive),
    }
    points = sorted(
        (m.active_bps, m.passive_bps(1), m.passive_bps(3)) for m in matches
    )  # fmt: skip
    charts = []
    if points:
        charts.append(
            Chart(
                "active-passive",
                f"passive throughput (formulas 1 and 3) against {probe}'s own",
                "scatter",
                [p[0] for p in points],
                [
                    Series("f1_bps", [p[1] for p in points]),
                    Series("f3_bps", [p[2] for p in points]),
                ],
                "compare",
                x_label=f"{probe} throughput_bps",
            )
        )
    return FlowsPage(since, now, probe, len(matches), unmatched, tables, charts)


def target_passive(
    q: Queries, target: str, since: datetime, until: datetime
) -> tuple[Table, Chart] | None:
    """The passive throughput of transfers to and from ``target``'s address (a target page's
    series beside its active results), or None when the archive has no flow records of it."""
    latest = list(q.archive.results(target=target, until=until, order="desc", limit=1))
    address = (latest[0].target_address or latest[0].target) if latest else None
    if not address:
        return None
    flows = list(read_flows(q.archive, since_ms=_ms(since), until_ms=_ms(until), address=address))
    rows = passive_rows(group(flows), {})
    if not rows:
        return None
    passive = Table(
        "passive", f"passive throughput of transfers with {address}", PASSIVE_COLUMNS, rows
    )
    chart = Chart(
        "passive",
        f"passive throughput with {address} (flow records, formula 1 and 3)",
        "time",
        [r.started_at.timestamp() for r in rows],
        [Series(f"f{k}_bps", [getattr(r, f"f{k}_bps") for r in rows]) for k in (1, 3)],
        "passive",
    )
    return passive, chart


# Built from the registry when this module is imported (as site.py's metric names are).
Probe = StrEnum("Probe", {n: n for n in transfer_probes()})  # type: ignore[misc]
DEFAULT_PROBE = next(iter(Probe))


class Format(StrEnum):
    csv = "csv"
    tsv = "tsv"


Days = Annotated[int, Query(ge=1, le=366, description="days back from until (or now)")]
Ports = Annotated[
    bool, Query(description="match a test's flows by its server port too (false: addresses only)")
]


def router() -> APIRouter:
    routes = APIRouter(tags=["pages"], responses=UNKNOWN)

    def data(
        w: WebContext, until: datetime | None, probe: str, days: int, ports: bool
    ) -> FlowsPage:
        return w.page_data(  # type: ignore[no-any-return]
            ("flows", probe, days, ports),
            until,
            lambda end: flows_page(w.queries, end, probe, timedelta(days=days), ports),
        )

    @routes.get("/flows", response_class=HTMLResponse, summary="Active against passive")
    async def flows_html(
        w: Context,
        request: Request,
        probe: Probe = DEFAULT_PROBE,  # type: ignore[valid-type]
        days: Days = 28,
        ports: Ports = True,
        until: Until = None,
    ) -> HTMLResponse:
        page = await w.computed(data, w, until, probe.value, days, ports)
        html = w.templates.get_template("flows.html").render(
            {**vars(page), "request": request, "until": until, "now": now_of(until),
             "days": days, "ports": ports, "probes": [p.value for p in Probe],
             "formulas": FORMULAS, "window_s": DEFAULT_WINDOW_S}
        )  # fmt: skip
        return HTMLResponse(html)

    @routes.get("/flows/tables/{name}", summary="Download a flows-page table")
    async def flows_table(
        w: Context,
        name: str,
        format: Format = Format.csv,
        probe: Probe = DEFAULT_PROBE,  # type: ignore[valid-type]
        days: Days = 28,
        ports: Ports = True,
        until: Until = None,
    ) -> Response:
        page = await w.computed(data, w, until, probe.value, days, ports)
        selection = f"probe={probe.value} days={days} ports={ports} until={format_time(page.until)}"
        return download(pick(page.tables, name), TableFormat(format.value), selection, "flows")

    return routes
