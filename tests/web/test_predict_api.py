"""Predictions served per path: ``/api/v1/forecast``, ``/api/v1/diurnal``, ``/api/v1/advice``,
the target page's forecast panel and ``/forecasts`` (Table 1), on the seeded web archive
(tests/web/data.py: levels known per target) and on a copy with study runs and tuned
parameters added."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from iepm.results import Purpose, format_time
from iepm.store import Archive
from iepm.tuned import save_tuned
from iepm.web.app import create_app
from tests.web import data

UNTIL = format_time(data.END)
LEVEL = {t: thr for t, (_rtt, thr, _loss) in data.TARGETS.items()}


def get(client: TestClient, url: str, **query: object) -> dict:
    res = client.get(url, params={"until": UNTIL, **query})
    assert res.status_code == 200, res.text
    return res.json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("target", sorted(data.TARGETS))
def test_forecast_of_every_path_lies_in_its_level_with_an_interval(
    client: TestClient, archive: Archive, target: str
) -> None:
    body = get(client, "/api/v1/forecast", target=target, metric="iperf3.throughput_bps")
    # The archive's routine, successful iperf3 runs of the 28 days before until.
    since = data.END - timedelta(days=28)
    expected = archive.count(
        probe="iperf3", target=target, monitor=body["monitor"], since=since, until=data.END,
        outcome="ok",
    )  # fmt: skip
    assert body["samples"] == expected > 300
    assert body["metric"] == "iperf3.throughput_bps" and body["probe"] == "iperf3"
    assert body["monitor"] == ("fnal-mon" if target == "bnl-2" else "slac-mon")
    assert body["horizon_s"] == 3600 and body["coverage"] == 0.8
    now, ahead = body["now"], body["ahead"]
    assert now["at"] == "2026-11-20T12:00:00Z" and ahead["at"] == "2026-11-20T13:00:00Z"
    # Throughput is the level × U(0.6, 1.05): forecasts between, intervals around them.
    for f in (now, ahead):
        assert 0.6 * LEVEL[target] < f["lower"] < f["value"] < f["upper"] < 1.2 * LEVEL[target]
        assert f["method"] in ("median5", "levelshift", "levelmode", "levelrel")
    recent = body["recent_error"]
    assert recent["forecasts"] == 50
    assert 0.05 < recent["mean_relative_error"] < 0.3
    assert 0.6 <= recent["coverage"] <= 1.0


def test_forecast_by_key_with_probe_per_monitor_and_horizon(client: TestClient) -> None:
    a = get(client, "/api/v1/forecast", target="bnl-2", metric="rtt_avg_ms", monitor="slac-mon")
    b = get(client, "/api/v1/forecast", target="bnl-2", metric="rtt_avg_ms", monitor="fnal-mon")
    assert (a["monitor"], b["monitor"]) == ("slac-mon", "fnal-mon")
    assert a["metric"] == "ping.rtt_avg_ms" and a["last_at"] != b["last_at"]
    for body in (a, b):
        assert 70 < body["now"]["lower"] < body["now"]["value"] < body["now"]["upper"] < 80
    # A key several probes have is the one measured on the target.
    c = get(client, "/api/v1/forecast", target="kek-3", metric="throughput_bps", horizon="2d")
    assert c["metric"] == "iperf3.throughput_bps" and c["horizon_s"] == 2 * 86400
    assert c["ahead"]["at"] == "2026-11-22T12:00:00Z"
    d = get(client, "/api/v1/forecast", target="kek-3", metric="throughput_bps", probe="iperf3")
    assert d["now"] == c["now"]


@pytest.mark.parametrize(
    ("query", "status", "detail"),
    [
        ({"target": "nope", "metric": "rtt_avg_ms"}, 404, "unknown target 'nope'"),
        ({"target": "cern-1", "metric": "vm"}, 422, "query.metric: unknown metric 'vm' (known:"),
        (
            {"target": "cern-1", "metric": "iperf3.throughput_bps", "probe": "ping"},
            422,
            "query.metric: metric 'iperf3.throughput_bps' is not of probe 'ping'",
        ),
        ({"target": "cern-1", "metric": "rtt_avg_ms", "horizon": "2w"}, 422, "query.horizon:"),
        (
            {"target": "cern-1", "metric": "rtt_avg_ms", "horizon": "31d"},
            422,
            "query.horizon: '31d' is beyond 30 days",
        ),
        ({"target": "cern-1"}, 422, "query.metric: Field required"),
        (
            {"target": "cern-1", "metric": "rtt_avg_ms", "monitor": "fnal-mon"},
            404,
            "monitor 'fnal-mon' has no results for target 'cern-1'",
        ),
        (
            {"target": "cern-1", "metric": "rtt_avg_ms", "since": "2026-11-20T07:00:00Z"},
            404,
            "only 3 sample(s) of ping.rtt_avg_ms on slac-mon → cern-1; at least 6 are needed",
        ),
    ],
)
def test_forecast_errors_name_the_field(
    client: TestClient, query: dict[str, str], status: int, detail: str
) -> None:
    res = client.get("/api/v1/forecast", params={"until": UNTIL, **query})
    assert res.status_code == status, res.text
    assert res.json()["detail"].startswith(detail), res.json()


def test_diurnal_fit_per_path_weekdays_and_weekends(client: TestClient) -> None:
    body = get(client, "/api/v1/diurnal", target="cern-1", metric="iperf3.throughput_bps")
    fc = get(client, "/api/v1/forecast", target="cern-1", metric="iperf3.throughput_bps")
    assert body["monitor"] == "slac-mon" and body["utc_offset_hours"] == 0
    assert body["since"] == "2026-10-23T12:00:00Z" and body["until"] == "2026-11-20T12:00:00Z"
    days = body["weekdays"], body["weekends"]
    assert days[0]["n"] + days[1]["n"] == fc["samples"]
    for fit in days:
        # Uniform noise with no daily cycle: the level is found, the path is not diurnal.
        assert 0.75 * LEVEL["cern-1"] < fit["c"] < 0.9 * LEVEL["cern-1"]
        assert fit["diurnal"] is False and fit["delta_b"] > 0.2
        assert set(fit) >= {"a", "b", "c", "delta_b", "peak_hour", "rmse", "simple_rmse"}
    res = client.get("/api/v1/diurnal", params={"target": "cern-1", "metric": "x"})
    assert res.status_code == 422 and res.json()["detail"].startswith("query.metric:")
    res = client.get(
        "/api/v1/diurnal", params={"target": "cern-1", "metric": "rtt_avg_ms", "utc_offset": 15}
    )
    assert res.status_code == 422 and "query.utc_offset" in res.json()["detail"]


def test_advice_ranks_replicas_by_expected_throughput(client: TestClient) -> None:
    body = get(
        client,
        "/api/v1/advice",
        destination=["kek-3", "cern-1", "bnl-2"],
        horizon="6h",
    )
    ranked = [(c["rank"], c["target"], c["monitor"]) for c in body["candidates"]]
    # bnl-2 (900 Mbit/s, from both monitors), then cern-1 (450), then kek-3 (120).
    assert [t for _r, t, _m in ranked] == ["bnl-2", "bnl-2", "cern-1", "kek-3"]
    assert [r for r, _t, _m in ranked] == [1, 2, 3, 4]
    values = [c["ahead"]["value"] for c in body["candidates"]]
    assert values == sorted(values, reverse=True)
    assert body["metric"] == "iperf3.throughput_bps" and body["horizon_s"] == 6 * 3600
    cern = next(c for c in body["candidates"] if c["target"] == "cern-1")
    assert cern["ahead"]["at"] == "2026-11-20T18:00:00Z"
    # No study chose parameters here: the latest run's (the seed: 4 streams on cern-1; the
    # window alternates by day, 4 MiB on odd days; the last run was on the 20th).
    assert cern["tuning"] == {"source": "last_run", "window": 2 * 1024 * 1024, "streams": 4}
    assert body["skipped"] == []
    one = get(client, "/api/v1/advice", destination="bnl-2", source=["fnal-mon", "slac-mon"])
    assert {c["monitor"] for c in one["candidates"]} == {"fnal-mon", "slac-mon"}
    res = get(client, "/api/v1/advice", destination="cern-1", source="fnal-mon")
    assert res["candidates"] == []
    assert res["skipped"] == [
        {
            "target": "cern-1",
            "monitor": "fnal-mon",
            "reason": "no routine iperf3 results on this path",
        }
    ]
    bad = client.get("/api/v1/advice", params={"destination": "nope"})
    assert bad.status_code == 404 and "unknown target 'nope'" in bad.json()["detail"]
    bad = client.get("/api/v1/advice")
    assert bad.status_code == 422
    assert bad.json()["detail"] == "query.destination: give at least one candidate target"


@pytest.fixture(scope="module")
def studied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The seeded archive with 10 Gbit/s study runs on cern-1 and a tuned choice for it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('studied') / 'archive.db'}"
    study_runs = [
        r.model_copy(
            update={
                "purpose": Purpose.STUDY,
                "data": {**r.data, "throughput_bps": 10e9},
                "started_at": r.started_at + timedelta(minutes=5),
                "raw_token": f"study-{i}",
            }
        )
        for i, r in enumerate(data.results())
        if r.probe == "iperf3" and r.target == "cern-1" and r.started_at > data.END - timedelta(2)
    ]
    with data.fill(url, extra=study_runs) as archive:
        save_tuned(
            archive,
            monitor="slac-mon",
            target="cern-1",
            probe="iperf3",
            params={"window": "8M", "streams": 8},
        )
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        yield client


def test_study_runs_never_enter_a_forecast_and_tuned_parameters_are_advised(
    client: TestClient, studied: TestClient
) -> None:
    plain = get(client, "/api/v1/forecast", target="cern-1", metric="iperf3.throughput_bps")
    body = get(studied, "/api/v1/forecast", target="cern-1", metric="iperf3.throughput_bps")
    assert body["samples"] == plain["samples"] and body["now"] == plain["now"]
    assert body["now"]["upper"] < 1e9
    advice = get(studied, "/api/v1/advice", destination="cern-1")
    (cern,) = advice["candidates"]
    assert cern["tuning"] == {"source": "tuned", "window": "8M", "streams": 8}


def test_target_page_shows_the_forecast_and_diurnal_fit_the_api_gives(
    client: TestClient,
) -> None:
    page = client.get("/targets/cern-1", params={"until": UNTIL})
    assert page.status_code == 200
    assert 'id="table-forecast"' in page.text and 'id="table-diurnal"' in page.text
    assert 'id="chart-forecast-throughput_bps"' in page.text
    api = get(client, "/api/v1/forecast", target="cern-1", metric="iperf3.throughput_bps")
    fit = get(client, "/api/v1/diurnal", target="cern-1", metric="iperf3.throughput_bps")
    res = client.get("/targets/cern-1/tables/forecast", params={"until": UNTIL})
    rows = {r["metric"]: r for r in csv.DictReader(io.StringIO(res.text))}
    assert set(rows) == {"ping.rtt_avg_ms", "iperf3.throughput_bps"}
    row = rows["iperf3.throughput_bps"]
    assert int(row["samples"]) == api["samples"]
    for name, key in (("forecast", "value"), ("lower", "lower"), ("upper", "upper")):
        assert float(row[name]) == pytest.approx(api["now"][key], rel=1e-5)
    assert row["method"] == api["now"]["method"]
    assert float(row["recent_coverage_percent"]) == pytest.approx(
        100 * api["recent_error"]["coverage"]
    )
    res = client.get("/targets/cern-1/tables/diurnal", params={"until": UNTIL})
    fits = {(r["metric"], r["days"]): r for r in csv.DictReader(io.StringIO(res.text))}
    weekdays = fits[("iperf3.throughput_bps", "weekdays")]
    assert int(weekdays["n"]) == fit["weekdays"]["n"]
    assert float(weekdays["c"]) == pytest.approx(fit["weekdays"]["c"], rel=1e-5)
    assert weekdays["diurnal"] == "0"


def test_forecasts_page_table_1_per_host_and_probe_with_csv(client: TestClient) -> None:
    page = client.get("/forecasts", params={"until": UNTIL, "window": "7d"})
    assert page.status_code == 200
    assert "Forecast error per host × probe" in page.text
    assert 'href="/forecasts/tables/forecast_error_matrix?format=csv' in page.text
    res = client.get(
        "/forecasts/tables/forecast_error_matrix",
        params={"until": UNTIL, "window": "7d", "format": "csv"},
    )
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/csv")
    assert 'filename="forecasts-forecast_error_matrix.csv"' in res.headers["content-disposition"]
    matrix = list(csv.DictReader(io.StringIO(res.text)))
    assert [(r["monitor"], r["target"]) for r in matrix] == [
        ("fnal-mon", "bnl-2"),
        ("slac-mon", "bnl-2"),
        ("slac-mon", "cern-1"),
        ("slac-mon", "kek-3"),
    ]
    # The seeds' Table 1: the transfer probes' rates (here iperf3's), not RTTs.
    assert list(matrix[0]) == ["monitor", "target", "iperf3.throughput_bps_error_percent"]
    for r in matrix:
        # Uniform noise of ±22% about the mean: a mean relative error of 10–20%.
        assert 8 < float(r["iperf3.throughput_bps_error_percent"]) < 22
    res = client.get(
        "/forecasts/tables/forecast_errors",
        params={"until": UNTIL, "window": "7d", "format": "csv"},
    )
    detail = list(csv.DictReader(io.StringIO(res.text)))
    assert len(detail) == 4
    for r in detail:
        assert int(r["forecasts"]) in range(100, 113)  # 7 days of 90-minute runs
        assert 60 <= float(r["coverage_percent"]) <= 95
        assert float(r["ma5_mean_error_percent"]) > 0 and float(r["ewma_mean_error_percent"]) > 0
        assert r["methods_chosen"]
    kek = next(r for r in detail if r["target"] == "kek-3")
    matrix_kek = next(r for r in matrix if r["target"] == "kek-3")
    assert kek["mean_error_percent"] == matrix_kek["iperf3.throughput_bps_error_percent"]
    res = client.get("/forecasts/tables/nope", params={"until": UNTIL})
    assert res.status_code == 404 and "no table 'nope'" in res.json()["detail"]
    res = client.get("/forecasts", params={"window": "3d"})
    assert res.status_code == 422 and "query.window" in res.json()["detail"]


def test_openapi_documents_the_prediction_endpoints(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path, params in (
        ("/api/v1/forecast", {"target", "metric", "probe", "horizon", "monitor", "since", "until"}),
        ("/api/v1/diurnal", {"target", "metric", "probe", "monitor", "utc_offset"}),
        ("/api/v1/advice", {"destination", "source", "metric", "horizon", "until"}),
    ):
        documented = {p["name"] for p in paths[path]["get"]["parameters"]}
        assert documented >= params, path
        assert {"200", "404", "422"} <= set(paths[path]["get"]["responses"]), path
