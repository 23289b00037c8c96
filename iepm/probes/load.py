"""Host load and tuning facts: what explains a bandwidth result (procfs / sysfs, no tool).

The probe reads files rather than running a measuring program. To keep the architecture's
run → raw log → pure parse() pipeline (and ``iepm extract``), the files are read by a tiny
snapshot program whose stdout is a JSON document ``{"files": {path: text}, "errors": {path:
reason}}``; that document is what the raw log keeps and what ``parse()`` reads.

Why a Python one-liner and not ``cat FILE…``: ``cat`` concatenates files with no boundaries, a
missing file would shift everything after it, and ``/sys/class/net/*/speed`` needs a glob that
only a shell could expand — and the glob must be expanded *inside* the network namespace, because
``ip netns exec`` remounts ``/sys`` and per-namespace sysctls (``/proc/sys/net``) differ. The
snapshot program is the same interpreter iepm runs on (``sys.executable -I -S``: isolated, no
site-packages, stdlib only), so nothing extra must be installed on a monitor.

``cpu_mhz_from_cpuinfo()`` and ``local_cpu_mhz()`` are shared with the iperf3 probe (MHz per
Mbit/s).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import Field

from iepm.errors import ParseError, ToolFailed
from iepm.probes.base import (
    Column,
    Metric,
    ProbeContext,
    ProbeMeta,
    ProbeSpec,
    execute,
    figure,
)
from iepm.results import Result
from iepm.runner import RawRun

NAME = "load"
TOOL = "procfs"
META = ProbeMeta(scheduling="background", version_argv=None, local=True)
# Host facts explain other probes' results (analysis.cause); none is plotted on its own.
METRICS: tuple[Metric, ...] = ()

LOADAVG = "/proc/loadavg"
CPUINFO = "/proc/cpuinfo"
CPU_ONLINE = "/sys/devices/system/cpu/online"
CPUFREQ_CUR = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq"
CPUFREQ_MAX = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
OSRELEASE = "/proc/sys/kernel/osrelease"
MEMINFO = "/proc/meminfo"
TCP_RMEM = "/proc/sys/net/ipv4/tcp_rmem"
TCP_WMEM = "/proc/sys/net/ipv4/tcp_wmem"
RMEM_MAX = "/proc/sys/net/core/rmem_max"
WMEM_MAX = "/proc/sys/net/core/wmem_max"
TCP_CC = "/proc/sys/net/ipv4/tcp_congestion_control"
TCP_CC_AVAILABLE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
NET_CLASS = "/sys/class/net"
NIC_ATTRIBUTES = ("speed", "mtu", "operstate")

# Globs are expanded by the snapshot program, i.e. inside the namespace it runs in.
SNAPSHOT_PATHS: tuple[str, ...] = (
    LOADAVG,
    CPUINFO,
    CPU_ONLINE,
    CPUFREQ_CUR,
    CPUFREQ_MAX,
    OSRELEASE,
    MEMINFO,
    TCP_RMEM,
    TCP_WMEM,
    RMEM_MAX,
    WMEM_MAX,
    TCP_CC,
    TCP_CC_AVAILABLE,
    *(f"{NET_CLASS}/*/{attr}" for attr in NIC_ATTRIBUTES),
)

# Reads each argument (glob-expanded) and prints one JSON document. An unreadable file is
# recorded with its reason and never stops the others (e.g. ``lo/speed`` gives EINVAL).
SNAPSHOT_PROGRAM = """\
import glob, json, sys
files, errors = {}, {}
for pattern in sys.argv[1:]:
    for path in (sorted(glob.glob(pattern)) if "*" in pattern else [pattern]):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                files[path] = f.read(1 << 20)
        except OSError as exc:
            errors[path] = exc.strerror or type(exc).__name__
