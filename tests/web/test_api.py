"""The REST API, /metrics and the tables behind the pages, against numbers computed here
independently from the archive (statistics module, plain loops)."""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from iepm.export import format_number
from iepm.results import Result, format_time
from iepm.store import Archive
from iepm.web.tables import human
from tests.web import data
from tests.web.conftest import LOOPBACK

END = format_time(data.END)
WINDOW = data.END - timedelta(days=28)


def csv_rows(client: TestClient, url: str) -> list[dict[str, str]]:
    response = client.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(response.text)))


def ok_values(archive: Archive, probe: str, target: str, key: str, monitor: str) -> list[float]:
    return [
        r.data[key]
        for r in archive.results(
            probe=probe, target=target, monitor=monitor, since=WINDOW, until=data.END
        )
        if r.succeeded and r.data.get(key) is not None
    ]


# -- API -------------------------------------------------------------------------------------


def test_targets_lists_every_target_with_counts(client: TestClient, archive: Archive) -> None:
    body = client.get("/api/v1/targets").json()
    assert sorted({row["target"] for row in body}) == archive.targets()
    for row in body:
        assert row["count"] == archive.count(probe=row["probe"], target=row["target"])
    one = client.get("/api/v1/targets/bnl-2").json()
    assert {row["monitor"] for row in one} == {"slac-mon", "fnal-mon"}


def test_results_filters_and_paging(client: TestClient, archive: Archive) -> None:
    since, until = data.END - timedelta(days=3), data.END - timedelta(days=1)
    query = f"probe=ping&target=kek-3&since={format_time(since)}&until={format_time(until)}"
    expected = [
        r.id for r in archive.results(probe="ping", target="kek-3", since=since, until=until)
    ]
    seen: list[str] = []
    offset = 0
    while True:
        page = client.get(f"/api/v1/results?{query}&limit=7&offset={offset}").json()
        assert page["total"] == len(expected)
        if not page["results"]:
            break
        seen += [r["id"] for r in page["results"]]
        offset += 7
    assert seen == expected
    timeouts = client.get("/api/v1/results?target=kek-3&outcome=timeout&limit=1000").json()
    assert timeouts["total"] == archive.count(target="kek-3", outcome="timeout") > 0
    assert {r["outcome"] for r in timeouts["results"]} == {"timeout"}
    # Envelopes exactly as the archive holds them (schema 1, units in names).
    first = timeouts["results"][0]
    assert first == next(archive.results(target="kek-3", outcome="timeout")).envelope()
    # Pages over INLINE_LIMIT are built in a worker thread: the same answer.
    big = client.get("/api/v1/results?target=kek-3&limit=5000").json()
    assert [r["id"] for r in big["results"]] == [r.id for r in archive.results(target="kek-3")]
    assert big["total"] == archive.count(target="kek-3") > 1000
    newest = client.get("/api/v1/results?target=cern-1&order=desc&limit=1").json()["results"][0]
    assert newest["started_at"] == format_time(
        max(r.started_at for r in archive.results(target="cern-1"))
    )


def test_latest_is_the_newest_result_of_every_path(client: TestClient, archive: Archive) -> None:
    body = client.get("/api/v1/latest?since=2000-01-01").json()
    newest: dict[tuple[str, str, str], Result] = {}
    for r in archive.results():
        newest[(r.monitor, r.target, r.probe)] = r  # ascending: the last one wins
    assert {(r["monitor"], r["target"], r["probe"]): r["id"] for r in body} == {
        key: r.id for key, r in newest.items()
    }
    only = client.get("/api/v1/latest?probe=ping&target=loopback").json()
    assert [r["id"] for r in only] == [newest[("slac-mon", LOOPBACK, "ping")].id]


def test_real_ping_results_are_served(client: TestClient, archive: Archive) -> None:
    real = list(archive.results(probe="ping", target=LOOPBACK))
    assert len(real) == 3 and all(r.tool == "ping" for r in real)
    body = client.get(f"/api/v1/results?target={LOOPBACK}&probe=ping").json()
    assert body["results"] == [r.envelope() for r in real]


