"""The agent's host facts (what a monitor needs to judge a test: CPU, memory, TCP buffers, NICs),
read in-process on the target: the agent does not import the monitor's probes."""

from __future__ import annotations

import contextlib
import platform
import re
from pathlib import Path

import psutil

NET = Path("/proc/sys/net")
NIC_ROOT = Path("/sys/class/net")


def _text(path: Path | str) -> str | None:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return Path(path).read_text(encoding="utf-8", errors="replace")[: 1 << 20].strip()
    return None


def _int(text: str | None) -> int | None:
    if text is None or not re.fullmatch(r"-?\d{1,19}", text):
        return None
    return int(text)


def _ints(text: str | None) -> list[int] | None:
    values = [_int(word) for word in (text or "").split()]
    return [v for v in values if v is not None] if values and None not in values else None


def host_facts() -> dict[str, object]:
    """Blocking (a few small files): call it from a thread."""
    cpuinfo = _text("/proc/cpuinfo") or ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    freq = None
    with contextlib.suppress(OSError, RuntimeError, NotImplementedError):
        current = psutil.cpu_freq()
        freq = round(current.current, 3) if current and current.current > 0 else None
    os_name = None
    for line in (_text("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            os_name = line.split("=", 1)[1].strip().strip('"')
    nics: dict[str, dict[str, int | str | None]] = {}
    with contextlib.suppress(OSError):
        for name, stats in sorted(psutil.net_if_stats().items()):
            nics[name] = {
                "speed_mbps": stats.speed if stats.speed > 0 else None,
                "mtu_bytes": stats.mtu,
                "operstate": _text(NIC_ROOT / name / "operstate") or None,
            }
    available = _text(NET / "ipv4/tcp_available_congestion_control")
    return {
        "os": os_name,
        "machine": platform.machine(),
        "kernel": platform.release() or None,
        "cpu_count": psutil.cpu_count(),
        "cpu_mhz": freq,
        "cpu_model": model.group(1).strip() if model else None,
        "memory_total_bytes": psutil.virtual_memory().total,
        "tcp_rmem_bytes": _ints(_text(NET / "ipv4/tcp_rmem")),
        "tcp_wmem_bytes": _ints(_text(NET / "ipv4/tcp_wmem")),
        "rmem_max_bytes": _int(_text(NET / "core/rmem_max")),
        "wmem_max_bytes": _int(_text(NET / "core/wmem_max")),
        "tcp_congestion_control": _text(NET / "ipv4/tcp_congestion_control") or None,
        "tcp_available_congestion_control": available.split() if available else None,
        "nics": nics,
    }


def tcp_buffer_defaults() -> tuple[tuple[int, int], tuple[int, int]]:
    """((rmem default, wmem default), (rmem max, wmem max)) of tcp_rmem/tcp_wmem: where an
    untouched socket starts and how far autotuning may take it."""
    rmem = _ints(_text(NET / "ipv4/tcp_rmem")) or [4096, 131072, 6291456]
    wmem = _ints(_text(NET / "ipv4/tcp_wmem")) or [4096, 16384, 4194304]
    return (rmem[1], wmem[1]), (rmem[2], wmem[2])
