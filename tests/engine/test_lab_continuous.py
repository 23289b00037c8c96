"""Per-second pings to 20 lab targets from a real ``iepm run``: memory stays flat, the archive
grows by what was predicted, the bandwidth tests between never overlap.

The short version of ``benchmarks/continuous_ping.py`` (which runs 10 minutes of 60-packet
windows on SQLite and PostgreSQL): here 5-packet windows for about 30 s, on SQLite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.continuous_ping import run_continuous
from iepm.lab.testing import LabFactory

pytestmark = pytest.mark.lab

TARGETS = 20
WINDOW_S = 5.0
PERIODS = 6


def test_continuous_pings_keep_memory_flat_and_the_archive_as_predicted(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/archive.db"
    report = run_continuous(
        lab_factory, url, tmp_path, n_targets=TARGETS, periods=PERIODS, window_s=WINDOW_S,
        prefix="cpt",
    )  # fmt: skip
    assert report["monitor_exit"] == 0, (tmp_path / "sqlite.out").read_text()[-2000:]
    # One result per target a window: PERIODS of them, and the one open at the stop.
    low, high = report["results_predicted_per_target"]
    assert low <= min(report["results_per_target"]) <= max(report["results_per_target"]) <= high
    assert report["full_windows"] >= TARGETS * (PERIODS - 1)
    # The monitor's memory is flat once running (its RSS sampled every second).
    assert report["rss_mib"]["samples"] >= PERIODS * WINDOW_S - 2
    assert report["rss_mib"]["settled_after_s"] is not None, report["rss_mib"]
    assert report["rss_mib"]["growth_after_settled"] < 8.0, report["rss_mib"]
    # The archive grew by what was predicted from the row's shape (page granularity aside).
    assert report["measured_over"]["rows"] >= TARGETS * 2
    ratio = report["bytes_per_row"]["ratio_measured_to_predicted"]
    assert 0.6 <= ratio <= 1.5, report["bytes_per_row"]
    # The bandwidth tests between ran, one at a time.
    assert report["iperf3_runs"] >= 2 and report["iperf3_overlaps"] == 0
