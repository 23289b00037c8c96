"""Predictions per path (iepm.analysis.predict) and `iepm forecast|diurnal|changes` on an
archive and on iepm's own export: interval coverage on a series of known noise, routine runs
only, and the CLI's reading of both sources (run as a user runs it, in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from iepm.analysis import predict
from iepm.errors import AnalysisError
from iepm.probes import all_metrics
from iepm.results import Purpose, Result, new_result_id
from iepm.store import Archive

# A real PostgreSQL server (the archive_url fixture's pg case) and the CLI in subprocesses.
pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parents[2]
END = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
STEP = timedelta(hours=1)
N = 400
THROUGHPUT = all_metrics()["iperf3.throughput_bps"]


def iperf3(monitor: str, target: str, when: datetime, rate_bps: float, **kw: object) -> Result:
    return Result(
        probe="iperf3",
        tool="iperf3",
        tool_version="test",
        monitor=monitor,
        target=target,
        target_address="198.18.0.1",
        started_at=when,
        duration_s=10.0,
        diags="iperf3 -c 198.18.0.1",
        raw_token=new_result_id(),
        params={},
        data={"throughput_bps": rate_bps, "window_bytes": 4194304, "stream_count": 2},
        **kw,  # type: ignore[arg-type]
    )


def level(i: int) -> float:
    """The path's true level: 500 Mbit/s, then 300 Mbit/s for the last 100 runs."""
    return 500e6 if i < N - 100 else 300e6


