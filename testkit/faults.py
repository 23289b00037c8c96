"""Fault injection for the engine tests and benchmarks/faults.py: small full file systems and a
private PostgreSQL server that can be frozen (SIGSTOP), stopped and started again."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import psycopg

from testkit.pg import PgServer, _runner, find_bindir, running_server

FILL_CHUNK = 64 * 1024
PG_WAIT_S = 60.0


@contextlib.contextmanager
def tmpfs(size: str, prefix: str = "iepm-full-") -> Iterator[Path]:
    """A small tmpfs mounted on a new temporary directory; unmounted and removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix=prefix))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(where)],
        check=True,
        timeout=30,
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True, timeout=30)
        where.rmdir()


def fill(directory: Path) -> Path:
    """Fill ``directory``'s file system to the last byte; remove the returned file to free it."""
    filler = directory / "filler"
    chunk = b"\0" * FILL_CHUNK
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = FILL_CHUNK
        while size:
            try:
                os.write(fd, chunk[:size])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                size //= 2  # down to the last byte
    finally:
        os.close(fd)
    return filler


def is_full(directory: Path) -> bool:
    try:
        with (directory / ".probe").open("wb") as probe:
            probe.write(b"x" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        return exc.errno == errno.ENOSPC
    (directory / ".probe").unlink()
    return False


@dataclass
class Postgres:
    """A private PostgreSQL cluster this test may freeze, stop and start."""

    server: PgServer
    bindir: Path

    @property
    def data(self) -> Path:
        return self.server.directory / "data"

    def _pg_ctl(self, *args: str) -> None:
        prefix, _uid, _gid = _runner(self.bindir)
        argv = [*prefix, str(self.bindir / "pg_ctl"), f"--pgdata={self.data}", *args]
        subprocess.run(argv, check=True, capture_output=True, timeout=90, cwd=self.server.directory)

    def processes(self) -> list[psutil.Process]:
        postmaster = psutil.Process(int((self.data / "postmaster.pid").read_text().split()[0]))
        return [postmaster, *postmaster.children(recursive=True)]

    def freeze(self) -> list[psutil.Process]:
        """SIGSTOP the postmaster and every backend; returns them for ``thaw``."""
        frozen = self.processes()
        for process in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGSTOP)
        return frozen

    @staticmethod
    def thaw(frozen: list[psutil.Process]) -> None:
        for process in frozen:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "-w", "--timeout=60", "stop")

    def start(self) -> None:
        log = self.server.directory / "server.log"
        self._pg_ctl(f"--log={log}", "-w", "--timeout=60", "start")

    def answering(self, timeout_s: float = PG_WAIT_S) -> None:
        """Wait until the server answers a query (it is thawed or started), at most timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=self.server.port,
                    user="postgres",
                    password=self.server.password,
                    dbname="postgres",
                    connect_timeout=2,
                ) as conn:
                    conn.execute("SELECT 1")
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


@contextlib.contextmanager
def private_postgres() -> Iterator[Postgres | None]:
    """A cluster of its own (freezing the session's shared one would stall other tests); None
    without the server binaries."""
    bindir = find_bindir()
    if bindir is None:
        yield None
        return
    with running_server(bindir) as server:
        yield Postgres(server, bindir)


@contextlib.contextmanager
def thawed_after(pg: Postgres, seconds: float) -> Iterator[list[list[psutil.Process]]]:
    """Collects what ``pg.freeze()`` froze (append to the yielded list) and thaws it
    ``seconds`` after each freeze, and in any case on leaving."""
    frozen: list[list[psutil.Process]] = []
    timers: list[threading.Timer] = []

    class _Frozen(list[list[psutil.Process]]):
        def append(self, processes: list[psutil.Process]) -> None:
            super().append(processes)
            timer = threading.Timer(seconds, pg.thaw, args=(processes,))
            timer.daemon = True
            timers.append(timer)
            timer.start()

    frozen = _Frozen()
    try:
        yield frozen
    finally:
        for timer in timers:
            timer.cancel()
        for processes in frozen:
            pg.thaw(processes)