def test_aggregates_per_week_equal_independent_means(client: TestClient, archive: Archive) -> None:
    since = data.END - timedelta(days=21)
    body = client.get(
        "/api/v1/aggregates?target=cern-1&metric=ping.rtt_avg_ms&period=week"
        f"&since={format_time(since)}&until={END}"
    ).json()
    weeks: dict[str, list[float]] = defaultdict(list)
    for r in archive.results(probe="ping", target="cern-1", since=since, until=data.END):
        if r.succeeded:
            day = r.started_at.astimezone(UTC).date()
            monday = datetime.combine(day - timedelta(days=day.weekday()), datetime.min.time(), UTC)
            weeks[format_time(monday)].append(r.data["rtt_avg_ms"])
    assert [b["start"] for b in body["buckets"]] == sorted(weeks)
    for bucket in body["buckets"]:
        values = weeks[bucket["start"]]
        assert bucket["count"] == len(values)
        assert bucket["mean"] == pytest.approx(statistics.fmean(values), rel=1e-12)
        assert bucket["median"] == pytest.approx(statistics.median(values), rel=1e-12)
        assert (bucket["min"], bucket["max"]) == (min(values), max(values))


@pytest.mark.parametrize(
    ("url", "status", "words"),
    [
        ("/api/v1/results?target=atlantis", 404, "unknown target 'atlantis'"),
        ("/api/v1/targets/atlantis", 404, "unknown target"),
        ("/targets/atlantis", 404, "unknown target"),
        ("/aggregate/atlantis", 404, "unknown target"),
        ("/api/v1/aggregates?target=atlantis&metric=ping.rtt_avg_ms", 404, "unknown target"),
        ("/api/v1/results?since=yesterday", 422, "query.since"),
        ("/api/v1/results?until=2026-13-45", 422, "query.until"),
        ("/api/v1/results?limit=0", 422, "query.limit"),
        ("/api/v1/results?offset=-1", 422, "query.offset"),
        ("/api/v1/results?probe=smoke", 422, "query.probe"),
        ("/api/v1/results?outcome=meh", 422, "query.outcome"),
        ("/api/v1/aggregates?target=cern-1&metric=ping.nope", 422, "query.metric"),
        ("/api/v1/aggregates?target=cern-1&metric=ping.rtt_avg_ms&period=decade", 422, "period"),
        ("/api/v1/results?since=0001-01-01T00:00:00%2B14:00", 422, "out of range"),
        ("/targets/cern-1?until=0001-01-02", 422, "out of range"),
        ("/?until=9999-12-31T23:59:59", 422, "until: 9999-12-31T23:59:59+00:00 is out of range"),
        ("/tables/paths?until=9999-12-31T23:59:59", 422, "out of range"),
        ("/api/v1/results?until=9999-12-31T23:59:59", 422, "out of range"),
        ("/api/v1/alerts?since=9999-12-31T23:59:59.999999", 422, "out of range"),
        ("/api/v1/latest?since=0001-01-01T00:00:00-14:00", 422, "out of range"),
        ("/compare?mode=time", 422, "give target="),
        ("/compare?x=ping.bogus", 422, "query.x"),
        ("/targets/cern-1/tables/nope", 404, "no table 'nope'"),
        ("/aggregate/cern-1?view=fortnight", 422, "query.view"),
        ("/api/v1/alerts?target=atlantis", 404, "unknown target"),
        ("/api/v1/alerts?limit=0", 422, "query.limit"),
        ("/api/v1/alerts?until=noon", 422, "query.until"),
        ("/api/v1/studies?target=atlantis", 404, "unknown target"),
        ("/api/v1/studies?offset=x", 422, "query.offset"),
    ],
)
def test_bad_input_is_a_4xx_with_a_message(
    client: TestClient, url: str, status: int, words: str
) -> None:
    response = client.get(url)
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]


# -- pages' tables ---------------------------------------------------------------------------


