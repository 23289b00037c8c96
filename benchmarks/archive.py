"""Archive throughput on SQLite and PostgreSQL, against the bare database driver in the same run.

For each backend: bulk insert rate (``add_many`` in batches) over N results, single-result
insert rate (``add``, one transaction each, added to the full archive), streaming query rate
(one target × probe over 30 days), one-day query rate, and the time to export one target's year
of pings (one every 10 minutes: 52,560 rows) as TSV. Each figure has a ``baseline``: the same
work done with the driver alone (sqlite3 / psycopg ``executemany``, plain ``SELECT`` + JSON
decoding, hand-joined TSV) on an identical, separate database; ``ratio`` is our time divided by
the baseline's time (1.0: our layer costs nothing). PostgreSQL runs on a private, durable server
started with testkit/pg.py, or on ``--pg-url`` (a database on a server where we may create and
drop scratch databases). Prints one JSON object.

    .venv/bin/python benchmarks/archive.py [--n 1000000] [--single 2000] [--pg-url URL | --no-pg]
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Json
from sqlalchemy import make_url

# testkit/pg.py (the PostgreSQL launcher) lives beside the package, not in it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.export import export
from iepm.probes import ping
from iepm.results import Result
from iepm.store import Archive
from testkit.pg import find_bindir, running_server

YEAR_START = datetime(2025, 1, 1, tzinfo=UTC)
YEAR_TARGET = "year-target"
YEAR_ROWS = 365 * 24 * 6  # one ping every 10 minutes
OTHER_TARGETS = [f"site-{i:02d}" for i in range(49)]
BATCH = 10_000
COLUMNS = (
    "id, schema, probe, tool, tool_version, monitor, target, target_address, started_at, "
    "duration_s, outcome, succeeded, error, diags, raw_token, params, data"
)


def make_result(rng: random.Random, index: int, target: str, moment: datetime) -> Result:
    """A ping (or, for other targets, one in five an iperf3 run) shaped like the real ones."""
    rtts = [round(rng.uniform(40, 45), 3) for _ in range(10)]
    if target != YEAR_TARGET and index % 5 == 0:
        probe = "iperf3"
        params: dict[str, Any] = {"duration_s": 10, "streams": 4, "window_bytes": 16777216}
        data: dict[str, Any] = {
            "throughput_bps": rng.uniform(1e8, 9.4e9),
            "sender_throughput_bps": rng.uniform(1e8, 9.4e9),
            "retransmits": rng.randint(0, 500),
            "streams": [{"id": i, "throughput_bps": rng.uniform(1e7, 2e9)} for i in range(4)],
            "local_cpu_percent": rng.uniform(1, 90),
            "remote_cpu_percent": rng.uniform(1, 90),
        }
    else:
        probe, params = "ping", {"count": 10, "interval_s": 1.0, "size_bytes": 56}
        received = 10 - (rng.random() < 0.05)
        data = {
            "packets_sent": 10,
            "packets_received": received,
            "duplicates": 0,
            "errors": 0,
            "loss_percent": 100.0 * (10 - received) / 10,
            "rtt_min_ms": min(rtts),
            "rtt_avg_ms": sum(rtts) / 10,
            "rtt_max_ms": max(rtts),
            "rtt_mdev_ms": rng.uniform(0.1, 2),
            "ttl": 52,
            "discarded": 0,
            "rtts_ms": rtts,
        }
    return Result(
        id=uuid.UUID(int=rng.getrandbits(128)).hex,
        probe=probe,
        tool=probe,
        tool_version="iputils 20221126" if probe == "ping" else "iperf 3.12",
        monitor="bench-mon",
        target=target,
        target_address=f"198.18.{index % 250}.2",
        started_at=moment + timedelta(microseconds=rng.randrange(1_000_000)),
        duration_s=rng.uniform(9, 11),
        diags=f"{probe} -c 10 -i 1 198.18.{index % 250}.2\n",
        raw_token=uuid.UUID(int=rng.getrandbits(128)).hex,
        params=params,
        data=data,
    )


def workload(n: int, seed: int = 1) -> Iterator[list[Result]]:
    """N results in batches: the year target's pings interleaved with other targets' runs."""
    rng = random.Random(seed)
    year_s = 365 * 86400
    batch: list[Result] = []
    for index in range(n):
        if index % (n // YEAR_ROWS) == 0 and index // (n // YEAR_ROWS) < YEAR_ROWS:
            moment = YEAR_START + timedelta(minutes=10 * (index // (n // YEAR_ROWS)))
            batch.append(make_result(rng, index, YEAR_TARGET, moment))
        else:
            moment = YEAR_START + timedelta(seconds=rng.randrange(year_s))
            batch.append(make_result(rng, index, rng.choice(OTHER_TARGETS), moment))
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def others(count: int, seed: int) -> list[Result]:
    """Results for the other targets only, at random moments of the year."""
    rng = random.Random(seed)
    return [
        make_result(
            rng, index, rng.choice(OTHER_TARGETS), YEAR_START + timedelta(days=rng.random() * 365)
        )
        for index in range(count)
    ]


class Stopwatch:
    """Accumulated seconds spent inside ``with stopwatch:`` blocks."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *_exc: object) -> None:
        self.seconds += time.perf_counter() - self.started


