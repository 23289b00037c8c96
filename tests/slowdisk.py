"""A target disk slower than the network: an ext4 file system on a loop device whose writes are
throttled for one blkio cgroup (cgroup v1 here: ``blkio.throttle.write_bps_device``).

What the throttle does here, measured with dd in the cgroup: direct writes and the write-back an
fsync issues run at the limit; buffered writes land in the page cache at memory speed (the
kernel's flusher threads, which would write them back later, are outside the cgroup). So a copy
that is not committed reports the cache's rate and one committed at the end the disk's. Every
piece (image, loop device, mount, cgroup) is removed afterwards by name."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLKIO = Path("/sys/fs/cgroup/blkio")
DD_RATE = re.compile(r"(\d+) bytes .* copied, ([\d.]+) s")


@dataclass
class SlowDisk:
    mount: Path
    device: str
    cgroup: Path
    rate_bytes_s: int

    def enter(self, pid: int) -> None:
        """Put a process (and the children it starts from now on) under the throttle."""
        (self.cgroup / "cgroup.procs").write_text(f"{pid}\n")

    def dd_rate(self, nbytes: int, *flags: str) -> float:
        """Bytes per second of a plain dd writing ``nbytes`` into the disk from the cgroup."""
        target = self.mount / "dd.probe"
        script = (
            f"echo $$ > {self.cgroup / 'cgroup.procs'} && exec dd if=/dev/zero of={target} "
            f"bs=1M count={nbytes >> 20} {' '.join(flags)}"
        )
        try:
            out = subprocess.run(
                ["bash", "-c", script], capture_output=True, text=True, timeout=300, check=True
            ).stderr
        finally:
            target.unlink(missing_ok=True)
        match = DD_RATE.search(out)
        assert match is not None, out
        return int(match[1]) / float(match[2])


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout


@contextlib.contextmanager
def slow_disk(rate_bytes_s: int, size_mb: int = 1400) -> Iterator[SlowDisk]:
    if not (BLKIO / "blkio.throttle.write_bps_device").exists():
        raise RuntimeError("no cgroup v1 blkio throttle on this host")
    work = Path(tempfile.mkdtemp(prefix="iepm-slow-", dir="/var/tmp"))
    image, mount = work / "disk.img", work / "mnt"
    cgroup = BLKIO / work.name
    device = None
    mounted = False
    try:
        work.chmod(0o755)
        with image.open("wb") as f:
            f.truncate(size_mb << 20)
        device = _run("losetup", "--find", "--show", str(image)).strip()
        # No lazy initialisation: it would write in the background while we measure.
        _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", device)
        mount.mkdir()
        _run("mount", device, str(mount))
        mounted = True
        mount.chmod(0o755)
        cgroup.mkdir()
        rdev = os.stat(device).st_rdev
        (cgroup / "blkio.throttle.write_bps_device").write_text(
            f"{os.major(rdev)}:{os.minor(rdev)} {rate_bytes_s}\n"
        )
        yield SlowDisk(mount, device, cgroup, rate_bytes_s)
    finally:
        if cgroup.exists():
            # Whatever is left in it goes back to the root group before the group goes.
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (BLKIO / "cgroup.procs").write_text(f"{pid}\n")
            cgroup.rmdir()
        if mounted:
            _run("umount", str(mount))
        if device is not None:
            _run("losetup", "-d", device)
        image.unlink(missing_ok=True)
        for path in (mount, work):
            with contextlib.suppress(OSError):
                path.rmdir()
