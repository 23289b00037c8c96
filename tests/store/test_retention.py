"""Retention: ``iepm archive prune`` removes old results (not their daily summaries) on SQLite and
PostgreSQL, and rotates raw logs so ``iepm extract`` still reads them."""

from __future__ import annotations

import gzip
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from sqlalchemy import func, select

from iepm.rawlog import RawLog, read_log
from iepm.runner import RawRun
from iepm.store import Archive, retention
from iepm.store.schema import daily as DAILY
from testkit import sample

NOW = sample.T0 + timedelta(days=400)


def _daily_rows(archive: Archive) -> int:
    with archive.reading("test") as conn:
        return int(conn.execute(select(func.count()).select_from(DAILY)).scalar_one())


def test_prune_removes_old_results_in_batches_and_keeps_daily_summaries(
    archive: Archive, monkeypatch
) -> None:
    monkeypatch.setattr(retention, "BATCH", 7)  # several batches, and one short last batch
    old = [sample.ping(started_at=sample.T0 + timedelta(hours=h)) for h in range(30)]
    new = [sample.ping(started_at=NOW - timedelta(days=d)) for d in range(5)]
    archive.add_many(old + new)
    days_before = _daily_rows(archive)

    counted = retention.prune(archive, keep_days=90, now=NOW, dry_run=True)
    assert counted.results == 30 and archive.count(purpose=None) == 35  # nothing removed
    report = retention.prune(archive, keep_days=90, now=NOW)
    assert report.results_by_probe == {"ping": 30}
    assert sorted(r.id for r in archive.results(purpose=None)) == sorted(r.id for r in new)
    assert _daily_rows(archive) == days_before  # the pruned days are still summarised
    assert "removed 30 results older than" in report.lines()[0]
    assert retention.prune(archive, keep_days=90, now=NOW).results == 0


def _raw(moment, token: str) -> RawRun:
    return RawRun(
        argv=("ping", "-c", "1", "198.18.0.2"),
        stdout="PING 198.18.0.2\n",
        stderr="",
        returncode=0,
        timed_out=False,
        started_at=moment,
        duration_s=1.0,
        token=token,
    )


def test_old_raw_logs_are_removed_and_recent_ones_compressed_readably(
    archive: Archive, tmp_path: Path
) -> None:
    log = RawLog(tmp_path)
    for age_days, token in ((200, "a1"), (20, "b2"), (1, "c3")):
        log.append("cern", "ping", _raw(NOW - timedelta(days=age_days), token))
    (tmp_path / "notes").mkdir()  # not a day directory: never touched
    report = retention.prune(
        archive, keep_days=90, now=NOW, log_dir=tmp_path, compress_after_days=7
    )
    assert len(report.log_days_removed) == 1 and report.logs_compressed == 1
    assert (tmp_path / "notes").is_dir()
    assert [r.raw.token for r in log.runs()] == ["b2", "c3"]
    [gz] = tmp_path.glob("*/*.log.gz")
    assert [r.raw.token for r in read_log(gz)] == ["b2"]
    assert gzip.decompress(gz.read_bytes()).startswith(b"==== iepm-run token=b2")


def test_the_command_reports_and_never_creates_an_archive(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    run = subprocess.run(
        [sys.executable, "-m", "iepm.cli", "archive", "prune", "--keep-days", "30",
         "--db", f"sqlite:///{missing}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and "does not exist" in run.stderr
    assert "Traceback" not in run.stderr and not missing.exists()
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Archive.open(url) as archive:
        archive.add(sample.ping(started_at=sample.T0))
    run = subprocess.run(
        [sys.executable, "-m", "iepm.cli", "archive", "prune", "--keep-days", "1", "--db", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("removed 1 results older than")
