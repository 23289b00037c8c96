"""Memory-to-memory GridFTP copy: a generated source (a sparse file on the monitor's memory file
system, read as zeros) copied by globus-url-copy to a file on the target's memory file system
(the agent's slot lives on a tmpfs), so that neither side touches a disk: what the network and
the two GridFTP ends can move, as the seeds' GridFTP runs measured. Tool details in
iepm/probes/gridftp.py."""

from __future__ import annotations

import sys

from iepm.probes import copy, gridftp
from iepm.probes.base import Metric, ProbeContext, ProbeMeta
from iepm.results import Result

NAME = "gridftp_mem"
TOOL = gridftp.TOOL
META = ProbeMeta(
    scheduling="exclusive",
    version_argv=gridftp.VERSION_ARGV,
    server=gridftp.SERVER,
    default=False,
    copy="memory",
)
METRICS: tuple[Metric, ...] = (
    Metric(
        NAME,
        "throughput_bps",
        "GridFTP memory copy throughput (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
        rollup=True,
        alert={"min_relative": 0.15},
    ),
    Metric(
        NAME,
        "end_to_end_throughput_bps",
        "GridFTP memory copy, set-up included (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
    ),
    Metric(
        NAME,
        "tool_throughput_bps",
        "GridFTP memory copy as globus-url-copy reports it (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
    ),
    Metric(NAME, "setup_s", "GridFTP copy set-up (s)", "lower", 1.0, "seconds", rollup=True),
)
COLUMNS = gridftp.COLUMNS


class Spec(gridftp.TransferSpec):
    """A memory-to-memory GridFTP copy (see :class:`~iepm.probes.gridftp.TransferSpec`)."""


def build_argv(spec: Spec, address: str) -> list[str]:
    return gridftp.build_argv(spec, address)


# The tool module reads every variant of its copy.
parse = gridftp.parse
check = gridftp.check
summary = gridftp.summary


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    source = copy.memory_source(spec.size_bytes)
    return await gridftp.run_copy(module, spec, ctx, "memory", source)
