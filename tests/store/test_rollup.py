"""The per-day summaries agree with the results after every kind of write, and a migration
fills them from an archive that predates them (SQLite and PostgreSQL)."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from alembic import command
from sqlalchemy import select

from iepm.results import Outcome, Result
from iepm.store import Archive
from iepm.store.archive import alembic_config, connect_engine
from iepm.store.schema import daily as DAILY
from testkit import sample
from testkit.sample import T0

KEYS = {
    "ping": ["rtt_min_ms", "rtt_avg_ms", "rtt_max_ms", "loss_percent"],
    "iperf3": ["throughput_bps", "retransmits"],
}


def stored(archive: Archive) -> dict[tuple[Any, ...], tuple[int, float, Any, Any]]:
    with archive.reading("reading the daily rows") as conn:
        rows = conn.execute(select(DAILY)).mappings().all()
    return {
        (r["target"], r["monitor"], r["probe"], r["day"].isoformat(), r["metric"]): (
            r["n"],
            r["total"],
            r["minimum"],
            r["maximum"],
        )
        for r in rows
    }


def expected(archive: Archive) -> dict[tuple[Any, ...], tuple[int, float, Any, Any]]:
    """Computed here with plain loops over what the archive returns."""
    runs: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
    values: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in archive.results():
        day = r.started_at.date().isoformat()  # started_at is UTC
        path = (r.target, r.monitor, r.probe, day)
        runs[path][0] += 1
        if r.outcome is not Outcome.OK:
            continue
        runs[path][1] += 1
        for key in KEYS.get(r.probe, []):
            value = r.data.get(key)
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                values[(*path, key)].append(float(value))
    out: dict[tuple[Any, ...], tuple[int, float, Any, Any]] = {
        (*path, "runs"): (n, float(ok), None, None) for path, (n, ok) in runs.items()
    }
    for key, vs in values.items():
        out[key] = (len(vs), math.fsum(vs), min(vs), max(vs))
    return out


def assert_agree(archive: Archive) -> None:
    got, want = stored(archive), expected(archive)
    assert got.keys() == want.keys()
    for key, (n, total, low, high) in want.items():
        assert got[key][0] == n, key
        assert got[key][1] == pytest.approx(total, rel=1e-9), key
        assert got[key][2:] == (low, high), key


def mixed_results(seed: int) -> list[Result]:
    """Pings and iperf3 runs over three UTC days, two monitors, some failed or without RTT."""
    rng = random.Random(seed)
    out = []
    for _ in range(60):
        moment = T0 + timedelta(hours=rng.uniform(-30, 30))
        monitor = rng.choice(["slac-mon", "bnl-mon"])
        if rng.random() < 0.2:
            out.append(sample.ping(started_at=moment, monitor=monitor, outcome=Outcome.TIMEOUT,
                                   succeeded=False, data={}))  # fmt: skip
        elif rng.random() < 0.1:
            out.append(
                sample.ping(started_at=moment, monitor=monitor, data={"loss_percent": 100.0})
            )
        elif rng.random() < 0.3:
            out.append(sample.iperf3(started_at=moment, monitor=monitor))
        else:
            rtt = rng.uniform(20, 200)
            data = {"rtt_min_ms": rtt - 1, "rtt_avg_ms": rtt, "rtt_max_ms": rtt + 3,
                    "loss_percent": rng.choice([0.0, 10.0])}  # fmt: skip
            out.append(sample.ping(started_at=moment, monitor=monitor, data=data))
    return out


def test_every_write_keeps_the_days_in_step(archive: Archive) -> None:
    results = mixed_results(1)
    for r in results[:10]:
        archive.add(r)
    archive.add_many(results[10:])
    assert_agree(archive)
    # A re-extracted run whose reading changed: its day is recomputed, not added to.
    measured = next(r for r in results if "rtt_avg_ms" in r.data)
    again = measured.model_copy(update={"data": {"rtt_avg_ms": 999.0}})
    archive.upsert_by_token(again)
    assert_agree(archive)
    assert max(v[3] for k, v in stored(archive).items() if k[4] == "rtt_avg_ms") == 999.0


def test_a_failed_write_leaves_the_days_as_they_were(archive: Archive) -> None:
    results = mixed_results(2)
    archive.add_many(results[:30])
    before = stored(archive)
    with pytest.raises(Exception, match="cannot add results"):
        archive.add_many([*results[30:40], results[0]])  # a duplicate id: all or nothing
    assert stored(archive) == before
    assert_agree(archive)


def test_the_migration_fills_the_days_of_an_older_archive(archive_url: str) -> None:
    with Archive.open(archive_url) as archive:
        archive.add_many(mixed_results(3))
        want = expected(archive)
    engine = connect_engine(archive_url)
    try:
        config = alembic_config()
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0002")  # as an archive written before the table existed
    finally:
        engine.dispose()
    with Archive.open(archive_url) as archive:  # upgrades to the head, filling the table
        assert stored(archive).keys() == want.keys()
        assert_agree(archive)