json.dump({"snapshot": 1, "files": files, "errors": errors}, sys.stdout)
"""

COLUMNS = [
    Column("load_avg_1m", "load average over 1 minute"),
    Column("load_avg_5m", "load average over 5 minutes"),
    Column("load_avg_15m", "load average over 15 minutes"),
    Column("cpu_count", "online logical CPUs"),
    Column("cpu_mhz", "mean current CPU clock, MHz"),
    Column("kernel_release", "kernel release (uname -r)"),
    Column("tcp_congestion_control", "default TCP congestion control"),
    Column("rmem_max_bytes", "net.core.rmem_max: largest receive buffer an application may set"),
    Column("wmem_max_bytes", "net.core.wmem_max: largest send buffer an application may set"),
    Column("memory_total_bytes", "MemTotal"),
    Column("memory_available_bytes", "MemAvailable"),
]


class Spec(ProbeSpec):
    """Nothing to tune but how long the snapshot may take (it is normally milliseconds)."""

    timeout_s: float = Field(
        default=10.0,
        ge=1.0,
        le=60.0,
        description="seconds the snapshot may take",
        json_schema_extra={"cli": "timeout"},
    )

    def deadline_s(self) -> float:
        return self.timeout_s


def build_argv(spec: Spec, address: str) -> list[str]:
    """The snapshot command. ``address`` is unused: a load result describes the local host."""
    # repr() keeps the program on one line, so the raw log's "$ command" line stays one line.
    return [sys.executable, "-I", "-S", "-c", f"exec({SNAPSHOT_PROGRAM!r})", *SNAPSHOT_PATHS]


# ---------------------------------------------------------------------------------------------
# Pure helpers over file texts (shared with the iperf3 probe).


def cpu_mhz_from_cpuinfo(text: str) -> float | None:
    """Mean of the ``cpu MHz`` lines of /proc/cpuinfo (absent on most ARM kernels)."""
    values = [
        v
        for v in (_float(m) for m in re.findall(r"^cpu MHz\s*:\s*(\S+)", text, re.MULTILINE))
        if v is not None and v > 0
    ]
    if not values:
        return None
    return round(sum(values) / len(values), 3)


def cpu_mhz_from_cpufreq(text: str) -> float | None:
    """A cpufreq sysfs value (kHz) in MHz."""
    khz = _int(text.strip())
    return round(khz / 1000.0, 3) if khz is not None and khz > 0 else None


def local_cpu_mhz() -> float | None:
    """This host's CPU clock in MHz: /proc/cpuinfo, else cpufreq, else None.

    Reads files, so call it from ``run()`` — never from a ``parse()``.
    """
    mhz = cpu_mhz_from_cpuinfo(_read(CPUINFO) or "")
    for path in (CPUFREQ_CUR, CPUFREQ_MAX):
        if mhz is not None:
            break
        mhz = cpu_mhz_from_cpufreq(_read(path) or "")
    return mhz


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# parse / check


def parse(raw: RawRun, spec: Spec | None = None) -> dict[str, Any]:
    """Host facts from a snapshot document. Missing files give None fields, never an error."""
    files, errors = _snapshot(raw)

    def text(path: str) -> str | None:
        return files.get(path)

    data: dict[str, Any] = {}
    loads = (text(LOADAVG) or "").split()
    data["load_avg_1m"], data["load_avg_5m"], data["load_avg_15m"] = (
        (_float(loads[i]) if len(loads) > i else None) for i in range(3)
    )

    cpuinfo = text(CPUINFO) or ""
    processors = len(re.findall(r"^processor\s*:", cpuinfo, re.MULTILINE))
    data["cpu_count"] = processors or _count_cpu_list(text(CPU_ONLINE) or "")
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    data["cpu_model"] = model.group(1).strip() if model else None
    data["cpu_mhz"] = (
        cpu_mhz_from_cpuinfo(cpuinfo)
        or cpu_mhz_from_cpufreq(text(CPUFREQ_CUR) or "")
        or cpu_mhz_from_cpufreq(text(CPUFREQ_MAX) or "")
    )

    data["kernel_release"] = (text(OSRELEASE) or "").strip() or None
    meminfo = text(MEMINFO) or ""
    data["memory_total_bytes"] = _meminfo_bytes(meminfo, "MemTotal")
    data["memory_available_bytes"] = _meminfo_bytes(meminfo, "MemAvailable")

    data["tcp_rmem_bytes"] = _three_ints(text(TCP_RMEM))
    data["tcp_wmem_bytes"] = _three_ints(text(TCP_WMEM))
    data["rmem_max_bytes"] = _int((text(RMEM_MAX) or "").strip())
    data["wmem_max_bytes"] = _int((text(WMEM_MAX) or "").strip())
    data["tcp_congestion_control"] = (text(TCP_CC) or "").strip() or None
    available = text(TCP_CC_AVAILABLE)
    data["tcp_available_congestion_control"] = available.split() if available else None

    data["nics"] = _nics(files, errors)
    # Which files could not be read, and why: "lo/speed: Invalid argument" is normal.
    data["unreadable"] = dict(sorted(errors.items()))
    return data


def check(data: dict[str, Any], spec: Spec) -> str | None:
    """A snapshot without the load average has failed at the one thing it is for."""
    if data.get("load_avg_1m") is None:
        reason = (data.get("unreadable") or {}).get(LOADAVG, "missing from the snapshot")
        return f"could not read the load average from {LOADAVG}: {reason}"
    return None


def summary(data: dict[str, Any]) -> str:
    d = data
    load = [d.get("load_avg_1m"), d.get("load_avg_5m"), d.get("load_avg_15m")]
    return (
        f"load {' '.join(figure(x, '.2f') for x in load)}, {d.get('cpu_count', '-')} CPUs "
        f"@ {figure(d.get('cpu_mhz'), '.0f')} MHz, cc {d.get('tcp_congestion_control', '-')}"
    )


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    return await execute(sys.modules[__name__], spec, ctx)


# ---------------------------------------------------------------------------------------------
# internals


def _snapshot(raw: RawRun) -> tuple[dict[str, str], dict[str, str]]:
    stdout = raw.stdout
    if not stdout.strip():
        said = next((ln.strip() for ln in reversed(raw.stderr.splitlines()) if ln.strip()), "")
        # e.g. ip netns exec: 'Cannot open network namespace "x": No such file or directory'
        raise ToolFailed(
            f"the load snapshot printed nothing (exit {raw.returncode})"
            + (f": {said}" if said else "")
        )
    try:
        doc = json.loads(stdout)
    except (ValueError, RecursionError) as exc:
        head = stdout.strip()[:120]
        raise ParseError(
            f"load snapshot is not a JSON document ({len(stdout)} chars; {exc}); "
            f"output began: {head!r}"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise ParseError("load snapshot has no 'files' object; was it made by iepm's snapshot?")
    files = {k: v for k, v in doc["files"].items() if isinstance(v, str)}
    raw_errors = doc.get("errors")
    errors = (
        {k: str(v) for k, v in raw_errors.items() if isinstance(v, str)}
        if isinstance(raw_errors, dict)
        else {}
    )
    return files, errors


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# A kernel integer fits in 64 bits: a sign and at most 20 ASCII digits. Anything else in a
# /proc or /sys file is not one (int() would also take '1_0', '+5' or Arabic-Indic digits, and
# raise instead of returning on more than 4,300 digits).
_KERNEL_INT = re.compile(r"-?[0-9]{1,20}")


def _int(text: str) -> int | None:
    return int(text) if _KERNEL_INT.fullmatch(text) else None


def _three_ints(text: str | None) -> list[int] | None:
    parts = (text or "").split()
    values = [_int(p) for p in parts]
    if len(values) != 3 or any(v is None for v in values):
        return None
    return [v for v in values if v is not None]


def _meminfo_bytes(text: str, key: str) -> int | None:
    match = re.search(rf"^{key}:\s*([0-9]{{1,20}})\s*kB", text, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def _count_cpu_list(text: str) -> int | None:
    """Count CPUs in a sysfs list such as ``0-3,8-11``."""
    total = 0
    for part in text.strip().split(","):
        bounds = part.split("-")
        lo = _int(bounds[0]) if bounds[0] else None
        hi = _int(bounds[-1]) if bounds[-1] else None
        if lo is None or hi is None or hi < lo or len(bounds) > 2:
            return None
        total += hi - lo + 1
    return total or None


NIC_FILE_RE = re.compile(rf"^{re.escape(NET_CLASS)}/([^/]+)/({'|'.join(NIC_ATTRIBUTES)})$")


def _nics(files: dict[str, str], errors: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per-interface speed (Mbit/s; -1 or unreadable → None), MTU and operstate."""
    nics: dict[str, dict[str, Any]] = {}
    for path in [*files, *errors]:
        match = NIC_FILE_RE.match(path)
        if match:
            nics.setdefault(
                match.group(1), {"speed_mbps": None, "mtu_bytes": None, "operstate": None}
            )
    for name, nic in nics.items():
        speed = _int((files.get(f"{NET_CLASS}/{name}/speed") or "").strip())
        nic["speed_mbps"] = speed if speed is not None and speed > 0 else None
        nic["mtu_bytes"] = _int((files.get(f"{NET_CLASS}/{name}/mtu") or "").strip())
        nic["operstate"] = (files.get(f"{NET_CLASS}/{name}/operstate") or "").strip() or None
    return dict(sorted(nics.items()))
