"""Several processes on one archive, and a writer killed with SIGKILL at a random moment."""

from __future__ import annotations

import os
import random
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from iepm.store import Archive

# Writers are real processes (the servers tier).
pytestmark = pytest.mark.servers

WRITER = Path(__file__).with_name("writer.py")


@contextmanager
def writer(url: str, prefix: str, count: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child that will add ``count`` results (0: until killed) once ``go(child)`` is called;
    killed by PID if still running at the end."""
    with log.open("ab") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(WRITER), url, prefix, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=10)
        for stream in (child.stdin, child.stdout):
            assert stream is not None
            stream.close()


def go(*children: subprocess.Popen[bytes]) -> None:
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()


class Lines:
    """Complete lines read from a child's stdout, without ever blocking past a deadline."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        self.fd = child.stdout.fileno()
        self.partial = b""
        self.lines: list[str] = []

    def read(self, until: float, timeout_s: float) -> list[str]:
        """Read until ``until`` lines have come or the stream ends."""
        deadline = time.monotonic() + timeout_s
        while len(self.lines) < until:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(self.lines)} lines within {timeout_s} s"
            if not select.select([self.fd], [], [], remaining)[0]:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                break
            *complete, self.partial = (self.partial + chunk).split(b"\n")
            self.lines += [line.decode() for line in complete]
        return self.lines


def test_two_processes_write_to_one_archive_at_once(archive_url: str, workdir: Path) -> None:
    # The archive does not exist yet: both processes also create it at the same time.
    count = 300
    log = workdir / "writers.log"
    with (
        writer(archive_url, "a", count, log) as first,
        writer(archive_url, "b", count, log) as second,
    ):
        go(first, second)
        lines = [Lines(first), Lines(second)]
        # Each writes half its results and waits: neither half can end before both began, and
        # both second halves start together, whatever the scheduler does.
        for child in lines:
            assert child.read(until=count // 2 + 1, timeout_s=180)[-1] == "half"
        go(first, second)
        reported = [
            line
            for child in lines
            for line in child.read(until=float("inf"), timeout_s=180)
            if line != "half"
        ]
        assert (first.wait(timeout=10), second.wait(timeout=10)) == (0, 0), log.read_text()
    assert len(reported) == 2 * count
    with Archive.open(archive_url) as archive:
        assert {result.id for result in archive.results()} == set(reported)
        assert archive.integrity_check() == "ok"
        # The two really wrote at the same time: their runs interleave (by the handshake).
        spans = [[r.started_at for r in archive.results(monitor=m)] for m in ("a", "b")]
        assert max(min(span) for span in spans) < min(max(span) for span in spans)


def test_a_kill_9_loses_at_most_the_result_in_flight(archive_url: str, workdir: Path) -> None:
    rng = random.Random(17)  # seeded: a failure replays with the same kill points
    log = workdir / "writer.log"
    Archive.open(archive_url).close()
    kept = 0
    for round_ in range(4):
        prefix = f"kill{round_}"
        with writer(archive_url, prefix, 0, log) as child:
            go(child)
            lines = Lines(child)
            lines.read(until=rng.randint(5, 60), timeout_s=60)
            time.sleep(rng.uniform(0, 0.02))  # somewhere inside a later add()
            child.kill()
            assert child.wait(timeout=10) == -9
            reported = lines.read(until=float("inf"), timeout_s=10)
        with Archive.open(archive_url) as archive:
            assert archive.integrity_check() == "ok"
            stored = sorted(result.id for result in archive.results(monitor=prefix))
            # The child adds results in order and prints each id once committed: the archive
            # holds exactly what it reported, plus perhaps one committed but not yet reported.
            assert stored[: len(reported)] == reported
            assert len(stored) - len(reported) in (0, 1)
            kept += len(stored)
            assert archive.count() == kept
