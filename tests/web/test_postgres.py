"""The same archive on PostgreSQL serves the same figures as on SQLite (the JSON extraction and
aggregation SQL differ per dialect)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from iepm.results import format_time
from iepm.web.app import create_app
from testkit.pg import PgServer, pg_server  # noqa: F401
from tests.web import data

pytestmark = [pytest.mark.pg, pytest.mark.servers]
END = format_time(data.END)
URLS = [
    f"/tables/paths?until={END}",
    f"/tables/outcomes?until={END}",
    "/tables/cycles",
    f"/targets/cern-1/tables/stats?until={END}",
    f"/targets/cern-1/tables/routes?until={END}",
    f"/targets/kek-3/tables/weekly?until={END}",
    f"/tables/route_links?until={END}",
    f"/tables/alerts?until={END}",
    "/api/v1/alerts",
    f"/targets/kek-3/tables/throughput_histogram?until={END}",
    f"/aggregate/kek-3/tables/monthly?view=monthly&until={END}",
    f"/aggregate/bnl-2/tables/weekday?view=weekday&monitor=slac-mon&until={END}",
    f"/compare/tables/fit?until={END}",
    f"/api/v1/aggregates?target=cern-1&metric=iperf3.throughput_bps&period=week&until={END}",
    "/api/v1/results?target=kek-3&outcome=skipped&limit=5",
]


@pytest.fixture(scope="module")
def pg_client(pg_server: PgServer) -> Iterator[TestClient]:  # noqa: F811
    name = f"iepm_web_{uuid.uuid4().hex[:12]}"
    url = pg_server.create_database(name)
    data.fill(url).close()
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        yield client


@pytest.fixture(scope="module")
def sqlite_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path_factory.mktemp('web-pg') / 'archive.db'}"
    data.fill(url).close()
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        yield client


@pytest.mark.parametrize("url", URLS)
def test_same_figures_on_both_backends(
    pg_client: TestClient, sqlite_client: TestClient, url: str
) -> None:
    on_pg, on_sqlite = pg_client.get(url), sqlite_client.get(url)
    assert on_pg.status_code == on_sqlite.status_code == 200, on_pg.text
    if url.startswith("/api/v1/results"):
        # Same content; the ids are random per fill.
        strip = [
            {k: v for k, v in r.items() if k not in ("id", "raw_token")}
            for r in on_pg.json()["results"]
        ]
        assert strip == [
            {k: v for k, v in r.items() if k not in ("id", "raw_token")}
            for r in on_sqlite.json()["results"]
        ]
    else:
        assert on_pg.text == on_sqlite.text


def test_metrics_on_postgres(pg_client: TestClient) -> None:
    text = pg_client.get("/metrics").text
    assert 'iepm_cycle_overruns_total{monitor="slac-mon"} 2.0' in text