def test_target_statistics_equal_independent_ones(client: TestClient, archive: Archive) -> None:
    rows = {r["metric"]: r for r in csv_rows(client, f"/targets/cern-1/tables/stats?until={END}")}
    page = client.get(f"/targets/cern-1?until={END}").text
    for metric, probe, key in [
        ("ping.rtt_avg_ms", "ping", "rtt_avg_ms"),
        ("iperf3.throughput_bps", "iperf3", "throughput_bps"),
        ("ping.loss_percent", "ping", "loss_percent"),
    ]:
        values = ok_values(archive, probe, "cern-1", key, "slac-mon")
        p25, _median, p75 = statistics.quantiles(values, n=4, method="inclusive")
        expected = {
            "median": statistics.median(values),
            "p25": p25,
            "p75": p75,
            "iqr": p75 - p25,
            "mean": statistics.fmean(values),
            "stdev": statistics.stdev(values),
            "count": len(values),
        }
        row = rows[metric]
        for name, value in expected.items():
            assert row[name] == format_number(float(value)) or row[name] == str(value), name
            # The page shows the very same numbers: those in the metric's unit written for
            # people, with the download's text on the cell; counts as they are.
            shown = human(float(row[name]), metric) if name != "count" else None
            cell = (
                f'<td data-value="{row[name]}">{shown}</td>' if shown else f"<td>{row[name]}</td>"
            )
            assert cell in page, cell
    runs = list(archive.results(probe="iperf3", target="kek-3", since=WINDOW, until=data.END))
    kek = {r["metric"]: r for r in csv_rows(client, f"/targets/kek-3/tables/stats?until={END}")}
    rate = sum(r.succeeded for r in runs) / len(runs)
    assert kek["iperf3.throughput_bps"]["success_rate"] == format_number(rate)
    assert kek["iperf3.throughput_bps"]["runs"] == str(len(runs))


def test_route_change_is_an_event(client: TestClient) -> None:
    rows = csv_rows(client, f"/targets/cern-1/tables/routes?until={END}")
    changes = [r for r in rows if r["changed"] == "1"]
    assert len(changes) == 1
    assert changes[0]["started_at"] >= format_time(data.ROUTE_CHANGE)
    assert changes[0]["route"] == "192.0.2.1 198.51.100.99 198.51.100.100 * 203.0.113.9"
    assert not [
        r
        for r in csv_rows(client, f"/targets/bnl-2/tables/routes?until={END}")
        if r["changed"] == "1"
    ]


def test_histogram_and_cdf_cover_every_successful_run(client: TestClient, archive: Archive) -> None:
    thr = ok_values(archive, "iperf3", "cern-1", "throughput_bps", "slac-mon")
    hist = csv_rows(client, f"/targets/cern-1/tables/throughput_histogram?until={END}")
    assert sum(int(r["count"]) for r in hist) == len(thr)
    assert float(hist[0]["bin_low_bps"]) == pytest.approx(min(thr), rel=1e-5)
    rtt = ok_values(archive, "ping", "cern-1", "rtt_avg_ms", "slac-mon")
    cdf = csv_rows(client, f"/targets/cern-1/tables/rtt_cdf?until={END}")
    assert len(cdf) == len(rtt) and cdf[-1]["fraction"] == "1"


def test_overview_share_better_and_outcome_counts(client: TestClient, archive: Archive) -> None:
    rows = csv_rows(client, f"/tables/paths?until={END}")
    got = {(r["monitor"], r["target"], r["metric"]): r for r in rows}
    for target, key, better in [
        ("cern-1", "throughput_bps", "higher"),
        ("kek-3", "rtt_avg_ms", "lower"),
    ]:
        probe = "iperf3" if key == "throughput_bps" else "ping"
        runs = list(
            archive.results(
                probe=probe,
                target=target,
                monitor="slac-mon",
                since=data.END - timedelta(days=28),
                until=data.END + timedelta(minutes=5),
            )
        )
        history = [r.data[key] for r in runs if r.succeeded]
        latest = runs[-1]
        row = got[("slac-mon", target, f"{probe}.{key}")]
        assert row["outcome"] == latest.outcome.value
        if latest.succeeded:
            value = latest.data[key]
            n_better = sum((v > value) if better == "higher" else (v < value) for v in history)
            assert row["share_better"] == format_number(n_better / len(history))
            assert row["value"] == format_number(value)
        assert row["count_28d"] == str(len(history))
    outcomes = {
        (r["monitor"], r["probe"]): r for r in csv_rows(client, f"/tables/outcomes?until={END}")
    }
    counts = Counter(
        (r.monitor, r.probe, r.outcome.value)
        for r in archive.results(since=data.END - timedelta(days=28), until=data.END)
    )
    for (monitor, probe, outcome), n in counts.items():
        assert outcomes[(monitor, probe)][outcome] == str(n)
    page = client.get(f"/?until={END}").text
    assert 'class="chip failed"' in page or 'class="chip good"' in page
    assert "kek-3" in page and "fnal-mon" in page


