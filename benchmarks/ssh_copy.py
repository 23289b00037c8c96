"""What SSH's cipher costs a copy on these CPUs: rsync memory-to-memory over SSH on loopback
(no link in the way: only CPU bounds it) against iperf3 on loopback, one TCP connection each,
measured in the same run, per cipher, and per number of parallel connections (``streams``:
on loopback they add CPUs, not window).

* ``figure``: rsync_mem over SSH with the default cipher (aes128-gcm), one stream,
  throughput_bps;
* ``baseline``: iperf3, one stream, on loopback;
* ``ratio`` = figure ÷ baseline; ``ciphers``: each cipher's figure and ratio (one stream);
  ``streams``: the default cipher's figure and ratio with each number of streams.

    .venv/bin/python benchmarks/ssh_copy.py [--size 512M] [--streams 1,2,4] [--json-out FILE]

Prints one JSON object. Needs rsync, sshd (openssh-server), iperf3; runs a private sshd on
127.0.0.1, stopped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.probes import iperf3, rsync, rsync_mem
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from testkit.net import free_port, iperf3_server
from testkit.sshd import private_sshd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="512M", help="bytes per copy (K/M/G)")
    parser.add_argument("--streams", default="1,2,4", help="numbers of parallel connections")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    t0 = time.monotonic()
    ciphers: dict[str, Any] = {}
    by_streams: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="iepm-sshbench-") as tmp,
        tempfile.TemporaryDirectory(prefix="iepm-sshbench-", dir="/dev/shm") as memory,
        private_sshd(Path(tmp) / "sshd", "127.0.0.1", free_port(), password_auth=False) as sshd,
    ):
        ctx = ProbeContext(
            "loop", "127.0.0.1", servers=server_source(sshd.access(memory_dir=memory))
        )
        with iperf3_server() as port:
            plain = ProbeContext("loop", "127.0.0.1")
            reference = asyncio.run(iperf3.run(iperf3.Spec(duration_s=5, port=port), plain))
        if not reference.succeeded:
            raise SystemExit(f"iperf3 failed: {reference.error}")
        baseline = reference.data["throughput_bps"]

        def copy(**settings: Any) -> dict[str, Any]:
            spec = rsync_mem.Spec(size=args.size, duration_s=300, **settings)
            result = asyncio.run(rsync_mem.run(spec, ctx))
            if not result.succeeded:
                raise SystemExit(f"{settings}: {result.error}\n{result.diags[-2000:]}")
            bps = result.data["throughput_bps"]
            return {"throughput_bps": bps, "ratio": round(bps / baseline, 3)}

        for cipher in get_args(rsync.Cipher):
            ciphers[cipher] = copy(cipher=cipher, streams=1)
        for streams in (int(n) for n in args.streams.split(",")):
            by_streams[str(streams)] = copy(streams=streams)
    default = ciphers["aes128-gcm@openssh.com"]["throughput_bps"]
    out = {
        "figure": "rsync_mem over SSH on loopback (aes128-gcm), throughput_bps",
        "value": default,
        "baseline": "iperf3 one stream on loopback, throughput_bps",
        "baseline_value": baseline,
        "ratio": round(default / baseline, 3),
        "ciphers": ciphers,
        "streams": by_streams,
        "size": args.size,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "wall_s": round(time.monotonic() - t0, 1),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")


if __name__ == "__main__":
    main()
