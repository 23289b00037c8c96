"""A target disk slower than the network: an ext4 file system on a loop device whose writes are
throttled (cgroup v1 blkio, ``blkio.throttle.write_bps_device``).

What throttling does to buffered writes here (cgroup v1, measured): writes land in the page
cache at memory speed whatever the cgroup; what is throttled is the write-back, charged to the
cgroup of whoever issues it — the process for its own fsync, the *root* group for the kernel's
flusher threads. A throttle on the server's own cgroup therefore held a 64 MB committed copy to
the limit but let a 1 GB copy's background write-back through at full speed (286 Mbit/s through
a 134 Mbit/s limit). So the limit is set in the root group, for this loop device only: every
write-back to it, the server's fsync or the flusher's, runs at the disk's rate, and nothing else
on the host is touched. Every piece (image, loop device, mount, the rule) is removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BLKIO_RULES = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
DD_RATE = re.compile(r"(\d+) bytes .* copied, ([\d.]+) s")


@dataclass
class SlowDisk:
    mount: Path
    device: str
    rate_bytes_s: int

    def dd_rate(self, nbytes: int, *flags: str) -> float:
        """Bytes per second of a plain dd writing ``nbytes`` into the disk."""
        target = self.mount / "dd.probe"
        argv = ["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={nbytes >> 20}", *flags]
        try:
            out = subprocess.run(
                argv, capture_output=True, text=True, timeout=600, check=True
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
    if not BLKIO_RULES.exists():
        raise RuntimeError("no cgroup v1 blkio throttle on this host")
    work = Path(tempfile.mkdtemp(prefix="iepm-slow-", dir="/var/tmp"))
    image, mount = work / "disk.img", work / "mnt"
    device = None
    rule = None
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
        rdev = os.stat(device).st_rdev
        rule = f"{os.major(rdev)}:{os.minor(rdev)}"
        BLKIO_RULES.write_text(f"{rule} {rate_bytes_s}\n")
        yield SlowDisk(mount, device, rate_bytes_s)
    finally:
        if mounted:
            _run("umount", str(mount))  # flushes what is left, at the limit
        if rule is not None:
            BLKIO_RULES.write_text(f"{rule} 0\n")  # 0 removes the rule
        if device is not None:
            _run("losetup", "-d", device)
        image.unlink(missing_ok=True)
        for path in (mount, work):
            with contextlib.suppress(OSError):
                path.rmdir()
