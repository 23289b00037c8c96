"""The monitor's bytes in and out per interface, from ``/proc/net/dev``, as rates.

The monitor may run its probes inside a network namespace (``[monitor] netns``, the lab's
monitor host): its interfaces are then that namespace's, read through ``ip netns exec`` (the
runner, with a deadline), since ``/proc/net/dev`` shows the reading process's own namespace.
"""

from __future__ import annotations

from pathlib import Path

from iepm.errors import ToolFailed
from iepm.runner import run_command

PROC_NET_DEV = Path("/proc/net/dev")
READ_DEADLINE_S = 5.0


def parse_net_dev(text: str) -> dict[str, tuple[int, int]]:
    """``/proc/net/dev`` → {interface: (rx_bytes, tx_bytes)} (pure)."""
    counters: dict[str, tuple[int, int]] = {}
    for line in text.splitlines()[2:]:  # two header lines
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or len(fields) < 9:
            continue
        counters[name.strip()] = (int(fields[0]), int(fields[8]))
    return counters


async def read_counters(netns: str | None = None) -> dict[str, tuple[int, int]]:
    """This host's (or ``netns``'s) byte counters now; ToolFailed when they cannot be read."""
    if netns is None:
        try:
            return parse_net_dev(PROC_NET_DEV.read_text())
        except OSError as exc:
            raise ToolFailed(f"cannot read {PROC_NET_DEV}: {exc.strerror or exc}") from None
    raw = await run_command(
        ["ip", "netns", "exec", netns, "cat", str(PROC_NET_DEV)], READ_DEADLINE_S
    )
    if raw.returncode != 0 or raw.timed_out:
        raise ToolFailed(f"cannot read {PROC_NET_DEV} in {netns}: {raw.stderr.strip()[:200]}")
    return parse_net_dev(raw.stdout)


def rates_mbps(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], elapsed_s: float
) -> dict[str, tuple[float, float]]:
    """{interface: (rx_mbps, tx_mbps)} between two readings ``elapsed_s`` apart; an interface
    new in ``after`` or whose counters went back (re-created) is left out."""
    rates: dict[str, tuple[float, float]] = {}
    if elapsed_s <= 0:
        return rates
    for name, (rx1, tx1) in after.items():
        if name not in before:
            continue
        rx0, tx0 = before[name]
        if rx1 < rx0 or tx1 < tx0:
            continue
        rates[name] = ((rx1 - rx0) * 8e-6 / elapsed_s, (tx1 - tx0) * 8e-6 / elapsed_s)
    return rates