@pytest.fixture(scope="module")
def archive_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One path (mon-a → tgt) with known noise (5% of the level, seeded), a second monitor
    on the same target, and study runs at 10 Gbit/s that must never enter a series."""
    rng = np.random.default_rng(15)
    url = f"sqlite:///{tmp_path_factory.mktemp('predict') / 'archive.db'}"
    results = []
    for i in range(N):
        when = END - (N - i) * STEP
        results.append(iperf3("mon-a", "tgt", when, level(i) * (1 + rng.normal(0, 0.05))))
        results.append(iperf3("mon-b", "tgt", when + timedelta(seconds=30), 90e6))
        if i % 50 == 7:
            study = iperf3("mon-a", "tgt", when + timedelta(seconds=60), 10e9)
            results.append(study.model_copy(update={"purpose": Purpose.STUDY}))
    with Archive.open(url) as archive:
        archive.add_many(results)
    return url


def test_the_80_percent_interval_covers_about_80_percent_of_a_series_of_known_noise() -> None:
    # Gaussian noise of 10% about a level that steps once: the ensemble's conformal interval
    # is calibrated online, so after a warm-up it should cover near 80% of what comes next.
    rng = np.random.default_rng(2026)
    n = 1500
    t = 1.7e9 + 3600.0 * np.arange(n)
    y = np.where(np.arange(n) < 700, 200.0, 260.0) * (1 + rng.normal(0, 0.1, n))
    s = predict.PathSeries("m", "x", THROUGHPUT, t, y)
    p = predict.predict(s, float(t[-1]) + 3600.0, 6 * 3600.0)
    scored = p.walk[100:]
    covered = np.mean([f.lower <= f.observed <= f.upper for f in scored])
    assert 0.76 <= covered <= 0.84, covered
    # The next forecast is the last level's, with an interval about ±1.28 σ wide.
    assert 245 < p.now.forecast < 275
    assert p.now.lower < 260 < p.now.upper
    width = (p.now.upper - p.now.lower) / p.now.forecast
    assert 0.15 < width < 0.45, width
    assert p.ahead.t == pytest.approx(float(t[-1]) + 7 * 3600.0)
    assert p.recent.forecasts == predict.RECENT
    assert 0.04 < p.recent.mean_relative_error < 0.15


def test_a_path_series_is_one_monitor_and_routine_runs_only(archive_url: str) -> None:
    with Archive.open(archive_url) as archive:
        assert predict.path_monitors(archive, "tgt", "iperf3") == ["mon-a", "mon-b"]
        s = predict.read_path(archive, target="tgt", metric=THROUGHPUT)
        b = predict.read_path(archive, target="tgt", metric=THROUGHPUT, monitor="mon-b")
        with pytest.raises(AnalysisError, match="no routine iperf3 results for target 'nope'"):
            predict.read_path(archive, target="nope", metric=THROUGHPUT)
    assert s.monitor == "mon-a" and len(s) == N
    assert float(s.y.max()) < 1e9  # the 10 Gbit/s study runs are not in it
    assert b.monitor == "mon-b" and set(b.y.tolist()) == {90e6}
    p = predict.predict(s, END.timestamp(), 3600.0)
    assert p.now.method in ("median5", "levelshift", "levelmode", "levelrel")
    assert 270e6 < p.now.forecast < 330e6
    assert p.now.lower < p.now.forecast < p.now.upper


def test_metric_names_keys_and_ambiguous_keys() -> None:
    assert predict.find_metric("iperf3.throughput_bps") is THROUGHPUT
    assert predict.find_metric("rtt_avg_ms").name == "ping.rtt_avg_ms"
    assert predict.find_metric("throughput_bps", "iperf3") is THROUGHPUT
    assert predict.find_metric("throughput_bps", None, ["ping", "iperf3"]) is THROUGHPUT
    with pytest.raises(AnalysisError, match="measured by iperf3, xrdcp_mem, xrdcp_disk"):
        predict.find_metric("throughput_bps")
    with pytest.raises(AnalysisError, match="unknown metric 'vm'"):
        predict.find_metric("vm")
    with pytest.raises(AnalysisError, match="is not of probe 'ping'"):
        predict.find_metric("iperf3.throughput_bps", "ping")


def test_table_1_scores_the_window_only_and_beats_nothing_it_should_not(archive_url: str) -> None:
    with Archive.open(archive_url) as archive:
        rows = predict.error_table(archive, END - timedelta(days=2), END)
    by_monitor = {r.monitor: r for r in rows}
    assert set(by_monitor) == {"mon-a", "mon-b"}
    a = by_monitor["mon-a"].by_method
    assert a["auto"].forecasts == a["ma5"].forecasts == 48  # two days of hourly runs
    # 5% noise: the mean relative error is about 0.8 σ ≈ 4%, for the ensemble and MA(5).
    assert 0.02 < a["auto"].mean_relative_error < 0.07
    assert 0.02 < a["ma5"].mean_relative_error < 0.08
    # A constant path is forecast exactly.
    assert by_monitor["mon-b"].by_method["auto"].mean_relative_error == 0.0


def iepm(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "iepm.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        check=False,
    )


def test_cli_reads_a_path_of_the_archive_and_its_own_export(
    archive_url: str, tmp_path: Path
) -> None:
    db = ["--db", archive_url, "--target", "tgt"]
    res = iepm("forecast", *db, "--metric", "throughput_bps", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    from_archive = json.loads(res.stdout)
    assert len(from_archive) == N - 5
    assert max(r["observed"] for r in from_archive) < 1e9  # routine runs only
    # iepm's own CSV export of the same path gives the same forecasts.
    export = tmp_path / "tgt.csv"
    res = iepm(
        "export", "--probe", "iperf3", "--target", "tgt", "--format", "csv",
        "--db", archive_url, "-o", str(export), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    res = iepm("forecast", "--csv", str(export), "--json", cwd=tmp_path)
    assert res.returncode == 2 and "rows of more than one path" in res.stderr
    assert "--monitor" in res.stderr
    res = iepm("forecast", "--csv", str(export), "--monitor", "mon-a", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    from_export = json.loads(res.stdout)
    # --metric names the export's column too.
    by_metric = ["--monitor", "mon-a", "--metric", "iperf3.throughput_bps", "--json"]
    res = iepm("forecast", "--csv", str(export), *by_metric, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == from_export
    assert [r["timestamp"] for r in from_export] == [r["timestamp"] for r in from_archive]
    for a, b in zip(from_archive, from_export, strict=True):
        # The export writes bit/s as integers: the same forecasts to that rounding.
        assert b["forecast"] == pytest.approx(a["forecast"], rel=1e-6)
        assert b["method"] == a["method"]
    # changes finds the step 100 runs before the end, from both sources.
    for source in ([*db, "--metric", "iperf3.throughput_bps"], ["--csv", str(export)]):
        res = iepm("changes", *source, "--monitor", "mon-a", "--json", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        (cp,) = json.loads(res.stdout)
        assert abs(cp["index"] - (N - 100)) <= 1 and cp["direction"] == "down"
    res = iepm("diurnal", *db, "--monitor", "mon-b", "--metric", "throughput_bps", "--json",
               cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    fits = json.loads(res.stdout)
    assert fits["weekdays"]["c"] == pytest.approx(90e6) and not fits["weekdays"]["diurnal"]


def test_cli_reading_an_archive_creates_nothing_and_names_what_is_wrong(
    archive_url: str, tmp_path: Path
) -> None:
    missing = tmp_path / "none.db"
    res = iepm("forecast", "--db", f"sqlite:///{missing}", "--target", "tgt", cwd=tmp_path)
    assert res.returncode == 2
    assert (
        res.stderr.strip() == f"error: archive sqlite:///{missing} does not exist (nothing to read)"
    )
    assert not missing.exists() and list(tmp_path.iterdir()) == []
    db = ["--db", archive_url]
    cases = {
        ("--target", "nope"): "error: --target: no routine results for 'nope' in the archive "
        "(targets: tgt)",
        ("--target", "tgt", "--metric", "vm"): "error: --metric: unknown metric 'vm'",
        ("--target", "tgt", "--monitor", "mon-z"): "error: --monitor: 'mon-z' has no iperf3 "
        "results for 'tgt' (monitors: mon-a, mon-b)",
        (): "error: --target: which path of the archive? (with --db/--config)",
        ("--target", "tgt", "--csv", "x.csv"): "error: give --csv, or --db/--config with "
        "--target, not both",
    }
    for args, message in cases.items():
        res = iepm("diurnal", *db, *args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.startswith(message), (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1
    res = iepm("forecast", cwd=tmp_path)
    assert res.returncode == 2 and "give the series: --csv FILE" in res.stderr
