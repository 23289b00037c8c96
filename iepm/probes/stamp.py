"""Run a tool and prefix every line it prints with the wall-clock time it was read at.

``/usr/bin/python3 -I stamp.py PROGRAM ARG...``: each line of the tool's stdout (to stdout) and
stderr (to stderr) becomes ``[EPOCH.USEC] line``; carriage returns end lines too, so a progress
meter's updates are events. The first line, on stderr, is the moment the tool was started.
Tools such as rsync and ssh log events but not when they happened; with the stamps a pure
parser reads the phases of a run from its raw log alone. Imports nothing of iepm (Debian's
python3 runs it, as xrdsync.py).
"""

import os
import select
import subprocess
import sys
import time


def stamp(sink, pending, chunk, final):
    """Write the complete lines of ``pending + chunk`` to ``sink``; return the unfinished rest."""
    data = pending + chunk
    now = f"[{time.time():.6f}] ".encode()
    start = 0
    for i, byte in enumerate(data):
        if byte in (10, 13):  # \n, \r
            if i > start:
                sink.write(now + data[start:i] + b"\n")
            start = i + 1
    rest = data[start:]
    if final and rest:
        sink.write(now + rest + b"\n")
        rest = b""
    sink.flush()
    return rest


def main():
    argv = sys.argv[1:]
    err = sys.stderr.buffer
    err.write(f"[{time.time():.6f}] stamp: start {argv[0]}\n".encode())
    err.flush()
    try:
        child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        err.write(f"[{time.time():.6f}] stamp: cannot run {argv[0]}: {exc.strerror}\n".encode())
        return 127
    sinks = {child.stdout.fileno(): sys.stdout.buffer, child.stderr.fileno(): err}
    pending = {fd: b"" for fd in sinks}
    while sinks:
        ready, _, _ = select.select(list(sinks), [], [])
        for fd in ready:
            chunk = os.read(fd, 65536)
            pending[fd] = stamp(sinks[fd], pending[fd], chunk, final=not chunk)
            if not chunk:
                del sinks[fd]
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
