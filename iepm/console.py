"""Readable terminal output: one-line summaries and the live cycle table."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from iepm.results import Outcome, Result

OUTCOME_STYLE = {
    Outcome.OK: "green",
    Outcome.FAILED: "red",
    Outcome.TIMEOUT: "magenta",
    Outcome.SKIPPED: "yellow",
}


def _num(value: Any, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def mbps(bps: float | None) -> str:
    return "-" if bps is None else f"{bps / 1e6:.1f} Mbit/s"


def summary(result: Result) -> str:
    """The figures a person looks at first, per probe."""
    d = result.data
    if not result.succeeded and not d:
        return result.error or result.outcome.value
    if result.probe == "ping":
        return (
            f"rtt min/avg/max {_num(d.get('rtt_min_ms'))}/{_num(d.get('rtt_avg_ms'))}/"
            f"{_num(d.get('rtt_max_ms'))} ms, loss {_num(d.get('loss_percent'))}% "
            f"({d.get('packets_received', '-')}/{d.get('packets_sent', '-')})"
        )
    if result.probe == "traceroute":
        hops = d.get("hops") or []
        path = " > ".join(h.get("address") or "*" for h in hops)
        reached = "reached" if d.get("reached") else "NOT reached"
        return f"{len(hops)} hops, {reached}: {path}"
    if result.probe == "iperf3":
        text = (
            f"{mbps(d.get('throughput_bps'))} received, {mbps(d.get('sender_throughput_bps'))} "
            f"sent, retransmits {d.get('retransmits', '-')}"
        )
        if d.get("mean_rtt_ms") is not None:
            text += f", rtt {_num(d.get('mean_rtt_ms'))} ms"
        if d.get("jitter_ms") is not None:
            text += f", jitter {_num(d.get('jitter_ms'))} ms, loss {_num(d.get('loss_percent'))}%"
        return text
    if result.probe == "load":
        load = d.get("loadavg") or [d.get("load_1m"), d.get("load_5m"), d.get("load_15m")]
        return (
            f"load {' '.join(_num(x, '.2f') for x in load)}, {d.get('cpu_count', '-')} CPUs "
            f"@ {_num(d.get('cpu_mhz'), '.0f')} MHz, cc {d.get('tcp_congestion_control', '-')}"
        )
    return ", ".join(f"{k}={v}" for k, v in d.items() if not isinstance(v, list | dict))


def describe(result: Result) -> Text:
    """A multi-line readable report of one result, for ``iepm probe``."""
    style = OUTCOME_STYLE[result.outcome]
    text = Text()
    text.append(f"{result.probe} ", style="bold")
    text.append(f"{result.target} ({result.target_address}) ")
    text.append(result.outcome.value.upper(), style=f"bold {style}")
    text.append(f" in {result.duration_s:.2f} s\n")
    if result.data:
        text.append(summary(result) + "\n")
    if result.error:
        text.append(f"error: {result.error}\n", style=style)
    if not result.succeeded and result.diags:
        text.append(result.diags + "\n", style="dim")
    return text


class LiveTable:
    """Latest result per target × probe, for ``iepm run`` and ``make demo``."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.latest: dict[tuple[str, str], Result] = {}

    def update(self, result: Result) -> None:
        self.latest[(result.target, result.probe)] = result

    def render(self) -> Table:
        table = Table(title=self.title, expand=True)
        for column in ("target", "probe", "time (UTC)", "outcome", "result"):
            table.add_column(column, overflow="fold")
        for (target, probe), result in sorted(self.latest.items()):
            style = OUTCOME_STYLE[result.outcome]
            text = summary(result) if result.data else (result.error or "")
            table.add_row(
                target,
                probe,
                result.started_at.strftime("%H:%M:%S"),
                Text(result.outcome.value, style=style),
                text,
            )
        return table
