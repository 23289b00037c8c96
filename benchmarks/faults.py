"""Results lost under faults: full disks, a frozen or stopped PostgreSQL, ``kill -9`` of
``iepm run`` (with the archive up, and while it is down and results are spooling).

Each trial runs real cycles (ping + traceroute on loopback), injects its fault, lets it clear
and lets the monitor catch up; *expected* are the results the monitor reported as made (the
cycle's report, or the lines ``iepm run`` printed before it was killed), *found* those of them
in the archive afterwards. ``lost`` must be 0. ``cycle_ratio`` is the wall time of a cycle with
the database frozen mid-cycle over a clean cycle's (the price of one archive deadline), and
``max_probe_over_deadline`` the longest probe's duration over its own deadline (must stay < 1:
a hung database never stretches a probe).

Full-disk trials need root (small tmpfs mounts, unmounted afterwards). Prints JSON.

    .venv/bin/python benchmarks/faults.py [--disks 3] [--freezes 2] [--stops 2] [--kills 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import iepm.scheduler
from iepm.config import Config, load_config_text
from iepm.results import Result
from iepm.scheduler import Scheduler
from iepm.store import Archive

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testkit.faults import Postgres, fill, private_postgres, thawed_after, tmpfs

RESULT_LINE = re.compile(r"^\S+ (\S+) (\S+) (ok|failed|timeout|skipped): .* \[([0-9a-f]{32})\]$")
LAYOUTS = ("raw-log", "shared", "archive-only")


def config_text(archive_url: str, log_dir: Path, targets: int = 3) -> str:
    hosts = "".join(
        f'[[targets]]\nname = "t{i}"\naddress = "127.0.0.{i + 1}"\n'
        'probes = ["ping", "traceroute"]\n'
        for i in range(targets)
    )
    return (
        f'[monitor]\nname = "faults-bench"\ncycle_interval_s = 300\narchive = "{archive_url}"\n'
        f'log_dir = "{log_dir}"\nalerts = false\n'
        "[defaults.ping]\ncount = 3\ninterval_s = 0.3\n"
        "[defaults.traceroute]\nmax_hops = 3\nwait_s = 1\n" + hosts
    )


def config(archive_url: str, log_dir: Path) -> Config:
    return load_config_text(config_text(archive_url, log_dir))


def found_in(url: str, ids: set[str]) -> int:
    with Archive.open(url) as archive:
        return len(ids & {r.id for r in archive.results()})


def over_deadline(cfg: Config, results: list[Result]) -> float:
    return max(r.duration_s / cfg.spec_for(cfg.targets[0], r.probe).deadline_s() for r in results)


def wait_for(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.1)


# -- full disks ------------------------------------------------------------------------------------


def disk_trial(layout: str, work: Path) -> dict[str, Any]:
    with tmpfs("4m") as disk:
        on_disk = layout in ("shared", "archive-only")
        url = f"sqlite:///{(disk if on_disk else work) / f'{layout}.db'}"
        log_dir = disk / "raw" if layout in ("raw-log", "shared") else work / f"{layout}-raw"
        cfg = config(url, log_dir)
        Archive.open(url).close()
        with Archive.open(url) as archive:
            with archive.reading("checkpoint") as conn:  # the next commit needs new space
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            scheduler = Scheduler(cfg, archive)
            filler = fill(disk)
            full = asyncio.run(scheduler.run_cycle())
            where = dict(scheduler.health.stored_in)
            filler.unlink()
            after = asyncio.run(scheduler.run_cycle())
        ids = {r.id for r in full.results + after.results}
        return {
            "fault": f"full disk ({layout})",
            "stored_while_full": where,
            "expected": len(ids),
            "found": found_in(url, ids),
        }


# -- PostgreSQL frozen or stopped mid-cycle --------------------------------------------------------


def pg_trial(pg: Postgres, url: str, fault: str, freeze_s: float, work: Path) -> dict[str, Any]:
    cfg = config(url, work / f"raw-{fault}")
    with Archive.open(url) as archive, thawed_after(pg, freeze_s) as frozen:
        done = threading.Event()

        def inject(_result: Result) -> None:
            if not done.is_set():
                done.set()
                if fault == "frozen":
                    frozen.append(pg.freeze())
                else:
                    threading.Thread(target=pg.stop, daemon=True).start()

        scheduler = Scheduler(cfg, archive, on_result=inject)
        t0 = time.monotonic()
        report = asyncio.run(scheduler.run_cycle())
        took = time.monotonic() - t0
        where = dict(scheduler.health.stored_in)
        if fault == "frozen":
            pg.answering()
        else:
            wait_for(lambda: not (pg.data / "postmaster.pid").exists(), 60)
            pg.start()
            pg.answering()
        wait_for(lambda: scheduler._stuck.value == 0, 60)
        asyncio.run(scheduler.catch_up())
    ids = {r.id for r in report.results}
    return {
        "fault": f"postgresql {fault}",
        "stored_during_fault": where,
        "cycle_s": round(took, 2),
        "max_probe_over_deadline": round(over_deadline(cfg, report.results), 3),
        "expected": len(ids),
        "found": found_in(url, ids),
    }


def clean_cycle_s(url: str, work: Path) -> float:
    with Archive.open(url) as archive:
        t0 = time.monotonic()
        asyncio.run(Scheduler(config(url, work / "raw-clean"), archive).run_cycle())
        return time.monotonic() - t0


# -- kill -9 of iepm run ---------------------------------------------------------------------------


def kill_trial(
    pg: Postgres, url: str, archive_down: bool, rng: random.Random, work: Path, n: int
) -> dict[str, Any]:
    path = work / f"kill{n}.toml"
    path.write_text(config_text(url, work / "raw-kill"))
    if archive_down:
        pg.stop()
    printed: set[str] = set()
    after = rng.randint(1, 5)
    proc = subprocess.Popen(
        [sys.executable, "-m", "iepm.cli", "run", "-c", str(path), "--cycles", "3", "--no-live"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while len(printed) < after and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if match := RESULT_LINE.match(line.strip()):
                printed.add(match[4])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if archive_down:
        pg.start()
        pg.answering()
    again = subprocess.run(
        [sys.executable, "-m", "iepm.cli", "run", "-c", str(path), "--once", "--no-live"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return {
        "fault": "kill -9" + (" while the archive is down" if archive_down else ""),
        "killed_after_results": after,
        "restart_exit": again.returncode,
        "expected": len(printed),
        "found": found_in(url, printed),
    }


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="iepm-faults-bench-") as path:
        yield Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--disks", type=int, default=3)
    parser.add_argument("--freezes", type=int, default=2)
    parser.add_argument("--stops", type=int, default=2)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--freeze-s", type=float, default=15.0)
    parser.add_argument("--seed", type=int, default=17)
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    rng = random.Random(args.seed)
    # Retry the archive soon after a hang, so each trial's catch-up does not wait 30 s.
    iepm.scheduler.ARCHIVE_RETRY_S = 1.0
    trials: list[dict[str, Any]] = []
    clean = frozen_cycles = None
    with workdir() as work:
        if os.geteuid() == 0:
            trials += [disk_trial(LAYOUTS[i % len(LAYOUTS)], work) for i in range(args.disks)]
        with private_postgres() as pg:
            if pg is None:
                sys.exit("PostgreSQL server binaries not found")
            url = pg.server.create_database("faults_bench")
            clean = clean_cycle_s(url, work)
            for _ in range(args.freezes):
                trials.append(pg_trial(pg, url, "frozen", args.freeze_s, work))
            for _ in range(args.stops):
                trials.append(pg_trial(pg, url, "stopped", args.freeze_s, work))
            for n in range(args.kills):
                trials.append(kill_trial(pg, url, n % 2 == 1, rng, work, n))
            frozen_cycles = [t["cycle_s"] for t in trials if t["fault"] == "postgresql frozen"]
    expected = sum(t["expected"] for t in trials)
    found = sum(t["found"] for t in trials)
    probe_ratios = [t["max_probe_over_deadline"] for t in trials if "max_probe_over_deadline" in t]
    print(
        json.dumps(
            {
                "figure": "results lost under faults",
                "full_disks_tried": sum(t["fault"].startswith("full disk") for t in trials),
                "outages_tried": args.freezes + args.stops,
                "kills_tried": args.kills,
                "results_expected": expected,
                "results_found": found,
                "lost": expected - found,
                "baseline": "main: a full disk or a torn spool stopped iepm run; a frozen "
                "database stretched a probe to the freeze's length",
                "clean_cycle_s": round(clean or 0, 2),
                "frozen_cycle_s": frozen_cycles,
                "cycle_ratio": round(max(frozen_cycles) / clean, 2)
                if frozen_cycles and clean
                else None,
                "max_probe_over_deadline": max(probe_ratios) if probe_ratios else None,
                "trials": trials,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
