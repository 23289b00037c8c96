"""The compare page's seed comparisons (IEPM-BW Fig. 8): iperf3 against each memory copy per path
with y = a·x and R², and memory against disk copy — derived from the probe registry and computed
from the archive (an archive built here with known ratios per path)."""

from __future__ import annotations

import random
import re
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from iepm.probes import PROBES
from iepm.results import Result
from iepm.store.archive import Archive
from iepm.web.app import create_app
from iepm.web.pages.compare import seed_comparisons
from tests.web.data import END, _result
from tests.web.test_api import END as UNTIL
from tests.web.test_api import csv_rows

HOSTS = {"cern": 900e6, "kek": 400e6, "ihep": 150e6, "bnl": 700e6, "fnal": 300e6}
# Each path's memory copy reaches this share of its iperf3 (rsync: one connection, less);
# each disk copy this share of its memory copy.
MEM_SHARE = {"xrdcp_mem": 0.8, "rsync_mem": 0.5}
DISK_SHARE = 0.4


def runs(seed: int = 12) -> list[Result]:
    rng = random.Random(seed)
    out = []
    for host, rate_bps in HOSTS.items():
        for day in range(5):
            when = END - timedelta(days=day, hours=1)
            iperf = rate_bps * rng.uniform(0.97, 1.03)
            out.append(
                _result("iperf3", "slac", host, when, {"throughput_bps": iperf}, duration=10)
            )
            for probe, share in MEM_SHARE.items():
                mem = rate_bps * share * rng.uniform(0.97, 1.03)
                at = when + timedelta(minutes=1)
                out.append(_result(probe, "slac", host, at, {"throughput_bps": mem}, duration=9))
                disk = mem * DISK_SHARE * rng.uniform(0.97, 1.03)
                key = "committed_throughput_bps"
                name = probe.replace("_mem", "_disk")
                at = when + timedelta(minutes=2)
                out.append(_result(name, "slac", host, at, {key: disk}, duration=9))
    return out


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with tempfile.TemporaryDirectory(prefix="iepm-seed-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'archive.db'}"
        with Archive.open(url) as archive:
            archive.add_many(runs())
        with TestClient(create_app(url, cache_ttl_s=0)) as test_client:
            yield test_client


def test_the_comparisons_come_from_the_registry() -> None:
    found = {(c.x, c.y) for c in seed_comparisons()}
    copies = {name for name, p in PROBES.items() if p.META.copy == "memory"}
    assert {("iperf3.throughput_bps", f"{m}.throughput_bps") for m in copies} <= found
    assert ("xrdcp_mem.throughput_bps", "xrdcp_disk.committed_throughput_bps") in found
    assert ("rsync_mem.throughput_bps", "rsync_disk.committed_throughput_bps") in found
    # A disk copy is set against the memory copy of its own tool only.
    assert ("xrdcp_mem.throughput_bps", "rsync_disk.committed_throughput_bps") not in found


def test_the_seed_table_gives_each_fit_and_ratio_per_path(client: TestClient) -> None:
    rows = {(r["x"], r["y"]): r for r in csv_rows(client, f"/compare/tables/seed?until={UNTIL}")}
    for probe, share in MEM_SHARE.items():
        row = rows[("iperf3.throughput_bps", f"{probe}.throughput_bps")]
        assert int(row["paths"]) == len(HOSTS)
        assert float(row["a"]) == pytest.approx(share, rel=0.05)
        assert float(row["r_squared"]) > 0.95
        assert float(row["ratio_p25"]) <= float(row["ratio_median"]) <= float(row["ratio_p75"])
        assert float(row["ratio_median"]) == pytest.approx(share, rel=0.05)
        disk = rows[(f"{probe}.throughput_bps", f"{probe[:-4]}_disk.committed_throughput_bps")]
        assert float(disk["a"]) == pytest.approx(DISK_SHARE, rel=0.05)


def test_the_page_links_each_comparison_to_its_scatter_through_the_origin(
    client: TestClient,
) -> None:
    page = client.get(f"/compare?until={UNTIL}").text
    assert "The seed&#39;s comparisons" in page or "The seed's comparisons" in page
    links = re.findall(r'class="seed-link" href="([^"]+)"', page)
    assert len(links) == len(seed_comparisons())
    target = next(link for link in links if "rsync_mem.throughput_bps" in link and "iperf3" in link)
    scatter = client.get(target.replace("&amp;", "&") + f"&until={UNTIL}").text
    assert "origin" in scatter and re.search(r"y = 0\.4\d*·x, R² = 0\.9\d+", scatter), scatter[:400]