def test_compare_fit_through_origin(client: TestClient, archive: Archive) -> None:
    # Through the origin when asked for (the default no longer assumes y grows with x).
    url = f"/compare/tables/points?x=ping.rtt_avg_ms&y=iperf3.throughput_bps&until={END}&fit=origin"
    points = csv_rows(client, url)
    expected = {}
    for target, monitor in [
        ("bnl-2", "fnal-mon"),
        ("bnl-2", "slac-mon"),
        ("cern-1", "slac-mon"),
        ("kek-3", "slac-mon"),
    ]:
        x = statistics.median(ok_values(archive, "ping", target, "rtt_avg_ms", monitor))
        y = statistics.median(ok_values(archive, "iperf3", target, "throughput_bps", monitor))
        expected[f"{target} ({monitor})"] = (x, y)
    assert {p["point"] for p in points} == set(expected)
    xs = [v[0] for v in expected.values()]
    ys = [v[1] for v in expected.values()]
    slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    mean_y = statistics.fmean(ys)
    r2 = 1 - sum((y - slope * x) ** 2 for x, y in zip(xs, ys, strict=True)) / sum(
        (y - mean_y) ** 2 for y in ys
    )
    fit = csv_rows(client, url.replace("/points", "/fit"))[0]
    assert float(fit["slope"]) == pytest.approx(slope, rel=1e-5)
    assert float(fit["r_squared"]) == pytest.approx(r2, rel=1e-5, abs=1e-6)
    page = client.get(url.replace("/compare/tables/points", "/compare")).text
    assert f"R² = {r2:.3f}" in page
    pairs = csv_rows(
        client,
        f"/compare/tables/points?x=ping.rtt_avg_ms&y=ping.loss_percent"
        f"&mode=time&target=kek-3&until={END}",
    )
    assert len(pairs) > 300


def test_monthly_table_equals_independent_figures(client: TestClient, archive: Archive) -> None:
    rows = csv_rows(client, f"/aggregate/kek-3/tables/monthly?view=monthly&until={END}")
    month = rows[-1]
    assert month["month"] == "2026-11"
    start = datetime(2026, 11, 1, tzinfo=UTC)
    pings = [
        r
        for r in archive.results(probe="ping", target="kek-3", since=start, until=data.END)
        if r.succeeded
    ]
    iperfs = [
        r.data["throughput_bps"]
        for r in archive.results(probe="iperf3", target="kek-3", since=start, until=data.END)
        if r.succeeded
    ]
    assert month["rtt_min_ms"] == format_number(min(r.data["rtt_min_ms"] for r in pings))
    assert month["rtt_max_ms"] == format_number(max(r.data["rtt_max_ms"] for r in pings))
    assert month["rtt_avg_ms"] == format_number(
        statistics.fmean(r.data["rtt_avg_ms"] for r in pings)
    )
    assert month["loss_percent_avg"] == format_number(
        statistics.fmean(r.data["loss_percent"] for r in pings)
    )
    assert month["throughput_bps_avg"] == format_number(statistics.fmean(iperfs))
    assert month["iperf3_count"] == str(len(iperfs))


@pytest.mark.parametrize("view", ["last7", "weekly", "daily", "weekday", "workday", "monthly"])
def test_every_aggregation_view_renders(client: TestClient, view: str) -> None:
    response = client.get(f"/aggregate/cern-1?view={view}&until={END}")
    assert response.status_code == 200
    assert 'class="chart-spec"' in response.text


def test_weekday_view_means(client: TestClient, archive: Archive) -> None:
    rows = csv_rows(
        client, f"/aggregate/bnl-2/tables/weekday?view=weekday&monitor=slac-mon&until={END}"
    )
    quarter = datetime(2026, 10, 1, tzinfo=UTC)
    cells: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in archive.results(
        probe="ping", target="bnl-2", monitor="slac-mon", since=quarter, until=data.END
    ):
        if r.succeeded:
            t = r.started_at.astimezone(UTC)
            cells[(t.hour, t.weekday())].append(r.data["rtt_avg_ms"])
    names = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    for row in rows:
        for d, name in enumerate(names):
            values = cells.get((int(row["hour_utc"]), d))
            assert row[name] == (format_number(statistics.fmean(values)) if values else "")


