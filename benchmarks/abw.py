"""The abw probe against ground truth and against iperf3, on the same lab paths in one run.

For each path (capacity C Mbit/s, cross traffic share of it from the lab's UDP generator), in a
lab of one link (the delay line's rate is the bottleneck, the truth), with an ``iepm agent`` in
the target leasing both the abw receiver and iperf3:

- the abw probe ``--estimates`` times: error against the truth A = C − cross, where cross is the
  bottleneck's delivered bytes over the estimates' span (delay-line counters) less the probes'
  own, and against each estimate's own window (the bytes the delay line queued while its probes
  were sent, from its trace); bytes and seconds per estimate;
- ``--methods`` runs of the tool with Spruce's trains added (the method it was chosen over),
  each with the delay line's trace of its probes: the method with perfect timing (the
  estimator's rule on the true queue waits) against the estimator, and the stamps' noise
  (measured wait − true wait, per probe): what the method loses and what the lab's timing loses;
- one iperf3 TCP test (``--iperf3-s`` seconds): throughput, bytes and seconds; the cost ratio
  (iperf3 bytes / abw bytes per estimate) is the point;
- with ``--bottleneck kernel`` or ``both``, the same paths with ``tc tbf`` in a namespace as the
  bottleneck instead of the user-space delay line;
- the capacity train's send spacing on loopback: a ``send`` loop against one ``sendmmsg``.

Then 20 targets (each behind its own 100 Mbit/s link, a receiver already listening: plain
endpoints) estimated concurrently, wall time against the 10 s goal.

Needs root. Prints JSON: per case (``cases``) and pooled median / P90 error, the share of
estimates within budget (``within_budget``), with the capacity within 10 %
(``capacity_within_10pct``) and between 0 and the capacity (``in_range``): the behaviours
tests/lab/test_lab_abw.py holds on one path, here over all of them; ``goal_met``
(median ≤ 10 %, P90 ≤ 25 %, ≤ 100 kB and ≤ 1 s per estimate), the same against each estimate's
window, iperf3's bytes (baseline) and the cost ratio, the load average before and after.

    PYTHONPATH=. .venv/bin/python benchmarks/abw.py [--paths 10:0,100:0.5] [--estimates 8]
        [--bottleneck both|delayline|kernel] [--targets 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm import abwtool as tool
from iepm.config import AgentAccess
from iepm.lab import Lab
from iepm.probes import abw, iperf3
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from testkit.agent import running_agent

PATHS = "10:0,10:0.7,50:0.3,100:0,100:0.5,200:0.3,200:0.7,500:0,500:0.3"
LINK = "mon-tg"
AGENT_PORT = 8720
RECEIVER_PORT = 7855


def topology(name: str, rate_mbit: float, cross_mbit: float) -> dict[str, Any]:
    topo: dict[str, Any] = {
        "lab": {"name": name, "seed": 5},
        "hosts": [{"name": "mon", "role": "monitor"}, {"name": "tg", "role": "target"}],
        "links": [{"a": "mon", "b": "tg", "delay_ms": 2.0, "rate_mbit": rate_mbit}],
    }
    if cross_mbit > 0:
        topo["traffic"] = [{"src": "mon", "dst": "tg", "protocol": "udp", "rate_mbit": cross_mbit}]
    return topo


def delivered_bytes(lab: Lab, link: str = LINK) -> int:
    for _ in range(50):  # the control socket may time out while a burst is forwarded
        with contextlib.suppress(Exception):
            return int(lab.link_state(link)["ab"]["stats"]["bytes_delivered"])
        time.sleep(0.05)
    raise RuntimeError(f"delay line of {link} does not answer")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def error_summary(errors: list[float]) -> dict[str, float | int]:
    return {
        "median_error": round(statistics.median(errors), 4),
        "p90_error": round(pct(errors, 0.9), 4),
        "n": len(errors),
    }


@contextlib.contextmanager
def lab_with_agent(rate_mbit: float, share: float, index: int) -> Iterator[tuple[Lab, Any]]:
    name = f"abwb{os.getpid()}x{index}"
    base = Path(tempfile.mkdtemp(prefix="iepm-abwb-", dir="/var/tmp"))
    try:
        with (
            Lab.up(topology("abwb", rate_mbit, rate_mbit * share), name=name) as lab,
            running_agent(
                base,
                address=lab.address("tg"),
                port=AGENT_PORT,
                netns=lab.netns("tg"),
                kinds=("abw", "iperf3"),
            ) as agent,
        ):
            lab.wait_reachable("mon")
            access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("mon1")))
            ctx = ProbeContext(
                target="tg",
                address=lab.address("tg"),
                monitor="mon1",
                netns=lab.netns("mon"),
                servers=server_source(access),
            )
            yield lab, ctx
    finally:
        shutil.rmtree(base, ignore_errors=True)


def ns_run(ns: str, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", ns, *argv], check=True, timeout=10)


@contextlib.contextmanager
def kernel_path(rate_mbit: float, share: float, index: int) -> Iterator[dict[str, Any]]:
    """The same path with the kernel as the bottleneck instead of the user-space delay line:
    two namespaces, a veth pair, ``tc tbf`` at C on the monitor's side (bucket of one packet,
    so a burst leaves at C), iperf3 UDP cross traffic at ``share`` of C (as the lab's
    generator), a receiver and an ``iperf3 -s`` in the target. Truth: tbf's byte counter."""
    tag = f"abwk{os.getpid() % 100000}x{index}"
    mon, tg = f"{tag}m", f"{tag}t"
    addr_m, addr_t = f"198.19.{200 + index % 50}.1", f"198.19.{200 + index % 50}.2"
    procs: list[subprocess.Popen[bytes]] = []
    logdir = Path(tempfile.mkdtemp(prefix="iepm-abwk-", dir="/var/tmp"))
    try:
        for ns in (mon, tg):
            subprocess.run(["ip", "netns", "add", ns], check=True, timeout=10)
        subprocess.run(
            ["ip", "link", "add", "v0", "netns", mon, "type", "veth", "peer", "v1", "netns", tg],
            check=True,
            timeout=10,
        )
        for ns, dev, addr in ((mon, "v0", addr_m), (tg, "v1", addr_t)):
            ns_run(ns, "ip", "addr", "add", f"{addr}/30", "dev", dev)
            ns_run(ns, "ip", "link", "set", dev, "up")
            ns_run(ns, "ip", "link", "set", "lo", "up")
        ns_run(mon, "tc", "qdisc", "add", "dev", "v0", "root", "tbf", "rate",
               f"{rate_mbit}mbit", "burst", "1600", "latency", "50ms")  # fmt: skip

        def start(ns: str, argv: list[str], name: str) -> subprocess.Popen[bytes]:
            log = (logdir / name).open("wb")
            proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=log, stderr=log)
            procs.append(proc)
            return proc

        start(tg, ["iperf3", "-s", "-B", addr_t, "-p", "5201"], "iperf3-s")
        start(tg, ["iperf3", "-s", "-B", addr_t, "-p", "5202"], "iperf3-cross-s")
        if share:
            time.sleep(0.5)  # the cross-traffic server listens
            start(mon, ["iperf3", "-c", addr_t, "-p", "5202", "-u", "-t", "600", "-l", "1448",
                        "-b", f"{rate_mbit * share * 1e6:.0f}"], "cross")  # fmt: skip

        def receiver() -> subprocess.Popen[bytes]:
            """A one-shot receiver (it exits on the sender's goodbye), once it listens."""
            name = f"rx{len(procs)}"
            rx = start(tg, [sys.executable, abw.TOOL_PATH, "receive", "--port",
                            str(RECEIVER_PORT), "--duration-s", "30"], name)  # fmt: skip
            deadline = time.monotonic() + 10
            while tool.READY not in (logdir / name).read_bytes():
                if time.monotonic() > deadline or rx.poll() is not None:
                    raise RuntimeError("kernel path: receiver did not start")
                time.sleep(0.05)
            return rx

        yield {"mon": mon, "tg": tg, "address": addr_t, "receiver": receiver}
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        for ns in (mon, tg):
            subprocess.run(["ip", "netns", "del", ns], check=False, timeout=10)
        shutil.rmtree(logdir, ignore_errors=True)


