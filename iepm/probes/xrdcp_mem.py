"""Memory-to-memory XRootD copy: a generated source (a sparse file on the monitor's memory file
system, read as zeros) to a file on the target's memory file system (the agent's slot lives on
a tmpfs), so that neither side touches a disk: what the network and the two xrootd ends can
move, as IEPM-BW's bbcp /dev/zero → /dev/null measured. Tool details in iepm/probes/xrdcp.py."""

from __future__ import annotations

import sys

from iepm.probes import xrdcp
from iepm.probes.base import Metric, ProbeContext, ProbeMeta
from iepm.results import Result

NAME = "xrdcp_mem"
TOOL = xrdcp.TOOL
META = ProbeMeta(
    scheduling="exclusive",
    version_argv=xrdcp.VERSION_ARGV,
    server=xrdcp.SERVER,
    default=False,
    copy="memory",
)
METRICS: tuple[Metric, ...] = (
    Metric(
        NAME,
        "throughput_bps",
        "memory copy throughput (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
        rollup=True,
        alert={"min_relative": 0.15},
    ),
    Metric(
        NAME,
        "end_to_end_throughput_bps",
        "memory copy, set-up included (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
    ),
    Metric(NAME, "setup_s", "copy set-up (s)", "lower", 1.0, "seconds", rollup=True),
)
COLUMNS = xrdcp.COLUMNS


class Spec(xrdcp.TransferSpec):
    """A memory-to-memory xrdcp copy (see :class:`~iepm.probes.xrdcp.TransferSpec`)."""


def build_argv(spec: Spec, address: str) -> list[str]:
    return xrdcp.build_argv(spec, address)


# The tool module reads every variant of its copy.
parse = xrdcp.parse
check = xrdcp.check
summary = xrdcp.summary


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    return await xrdcp.run_copy(module, spec, ctx, "memory", xrdcp.memory_source(spec.size_bytes))
