"""Available bandwidth from packet trains (client side; the target's ``iepm agent`` leases the
receiver, the ``abw`` server kind). A light probe: at most ``budget_bytes`` (100 kB by default)
and about a second per estimate, so it can run every minute where iperf3 runs every 90.

The tool is ``iepm/abwtool.py`` (one stdlib-only file, run by path): it sends small probes at
Poisson moments, whose one-way delays tell how often they found the bottleneck busy — its
utilisation u — then three back-to-back bursts of full-size packets (one ``sendmmsg`` call
each), whose spacing at the receiver gives the bottleneck's capacity C; A = C·(1 − u) plus the
probes' own rate. The receiver stamps every packet with the kernel's receive time. Why this
method and not Spruce's pairs or rate trains: README, "Available bandwidth (abw)".

``parse()`` recomputes the estimate from the send and receive times the tool prints (kept in the
raw log), so ``iepm extract`` reproduces it and a better estimator can be re-run on old runs.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from typing import Any

from pydantic import Field, model_validator

from iepm import abwtool as tool
from iepm.errors import ConfigError, ParseError, RemoteError, ToolFailed
from iepm.probes.base import (
    Column,
    Metric,
    ProbeContext,
    ProbeMeta,
    ProbeSpec,
    ServerNeed,
    execute,
    failed_result,
    figure,
)
from iepm.results import Result
from iepm.runner import RawRun

NAME = "abw"
TOOL = "iepm-abw"
SERVER = "abw"
TOOL_PATH = tool.__file__
META = ProbeMeta(
    # Light: 100 kB a run; runs beside the other light probes, never gates anything.
    scheduling="background",
    version_argv=(sys.executable, TOOL_PATH, "--version"),
    server=SERVER,
    default=False,
)
METRICS: tuple[Metric, ...] = (
    Metric(
        NAME,
        "available_bps",
        "available bandwidth (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
        rollup=True,
        alert={"min_relative": 0.25},
    ),
    Metric(NAME, "capacity_bps", "bottleneck capacity (bit/s)", "higher", 1.0, "bits_per_second"),
    Metric(NAME, "utilisation_percent", "bottleneck utilisation (%)", "lower", 1e-2, "ratio"),
)
COLUMNS = [
    Column("available_bps", "available bandwidth estimate, bit/s"),
    Column("capacity_bps", "bottleneck capacity estimate (back-to-back train), bit/s"),
    Column("utilisation_percent", "share of probes that found the bottleneck busy, percent"),
    Column("quality", "1 − relative standard error of the estimate (0..1)"),
    Column("probe_packets", "packets sent for the estimate"),
    Column("probe_bytes", "IP bytes sent for the estimate"),
    Column("received_packets", "packets the receiver stamped"),
    Column("estimate_s", "first packet sent to last stamp received back, s"),
]
DEFAULT_PORT = 7855
DEFAULT_BUDGET_BYTES = 100_000


class Spec(ProbeSpec):
    """One estimate. The packets sent (capacity train plus probes) must fit ``budget_bytes``."""

    port: int = Field(
        default=DEFAULT_PORT, ge=1, le=65535, description="receiver's UDP port (no agent)"
    )
    size_bytes: int = Field(
        default=1500,
        ge=200,
        le=tool.MAX_SIZE_BYTES,
        description="IP size of the capacity train's packets, bytes (the path's MTU)",
    )
    capacity_packets: int = Field(
        default=16, ge=4, le=64, description="packets in the back-to-back capacity train"
    )
    capacity_trains: int = Field(
        default=3, ge=1, le=8, description="capacity trains (bursts), 60 ms apart"
    )
    probes: int = Field(
        default=400, ge=tool.MIN_PROBES, le=1500, description="single probes for the utilisation"
    )
    probe_size_bytes: int = Field(
        default=64, ge=tool.MIN_SIZE_BYTES, le=1500, description="IP size of a probe, bytes"
    )
    spread_s: float = Field(
        default=0.5,
        ge=0.05,
        le=10,
        description="time the probes are spread over (Poisson), s",
        json_schema_extra={"cli": "spread"},
    )
    budget_bytes: int = Field(
        default=DEFAULT_BUDGET_BYTES,
        ge=1000,
        le=10_000_000,
        description="most IP bytes one estimate may send",
        json_schema_extra={"cli": "budget"},
    )

    @model_validator(mode="after")
    def _within_budget(self) -> Spec:
        total = self.total_bytes()
        if total > self.budget_bytes:
            raise ValueError(
                "capacity_trains × capacity_packets × size_bytes + probes × probe_size_bytes"
                f" = {total} bytes "
                f"exceeds budget_bytes = {self.budget_bytes}"
            )
        return self

    def plan(self) -> tool.Plan:
        return tool.Plan(
            size_bytes=self.size_bytes,
            capacity_packets=self.capacity_packets,
            capacity_trains=self.capacity_trains,
            probes=self.probes,
            probe_size_bytes=self.probe_size_bytes,
            spread_s=self.spread_s,
        )

    def total_bytes(self) -> int:
        return self.plan().total_bytes()

    def deadline_s(self) -> float:
        # The spread, the report's round trips (three tries of each page), start-up.
        return self.spread_s + 3.0 * self.pages() * 0.3 + 3.0

    def pages(self) -> int:
        packets = self.capacity_packets * self.capacity_trains + self.probes
        return math.ceil(packets / tool.MAX_REPORT_ENTRIES)


def build_argv(spec: Spec, address: str) -> list[str]:
    plan = spec.plan()
    return [
        sys.executable,
        TOOL_PATH,
        "send",
        address,
        str(spec.port),
        "--size-bytes",
        str(plan.size_bytes),
        "--capacity-packets",
        str(plan.capacity_packets),
        "--capacity-trains",
        str(plan.capacity_trains),
        "--probes",
        str(plan.probes),
        "--probe-size-bytes",
        str(plan.probe_size_bytes),
        "--spread-s",
        f"{plan.spread_s:g}",
        "--deadline-s",
        f"{spec.spread_s + 1.0:g}",
    ]


def parse(raw: RawRun, spec: Spec | None = None) -> dict[str, Any]:
    """The estimate from the tool's document of send and receive times."""
    out = raw.stdout.strip()
    if raw.returncode != 0 and not out:
        tail = raw.stderr.strip().splitlines()[-1:] or [f"exit status {raw.returncode}"]
        raise ToolFailed(f"{TOOL} failed: {tail[0]}")
    try:
        doc = json.loads(out)
        trains = tool.trains_from_doc(doc)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ParseError(f"{TOOL} output is not its JSON document ({exc}): {out[:120]!r}") from None
    est = tool.estimate(trains)
    sent = sum(len(t.sent_ns) for t in trains)
    return {
        "available_bps": None if est.available_bps is None else round(est.available_bps),
        "capacity_bps": None if est.capacity_bps is None else round(est.capacity_bps),
        "utilisation_percent": (
            None
            if est.available_bps is None or not est.capacity_bps
            else round(100.0 * (1.0 - est.available_bps / est.capacity_bps), 2)
        ),
        "quality": est.quality,
        "probe_packets": sent,
        "probe_bytes": sum(len(t.sent_ns) * t.size_bytes for t in trains),
        "received_packets": sum(len(t.received) for t in trains),
        "probes_used": est.probes_used,
        "estimate_s": doc.get("duration_s"),
        "problems": list(doc.get("problems", [])),
        "estimate_error": est.error,
    }