def tbf_bytes(ns: str) -> int:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", "v0"],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    words = out.split()
    # IP bytes: tbf counts Ethernet frames (14 bytes of header each).
    return int(words[words.index("Sent") + 1]) - 14 * int(words[words.index("Sent") + 3])


def bench_kernel_path(rate_mbit: float, share: float, index: int, args: argparse.Namespace) -> dict:
    with kernel_path(rate_mbit, share, index) as path:
        ctx = ProbeContext("tg", path["address"], netns=path["mon"])
        if share:
            time.sleep(2.0)
        b0, t0 = tbf_bytes(path["mon"]), time.monotonic()
        runs = []
        for _ in range(args.estimates):
            rx = path["receiver"]()  # one-shot: it exits on the sender's goodbye
            runs.append(asyncio.run(abw.run(abw.Spec(port=RECEIVER_PORT), ctx)))
            with contextlib.suppress(subprocess.TimeoutExpired):
                rx.wait(5)
        b1, t1 = tbf_bytes(path["mon"]), time.monotonic()
        ours = sum(r.data.get("probe_bytes", 0) for r in runs)
        cross_bps = max(0.0, (b1 - b0 - ours) * 8 / (t1 - t0))
    truth = rate_mbit * 1e6 - cross_bps
    ok = [r for r in runs if r.succeeded]
    errors = [abs(r.data["available_bps"] - truth) / truth for r in ok]
    print(f"kernel {rate_mbit:g}:{share:g} done", file=sys.stderr, flush=True)
    return {
        "capacity_mbit": rate_mbit,
        "cross_configured_mbit": rate_mbit * share,
        "cross_measured_mbit": round(cross_bps / 1e6, 2),
        "available_truth_mbit": round(truth / 1e6, 2),
        "abw": {
            "estimates_mbit": [round(r.data["available_bps"] / 1e6, 2) for r in ok],
            "capacity_mbit": [round(r.data["capacity_bps"] / 1e6, 2) for r in ok],
            "quality": [r.data["quality"] for r in ok],
            "failed": [r.error for r in runs if not r.succeeded],
            **(error_summary(errors) if errors else {}),
        },
    }


