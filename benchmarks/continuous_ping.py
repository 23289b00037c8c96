"""Continuous ping to many lab targets: the monitor's memory over time and the archive's growth.

A lab of one monitor and N targets (each behind its own link of 1-5 ms); ``iepm run`` (a real
monitor process, in the lab's monitor namespace) pings every target once a second with one
long-lived ``ping -D -O`` each, stores one result per target a minute (its 60 RTTs), and runs
two bandwidth tests (iperf3, exclusive) between them. Measured: the monitor's RSS every second
(start, end, max, and the growth after the first period), the results per target, and the
archive's growth against the growth predicted *before* the run from the row's shape (see
``predict_row_bytes``); the year's cost follows from the measured growth. The same run on SQLite
and on a private PostgreSQL (testkit/pg.py).

    .venv/bin/python benchmarks/continuous_ping.py [--targets 20] [--minutes 10] [--no-pg]

Prints JSON. Root (the lab builds network namespaces).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import text

# tests/ (the PostgreSQL launcher, the iperf3 server helper) lives beside the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.lab.testing import LabFactory
from iepm.probes import ping
from iepm.probes.base import ProbeContext, result_from_raw
from iepm.runner import RawRun, start_process_sync
from iepm.store import Archive
from testkit.net import iperf3_server

MINUTES_PER_YEAR = 365 * 24 * 60
FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/ping"
# Per-row storage beyond the values themselves, by engine: SQLite's record header (~1 byte a
# column), rowid and cell pointer (~24), and ~6 bytes per index entry beside its key;
# PostgreSQL's tuple header (24) and item pointer (4), a varlena header per column (~17) and
# alignment (~4), and 8 + 4 bytes per index tuple. Index pages are taken as 70 % full (the
# primary key is a random uuid).
ROW_OVERHEAD_BYTES = {"sqlite": 24 + 4 * 6, "postgresql": 24 + 4 + 17 + 4 + 4 * 12}
INDEX_FILL = 0.7


def lab_topology(n_targets: int) -> dict[str, Any]:
    return {
        "lab": {"name": "cping", "seed": 5},
        "hosts": [
            {"name": "mon", "role": "monitor"},
            *({"name": f"t{i}", "role": "target"} for i in range(n_targets)),
        ],
        "links": [{"a": "mon", "b": f"t{i}", "delay_ms": 1.0 + i % 5} for i in range(n_targets)],
    }


def predict_row_bytes(engine: str, *, packets: int, rtt_ms: float, seq_top: int) -> float:
    """Bytes one stored window adds to the archive, predicted from its shape: the result that
    the recorded fixture's window parses into (keys, envelope fields), with its ``packets``
    RTTs (``rtt_ms`` as the lab gives) and sequence numbers (up to ``seq_top``) in the JSON,
    plus the indexes' keys and the engine's per-row overhead."""
    text = (FIXTURE / "ping-20221126--continuous-D-outage.out").read_text()
    argv = ("ping", "-n", "-O", "-D", "-i", "1", "-s", "56", "-w", "3600", "--", "198.18.1.2")
    raw = RawRun(argv=argv, stdout=text, returncode=None)
    ctx = ProbeContext(target="t10", address="198.18.1.2", monitor="mon")
    result = result_from_raw(ping, ping.Spec(), ctx, raw, "ping from iputils 20221126")
    envelope = json.loads(result.model_dump_json())
    data = envelope["data"]
    # Replace the fixture's 10 replies by the window's: one RTT and one seq per packet.
    # Stored compact (no spaces): each number and its comma.
    rtt_text = len(json.dumps(round(rtt_ms, 3))) + 1
    seq_text = sum(len(str(s)) + 1 for s in range(max(1, seq_top - packets), seq_top)) / packets
    lists = len(json.dumps(data["rtts_ms"])) + len(json.dumps(data["seqs"]))
    values = sum(len(json.dumps(v)) for v in envelope.values() if not isinstance(v, dict))
    payload = (
        values
        + len(json.dumps(envelope["params"]))
        + len(json.dumps(data))
        - lists
        + packets * (rtt_text + seq_text)
    )
    # Index keys: id, raw_token, (target, probe, purpose, started_at), (probe, started_at).
    keys = len(result.id) + 16 + (len("t10") + 4 + 7 + 8) + (4 + 8)
    return payload + keys / INDEX_FILL + ROW_OVERHEAD_BYTES[engine]


def archive_bytes(url: str) -> tuple[int, int]:
    """(the results table with its indexes, the whole archive) in bytes now: SQLite's pages of
    each (dbstat, after a checkpoint) or PostgreSQL's relation sizes."""
    with Archive.open(url) as archive:  # creates the schema on first use
        if url.startswith("postgresql"):
            with archive.reading("measuring") as conn:
                results = conn.exec_driver_sql("SELECT pg_total_relation_size('results')")
                whole = conn.exec_driver_sql("SELECT pg_database_size(current_database())")
                return int(results.scalar() or 0), int(whole.scalar() or 0)
    with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (results,) = db.execute(
            "SELECT SUM(pgsize) FROM dbstat WHERE name = 'results' OR name IN "
            "(SELECT name FROM sqlite_master WHERE tbl_name = 'results' AND type = 'index')"
        ).fetchone()
        (whole,) = db.execute("SELECT SUM(pgsize) FROM dbstat").fetchone()
        return int(results or 0), int(whole or 0)


