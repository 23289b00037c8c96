"""Maximum TCP goodput through one emulated lab link (20 ms RTT, no rate limit) and the delay
line's CPU cost, against iperf3 over a plain veth pair measured in the same run.

Needs root. Prints JSON: ``figure`` (emulated goodput), ``baseline`` (plain veth), ``ratio``,
and the delay line's CPU seconds per Gbit carried (utime + stime from /proc/PID/stat).

    .venv/bin/python benchmarks/lab_throughput.py [--seconds 10] [--streams 1,4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from iepm.lab import Lab
from iepm.lab import netns as nx

PORT = 5201


def iperf3(prefix: list[str], address: str, seconds: int, streams: int) -> dict[str, Any]:
    argv = [*prefix, "iperf3", "-c", address, "-p", str(PORT), "-t", str(seconds)]
    argv += ["-P", str(streams), "-J"]
    out = nx.run(argv, timeout_s=seconds + 30).stdout
    end = json.loads(out)["end"]
    return {
        "streams": streams,
        "goodput_mbit": end["sum_received"]["bits_per_second"] / 1e6,
        "bytes": end["sum_received"]["bytes"],
        "retransmits": end["sum_sent"].get("retransmits"),
    }


def emulated(seconds: int, streams: list[int]) -> list[dict[str, Any]]:
    topo = {
        "lab": {"name": "bench"},
        "hosts": [{"name": "a", "role": "monitor"}, {"name": "b", "role": "target"}],
        "links": [{"name": "wan", "a": "a", "b": "b", "delay_ms": 10}],
    }
    results = []
    with Lab.up(topo, name=f"bench{os.getpid()}") as lab:
        pid = lab.link_state("wan")["pid"]
        server = lab.popen("b", ["iperf3", "-s", "-p", str(PORT), "-B", lab.address("b")])
        time.sleep(0.5)
        rtts = lab.exec("a", ["ping", "-n", "-c", "20", "-i", "0.05", lab.address("b")]).stdout
        for n in streams:
            ticks0, t0 = nx.cpu_ticks(pid) or 0, time.monotonic()
            res = iperf3(["ip", "netns", "exec", lab.netns("a")], lab.address("b"), seconds, n)
            cpu_s = ((nx.cpu_ticks(pid) or 0) - ticks0) / os.sysconf("SC_CLK_TCK")
            wall = time.monotonic() - t0
            res["delay_line_cpu_s"] = round(cpu_s, 2)
            res["delay_line_cpu_cores"] = round(cpu_s / wall, 3)
            res["delay_line_cpu_s_per_gbit"] = round(cpu_s / (res["bytes"] * 8 / 1e9), 3)
            results.append(res)
        lab.stop(server)
        res_rtt = [line for line in rtts.splitlines() if line.startswith("rtt")]
        results.append({"ping_20ms_link": res_rtt[0] if res_rtt else rtts[-200:]})
    return results


def plain_veth(seconds: int, streams: list[int]) -> list[dict[str, Any]]:
    a, b = f"iepmbench{os.getpid()}a", f"iepmbench{os.getpid()}b"
    server = None
    try:
        nx.ip_batch(None, [f"netns add {a}", f"netns add {b}"])
        nx.run(["ip", "-n", a, "link", "add", "v0", "type", "veth", "peer", "v1", "netns", b])
        nx.ip_batch(a, ["link set lo up", "addr add 198.18.255.1/30 dev v0", "link set v0 up"])
        nx.ip_batch(b, ["link set lo up", "addr add 198.18.255.2/30 dev v1", "link set v1 up"])
        server, _ = nx.spawn(["ip", "netns", "exec", b, "iperf3", "-s", "-p", str(PORT)], role="x")
        time.sleep(0.5)
        return [iperf3(["ip", "netns", "exec", a], "198.18.255.2", seconds, n) for n in streams]
    finally:
        if server is not None:
            nx.terminate([nx.ProcRecord("x", server.pid, nx.start_time(server.pid), [])])
        existing = nx.list_netns()
        for ns in (a, b):
            if ns in existing:
                nx.kill_pids(nx.netns_pids(ns))
                nx.run(["ip", "netns", "del", ns], check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--streams", default="1,4", help="comma-separated stream counts")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    nx.require_privileges()
    lab_runs = emulated(args.seconds, streams)
    veth_runs = plain_veth(args.seconds, streams)
    best = max((r for r in lab_runs if "goodput_mbit" in r), key=lambda r: r["goodput_mbit"])
    base = max(veth_runs, key=lambda r: r["goodput_mbit"])
    print(
        json.dumps(
            {
                "figure": "lab_link_tcp_goodput_mbit",
                "value": round(best["goodput_mbit"], 1),
                "baseline": round(base["goodput_mbit"], 1),
                "baseline_what": "iperf3 over a plain veth pair (no delay), same run",
                "ratio": round(best["goodput_mbit"] / base["goodput_mbit"], 4),
                "rtt_configured_ms": 20,
                "delay_line_cpu_s_per_gbit": best["delay_line_cpu_s_per_gbit"],
                "cpus": os.cpu_count(),
                "load_avg_1m": os.getloadavg()[0],
                "lab_runs": lab_runs,
                "veth_runs": veth_runs,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