def sender_spacing(packets: int = 16, size: int = 1500, runs: int = 50) -> dict[str, Any]:
    """The capacity train's spacing on loopback as the receiver's kernel stamps it: a Python
    ``send`` loop against one ``sendmmsg`` call (the tool's). µs between packets, and the rate
    the spacing alone would allow (the most a back-to-back train can measure)."""
    out: dict[str, Any] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, tool.SO_TIMESTAMPNS, 1)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
        rx.settimeout(2.0)
        for mode in ("send_loop", "sendmmsg"):
            gaps: list[float] = []
            spans: list[float] = []
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
                tx.connect(rx.getsockname())
                datagrams = [bytes(size - tool.IP_UDP_HEADER_BYTES)] * packets
                for _ in range(runs):
                    if mode == "sendmmsg":
                        tool.send_burst(tx, datagrams)
                    else:
                        for d in datagrams:
                            tx.send(d)
                    stamps = []
                    for _ in range(packets):
                        _, anc, _, _ = rx.recvmsg(65535, socket.CMSG_SPACE(16))
                        stamps.append(tool.kernel_stamp_ns(anc) or 0)
                    gaps += [(b - a) / 1000 for a, b in itertools.pairwise(stamps)]
                    spans.append((stamps[-1] - stamps[0]) / 1000)
            out[mode] = {
                "gap_us_p50": round(pct(gaps, 0.5), 2),
                "gap_us_p90": round(pct(gaps, 0.9), 2),
                "gap_us_max": round(max(gaps), 1),
                "train_rate_mbit_p50": round(size * 8 * (packets - 1) / pct(spans, 0.5), 0),
                "train_rate_mbit_p10": round(size * 8 * (packets - 1) / pct(spans, 0.9), 0),
            }
    return out


def receiver(lab: Lab, node: str, log: Path) -> subprocess.Popen[bytes]:
    """A receiver in ``node``, once it says it listens (its log), within 10 s."""
    argv = [sys.executable, abw.TOOL_PATH, "receive", "--port", str(RECEIVER_PORT)]
    rx = lab.popen(node, [*argv, "--duration-s", "60", "--max-bytes", "1000000"], log=log)
    deadline = time.monotonic() + 10.0
    while tool.READY not in (log.read_bytes() if log.exists() else b""):
        if time.monotonic() > deadline or rx.poll() is not None:
            raise RuntimeError(f"receiver in {node} did not start: {log.read_text()[-300:]}")
        time.sleep(0.05)
    return rx


Trace = list[tuple[float, float, int]]


def window_truth(
    trace: Trace, rate_mbit: float, probe_bytes: int, carried: bool = True
) -> float | None:
    """The available bandwidth while the probes were sent: C less what the bottleneck carried
    between the first probe's arrival and the last one's, other than the probes (bit/s). What
    it carried is what arrived in between (the trace's byte counts) plus the backlog the first
    probe found less the one the last probe left behind: a probe's queue wait is the work
    ahead of it (``carried=False``: what arrived only, the benchmark's truth before)."""
    if len(trace) < 2 or trace[-1][0] <= trace[0][0]:
        return None
    (t0, w0, b0), (t1, w1, b1) = trace[0], trace[-1]
    rate = rate_mbit * 1e6
    bytes_in = b1 - b0 + ((w0 - w1) * rate / 8 if carried else 0.0)
    cross = bytes_in - probe_bytes * (len(trace) - 1)
    return rate - max(0.0, cross) * 8 / (t1 - t0)


def traced_estimate(lab: Lab, ctx: ProbeContext) -> tuple[Any, Trace]:
    lab.link_trace(LINK, tool.Plan.probe_size_bytes, 10 * tool.Plan.probes)
    result = asyncio.run(abw.run(abw.Spec(), ctx))
    return result, lab.link_trace(LINK)


def record_path(rate_mbit: float, share: float, index: int, args: argparse.Namespace) -> int:
    """``--record-only``: the traced tool runs on one path, appended to ``--record``; no agent,
    no estimates through the probe, no iperf3. The runs recorded."""
    topo = topology("abwr", rate_mbit, rate_mbit * share)
    with Lab.up(topo, name=f"abwr{os.getpid()}x{index}") as lab:
        lab.wait_reachable("mon")
        if share:
            time.sleep(2.0)  # the generator's client is up
        traced = tool_runs(lab, args.methods, args.tool or abw.TOOL_PATH)
    with open(args.record, "a") as fh:
        for doc, trace in traced:
            rec = {"capacity_mbit": rate_mbit, "share": share, "doc": doc, "trace": trace}
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
    print(f"recorded {rate_mbit:g}:{share:g}: {len(traced)} runs", file=sys.stderr, flush=True)
    return len(traced)