def snapshot(url: str) -> tuple[int, int, int, int]:
    """(results table bytes, continuous-ping rows, bytes of the other rows' JSON, other rows)."""
    table, _ = archive_bytes(url)
    window = "probe = 'ping' AND diags LIKE :stream"
    stream = {"stream": "% -D %"}
    with Archive.open(url) as archive, archive.reading("counting") as conn:
        windows = conn.execute(text(f"SELECT COUNT(*) FROM results WHERE {window}"), stream)
        others = conn.execute(
            text(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(data AS TEXT)) + LENGTH(CAST(params "
                f"AS TEXT)) + LENGTH(diags) + 200), 0) FROM results WHERE NOT ({window})"
            ),
            stream,
        ).one()
        n_windows = windows.scalar()
    return table, int(n_windows or 0), int(others[1]), int(others[0])


def config_text(
    lab: Any, url: str, log_dir: Path, n_targets: int, window_s: float, iperf_port: int
) -> str:
    head = f"""
[monitor]
name = "cping"
cycle_interval_s = {window_s}
archive = "{url}"
log_dir = "{log_dir}"
netns = "{lab.netns("mon")}"
alerts = false

[schedule]
window_s = {window_s}
ping = "continuous"
iperf3 = {max(2.0 * window_s / 3.0, 10.0)}

[defaults.iperf3]
duration_s = 2
port = {iperf_port}
"""
    targets = "".join(
        f'\n[[targets]]\nname = "t{i}"\naddress = "{lab.address(f"t{i}")}"\n'
        + ('probes = ["ping", "iperf3"]\n' if i < 2 else 'probes = ["ping"]\n')
        for i in range(n_targets)
    )
    return head + targets


def run_continuous(
    factory: LabFactory,
    url: str,
    workdir: Path,
    *,
    n_targets: int,
    periods: int,
    window_s: float,
    prefix: str = "cping",
) -> dict[str, Any]:
    """Run ``iepm run`` for ``periods`` windows against ``n_targets`` lab targets; return what
    was predicted and measured (see the module docstring)."""
    lab = factory(lab_topology(n_targets), prefix=prefix)
    lab.wait_reachable("mon")
    engine = "postgresql" if url.startswith("postgresql") else "sqlite"
    config = workdir / f"{engine}.toml"
    with contextlib.ExitStack() as stack:
        ports = [
            stack.enter_context(iperf3_server(lab.address(f"t{i}"), 5201, lab.netns(f"t{i}")))
            for i in range(min(2, n_targets))
        ]
        config.write_text(
            config_text(lab, url, workdir / f"raw-{engine}", n_targets, window_s, ports[0])
        )
        archive_bytes(url)  # create the schema before the "before" size
        before, whole_before = archive_bytes(url)
        argv = [sys.executable, "-m", "iepm.cli", "run", "--config", str(config)]
        out = stack.enter_context((workdir / f"{engine}.out").open("w"))
        monitor = start_process_sync(
            [*argv, "--cycles", str(periods), "--no-live"], stdout=out, stderr=out
        )
        process = psutil.Process(monitor.pid)
        rss: list[tuple[float, int]] = []
        t0 = time.monotonic()
        deadline = t0 + periods * window_s + 120.0
        # Growth (of the archive and of the RSS) is measured from the first moment every
        # target has a window stored: the monitor is then fully started (on a loaded machine
        # that can take many seconds), and an empty table's first pages and forks, a fixed
        # cost, are behind.
        first: tuple[int, int, int, int] | None = None
        settled_at: float | None = None
        try:
            while monitor.popen.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(psutil.NoSuchProcess):
                    rss.append((time.monotonic() - t0, process.memory_info().rss))
                if first is None and time.monotonic() - t0 >= window_s:
                    now = snapshot(url)
                    if now[1] >= n_targets:
                        first, settled_at = now, time.monotonic() - t0
                monitor.wait(1.0)
        finally:
            monitor.stop()
        elapsed_s = time.monotonic() - t0
    after, whole_after = archive_bytes(url)
    last = snapshot(url)
    with Archive.open(url) as archive:
        # Windows of the continuous pings (-D); other ping rows are the sanity rule's own
        # runs before a bandwidth test, taken while a stream had no window stored yet.
        results = [r for r in archive.results(probe="ping") if " -D " in r.diags]
        iperf = list(archive.results(probe="iperf3"))
    per_target = {f"t{i}": 0 for i in range(n_targets)}
    for result in results:
        per_target[result.target] += 1
    full = [r for r in results if r.data.get("packets_sent") == round(window_s)]
    mean_rtt = sum(r.data["rtt_avg_ms"] for r in full) / max(1, len(full))
    rows = len(results)
    predicted_row = predict_row_bytes(
        engine, packets=round(window_s), rtt_ms=mean_rtt, seq_top=round(periods * window_s)
    )
    # Rows and bytes between the first snapshot and the end; the few other results (bandwidth
    # tests, gate pings) sharing the table are taken out at their stored size plus overhead.
    first = first or snapshot(url)
    grown_rows = last[1] - first[1]
    other_bytes = last[2] - first[2] + (last[3] - first[3]) * ROW_OVERHEAD_BYTES[engine]
    measured_row = (last[0] - first[0] - other_bytes) / max(1, grown_rows)
    spans = sorted((r.started_at.timestamp(), r.started_at.timestamp() + r.duration_s)
                   for r in iperf)  # fmt: skip
    overlaps = sum(b[0] < a[1] - 0.01 for a, b in itertools.pairwise(spans))
    settled = [b for t, b in rss if settled_at is not None and t >= settled_at]
    minutes_per_row = window_s / 60.0
    return {
        "engine": engine,
        "targets": n_targets,
        "window_s": window_s,
        "periods": periods,
        "monitor_exit": monitor.returncode,
        "elapsed_s": round(elapsed_s, 1),
        "rss_mib": {
            "start": round(rss[0][1] / 2**20, 1) if rss else None,
            "settled_after_s": None if settled_at is None else round(settled_at, 1),
            "settled": round(settled[0] / 2**20, 1) if settled else None,
            "end": round(rss[-1][1] / 2**20, 1) if rss else None,
            "max": round(max(b for _, b in rss) / 2**20, 1) if rss else None,
            "growth_after_settled": round((settled[-1] - settled[0]) / 2**20, 2)
            if settled
            else None,
            "samples": len(rss),
        },
        "results_per_target": sorted(set(per_target.values())),
        "results_predicted_per_target": [periods, periods + 1],
        "full_windows": len(full),
        "packets_per_full_window": round(window_s),
        "iperf3_runs": len(iperf),
        "iperf3_overlaps": overlaps,
        "results_table_growth_bytes": after - before,
        "measured_over": {"rows": grown_rows, "bytes": last[0] - first[0]},
        "archive_growth_bytes": whole_after - whole_before,
        "ping_rows": rows,
        "bytes_per_row": {
            "predicted": round(predicted_row),
            "measured": round(measured_row),
            "ratio_measured_to_predicted": round(measured_row / predicted_row, 3),
        },
        "bytes_per_target_per_minute": {
            "predicted": round(predicted_row / minutes_per_row),
            "measured": round(measured_row / minutes_per_row),
        },
        "year_per_target_mib": round(measured_row / minutes_per_row * MINUTES_PER_YEAR / 2**20),
        "year_for_targets_gib": round(
            measured_row / minutes_per_row * MINUTES_PER_YEAR * n_targets / 2**30, 2
        ),
    }


@contextlib.contextmanager
def pg_url() -> Iterator[str | None]:
    from testkit.pg import find_bindir, running_server

    bindir = find_bindir()
    if bindir is None:
        yield None
        return
    with running_server(bindir) as server:
        yield server.create_database(f"cping{math.floor(time.time())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=60.0, help="seconds per stored result")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    parser.add_argument("--only-pg", action="store_true", help="PostgreSQL only")
    args = parser.parse_args()
    periods = max(1, round(args.minutes * 60 / args.window))
    report: dict[str, Any] = {"benchmark": "continuous_ping", "command": " ".join(sys.argv)}
    with tempfile.TemporaryDirectory(prefix="iepm-cping-") as tmp, LabFactory() as factory:
        workdir = Path(tmp)
        if not args.only_pg:
            url = f"sqlite:///{workdir}/archive.db"
            report["sqlite"] = run_continuous(
                factory, url, workdir, n_targets=args.targets, periods=periods,
                window_s=args.window, prefix="cps",
            )  # fmt: skip
        if not args.no_pg:
            with pg_url() as url:
                if url is None:
                    report["postgresql"] = {"skipped": "no PostgreSQL server binaries"}
                else:
                    report["postgresql"] = run_continuous(
                        factory, url, workdir, n_targets=args.targets, periods=periods,
                        window_s=args.window, prefix="cpp",
                    )  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
