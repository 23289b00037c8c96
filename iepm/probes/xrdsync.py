"""Commit step of a disk copy: ask the xrootd server to sync a file (kXR_sync, an fsync(2) of the
file on the server) and print how long each request took, as one JSON line.

Run by Debian's python3 with python3-xrootd (``/usr/bin/python3 -I xrdsync.py URL TIMEOUT``),
not by iepm's interpreter: it imports nothing of iepm. xrdcp itself never syncs: it closes,
and the server's page cache still holds what a "finished" copy wrote.
"""

import json
import os
import sys
import time


def main() -> int:
    url, timeout = sys.argv[1], int(sys.argv[2])
    # Give up connecting within the timeout (the client's default retries for ten minutes).
    os.environ["XRD_CONNECTIONWINDOW"] = str(min(timeout, 10))
    os.environ["XRD_CONNECTIONRETRY"] = "1"
    try:
        from XRootD import client
        from XRootD.client.flags import OpenFlags
    except ImportError as exc:
        print(json.dumps({"error": f"python3-xrootd is missing: {exc}"}))
        return 3
    times = {}
    handle = client.File()
    last = {}

    def touch():
        # xrootd 5.5 syncs only a handle that wrote (XrdOfsFile::sync is a no-op otherwise):
        # write the file's last byte back over itself, which changes nothing on disk.
        status, info = handle.stat(timeout=timeout)
        if not status.ok:
            return status, None
        last["offset"] = max(0, info.size - 1)
        status, byte = handle.read(last["offset"], 1, timeout=timeout)
        if not status.ok:
            return status, None
        return handle.write(byte, last["offset"], timeout=timeout)

    for step, call in (
        ("open", lambda: handle.open(url, OpenFlags.UPDATE, timeout=timeout)),
        ("touch", touch),
        ("sync", lambda: handle.sync(timeout=timeout)),
        ("close", lambda: handle.close(timeout=timeout)),
    ):
        t0 = time.monotonic()
        status, _ = call()
        times[f"{step}_s"] = round(time.monotonic() - t0, 6)
        if not status.ok:
            print(json.dumps({**times, "error": f"{step}: {status.message.strip()}"}))
            return 1
    print(json.dumps(times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