def tool_runs(
    lab: Lab, runs: int, tool_path: str = abw.TOOL_PATH
) -> list[tuple[dict[str, Any], Trace]]:
    """The tool with Spruce's trains added, against a receiver started for each run, each with
    the delay line's trace of its probes (their queue wait as the lab scheduled them)."""
    out = []
    for i in range(runs):
        rx = receiver(lab, "tg", lab.run_dir / f"rx{i}.log")
        argv = [sys.executable, tool_path, "send", lab.address("tg"), str(RECEIVER_PORT)]
        lab.link_trace(LINK, tool.Plan.probe_size_bytes, 10 * tool.Plan.probes)
        raw = lab.exec("mon", [*argv, "--trains", "10"], timeout_s=10)
        trace = lab.link_trace(LINK)
        lab.stop(rx)
        with contextlib.suppress(json.JSONDecodeError):
            out.append((json.loads(raw.stdout), trace))
    return out


def truth_split(
    docs: list[tuple[dict[str, Any], Trace]], rate_mbit: float, truth: float
) -> dict[str, Any]:
    """What the method loses against what the lab's timing loses, on the same runs: the error
    of A = C·(1 − u) with u the share of probes the delay line itself queued (perfect timing:
    the method's own loss: sampling, the probes' own load), the estimator's error from the
    stamps, and the stamps' noise: each probe's measured wait less its true wait."""
    method_err, tool_err, noise_us, u_true, u_est = [], [], [], [], []
    method_win, tool_win = [], []
    for doc, trace in docs:
        trains = tool.trains_from_doc(doc)
        probes = trains[1]
        if len(trace) != len(probes.sent_ns) or len(probes.received) != len(probes.sent_ns):
            continue  # a probe lost or a stranger of the same size: no one-to-one match
        waits = [w for _, w, _ in trace]
        # The estimator's own rule with perfect timing: busy when the delay line queued the
        # probe longer than a tenth of a full-size packet at C (no noise floor), plus the
        # probes' own rate.
        rate = rate_mbit * 1e6
        busy_s = tool.BUSY_PACKET_SHARE * tool.MTU_BYTES * 8 / rate
        share = sum(1 for w in waits if w > busy_s) / len(waits)
        perfect = min(rate, rate * (1 - share) + tool.probe_rate_bps(probes))
        method_err.append(abs(perfect - truth) / truth)
        win = window_truth(trace, rate_mbit, probes.size_bytes)
        if win and win > 0:
            method_win.append(abs(perfect - win) / win)
        u_true.append(share)
        est = tool.estimate(trains)
        if est.available_bps is not None and est.capacity_bps:
            tool_err.append(abs(est.available_bps - truth) / truth)
            if win and win > 0:
                tool_win.append(abs(est.available_bps - win) / win)
            u_est.append(1 - est.available_bps / est.capacity_bps)
        by_seq = dict(probes.received)  # the delay line sees the probes in the order sent
        delays = [by_seq[q] - sent for q, sent in enumerate(probes.sent_ns)]
        base = min(d - w * 1e9 for d, w in zip(delays, waits, strict=True))
        noise_us += [(d - w * 1e9 - base) / 1000 for d, w in zip(delays, waits, strict=True)]
    if not method_err:
        return {"matched_runs": 0}
    return {
        "matched_runs": len(method_err),
        "utilisation_true_vs_estimated": [
            [round(a, 3), round(b, 3)] for a, b in zip(u_true, u_est, strict=False)
        ],
        "method_with_true_waits": error_summary(method_err),
        "method_with_true_waits_vs_window": error_summary(method_win) if method_win else None,
        "estimator_same_runs": error_summary(tool_err) if tool_err else None,
        "estimator_same_runs_vs_window": error_summary(tool_win) if tool_win else None,
        "stamp_noise_us": {
            "p50": round(pct(noise_us, 0.5), 1),
            "p90": round(pct(noise_us, 0.9), 1),
            "p99": round(pct(noise_us, 0.99), 1),
        },
    }


