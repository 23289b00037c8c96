"""Disk-to-disk XRootD copy: a real file on the monitor's disk to a real file on the target's
(the agent's slot under its state directory). With ``commit = "at_end"`` the server syncs the
copy before the lease ends and that time is counted: a small copy whose cached rest is committed
at the end predicts a large one, where ``commit = "none"`` reports the page cache's rate (the
IEPM-BW finding). Tool details in iepm/probes/xrdcp.py."""

from __future__ import annotations

import contextlib
import os
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from iepm.probes import xrdcp
from iepm.probes.base import Metric, ProbeContext, ProbeMeta
from iepm.results import Result
from iepm.runner import RawRun

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
# Seed of the source file's bytes: incompressible, and the same file on every run.
SOURCE_SEED = 20261124
CHUNK = 4 * 1024 * 1024


class Spec(xrdcp.TransferSpec):
    """A disk-to-disk xrdcp copy (see :class:`~iepm.probes.xrdcp.TransferSpec`)."""

    commit: Literal["none", "at_end"] = Field(
        default="at_end",
        description="at_end: the server syncs the copy and the time counts; none: it does not",
    )
    source_dir: str = Field(
        default="/var/tmp",
        description="monitor directory holding the source file (iepm-xrdcp-SIZE.src, kept)",
    )

    @field_validator("source_dir")
    @classmethod
    def _source_dir(cls, value: str) -> str:
        if not xrdcp.PATH_RE.match(value):
            raise ValueError(f"source_dir {value!r} must be an absolute path")
        return value


@contextlib.contextmanager
def disk_source(nbytes: int, directory: str) -> Iterator[str]:
    """The source file on disk: written once (seeded random bytes, fsynced) and kept for the
    next runs, so that a copy does not pay for making it."""
    path = Path(directory) / f"iepm-xrdcp-{nbytes}.src"
    if not path.exists() or path.stat().st_size != nbytes:
        rng = random.Random(SOURCE_SEED)
        partial = path.with_suffix(".partial")
        with partial.open("wb") as f:
            left = nbytes
            while left:
                block = rng.randbytes(min(CHUNK, left))
                f.write(block)
                left -= len(block)
            f.flush()
            os.fsync(f.fileno())
        partial.replace(path)
    yield str(path)


def build_argv(spec: Spec, address: str) -> list[str]:
    source = str(Path(spec.source_dir) / f"iepm-xrdcp-{spec.size_bytes}.src")
    return xrdcp.build_argv(spec, address, source=source)


def parse(raw: RawRun, spec: Spec | None = None) -> dict[str, Any]:
    return xrdcp.parse(raw, spec)


def check(data: dict[str, Any], spec: Spec) -> str | None:
    return xrdcp.check(data, spec)


def summary(data: dict[str, Any]) -> str:
    text = xrdcp.summary(data)
    committed = data.get("committed_throughput_bps")
    return text if committed is None else f"{committed / 1e6:.1f} Mbit/s committed; {text}"


async def run(spec: Spec, ctx: ProbeContext) -> Result:
    module = sys.modules[__name__]
    source = disk_source(spec.size_bytes, spec.source_dir)
    return await xrdcp.run_copy(module, spec, ctx, "disk", source, commit=spec.commit == "at_end")
