"""Runs of tuning and impact studies are kept beside a path's routine series and never enter
what the web app shows of it: charts, statistics, the overview, /metrics (store.filters)."""

from __future__ import annotations

import csv
import io
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from iepm.export import format_number
from iepm.results import Purpose, format_time
from iepm.store import Archive
from iepm.web.app import create_app
from tests.web import data

END = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def test_study_runs_stay_out_of_the_routine_views(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    rng = random.Random(3)
    routine = [
        data._iperf3(rng, "slac-mon", "bnl-2", END - timedelta(hours=10 - i)) for i in range(8)
    ]
    # The sweep's transfer: the newest run, at ten times the path's usual throughput.
    study = data._iperf3(rng, "slac-mon", "bnl-2", END - timedelta(minutes=30)).model_copy(
        update={"purpose": Purpose.STUDY}
    )
    study.data["throughput_bps"] = 9e9
    with Archive.open(url) as archive:
        archive.add_many([*routine, study])
    until = format_time(END)
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        stats = client.get(f"/targets/bnl-2/tables/stats?until={until}").text
        rows = {r["metric"]: r for r in csv.DictReader(io.StringIO(stats))}
        assert rows["iperf3.throughput_bps"]["runs"] == "8"
        assert float(rows["iperf3.throughput_bps"]["mean"]) < 1e9
        runs = client.get(f"/targets/bnl-2/tables/iperf3?until={until}").text
        assert len(runs.splitlines()) == 1 + 8
        grid = client.get(f"/tables/paths?until={until}").text
        (cell,) = [r for r in csv.DictReader(io.StringIO(grid)) if r["metric"].endswith("_bps")]
        assert cell["value"] == format_number(routine[-1].data["throughput_bps"])
        metrics = client.get("/metrics").text
        assert "9e+09" not in metrics and "9000000000" not in metrics
        listed = client.get("/api/v1/results?probe=iperf3").json()
        assert listed["total"] == 8
        studies = client.get("/api/v1/results?probe=iperf3&purpose=study").json()
        assert [r["id"] for r in studies["results"]] == [study.id]
