"""Disk-to-disk copy over SSH: a real file on the monitor's disk copied by rsync over ssh into a
private directory under the target's ``[targets.ssh] work_dir``. With ``commit = "at_end"``
rsync fsyncs the copy before it reports (``--fsync``) and that time is counted in
``committed_throughput_bps``; with ``"none"`` the copy may still sit in the target's page cache.
Tool details in iepm/probes/rsync.py."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from iepm.probes import copy, rsync
from iepm.probes.base import SSH_LOGIN, Metric, ProbeContext, ProbeMeta
from iepm.probes.copy import disk_source as disk_source
from iepm.results import Result

NAME = "rsync_disk"
TOOL = rsync.TOOL
META = ProbeMeta(
    scheduling="exclusive",
    version_argv=rsync.VERSION_ARGV,
    server=SSH_LOGIN,
    default=False,
    copy="disk",
)
METRICS: tuple[Metric, ...] = (
    Metric(
        NAME,
        "committed_throughput_bps",
        "disk copy over SSH, committed (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
        rollup=True,
        alert={"min_relative": 0.15},
    ),
    Metric(
        NAME,
        "throughput_bps",
        "disk copy over SSH, sender's view (bit/s)",
        "higher",
        1.0,
        "bits_per_second",
    ),
    Metric(NAME, "commit_s", "SSH copy commit (s)", "lower", 1.0, "seconds", rollup=True),
)
COLUMNS = rsync.COLUMNS


class Spec(copy.DiskSourceSpec, rsync.CopySpec):
    """A disk-to-disk rsync copy over SSH (see :class:`~iepm.probes.rsync.CopySpec`)."""

    commit: Literal["none", "at_end"] = Field(
        default="at_end",
        description="at_end: rsync fsyncs the copy (--fsync), the time counts; none: no fsync",
    )


def build_argv(spec: Spec, address: str) -> list[str]:
    source = copy.disk_source_path(spec.size_bytes, spec.source_dir)
    return rsync.build_argv(spec, address, source=source, fsync=spec.commit == "at_end")


# The tool module reads every variant of its copy.
parse = rsync.parse
check = rsync.check


def summary(data: dict[str, Any]) -> str:
    return copy.with_committed(rsync.summary(data), data)


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    fsync = spec.commit == "at_end"
    sources = one_disk_source(spec.size_bytes, spec.source_dir)
    return await rsync.run_copy(module, spec, ctx, "disk", sources, fsync=fsync)


@contextlib.contextmanager
def one_disk_source(nbytes: int, directory: str) -> Iterator[list[str]]:
    """The disk source as the one part of the copy: one rsync, one connection (N parts would
    need N different files on the disk, or N readers would share one file's page cache)."""
    with disk_source(nbytes, directory) as path:
        yield [path]
