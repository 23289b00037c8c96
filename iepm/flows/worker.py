"""The collector's worker process: decode the receiver's frames and store the records.

Started by :class:`iepm.flows.collector.Collector` through the project's supervisor as
``python -m iepm.flows.worker``. Its stdin carries length-prefixed frames: first the settings
(JSON, so the archive URL with its password never shows in the process list), then frames of
datagrams. At end of input it writes what is pending and prints its report as one JSON line.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any

from iepm.errors import IepmError
from iepm.flows.collector import FRAME, PROGRESS, READY, Pipeline, peak_rss_kb, unpack_frame
from iepm.store import Archive


def _read_exactly(fd: int, size: int) -> bytes | None:
    """``size`` bytes from ``fd``, or None at end of input (the receiver closed the pipe)."""
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _frame(fd: int) -> bytes | None:
    header = _read_exactly(fd, FRAME.size)
    return None if header is None else _read_exactly(fd, FRAME.unpack(header)[0])


def _progress(pipeline: Pipeline) -> None:
    """One stderr line: records decoded so far, and those committed to the archive."""
    with pipeline.lock:
        stored = pipeline.report.stored
    line = {"pid": os.getpid(), "records": pipeline.decoder.stats.records, "stored": stored}
    sys.stderr.write(f"{PROGRESS} {json.dumps(line)}\n")
    sys.stderr.flush()


def main() -> int:
    # The receiver decides when to stop (it closes our stdin); a terminal's Ctrl-C is its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = sys.stdin.fileno()
    head = _frame(fd)
    if head is None:
        return 1
    settings: dict[str, Any] = json.loads(head)
    url = settings.pop("db")
    progress_s = settings.pop("progress_s", None)
    try:
        archive = Archive.open(url) if url else None
    except IepmError as exc:
        # The report still comes: the receiver counts every record of ours as dropped.
        sys.stdout.write(json.dumps({"errors": [str(exc)]}) + "\n")
        return 1
    pipeline = Pipeline(archive, **settings)
    sys.stdout.write(READY + "\n")  # the receiver says so: from here records are stored
    sys.stdout.flush()
    feed_many, tick = pipeline.feed_many, pipeline.tick
    progress_at = time.monotonic()
    try:
        while True:
            if progress_s is not None and time.monotonic() >= progress_at:
                progress_at = time.monotonic() + progress_s
                _progress(pipeline)
            # Waiting no longer than flush_s keeps writes going at low rates.
            wait_s = pipeline.flush_s if progress_s is None else min(pipeline.flush_s, progress_s)
            if not select.select([fd], [], [], wait_s)[0]:
                tick()
                continue
            frame = _frame(fd)
            if frame is None:
                break
            feed_many(unpack_frame(frame))
            tick()
        report = pipeline.close()
    finally:
        if archive is not None:
            archive.close()
    out = report.as_dict()
    out["worker_peak_rss_kb"] = peak_rss_kb()
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
