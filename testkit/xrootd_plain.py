"""A plain xrootd endpoint for tests and fixture recording: its own directory on the memory file
system, a free loopback port, run as ``nobody`` when we are root (xrootd refuses root); stopped by
process group and its directory removed afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from iepm.runner import start_process_sync
from testkit.net import free_port


@dataclass
class PlainXrootd:
    port: int
    root: Path
    # Exported and writable by the server.
    export: Path
    # Exported but owned by root, mode 0755: the server may not write there.
    readonly: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def files(self) -> list[Path]:
        return [p for d in (self.export, self.readonly) for p in d.iterdir()]


@contextlib.contextmanager
def plain_xrootd(timeout_s: float = 10.0) -> Iterator[PlainXrootd]:
    root = Path(tempfile.mkdtemp(prefix="iepm-test-xrootd-", dir="/dev/shm"))
    root.chmod(0o755)
    export, readonly, admin = root / "export", root / "readonly", root / "admin"
    for d in (export, readonly, admin):
        d.mkdir()
    port = free_port()
    (root / "xrootd.cf").write_text(
        f"all.export {export}\nall.export {readonly}\nall.adminpath {admin}\nall.pidpath {admin}\n"
    )
    argv = ["xrootd", "-c", str(root / "xrootd.cf"), "-n", f"test{port}", "-p", str(port)]
    argv += ["-l", "-"]
    if os.geteuid() == 0:
        argv += ["-R", "nobody"]
        for d in (export, admin):
            shutil.chown(d, "nobody")
    log = root / "xrootd.log"
    with log.open("wb") as out:
        tool = start_process_sync(argv, stdout=out, stderr=out)
    proc = tool.popen
    try:
        deadline = time.monotonic() + timeout_s
        while b"initialization completed" not in (log.read_bytes() if log.exists() else b""):
            if proc.poll() is not None or time.monotonic() > deadline:
                said = log.read_text(errors="replace") if log.exists() else ""
                raise AssertionError(f"xrootd did not start: {said[-2000:]}")
            time.sleep(0.05)
        yield PlainXrootd(port, root, export, readonly, log, proc)
    finally:
        tool.stop()  # the project's one supervisor: TERM, grace, KILL, sweep the group
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def silent_listener() -> Iterator[int]:
    """A port that accepts connections and never says a word (a hung server)."""
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()