def bench_path(rate_mbit: float, share: float, index: int, args: argparse.Namespace) -> dict:
    with lab_with_agent(rate_mbit, share, index) as (lab, ctx):
        if share:
            time.sleep(2.0)  # the generator's client is up
        b0, t0 = delivered_bytes(lab), time.monotonic()
        pairs = [traced_estimate(lab, ctx) for _ in range(args.estimates)]
        runs = [r for r, _ in pairs]
        traced = tool_runs(lab, args.methods, args.tool or abw.TOOL_PATH)
        if args.record:
            with open(args.record, "a") as fh:
                for doc, trace in traced:
                    rec = {"capacity_mbit": rate_mbit, "share": share, "doc": doc, "trace": trace}
                    fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        docs = [d for d, _ in traced]
        b1, t1 = delivered_bytes(lab), time.monotonic()
        ours = sum(r.data.get("probe_bytes", 0) for r in runs)
        ours += sum(len(t["sent_ns"]) * t["size_bytes"] for d in docs for t in d["trains"])
        cross_bps = max(0.0, (b1 - b0 - ours) * 8 / (t1 - t0))
        ip = asyncio.run(iperf3.run(iperf3.Spec(duration_s=args.iperf3_s), ctx))
    truth = rate_mbit * 1e6 - cross_bps
    ok = [r for r in runs if r.succeeded]
    errors = [abs(r.data["available_bps"] - truth) / truth for r in ok]
    windows = [window_truth(t, rate_mbit, tool.Plan.probe_size_bytes) for r, t in pairs]
    errors_window = [
        abs(r.data["available_bps"] - w) / w
        for (r, _), w in zip(pairs, windows, strict=True)
        if r.succeeded and w and w > 0  # ≤ 0: oversubscribed in that window
    ]
    qualities = [
        r.data["quality"]
        for (r, _), w in zip(pairs, windows, strict=True)
        if r.succeeded and w and w > 0
    ]
    trains = [tool.trains_from_doc(d) for d in docs]
    print(f"delay line {rate_mbit:g}:{share:g} done", file=sys.stderr, flush=True)
    busy = [tool.estimate(t).available_bps for t in trains]
    spruce = [tool.spruce_bps(t) for t in trains]
    noise_us: list[float] = []
    if share == 0:
        for r in trains:
            delays = tool.one_way_delays_ns(r[1])
            noise_us += [(d - min(delays)) / 1000 for d in delays]
    abw_bytes = statistics.fmean(r.data["probe_bytes"] for r in ok) if ok else None
    # tests/lab/test_lab_abw.py's behaviours, per path over all its estimates (the suite holds
    # them on one 100 Mbit/s path): the share of estimates within 100 kB and 1 s, with the
    # capacity within 10 %, with the estimate between 0 and the capacity (+5 %).
    held = {
        "within_budget": [
            r.data["probe_bytes"] <= 100_000 and r.data["estimate_s"] <= 1.0 for r in ok
        ],
        "capacity_within_10pct": [
            abs(r.data["capacity_bps"] - rate_mbit * 1e6) <= 0.1 * rate_mbit * 1e6 for r in ok
        ],
        "in_range": [0 <= r.data["available_bps"] <= r.data["capacity_bps"] * 1.05 for r in ok],
    }
    ip_bytes = ip.data.get("bytes_sent") if ip.succeeded else None
    return {
        "capacity_mbit": rate_mbit,
        "cross_configured_mbit": rate_mbit * share,
        "cross_measured_mbit": round(cross_bps / 1e6, 2),
        "available_truth_mbit": round(truth / 1e6, 2),
        "abw": {
            "estimates_mbit": [round(r.data["available_bps"] / 1e6, 2) for r in ok],
            "capacity_mbit": [round(r.data["capacity_bps"] / 1e6, 2) for r in ok],
            "failed": [r.error for r in runs if not r.succeeded],
            **(error_summary(errors) if errors else {}),
            "window_truth_mbit": [round(w / 1e6, 2) if w else None for w in windows],
            "vs_window": error_summary(errors_window) if errors_window else None,
            "errors_vs_window": [round(e, 4) for e in errors_window],
            "quality_vs_window": qualities,
            "quality": [r.data["quality"] for r in ok],
            **{k: round(sum(v) / len(v), 3) if v else None for k, v in held.items()},
            "bytes_per_estimate": abw_bytes,
            "seconds_per_estimate": round(statistics.median(r.data["estimate_s"] for r in ok), 3)
            if ok
            else None,
        },
        "methods_same_runs": {
            "busy_fraction": error_summary(
                [abs((v or 0) - truth) / truth for v in busy] or [math.nan]
            ),
            "spruce": error_summary([abs((v or 0) - truth) / truth for v in spruce] or [math.nan]),
        },
        "truth_split": truth_split(traced, rate_mbit, truth),
        "lab_noise_us": (
            {
                "p50": round(pct(noise_us, 0.5), 1),
                "p90": round(pct(noise_us, 0.9), 1),
                "p99": round(pct(noise_us, 0.99), 1),
            }
            if noise_us
            else None
        ),
        "iperf3": {
            "throughput_mbit": round(ip.data["throughput_bps"] / 1e6, 2) if ip.succeeded else None,
            "bytes": ip_bytes,
            "seconds": ip.duration_s,
            "error": ip.error,
        },
        "cost_ratio_bytes": round(ip_bytes / abw_bytes, 1) if ip_bytes and abw_bytes else None,
    }