def check(data: dict[str, Any], spec: Spec) -> str | None:
    if data.get("available_bps") is None:
        why = data.get("estimate_error") or "no estimate"
        problems = "; ".join(data.get("problems") or [])
        return f"no available-bandwidth estimate: {why}" + (f" ({problems})" if problems else "")
    return None


def summary(data: dict[str, Any]) -> str:
    def mbps(bps: float | None) -> str:
        return "-" if bps is None else f"{bps / 1e6:.1f} Mbit/s"

    return (
        f"available {mbps(data.get('available_bps'))} of {mbps(data.get('capacity_bps'))}, "
        f"quality {figure(data.get('quality'), '.2f')}, {data.get('probe_bytes', '-')} bytes "
        f"in {figure(data.get('estimate_s'), '.2f')} s"
    )


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    need = ServerNeed(
        kind=SERVER,
        duration_s=math.ceil(spec.deadline_s()),
        udp=True,
        size_bytes=spec.budget_bytes,
    )
    try:
        async with ctx.server(need) as lease:
            used = spec if lease.port is None else spec.model_copy(update={"port": lease.port})
            result = await execute(module, used, replace(ctx, address=lease.address))
    except (RemoteError, ConfigError) as exc:
        return failed_result(module, spec, ctx, str(exc))
    if not lease.note:
        return result
    return result.model_copy(update={"diags": f"{lease.note}\n{result.diags}"})
