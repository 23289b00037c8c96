"""The spool is append-safe and idempotent: a torn line is skipped and reported, a result already
in the archive is no error, and nothing behind either is held up (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest

from iepm.results import Result
from iepm.store import Archive, Cycle
from iepm.store.spool import Spool
from testkit import sample
from testkit.sample import T0


def cycle(n: int) -> Cycle:
    start = T0 + timedelta(minutes=n)
    return Cycle("slac-mon", start, start + timedelta(seconds=30), 60.0, False, 3, n, id=f"c{n}")


def flush(spool: Spool, archive: Archive) -> tuple[int, int, list[str]]:
    return spool.flush(archive.add_new, archive.add_cycles_new)


def test_a_torn_last_line_is_skipped_reported_and_kept_aside(
    workdir: Path, archive: Archive
) -> None:
    spool = Spool(workdir / "spool.jsonl")
    first, later = sample.ping(started_at=T0), sample.ping(started_at=T0 + timedelta(minutes=1))
    spool.append_result(first)
    with spool.path.open("ab") as torn:  # what kill -9 or ENOSPC mid-write leaves
        torn.write(b'{"kind":"result","result":{"schema":1,"id":"abc","pro')
    spool.append_result(later)  # starts on a line of its own
    spool.append_cycle(cycle(1))
    results, cycles, rejected = flush(spool, archive)
    assert (results, cycles) == (2, 1)
    assert rejected == [f"{workdir / 'spool.jsonl.flushing'}:2: cut short (not complete JSON)"]
    assert {r.id for r in archive.results()} == {first.id, later.id}
    assert [c.n_failed for c in archive.cycles()] == [1]
    assert not spool.pending()
    kept = spool.rejected.read_text()
    assert '"pro' in kept and "spool.jsonl.flushing:2" in kept


def test_a_torn_final_line_without_newline_is_skipped(workdir: Path, archive: Archive) -> None:
    spool = Spool(workdir / "spool.jsonl")
    spool.append_result(sample.ping())
    with spool.path.open("ab") as torn:
        torn.write(b'{"kind":"cyc')
    results, cycles, rejected = flush(spool, archive)
    assert (results, cycles, len(rejected)) == (1, 0, 1)
    assert rejected[0].endswith(":2: cut short (not complete JSON)")
    assert archive.count() == 1


def test_a_spooled_result_already_in_the_archive_does_not_block_the_rest(
    workdir: Path, archive: Archive
) -> None:
    spool = Spool(workdir / "spool.jsonl")
    stored = sample.ping(started_at=T0)
    archive.add(stored)  # e.g. a write that outlived its deadline and finished later
    archive.add_cycle(cycle(1))
    later = [sample.ping(started_at=T0 + timedelta(minutes=i)) for i in range(1, 4)]
    for result in [stored, *later]:
        spool.append_result(result)
    spool.append_cycle(cycle(1))
    spool.append_cycle(cycle(2))
    assert flush(spool, archive) == (4, 2, [])
    assert archive.count() == 4
    assert [c.n_failed for c in archive.cycles()] == [1, 2]
    assert not spool.pending()
    # Flushing the same records again (a flush cut short and rerun) changes nothing.
    for result in later:
        spool.append_result(result)
    assert flush(spool, archive) == (3, 0, [])
    assert archive.count() == 4
    with archive.reading("daily") as conn:  # the duplicate was not summarised twice
        runs = conn.exec_driver_sql("SELECT sum(n) FROM daily WHERE metric = 'runs'").scalar()
    assert runs == 4


def test_a_failed_flush_keeps_every_record_and_a_rerun_finishes(
    workdir: Path, archive: Archive
) -> None:
    spool = Spool(workdir / "spool.jsonl")
    results = [sample.ping(started_at=T0 + timedelta(minutes=i)) for i in range(3)]
    for result in results:
        spool.append_result(result)

    def broken(_chunk: object) -> int:
        raise OSError("archive gone")

    with pytest.raises(OSError, match="archive gone"):
        spool.flush(broken, archive.add_cycles_new)
    assert spool.flushing.exists()
    spool.append_result(late := sample.ping(started_at=T0 + timedelta(hours=1)))
    assert spool.count() == (4, 0)
    assert flush(spool, archive)[0] == 4
    assert archive.count() == 4 and late.id in {r.id for r in archive.results()}


def test_a_spool_of_an_earlier_version_is_read(workdir: Path, archive: Archive) -> None:
    path = workdir / "spool.jsonl"
    old = sample.ping()
    path.write_text(json.dumps(old.envelope()) + "\n")  # as the spool was written before
    assert flush(Spool(path), archive)[0] == 1
    stored = archive.latest("ping", "cern-1")
    assert stored is not None and stored.envelope() == old.envelope()


def test_appends_are_whole_lines(workdir: Path) -> None:
    spool = Spool(workdir / "spool.jsonl")
    for i in range(50):
        spool.append_result(sample.ping(started_at=T0 + timedelta(seconds=i)))
    data = spool.path.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 50
    assert os.stat(spool.path).st_size == len(data)


def test_a_long_spool_is_written_back_in_bounded_chunks(
    workdir: Path, archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("iepm.store.spool.FLUSH_CHUNK", 3)
    spool = Spool(workdir / "spool.jsonl")
    for i in range(8):
        spool.append_result(sample.ping(started_at=T0 + timedelta(minutes=i)))
    sizes: list[int] = []

    def write(chunk: list[Result]) -> int:
        sizes.append(len(chunk))
        return archive.add_new(chunk)

    assert spool.flush(write, archive.add_cycles_new) == (8, 0, [])
    assert sizes == [3, 3, 2] and archive.count() == 8