def twenty_targets(count: int) -> dict[str, Any]:
    """``count`` targets behind their own 100 Mbit/s links off one router, receivers already
    listening (plain endpoints), estimated concurrently."""
    targets = [f"t{i:02d}" for i in range(count)]
    topo = {
        "lab": {"name": "abwm"},
        "hosts": [{"name": "mon", "role": "monitor"}, {"name": "r", "role": "router"}]
        + [{"name": t, "role": "target"} for t in targets],
        "links": [{"a": "mon", "b": "r", "delay_ms": 1.0}]
        + [{"a": "r", "b": t, "delay_ms": 5.0, "rate_mbit": 100} for t in targets],
    }
    with Lab.up(topo, name=f"abwm{os.getpid()}") as lab:
        lab.wait_reachable("mon")
        receivers = [receiver(lab, t, lab.run_dir / f"rx-{t}.log") for t in targets]

        async def all_of_them() -> list[Any]:
            runs = [
                abw.run(abw.Spec(), ProbeContext(t, lab.address(t), netns=lab.netns("mon")))
                for t in targets
            ]
            return await asyncio.gather(*runs)

        t0 = time.monotonic()
        results = asyncio.run(all_of_them())
        wall_s = time.monotonic() - t0
        for rx in receivers:
            lab.stop(rx)
    ok = [r for r in results if r.succeeded]
    return {
        "targets": count,
        "wall_s": round(wall_s, 2),
        "goal_s": 10.0,
        "succeeded": len(ok),
        "errors": [r.error for r in results if not r.succeeded][:3],
        "median_error_vs_100_mbit": round(
            statistics.median(abs(r.data["available_bps"] - 100e6) / 100e6 for r in ok), 4
        )
        if ok
        else None,
    }


def pooled(paths: list[dict[str, Any]]) -> list[float]:
    return [
        abs(e - p["available_truth_mbit"]) / p["available_truth_mbit"]
        for p in paths
        for e in p["abw"]["estimates_mbit"]
    ]


def goal_met(errors: list[float]) -> bool:
    # The goal over these paths: median error within 10 %, its P90 within 25 %.
    return bool(errors and statistics.median(errors) <= 0.10 and pct(errors, 0.9) <= 0.25)


# --- offline: the methods compared on recorded runs --------------------------------------------

# Paths the method is chosen on, and the ones held out to confirm it (whole paths, --offline).
FIT_PATHS = ("10:0", "50:0.3", "100:0.5", "500:0")


def binomial_floor(u: float, probes: int) -> float:
    """The binary method's relative error of A (1 σ) from sampling alone: u's binomial error
    with ``probes`` independent probes carried to A = C·(1 − u)."""
    return math.sqrt(u * (1 - u) / probes) / (1 - u) if u < 1 else math.inf


def pair_spruce_bps(trains: list[tool.Train], capacity: float) -> float | None:
    """Spruce's gap model per pair of the trains 2… (sent at C): A_i = C·(1 − (g_out − g_in)/
    g_in), their mean with the top and bottom tenth trimmed (a robust mean); pairs whose send
    gap shows a descheduled sender (over :data:`tool.STALL` × S/C) left out."""
    if len(trains) < 3:
        return None
    values = []
    for t in trains[2:]:
        nominal = t.bits() / capacity * 1e9
        for g_in, g_out in t.gaps():
            if 0 < g_in <= tool.STALL * nominal:
                values.append(capacity * (1 - (g_out - g_in) / g_in))
    if len(values) < 4:
        return None
    values.sort()
    cut = len(values) // 10
    kept = values[cut : len(values) - cut]
    return min(capacity, max(0.0, statistics.fmean(kept)))


def record_methods(rec: dict[str, Any]) -> dict[str, Any] | None:
    """Every method's estimate (bit/s) on one recorded run, with its window's truth."""
    trains = tool.trains_from_doc(rec["doc"])
    trace = [(float(a), float(w), int(b)) for a, w, b in rec["trace"]]
    rate = rec["capacity_mbit"] * 1e6
    if len(trains) < 2:
        return None
    probes = trains[1]
    truth = window_truth(trace, rec["capacity_mbit"], probes.size_bytes)
    if (
        truth is None
        or truth <= 0
        or len(trace) != len(probes.sent_ns)
        or len(probes.received) != len(probes.sent_ns)
    ):
        return None  # oversubscribed, or a probe lost: no one-to-one match with the trace
    waits = [w for _, w, _ in trace]
    own = tool.probe_rate_bps(probes)
    capacity = tool.train_capacity_bps(trains[0])
    est = tool.estimate(trains[:2])
    carried_u = 1 - truth / rate  # the bottleneck's busy share in the window, probes excluded
    out: dict[str, Any] = {
        "path": f"{rec['capacity_mbit']:g}:{rec['share']:g}",
        "truth": truth,
        "arrived_truth": window_truth(trace, rec["capacity_mbit"], probes.size_bytes, False),
        "u": carried_u + own / rate,
        "probes": len(waits),
        "capacity": capacity,
        "methods": {},
    }
    m = out["methods"]
    m["binary_stamps"] = est.available_bps
    # Perfect timing: the delay line's own queue wait of each probe, C exact.
    packet_s = tool.MTU_BYTES * 8 / rate
    rule = sum(1 for w in waits if w > tool.BUSY_PACKET_SHARE * packet_s) / len(waits)
    anywait = sum(1 for w in waits if w > 1e-6) / len(waits)
    m["binary_true_waits_tool_rule"] = min(rate, rate * (1 - rule) + own)
    m["binary_true_waits_any_wait"] = min(rate, rate * (1 - anywait) + own)
    # Diagnostic: the exact waits re-weighted to a uniform phase of the probes' arrival within
    # the host's millisecond (the lab's generator paces on a 1 ms timer grid): what is left of
    # the error when the probes' moments are made random with respect to that grid.
    bins: list[list[bool]] = [[] for _ in range(10)]
    for t, w, _ in trace:
        bins[int(t * 1e4) % 10].append(w > 1e-6)
    strata = statistics.fmean(sum(b) / len(b) for b in bins if b)
    m["binary_true_waits_phase_strata"] = min(rate, rate * (1 - strata) + own)
    # The stamps with other busy thresholds (noise floor µs), the tail rule as the tool's.
    if capacity:
        for floor_us in (60, 250):
            e2 = tool.estimate(trains[:2], noise_floor_ns=floor_us * 1000)
            m[f"binary_stamps_floor_{floor_us}us"] = e2.available_bps
    # C the largest of the bursts' readings instead of their median (a stall only stretches).
    bursts = tool.burst_capacities(trains[0])
    if bursts:
        m["binary_stamps_c_max"] = tool.estimate(trains[:2], capacity=max(bursts)).available_bps
    # The first N probes only (the statistical floor's N): 100 and 200.
    for n in (100, 200):
        part = waits[:n]
        share = sum(1 for w in part if w > 1e-6) / len(part)
        m[f"binary_true_waits_any_wait_{n}"] = min(rate, rate * (1 - share) + own)
    if capacity:
        m["spruce_trains"] = tool.spruce_bps(trains)
        m["spruce_pairs"] = pair_spruce_bps(trains, capacity)
        if est.available_bps is not None and m["spruce_pairs"] is not None:
            m["mean_binary_spruce"] = (est.available_bps + m["spruce_pairs"]) / 2
    return out


