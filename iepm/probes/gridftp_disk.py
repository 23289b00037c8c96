"""Disk-to-disk GridFTP copy: a real file on the monitor's disk (seeded random bytes, the same
file the other disk copies read) copied by globus-url-copy to a real file on the target's disk
(the agent's slot under its state directory).

Only ``commit = "none"``: Debian's globus-gridftp-server 13.24 closes the file without a sync
(its ``-sync-writes`` syncs before restart markers only; a traced copy made no sync, fsync or
fdatasync), and nothing in the protocol asks it to, so the copy's rate is what the target's page
cache took in, not its disk — the inflated figure the seeds warned about. ``commit_s`` is the
close. For a committed disk rate use ``xrdcp_disk`` or ``rsync_disk`` with ``at_end``. Tool
details in iepm/probes/gridftp.py."""

from __future__ import annotations

import sys
from typing import Literal

from pydantic import Field

from iepm.probes import copy, gridftp
from iepm.probes.base import Metric, ProbeContext, ProbeMeta
from iepm.results import Result

NAME = "gridftp_disk"
TOOL = gridftp.TOOL
META = ProbeMeta(
    scheduling="exclusive",
    version_argv=gridftp.VERSION_ARGV,
    server=gridftp.SERVER,
    default=False,
    copy="disk",
)
METRICS: tuple[Metric, ...] = (
    Metric(
        NAME,
        "throughput_bps",
        "GridFTP disk copy throughput, uncommitted (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
        rollup=True,
        alert={"min_relative": 0.15},
    ),
    Metric(
        NAME,
        "tool_throughput_bps",
        "GridFTP disk copy as globus-url-copy reports it (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
    ),
    Metric(NAME, "commit_s", "GridFTP copy close (s)", "lower", 1.0, "seconds", rollup=True),
)
COLUMNS = gridftp.COLUMNS


class Spec(copy.DiskSourceSpec, gridftp.TransferSpec):
    """A disk-to-disk GridFTP copy (see :class:`~iepm.probes.gridftp.TransferSpec`)."""

    commit: Literal["none"] = Field(
        default="none",
        description="none only: the GridFTP server cannot be made to sync the file it wrote",
    )


def build_argv(spec: Spec, address: str) -> list[str]:
    source = copy.disk_source_path(spec.size_bytes, spec.source_dir)
    return gridftp.build_argv(spec, address, source=source)


# The tool module reads every variant of its copy.
parse = gridftp.parse
check = gridftp.check
summary = gridftp.summary


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    source = copy.disk_source(spec.size_bytes, spec.source_dir)
    return await gridftp.run_copy(module, spec, ctx, "disk", source)
