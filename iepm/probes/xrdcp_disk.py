"""Disk-to-disk XRootD copy: a real file on the monitor's disk to a real file on the target's
(the agent's slot under its state directory). With ``commit = "at_end"`` the server syncs the
copy before the lease ends and that time is counted: a small copy whose cached rest is committed
at the end predicts a large one, where ``commit = "none"`` reports the page cache's rate (the
IEPM-BW finding). Tool details in iepm/probes/xrdcp.py."""

from __future__ import annotations

import sys
from typing import Any, Literal

from pydantic import Field

from iepm.probes import copy, xrdcp
from iepm.probes.base import Metric, ProbeContext, ProbeMeta
from iepm.probes.copy import disk_source as disk_source
from iepm.results import Result

NAME = "xrdcp_disk"
TOOL = xrdcp.TOOL
META = ProbeMeta(
    scheduling="exclusive",
    version_argv=xrdcp.VERSION_ARGV,
    server=xrdcp.SERVER,
    default=False,
    copy="disk",
)
METRICS: tuple[Metric, ...] = (
    Metric(
        NAME,
        "committed_throughput_bps",
        "disk copy throughput, committed (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
        rollup=True,
        alert={"min_relative": 0.15},
    ),
    Metric(
        NAME,
        "throughput_bps",
        "disk copy throughput, uncommitted (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
    ),
    Metric(NAME, "commit_s", "copy commit (s)", "lower", 1.0, "seconds", rollup=True),
)
COLUMNS = xrdcp.COLUMNS


class Spec(copy.DiskSourceSpec, xrdcp.TransferSpec):
    """A disk-to-disk xrdcp copy (see :class:`~iepm.probes.xrdcp.TransferSpec`)."""

    commit: Literal["none", "at_end"] = Field(
        default="at_end",
        description="at_end: the server syncs the copy and the time counts; none: it does not",
    )


def build_argv(spec: Spec, address: str) -> list[str]:
    source = copy.disk_source_path(spec.size_bytes, spec.source_dir)
    return xrdcp.build_argv(spec, address, source=source)


# The tool module reads every variant of its copy.
parse = xrdcp.parse
check = xrdcp.check


def summary(data: dict[str, Any]) -> str:
    return copy.with_committed(xrdcp.summary(data), data)


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    source = disk_source(spec.size_bytes, spec.source_dir)
    return await xrdcp.run_copy(module, spec, ctx, "disk", source, commit=spec.commit == "at_end")
