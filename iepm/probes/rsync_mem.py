"""Memory-to-memory copy over SSH: a generated source (a sparse file on the monitor's memory file
system, read as zeros) copied by rsync over ssh into a private directory on the target's memory
file system (``[targets.ssh] memory_dir``, /dev/shm), so that neither side touches a disk: what
the network, SSH's cipher and the two ends can move. Tool details in iepm/probes/rsync.py."""

from __future__ import annotations

import sys

from pydantic import Field

from iepm.probes import copy, rsync
from iepm.probes.base import SSH_LOGIN, Metric, ProbeContext, ProbeMeta
from iepm.results import Result

NAME = "rsync_mem"
TOOL = rsync.TOOL
META = ProbeMeta(
    scheduling="exclusive",
    version_argv=rsync.VERSION_ARGV,
    server=SSH_LOGIN,
    default=False,
    copy="memory",
)
METRICS: tuple[Metric, ...] = (
    Metric(
        NAME,
        "throughput_bps",
        "memory copy over SSH (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
        rollup=True,
        alert={"min_relative": 0.15},
    ),
    Metric(
        NAME,
        "end_to_end_throughput_bps",
        "memory copy over SSH, set-up included (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
    ),
    Metric(NAME, "setup_s", "SSH copy set-up (s)", "lower", 1.0, "seconds", rollup=True),
)
COLUMNS = rsync.COLUMNS
# Two SSH connections by default: on the lab's two paths under load 15-25 two beat one in each
# of six paired rounds (median 0.82 of tuned iperf3 against 0.49) and beat 4 and 8, whose
# extra set-ups (each SSH key exchange and log-in) spread their starts by seconds there
# (README, "Copies over SSH").
DEFAULT_STREAMS = 2


class Spec(rsync.CopySpec):
    """A memory-to-memory rsync copy over SSH (see :class:`~iepm.probes.rsync.CopySpec`)."""

    streams: int = Field(
        default=DEFAULT_STREAMS,
        ge=1,
        le=rsync.MAX_STREAMS,
        description="rsync copies at once, one SSH connection each (size split in as many files)",
    )


def build_argv(spec: Spec, address: str) -> list[str]:
    sources = [f"{copy.MEMORY_DIR}/iepm-xrdcp.src"] * spec.streams
    return rsync.build_argv(spec, address, source=rsync.part_names(sources[0], spec.streams))


# The tool module reads every variant of its copy.
parse = rsync.parse
check = rsync.check
summary = rsync.summary


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    sources = copy.memory_sources(rsync.part_sizes(spec.size_bytes, spec.streams))
    return await rsync.run_copy(module, spec, ctx, "memory", sources)
