"""Run a tool and prefix every line it prints with the wall-clock time it was read at.

``/usr/bin/python3 -I stamp.py PROGRAM ARG...``: each line of the tool's stdout (to stdout) and
stderr (to stderr) becomes ``[EPOCH.USEC] line``; carriage returns end lines too, so a progress
meter's updates are events. The first line, on stderr, is the moment the tool was started.
Tools such as rsync and ssh log events but not when they happened; with the stamps a pure
parser reads the phases of a run from its raw log alone. Imports nothing of iepm (Debian's
python3 runs it, as xrdsync.py).

``stamp.py --all PROGRAM ARG... --and PROGRAM ARG...``: the tools run at once (parallel copies:
one raw record for the set), each line ``[EPOCH.USEC] <i> line`` with ``i`` the tool's place,
and each tool's exit ``<i> stamp: exit CODE`` on stderr; the exit code is the first failing
tool's, else 0.
"""

import os
import select
import subprocess
import sys
import time


def stamp(sink, pending, chunk, final, tag=b""):
    """Write the complete lines of ``pending + chunk`` to ``sink``; return the unfinished rest."""
    data = pending + chunk
    now = f"[{time.time():.6f}] ".encode() + tag
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
    args = sys.argv[1:]
    tagged = args[:1] == ["--all"]
    commands = [[]]
    for arg in args[1:] if tagged else args:
        if tagged and arg == "--and":
            commands.append([])
        else:
            commands[-1].append(arg)
    err = sys.stderr.buffer
    children, sinks, tags = [], {}, {}
    for i, argv in enumerate(commands):
        tag = f"<{i}> ".encode() if tagged else b""
        err.write(f"[{time.time():.6f}] ".encode() + tag + f"stamp: start {argv[0]}\n".encode())
        err.flush()
        try:
            child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            err.write(
                f"[{time.time():.6f}] ".encode()
                + tag
                + f"stamp: cannot run {argv[0]}: {exc.strerror}\n".encode()
            )
            for started in children:
                started.kill()
            return 127
        children.append(child)
        sinks.update({child.stdout.fileno(): sys.stdout.buffer, child.stderr.fileno(): err})
        tags.update({child.stdout.fileno(): tag, child.stderr.fileno(): tag})
    pending = {fd: b"" for fd in sinks}
    while sinks:
        ready, _, _ = select.select(list(sinks), [], [])
        for fd in ready:
            chunk = os.read(fd, 65536)
            pending[fd] = stamp(sinks[fd], pending[fd], chunk, not chunk, tags[fd])
            if not chunk:
                del sinks[fd]
    codes = [child.wait() for child in children]
    if not tagged:
        return codes[0]
    for i, code in enumerate(codes):
        err.write(f"[{time.time():.6f}] <{i}> stamp: exit {code}\n".encode())
    err.flush()
    return next((code for code in codes if code != 0), 0)


if __name__ == "__main__":
    sys.exit(main())