def test_tsv_download_documents_its_columns(client: TestClient) -> None:
    text = client.get(f"/targets/cern-1/tables/iperf3?format=tsv&until={END}").text
    lines = text.splitlines()
    assert lines[0].startswith("# iepm iperf3 results: target=cern-1 monitor=slac-mon")
    assert "# throughput_bps: receiver-side throughput, bit/s" in lines
    header = next(line for line in lines if not line.startswith("#"))
    # Every metric the iperf3 probe declares, in its order (the probe registry's).
    assert header.split("\t") == [
        "started_at",
        "outcome",
        "throughput_bps",
        "retransmits",
        "mean_rtt_ms",
        "window_bytes",
        "stream_count",
    ]


def test_host_facts_from_latest_load(client: TestClient) -> None:
    facts = {r["fact"]: r["value"] for r in csv_rows(client, "/targets/cern-1/tables/host_facts")}
    assert facts["kernel_release"] == "6.1.0-18-amd64"
    assert facts["tcp_rmem_bytes"] == "4096 131072 67108864"
    assert facts["nic eth0"] == "mtu_bytes=9000, operstate=up, speed_mbps=10000"
    real = {
        r["fact"]: r["value"] for r in csv_rows(client, f"/targets/{LOOPBACK}/tables/host_facts")
    }
    assert int(real["cpu_count"]) >= 1


# -- /metrics --------------------------------------------------------------------------------


def test_metrics_in_base_units(client: TestClient, archive: Archive) -> None:
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    latest_ping = archive.latest("ping", "cern-1")
    latest_iperf = archive.latest("iperf3", "bnl-2")
    assert latest_ping is not None and latest_iperf is not None
    path = (("monitor", "slac-mon"), ("target", "cern-1"))
    assert samples[("iepm_ping_rtt_avg_seconds", path)] == pytest.approx(
        latest_ping.data["rtt_avg_ms"] / 1000
    )
    assert samples[("iepm_ping_loss_ratio", path)] == pytest.approx(
        latest_ping.data["loss_percent"] / 100
    )
    bnl = (("monitor", latest_iperf.monitor), ("target", "bnl-2"))
    assert samples[("iepm_iperf3_throughput_bits_per_second", bnl)] == pytest.approx(
        latest_iperf.data["throughput_bps"]
    )
    counts = Counter((r.monitor, r.probe, r.outcome.value) for r in archive.results())
    for (monitor, probe, outcome), n in counts.items():
        key = ("iepm_runs_total", (("monitor", monitor), ("outcome", outcome), ("probe", probe)))
        assert samples[key] == n
    assert samples[("iepm_cycle_overruns_total", (("monitor", "slac-mon"),))] == 2
    assert samples[("iepm_cycles_total", (("monitor", "slac-mon"),))] == len(data.cycles())
    stamp = (
        "iepm_last_result_timestamp_seconds",
        (("monitor", "slac-mon"), ("probe", "ping"), ("target", "cern-1")),
    )
    assert samples[stamp] == pytest.approx(latest_ping.started_at.timestamp())