def offline(files: list[str]) -> dict[str, Any]:
    """The methods on recorded runs: per method, median / P90 relative error against each run's
    window truth (what the bottleneck carried while the probes were sent), on the paths the
    choice is made on (:data:`FIT_PATHS`) and on the held-out ones; the binary method's
    statistical floor against its error with exact timing."""
    rows = []
    for name in files:
        with open(name) as fh:
            for line in fh:
                if line.strip() and (row := record_methods(json.loads(line))) is not None:
                    rows.append(row)
    methods = sorted({k for r in rows for k in r["methods"]})
    report: dict[str, Any] = {"runs": len(rows), "fit_paths": list(FIT_PATHS), "methods": {}}
    for method in methods:
        entry: dict[str, Any] = {}
        for part, keep in (("fit", True), ("held_out", False)):
            errs = [
                abs((r["methods"].get(method) or 0.0) - r["truth"]) / r["truth"]
                for r in rows
                if (r["path"] in FIT_PATHS) == keep and method in r["methods"]
            ]
            entry[part] = error_summary(errs) if errs else None
        entry["per_path"] = {
            path: error_summary(
                [
                    abs((r["methods"].get(method) or 0.0) - r["truth"]) / r["truth"]
                    for r in rows
                    if r["path"] == path and method in r["methods"]
                ]
            )
            for path in sorted({r["path"] for r in rows})
            if any(r["path"] == path and method in r["methods"] for r in rows)
        }
        report["methods"][method] = entry
    # The statistical floor: the error the binomial sampling alone predicts (1 σ and its P90,
    # 1.645 σ) against the binary method's error with exact timing, per path.
    floor: dict[str, Any] = {}
    for path in sorted({r["path"] for r in rows}):
        mine = [r for r in rows if r["path"] == path]
        u = statistics.fmean(r["u"] for r in mine)
        n = round(statistics.fmean(r["probes"] for r in mine))
        sigma = binomial_floor(min(u, 0.999), n)
        floor[path] = {
            "u": round(u, 3),
            "probes": n,
            "predicted_sigma": round(sigma, 4),
            "predicted_p90": round(1.645 * sigma, 4),
            "exact_timing": error_summary(
                [
                    abs(r["methods"]["binary_true_waits_any_wait"] - r["truth"]) / r["truth"]
                    for r in mine
                ]
            ),
            "truth_mbit_range": [
                round(min(r["truth"] for r in mine) / 1e6, 2),
                round(max(r["truth"] for r in mine) / 1e6, 2),
            ],
            "arrived_vs_carried_truth_median_diff": round(
                statistics.median(
                    abs((r["arrived_truth"] or 0) - r["truth"]) / r["truth"] for r in mine
                ),
                4,
            ),
        }
    report["statistical_floor"] = floor
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default=PATHS, help="C:share,… (Mbit/s : cross share)")
    parser.add_argument("--estimates", type=int, default=8)
    parser.add_argument("--methods", type=int, default=6, help="tool runs with Spruce's trains")
    parser.add_argument("--iperf3-s", type=int, default=5)
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument(
        "--record",
        help="append each traced tool run (its raw output and the delay line's trace "
        "of its probes) to this JSON-lines file, for --offline",
    )
    parser.add_argument(
        "--tool",
        help="the abwtool.py the traced runs send with (default: this tree's; an older "
        "copy for a comparison on the same paths)",
    )
    parser.add_argument(
        "--record-only",
        action="store_true",
        help="with --record: only the traced tool runs (no agent, probe, iperf3)",
    )
    parser.add_argument(
        "--offline",
        nargs="+",
        metavar="FILE",
        help="no lab: compare the methods on recorded runs (--record) and exit",
    )
    parser.add_argument(
        "--bottleneck",
        choices=("both", "delayline", "kernel"),
        default="both",
        help="the lab's user-space delay line, the kernel's tbf, or both on the same paths",
    )
    args = parser.parse_args()
    if args.offline:
        print(json.dumps(offline(args.offline), indent=1))
        return
    if args.record_only:
        cases = [(float(r), float(x)) for r, x in (i.split(":") for i in args.paths.split(","))]
        loads = [os.getloadavg()[0]]
        runs = [record_path(rate, share, i, args) for i, (rate, share) in enumerate(cases)]
        loads.append(os.getloadavg()[0])
        print(json.dumps({"recorded": runs, "load_average_1min": loads}))
        return
    load_before = os.getloadavg()
    cases = [(float(r), float(s)) for r, s in (item.split(":") for item in args.paths.split(","))]
    report: dict[str, Any] = {
        "figure": "abw pooled median relative error against the lab's truth (delay line)",
        "goal": {"median": 0.10, "p90": 0.25, "bytes": 100_000, "seconds": 1.0},
        "sender_spacing_loopback": sender_spacing(),
    }
    if args.bottleneck in ("both", "delayline"):
        paths = [bench_path(rate, share, i, args) for i, (rate, share) in enumerate(cases)]
        errors = pooled(paths)
        window = [e for p in paths for e in p["abw"]["errors_vs_window"]]
        confident = [
            e
            for p in paths
            for e, q in zip(
                p["abw"]["errors_vs_window"], p["abw"]["quality_vs_window"], strict=True
            )
            if q >= 0.5
        ]
        ratios = [p["cost_ratio_bytes"] for p in paths if p["cost_ratio_bytes"]]
        per_estimate = [p["abw"] for p in paths if p["abw"]["bytes_per_estimate"]]
        report.update(
            {
                **error_summary(errors),
                "goal_met": goal_met(errors)
                and all(p["bytes_per_estimate"] <= 100_000 for p in per_estimate)
                and all(p["seconds_per_estimate"] <= 1.0 for p in per_estimate),
                "baseline": "iperf3 bytes per test on the same paths (median)",
                "baseline_bytes": statistics.median(
                    p["iperf3"]["bytes"] for p in paths if p["iperf3"]["bytes"]
                ),
                "ratio": "iperf3 bytes / abw bytes per estimate (median over paths)",
                "cost_ratio_bytes": statistics.median(ratios) if ratios else None,
                "cases": {
                    f"{p['capacity_mbit']:g}:{p['cross_configured_mbit'] / p['capacity_mbit']:g}": {
                        **{
                            k: p["abw"].get(k)
                            for k in (
                                "median_error",
                                "p90_error",
                                "n",
                                "within_budget",
                                "capacity_within_10pct",
                                "in_range",
                            )
                        },
                        "vs_window": p["abw"]["vs_window"],
                        "method_with_true_waits": p["truth_split"].get("method_with_true_waits"),
                        "stamp_noise_us": p["truth_split"].get("stamp_noise_us"),
                    }
                    for p in paths
                },
                # Against the available bandwidth while each estimate's probes were sent (the
                # delay line's counters over that half second), not the mean over all of them.
                "vs_window": error_summary(window) if window else None,
                "goal_met_vs_window": goal_met(window),
                # The same, only the estimates whose own quality figure is at least 0.5.
                "vs_window_quality_0_5": {
                    **(error_summary(confident) if confident else {}),
                    "left_out": len(window) - len(confident),
                    "goal_met": goal_met(confident),
                },
                "paths": paths,
            }
        )
    if args.bottleneck in ("both", "kernel"):
        kpaths = [bench_kernel_path(rate, share, i, args) for i, (rate, share) in enumerate(cases)]
        kerrors = pooled(kpaths)
        report["kernel_bottleneck"] = {
            "what": "same paths, tc tbf in a namespace as the bottleneck (no user-space hop)",
            **(error_summary(kerrors) if kerrors else {}),
            "goal_met": goal_met(kerrors),
            "cases": {
                f"{p['capacity_mbit']:g}:{p['cross_configured_mbit'] / p['capacity_mbit']:g}": {
                    k: p["abw"].get(k) for k in ("median_error", "p90_error", "n")
                }
                for p in kpaths
            },
            "paths": kpaths,
        }
    if args.targets:
        report["concurrent"] = twenty_targets(args.targets)
    report["load_average_before"] = [round(x, 2) for x in load_before]
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    report["cpus"] = os.cpu_count()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
