"""Import nfcapd files (what most sites already collect) through nfdump's own reader.

nfdump's JSON output is read, not its CSV or ``fmt:`` output: the CSV has whole-second start
and end times, and ``%ter`` in nfdump 1.7.1 prints the wrong milliseconds (930.932 s comes out as
930.032 s), while the JSON's ``first``/``last`` carry exact milliseconds. nfdump prints local
time without a zone, so it runs with ``TZ=UTC``.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from subprocess import PIPE
from typing import Any

from iepm.errors import ToolFailed, UsageError
from iepm.flows.records import Flow
from iepm.runner import start_process_sync

NFDUMP_DEADLINE_S = 600.0


def _ms(text: str) -> int:
    moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000 + 0.5)


def flow_from_json(obj: dict[str, Any]) -> Flow | None:
    """One nfdump JSON record as a Flow; None for records that are not flows (e.g. ``EXPORTER``
    lines). Raises KeyError/ValueError naming nothing: the caller adds where."""
    if obj.get("type") != "FLOW":
        return None
    octets, packets, proto = int(obj["in_bytes"]), int(obj["in_packets"]), int(obj["proto"])
    start, end = _ms(obj["first"]), _ms(obj["last"])
    src = obj.get("src4_addr") or obj.get("src6_addr")
    dst = obj.get("dst4_addr") or obj.get("dst6_addr")
    if src is None or dst is None:
        raise KeyError("src4_addr" if src is None else "dst4_addr")
    exporter = obj.get("ip4_router") or obj.get("ip6_router") or "unknown"
    return Flow(
        str(exporter), int(obj.get("export_sysid", 0)), 0, str(src), str(dst),
        int(obj.get("src_port", 0)), int(obj.get("dst_port", 0)), proto, octets, packets,
        start, end, 1,
    )  # fmt: skip


def parse_json_lines(lines: Iterator[str], name: str) -> Iterator[Flow]:
    """nfdump ``-o json`` output (one object over several lines) → flows. Bad input raises
    UsageError naming the file, the line and the field."""
    buffer: list[str] = []
    start = 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped == "{":
            buffer, start = [stripped], number
            continue
        if not buffer:
            continue
        if stripped in ("}", "},", "}]"):  # nfdump closes the last object and the list on one line
            buffer.append("}")
            try:
                obj = json.loads("".join(buffer))
            except json.JSONDecodeError as exc:
                raise UsageError(f"{name}: line {start}: not JSON: {exc.msg}") from None
            buffer = []
            try:
                flow = flow_from_json(obj)
            except KeyError as exc:
                raise UsageError(f"{name}: line {start}: field {exc.args[0]} missing") from None
            except (TypeError, ValueError) as exc:
                raise UsageError(f"{name}: line {start}: bad value: {exc}") from None
            if flow is not None:
                yield flow
        else:
            buffer.append(stripped)


def read_nfcapd(path: Path, deadline_s: float = NFDUMP_DEADLINE_S) -> Iterator[Flow]:
    """The flows of one nfcapd file, read by ``nfdump -r FILE -o json`` within ``deadline_s``."""
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    env = {**os.environ, "TZ": "UTC"}
    expired = threading.Event()
    with tempfile.TemporaryFile() as errors:  # a file: a chatty stderr cannot block nfdump
        tool = start_process_sync(
            ["nfdump", "-r", str(path), "-o", "json"], stdout=PIPE, stderr=errors, env=env
        )

        def expire() -> None:
            expired.set()
            tool.stop()

        timer = threading.Timer(deadline_s, expire)
        timer.start()
        try:
            assert tool.popen.stdout is not None
            lines = (raw.decode("utf-8", "replace") for raw in tool.popen.stdout)
            yield from parse_json_lines(lines, str(path))
            code = tool.wait(deadline_s)
        finally:
            timer.cancel()
            tool.stop()
        if expired.is_set():
            raise ToolFailed(f"nfdump -r {path}: not finished within {deadline_s:g} s")
        errors.seek(0)
        said = errors.read().decode("utf-8", "replace").strip().splitlines()
        # nfdump exits 0 after "Short read from file" on a file that is not nfcapd's: any
        # complaint on stderr fails the import (what was read is not trusted).
        if code != 0 or said:
            raise ToolFailed(f"nfdump -r {path} exited {code}: {said[0] if said else 'no message'}")