def test_openapi_documents_the_api(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in [
        "/api/v1/targets",
        "/api/v1/results",
        "/api/v1/latest",
        "/api/v1/aggregates",
        "/metrics",
    ]:
        assert path in spec["paths"]
    params = {p["name"] for p in spec["paths"]["/api/v1/results"]["get"]["parameters"]}
    assert {"probe", "target", "since", "until", "outcome", "limit", "offset"} <= params


# -- alerts and studies (tables written by the analysis and tuning layers) -------------------


def alert_rows(archive: Archive) -> list[dict[str, object]]:
    from iepm.store import schema

    with archive.reading("reading alerts") as conn:
        return [dict(r._mapping) for r in conn.execute(schema.alerts.select())]


def test_alerts_api_filters_and_pages(client: TestClient, archive: Archive) -> None:
    stored = alert_rows(archive)
    body = client.get("/api/v1/alerts").json()
    assert body["total"] == len(stored) == 3
    newest_first = sorted(stored, key=lambda r: r["detected_at"], reverse=True)  # type: ignore
    assert [a["id"] for a in body["alerts"]] == [r["id"] for r in newest_first]
    kek = client.get("/api/v1/alerts?target=kek-3&limit=1&offset=1").json()
    assert kek["total"] == 2 and [a["cause"] for a in kek["alerts"]] == ["host"]
    since = format_time(data.END - timedelta(days=28))
    recent = client.get(f"/api/v1/alerts?since={since}&cause=unknown").json()
    assert [a["id"] for a in recent["alerts"]] == ["alert-2"]
    assert recent["alerts"][0]["change_percent"] == -33.3
    bad = client.get("/api/v1/alerts?since=yesterday")
    assert bad.status_code == 422 and "query.since" in bad.json()["detail"]


def test_alerts_on_overview_and_target_page(client: TestClient, archive: Archive) -> None:
    window = data.END - timedelta(days=28)
    recent = [r for r in alert_rows(archive) if r["detected_at"] >= window]  # type: ignore
    rows = csv_rows(client, f"/tables/alerts?until={END}")
    assert sorted(r["target"] for r in rows) == sorted(str(r["target"]) for r in recent)
    page = client.get(f"/?until={END}").text
    assert 'id="table-alerts"' in page and "route" in page
    cern = csv_rows(client, f"/targets/cern-1/tables/alerts?until={END}")
    assert [(r["metric"], r["cause"], r["after"]) for r in cern] == [
        ("ping.rtt_avg_ms", "route", "163.5")
    ]
    studies = csv_rows(client, f"/targets/cern-1/tables/studies?until={END}")
    assert [(r["kind"], r["partial"], r["points"]) for r in studies] == [
        ("duration", "1", "1"),
        ("sweep", "0", "4"),
    ]
    assert "window=4M" in studies[1]["summary"]
    api = client.get("/api/v1/studies?target=cern-1&kind=sweep").json()
    assert api["total"] == 1 and api["studies"][0]["summary"] == {"window": "4M", "streams": 4}


def test_metrics_count_alerts_by_cause(client: TestClient, archive: Archive) -> None:
    text = client.get("/metrics").text
    samples = {
        s.labels["cause"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "iepm_alerts"
        for s in family.samples
    }
    assert samples == dict(Counter(str(r["cause"]) for r in alert_rows(archive)))


def test_target_weekly_means_equal_independent_ones(client: TestClient, archive: Archive) -> None:
    weeks: dict[datetime, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in archive.results(target="kek-3", monitor="slac-mon", until=data.END):
        if r.probe not in ("ping", "iperf3") or not r.succeeded:
            continue
        day = r.started_at.replace(hour=0, minute=0, second=0, microsecond=0)
        monday = day - timedelta(days=day.weekday())
        for key in ("rtt_avg_ms", "loss_percent", "throughput_bps"):
            if key in r.data:
                weeks[monday][key].append(r.data[key])
    rows = csv_rows(client, f"/targets/kek-3/tables/weekly?until={END}")
    assert [r["period_start"] for r in rows] == [format_time(w) for w in sorted(weeks)]
    for row, week in zip(rows, sorted(weeks), strict=True):
        got = weeks[week]
        assert row["ping_count"] == str(len(got["rtt_avg_ms"]))
        assert row["iperf3_count"] == str(len(got["throughput_bps"]))
        assert float(row["rtt_avg_ms_mean"]) == pytest.approx(
            statistics.fmean(got["rtt_avg_ms"]), rel=1e-5
        )
        assert float(row["throughput_bps_mean"]) == pytest.approx(
            statistics.fmean(got["throughput_bps"]), rel=1e-5
        )


def chart_specs(html: str) -> dict[str, dict[str, Any]]:
    pattern = r'<script type="application/json" class="chart-spec"[^>]*>(.*?)</script>'
    found = re.findall(pattern, html)
    return {spec["id"]: spec for spec in map(json.loads, found)}


def test_alerts_are_marked_on_the_charts_of_their_metric(
    client: TestClient, archive: Archive
) -> None:
    rows: dict[Any, Any] = {a["id"]: a for a in alert_rows(archive)}
    kek = chart_specs(client.get(f"/targets/kek-3?monitor=slac-mon&until={END}").text)
    # The drop 4 days ago is marked on the throughput chart; the one 40 days ago is outside it.
    assert [a["t"] for a in kek["throughput"]["alerts"]] == [
        rows["alert-2"]["change_at"].timestamp()
    ]
    assert kek["throughput"]["alerts"][0]["label"] == "iperf3.throughput_bps down: unknown"
    assert kek["rtt"]["alerts"] == [] and kek["loss"]["alerts"] == []
    cern = chart_specs(client.get(f"/targets/cern-1?monitor=slac-mon&until={END}").text)
    assert [a["t"] for a in cern["rtt"]["alerts"]] == [rows["alert-1"]["change_at"].timestamp()]
    assert cern["throughput"]["alerts"] == []
