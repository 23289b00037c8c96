"""The estimator normalised by iperf3 (analysis/normalise.py): pairing by time, the fit through
the origin, per-path fits from an archive, and the live bandwidth page drawing raw and
normalised estimates."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from iepm.analysis import normalise
from iepm.results import Result
from iepm.store import Archive
from iepm.web.app import create_app
from testkit import sample

# A real PostgreSQL server (the archive_url fixture's pg case).
pytestmark = pytest.mark.servers

NOW = datetime.now(UTC).replace(microsecond=0)


@given(
    st.floats(0.05, 20.0),
    st.lists(st.floats(1e5, 1e10), min_size=3, max_size=40, unique=True),
)
def test_an_exact_proportion_is_found_with_r2_one(slope: float, xs: list[float]) -> None:
    found = normalise.fit([(x, slope * x) for x in xs])
    assert found is not None and found.n == len(xs)
    assert found.slope == pytest.approx(slope, rel=1e-9)
    assert found.r2 == pytest.approx(1.0, abs=1e-9)


def test_too_few_pairs_or_no_spread_give_no_guess() -> None:
    assert normalise.fit([(1.0, 2.0), (2.0, 4.0)]) is None
    flat = normalise.fit([(1.0, 5.0), (2.0, 5.0), (3.0, 5.0)])
    assert flat is not None and flat.r2 is None  # iperf3 never varied: R² means nothing


def test_each_reference_takes_the_nearest_estimate_within_the_gap() -> None:
    estimates = [(0.0, 10.0), (100.0, 20.0), (5000.0, 30.0)]
    references = [(40.0, 1.0), (70.0, 2.0), (2000.0, 3.0), (5800.0, 4.0)]
    assert normalise.pair(estimates, references, max_gap_s=900.0) == [
        (10.0, 1.0),  # 40 s from the first, 60 s from the second
        (20.0, 2.0),
        (30.0, 4.0),  # 2000 s is 1900 s from any estimate: unpaired
    ]


def _abw(target: str, at: datetime, bps: float) -> Result:
    return sample.iperf3(
        target, at, probe="abw", tool="iepm-abw", params={},
        data={"available_bps": bps, "capacity_bps": 2 * bps},
    )  # fmt: skip


def _archive_with_paths(archive: Archive) -> None:
    # cern: iperf3 reads 0.8 × the estimate; fnal: estimates only (no fit).
    results = []
    for i in range(6):
        at = NOW - timedelta(hours=6 - i)
        est = 100e6 + 10e6 * i
        results.append(_abw("cern", at - timedelta(minutes=2), est))
        data = {**sample.iperf3().data, "throughput_bps": 0.8 * est}
        results.append(sample.iperf3("cern", at, data=data))
        results.append(_abw("fnal", at, 50e6))
    archive.add_many(results)


def test_per_path_fits_come_from_the_archive(archive_url: str) -> None:
    with Archive.open(archive_url) as archive:
        _archive_with_paths(archive)
        fits = normalise.estimator_fits(archive, NOW)
    assert set(fits) == {"cern"}
    assert fits["cern"].slope == pytest.approx(0.8) and fits["cern"].n == 6
    assert fits["cern"].r2 == pytest.approx(1.0)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    url = f"sqlite:///{tmp_path / 'iepm.db'}"
    with Archive.open(url) as archive:
        _archive_with_paths(archive)
    with TestClient(create_app(url, cache_ttl_s=0)) as test_client:
        yield test_client


def test_the_live_bandwidth_page_draws_raw_and_normalised(client: TestClient) -> None:
    page = client.get("/live/bandwidth?probe=abw&hours=24")
    assert page.status_code == 200, page.text
    found = re.search(
        r'<script type="application/json" id="live-spec">(.*?)</script>', page.text, re.S
    )
    assert found
    spec = json.loads(found.group(1))
    cern, fnal = spec["targets"]["cern"], spec["targets"]["fnal"]
    assert cern["norm"] == pytest.approx([0.8 * v for v in cern["raw"]])
    assert fnal["norm"] == [None] * len(fnal["raw"])  # no iperf3 on that path: raw only
    assert spec["fits"]["cern"]["n"] == 6 and "fnal" not in spec["fits"]
    assert "iperf3 ÷ estimate" in page.text