def figure(ours: Stopwatch, base: Stopwatch, work: float, unit: str) -> dict[str, Any]:
    """``work`` units done by us and by the baseline, as rates (or, for unit "s", the times)."""
    ours_s, base_s = ours.seconds, base.seconds
    ratio = round(ours_s / base_s, 2)
    if unit == "s":
        return {
            "figure": round(ours_s, 3),
            "baseline": round(base_s, 3),
            "unit": unit,
            "ratio": ratio,
        }
    rates = {"figure": round(work / ours_s, 1), "baseline": round(work / base_s, 1)}
    return {**rates, "unit": unit, "ratio": ratio}


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def connect_pg(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    parsed = make_url(url)
    return psycopg.connect(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        password=parsed.password,
        dbname=parsed.database,
        autocommit=True,
        connect_timeout=10,
    )


class Baseline:
    """The same inserts and reads with the bare driver, on a database with the same schema."""

    def __init__(self, url: str) -> None:
        Archive.open(url).close()  # same tables and indexes
        parsed = make_url(url)
        self.sqlite = parsed.get_backend_name() == "sqlite"
        self.conn: Any
        if self.sqlite:
            self.conn = sqlite3.connect(parsed.database or "", isolation_level=None)
            self.conn.execute("PRAGMA journal_mode = WAL")
            self.conn.execute("PRAGMA synchronous = FULL")
            self.mark = "?"
        else:
            self.conn = connect_pg(url)
            self.mark = "%s"
        marks = ", ".join([self.mark] * 17)
        self.insert = f"INSERT INTO results ({COLUMNS}) VALUES ({marks})"

    def row(self, r: Result) -> tuple[Any, ...]:
        if self.sqlite:
            moment: Any = r.started_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
            params: Any = json.dumps(r.params)
            data: Any = json.dumps(r.data)
        else:
            moment, params, data = r.started_at, Json(r.params), Json(r.data)
        envelope = (r.id, r.schema_, r.probe, r.tool, r.tool_version, r.monitor, r.target)
        measured = (r.duration_s, r.outcome.value, r.succeeded, r.error, r.diags, r.raw_token)
        return (*envelope, r.target_address, moment, *measured, params, data)

    def add_many(self, results: list[Result]) -> None:
        with self.transaction() as cursor:
            cursor.executemany(self.insert, [self.row(r) for r in results])

    def add(self, result: Result) -> None:
        with self.transaction() as cursor:
            cursor.execute(self.insert, self.row(result))

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        if self.sqlite:
            self.conn.execute("BEGIN IMMEDIATE")
            yield self.conn
            self.conn.execute("COMMIT")
        else:
            with self.conn.transaction(), self.conn.cursor() as cursor:
                yield cursor

    def select(self, target: str, since: datetime, until: datetime) -> Iterator[tuple[Any, ...]]:
        query = (
            f"SELECT {COLUMNS} FROM results WHERE probe = {self.mark} AND target = {self.mark} "
            f"AND started_at >= {self.mark} AND started_at < {self.mark} ORDER BY started_at, id"
        )
        if self.sqlite:
            bounds = [m.strftime("%Y-%m-%d %H:%M:%S.%f") for m in (since, until)]
            for row in self.conn.execute(query, ("ping", target, *bounds)):
                yield (*row[:15], json.loads(row[15]), json.loads(row[16]))
        else:
            with self.conn.cursor() as cursor:  # psycopg decodes json itself
                yield from cursor.execute(query, ("ping", target, since, until))

    def export_tsv(self, out: Any, since: datetime, until: datetime) -> None:
        names = [column.name for column in ping.COLUMNS]
        for row in self.select(YEAR_TARGET, since, until):
            data = row[16]
            cells = [str(row[8]), row[5], row[6], row[7] or "", row[10], str(row[9]), row[12] or ""]
            cells += [str(data.get(name, "")) for name in names]
            out.write("\t".join(cells) + "\n")

    def close(self) -> None:
        self.conn.close()


def run_backend(url: str, base_url: str, n: int, single: int) -> dict[str, Any]:
    archive = Archive.open(url)
    baseline = Baseline(base_url)
    try:
        ours, base = Stopwatch(), Stopwatch()
        for number, batch in enumerate(workload(n)):
            with ours:
                archive.add_many(batch)
            with base:
                baseline.add_many(batch)
            if number % 20 == 0:
                progress(f"{archive.url}: {(number + 1) * BATCH} results")
        report: dict[str, Any] = {"add_many": figure(ours, base, n, "results/s")}

        # Alternating, so that a busy machine slows both alike.
        ours, base = Stopwatch(), Stopwatch()
        for result in others(single, seed=2):
            with ours:
                archive.add(result)
            with base:
                baseline.add(result)
        report["add"] = figure(ours, base, single, "results/s")

        rng = random.Random(3)
        ours, base = Stopwatch(), Stopwatch()
        rows = 0
        for _ in range(5):
            since = YEAR_START + timedelta(days=rng.randrange(330))
            until = since + timedelta(days=30)
            with ours:
                rows += sum(1 for _ in archive.results("ping", YEAR_TARGET, since, until))
            with base:
                sum(1 for _ in baseline.select(YEAR_TARGET, since, until))
        report["query_30_days"] = figure(ours, base, rows, "results/s")

        days = [YEAR_START + timedelta(days=rng.randrange(364)) for _ in range(200)]
        ours, base = Stopwatch(), Stopwatch()
        for day in days:
            with ours:
                list(archive.results("ping", YEAR_TARGET, day, day + timedelta(days=1)))
            with base:
                list(baseline.select(YEAR_TARGET, day, day + timedelta(days=1)))
        report["query_1_day"] = figure(ours, base, len(days), "queries/s")

        # Best of three, alternating.
        ours_runs, base_runs = [], []
        for _ in range(3):
            ours, base = Stopwatch(), Stopwatch()
            with tempfile.TemporaryFile("w+") as out:
                with ours:
                    exported = export(archive, "ping", ping.COLUMNS, "tsv", out, YEAR_TARGET)
                size = out.tell()
            with tempfile.TemporaryFile("w+") as out, base:
                baseline.export_tsv(out, YEAR_START, YEAR_START + timedelta(days=365))
            ours_runs.append(ours)
            base_runs.append(base)
        best = min(ours_runs, key=lambda watch: watch.seconds)
        best_base = min(base_runs, key=lambda watch: watch.seconds)
        report["export_tsv_year"] = {
            **figure(best, best_base, 1, "s"),
            "rows": exported,
            "bytes": size,
        }
        report["results_stored"] = archive.count()
        return report
    finally:
        baseline.close()
        archive.close()


def sqlite_single_add_normal(single: int) -> dict[str, Any]:
    """For scale: raw sqlite3 single inserts with synchronous=NORMAL (no fsync per commit)."""
    with tempfile.TemporaryDirectory(prefix="iepm-bench-") as directory:
        baseline = Baseline(f"sqlite:///{directory}/normal.db")
        baseline.conn.execute("PRAGMA synchronous = NORMAL")
        results = others(single, seed=2)
        watch = Stopwatch()
        with watch:
            for result in results:
                baseline.add(result)
        baseline.close()
    return {"figure": round(single / watch.seconds, 1), "unit": "results/s"}


@contextmanager
def pg_databases(pg_url: str | None) -> Iterator[tuple[str, str] | str]:
    """Two scratch databases (ours, baseline), or why PostgreSQL is not measured."""
    with ExitStack() as stack:
        if pg_url is None:
            bindir = find_bindir()
            if bindir is None:
                yield "no PostgreSQL server binaries; give --pg-url or run `make deps`"
                return
            # A durable server (fsync on): the figures are what a real archive would see.
            pg_url = stack.enter_context(running_server(bindir, settings={})).url()
        admin = make_url(pg_url)
        conn = stack.enter_context(connect_pg(pg_url))
        names = [f"iepm_bench_{uuid.uuid4().hex[:8]}" for _ in range(2)]
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            stack.callback(
                conn.execute,
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
            )
        ours, base = (admin.set(database=name).render_as_string(False) for name in names)
        yield ours, base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="results for the bulk insert")
    parser.add_argument("--single", type=int, default=2_000, help="results added one by one")
    parser.add_argument("--pg-url", help="PostgreSQL database to create scratch databases from")
    parser.add_argument("--no-pg", action="store_true", help="measure SQLite only")
    args = parser.parse_args()
    if args.n < YEAR_ROWS:
        parser.error(f"--n must be at least {YEAR_ROWS} (the year target's pings)")
    report: dict[str, Any] = {
        "benchmark": "archive",
        "n": args.n,
        "single": args.single,
        "ratio": "our time / bare driver's time for the same work (1.0: no overhead)",
    }
    with tempfile.TemporaryDirectory(prefix="iepm-bench-") as directory:
        progress("sqlite")
        report["sqlite"] = run_backend(
            f"sqlite:///{directory}/ours.db", f"sqlite:///{directory}/base.db", args.n, args.single
        )
        report["sqlite"]["file_bytes"] = Path(directory, "ours.db").stat().st_size
    report["sqlite"]["add_raw_synchronous_normal"] = sqlite_single_add_normal(args.single)
    if args.no_pg:
        report["postgresql"] = {"skipped": "--no-pg"}
    else:
        with pg_databases(args.pg_url) as databases:
            if isinstance(databases, str):
                report["postgresql"] = {"skipped": databases}
            else:
                progress("postgresql")
                report["postgresql"] = run_backend(*databases, args.n, args.single)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
