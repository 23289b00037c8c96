"""Target facts: the *target* host's CPU, kernel, NIC speeds and MTUs, TCP buffer limits and
congestion control, recorded each cycle so that a change at the far end can be named as the
cause of a step (:mod:`iepm.analysis.cause`), as the ``load`` probe's facts name the monitor.

How the facts are read depends on how the target is reached, through ``ctx.facts()`` (the
probe never imports ``iepm.remote``):

- an agent target: ``GET /v1/facts`` (the agent reads them in its own namespace);
- an SSH target: the ``load`` probe's snapshot program run there with ``python3 -I -S`` (the
  same files, read the same way, inside the target's own namespaces);
- a plain endpoint: nothing can be read there; the run is a skipped result saying so.

Either way the raw log keeps the JSON document received, and :func:`parse` (pure) turns it
into the same fields the ``load`` probe gives, so both ends compare with one reading.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import Field

from iepm.errors import ParseError, RemoteError, ToolFailed
from iepm.probes import load
from iepm.probes.base import (
    Column,
    Metric,
    ProbeContext,
    ProbeMeta,
    ProbeSpec,
    failed_result,
    figure,
    result_from_raw,
    skipped_result,
)
from iepm.results import Result
from iepm.runner import RawRun

NAME = "facts"
TOOL = "iepm-facts"
# Light: a few small files or one HTTP request; runs beside ping and traceroute.
META = ProbeMeta(scheduling="background", version_argv=None)
# Facts explain other probes' results (analysis.cause); none is plotted on its own.
METRICS: tuple[Metric, ...] = ()

COLUMNS = [
    Column("via", "how the facts were read: agent or ssh"),
    Column("cpu_count", "online logical CPUs of the target"),
    Column("cpu_mhz", "mean current CPU clock of the target, MHz"),
    Column("kernel_release", "the target's kernel release (uname -r)"),
    Column("tcp_congestion_control", "the target's default TCP congestion control"),
    Column("rmem_max_bytes", "the target's net.core.rmem_max"),
    Column("wmem_max_bytes", "the target's net.core.wmem_max"),
    Column("tcp_rmem_max_bytes", "the target's net.ipv4.tcp_rmem maximum (autotuning's limit)"),
    Column("tcp_wmem_max_bytes", "the target's net.ipv4.tcp_wmem maximum (autotuning's limit)"),
]

# The facts kept from either source, named as the load probe names them.
FACT_KEYS = (
    "cpu_count",
    "cpu_mhz",
    "cpu_model",
    "kernel_release",
    "memory_total_bytes",
    "tcp_rmem_bytes",
    "tcp_wmem_bytes",
    "rmem_max_bytes",
    "wmem_max_bytes",
    "tcp_congestion_control",
    "tcp_available_congestion_control",
    "nics",
)


class Spec(ProbeSpec):
    """How long reading the target's facts may take (one request or one remote command)."""

    timeout_s: float = Field(
        default=15.0,
        ge=1.0,
        le=120.0,
        description="seconds reading the target's facts may take",
        json_schema_extra={"cli": "timeout"},
    )

    def deadline_s(self) -> float:
        return self.timeout_s


def build_argv(spec: Spec, address: str) -> list[str]:
    """The command an SSH target runs: the load probe's snapshot with the target's python3
    (isolated, stdlib only); an agent target is asked over HTTP instead."""
    # exec(repr()) keeps the program on one line, as the load probe does (one raw-log line).
    return ["python3", "-I", "-S", "-c", f"exec({load.SNAPSHOT_PROGRAM!r})", *load.SNAPSHOT_PATHS]


def parse(raw: RawRun, spec: Spec | None = None) -> dict[str, Any]:
    """The facts of an agent's ``/v1/facts`` answer or of a snapshot run over SSH."""
    if not raw.stdout.strip():
        said = next((ln.strip() for ln in reversed(raw.stderr.splitlines()) if ln.strip()), "")
        if raw.returncode == 127:
            said = (
                f"python3 is not installed on the target (Debian: apt-get install python3); {said}"
            )
        raise ToolFailed(
            f"reading the target's facts gave nothing (exit {raw.returncode})"
            + (f": {said}" if said else "")
        )
    try:
        doc = json.loads(raw.stdout)
    except (ValueError, RecursionError) as exc:
        raise ParseError(
            f"target facts are not a JSON document ({exc}); began: {raw.stdout.strip()[:120]!r}"
        ) from None
    if not isinstance(doc, dict):
        raise ParseError("target facts are not a JSON object")
    if "snapshot" in doc:
        data = {k: v for k, v in load.parse(raw).items() if k in FACT_KEYS}
        data["via"] = "ssh"
        data["host"] = None
    elif "agent" in doc:
        data = {k: doc.get(k) for k in FACT_KEYS if k != "kernel_release"}
        data["kernel_release"] = doc.get("kernel")
        data["via"] = "agent"
        data["host"] = doc.get("hostname")
        if not isinstance(data["nics"], dict):
            raise ParseError("the agent's facts have no 'nics' object")
    else:
        raise ParseError("target facts are neither an agent's /v1/facts nor a snapshot")
    for key in ("tcp_rmem", "tcp_wmem"):
        limits = data.get(f"{key}_bytes")
        data[f"{key}_max_bytes"] = (
            limits[2] if isinstance(limits, list) and len(limits) == 3 else None
        )
    return data


def check(data: dict[str, Any], spec: Spec) -> str | None:
    """Facts without a kernel release were not read from a host at all."""
    if not data.get("kernel_release"):
        return "the target's facts have no kernel release: nothing was read from its /proc"
    return None


def summary(data: dict[str, Any]) -> str:
    d = data
    return (
        f"{d.get('cpu_count', '-')} CPUs, kernel {d.get('kernel_release') or '-'}, "
        f"cc {d.get('tcp_congestion_control') or '-'}, tcp_rmem max "
        f"{figure(d.get('tcp_rmem_max_bytes'), 'd')} B (via {d.get('via', '-')})"
    )


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    if not ctx.can_read_facts():
        return skipped_result(
            module,
            spec,
            ctx,
            f"skipped: {ctx.target} is a plain endpoint (no agent or SSH access), so its host "
            "facts cannot be read",
        )
    try:
        raw = await ctx.facts(build_argv(spec, ctx.address), spec.deadline_s())
    except RemoteError as exc:
        return failed_result(module, spec, ctx, str(exc))
    if ctx.raw_log is not None:
        ctx.raw_log.append(ctx.target, NAME, raw, params=spec.model_dump(mode="json"))
    return result_from_raw(module, spec, ctx, raw, raw_version(raw))


def raw_version(raw: RawRun) -> str | None:
    """The agent's version when it answered (its facts name it); None over SSH."""
    try:
        doc = json.loads(raw.stdout)
    except ValueError:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("version"), str):
        return f"iepm agent {doc['version']}"
    return None
