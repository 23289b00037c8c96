"""The packet-train tool of the ``abw`` probe: a receiver the agent leases, a sender the monitor
runs, their wire format, and the dispersion maths both sides share.

``python iepm/abwtool.py receive --port P [--bind A] --duration-s S --max-bytes B`` is the
one-shot server of the agent's ``abw`` kind: it stamps every probe datagram with the kernel's
receive time (SO_TIMESTAMPNS, read from recvmsg's ancillary data, so the receiver's own
scheduling does not blur the spacing), answers each train's query with the stamps, and exits on
the sender's goodbye, at its deadline, or (exit 3) when more than its byte budget arrives.

``python iepm/abwtool.py send HOST PORT [options]`` sends the trains (see :func:`send`) and
prints one JSON document with every send and receive time: the probe's raw output, from which
``parse()`` recomputes the estimate (:func:`estimate`) without the network.

Wire (all big-endian; a datagram's payload, padded with zeros to the probe size):
    probe   b"IEAP" session:u32 train:u16 seq:u16 count:u16
    query   b"IEAQ" session:u32 offset:u16       (the stamps from the offset-th on)
    report  b"IEAR" session:u32 offset:u16 n:u16 total:u16, then n × (train:u16 seq:u16
            recv_ns:u64) in arrival order
    bye     b"IEAB" session:u32

Standard library only: the agent runs this file by path (no iepm on its path needed), and the
probe imports it for the maths (probes may not import iepm.remote).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import math
import os
import random
import select
import socket
import statistics
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

VERSION = "iepm-abw 1"
PROBE = struct.Struct("!4sIHHH")
QUERY = struct.Struct("!4sIH")
REPORT = struct.Struct("!4sIHHH")
ENTRY = struct.Struct("!HHQ")
BYE = struct.Struct("!4sI")
MAGIC_PROBE, MAGIC_QUERY, MAGIC_REPORT, MAGIC_BYE = b"IEAP", b"IEAQ", b"IEAR", b"IEAB"
# Linux values (asm-generic/socket.h); Python's socket module does not name them.
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
TIMESPEC = struct.Struct("@qq")
IP_UDP_HEADER_BYTES = 28
MIN_SIZE_BYTES = IP_UDP_HEADER_BYTES + PROBE.size
MAX_SIZE_BYTES = 1500
# A report must fit one datagram without IP fragments on a 1500-byte path: this many stamps.
MAX_REPORT_ENTRIES = (1472 - REPORT.size) // ENTRY.size
# Stamps kept per session (the sender's byte budget keeps it far lower).
MAX_SESSION_STAMPS = 2048
# A send gap this many times the one asked means the sender was descheduled (see cross_bps).
STALL = 1.5
# A probe found the link busy when it waited longer than this share of a full-size packet's
# time at the bottleneck (a shorter wait is the tail of a packet, not telling) and than the
# timing noise (measured in the lab; README "Available bandwidth").
BUSY_PACKET_SHARE = 0.1
MTU_BYTES = 1500
NOISE_FLOOR_NS = 120_000
MIN_PROBES = 20
# The empty queue's delay is this low quantile of the probes' delays, not their least: a probe
# or two delivered early (in the lab, by a delay line already awake for another packet while
# the rest wait for its wake-up) would otherwise make every other probe look queued.
FLOOR_QUANTILE = 0.02
# A probe the sender reaches later than this after its Poisson moment is skipped (see send()).
LATE_PROBE_S = 100e-6
# The last stretch before a probe's moment is spun, not slept: short, since every µs spun is
# taken from whatever else runs on the host (in the lab: the cross traffic's sender).
PROBE_SPIN_NS = 60_000
# A burst reading this many times the next one was delivered in one batch (train_capacity_bps):
# stretched readings seen under load were at most 5.5 times below the true C.
BATCH_FACTOR = 6.0
PR_SET_TIMERSLACK, PR_GET_TIMERSLACK = 29, 30
READY = b"iepm abw receiver listening on"


# --- receiver ----------------------------------------------------------------------------------


@dataclass
class _Session:
    peer: str
    stamps: list[tuple[int, int, int]] = field(default_factory=list)  # (train, seq, ns)


def kernel_stamp_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            return int(sec) * 1_000_000_000 + int(nsec)
    return None


def report(sid: int, offset: int, stamps: Sequence[tuple[int, int, int]]) -> bytes:
    """The reply to a query: up to :data:`MAX_REPORT_ENTRIES` stamps from ``offset`` on."""
    entries = stamps[offset : offset + MAX_REPORT_ENTRIES]
    head = REPORT.pack(MAGIC_REPORT, sid, offset, len(entries), len(stamps))
    return head + b"".join(ENTRY.pack(*e) for e in entries)


def receive(
    port: int, bind: str | None, duration_s: float, max_bytes: int, out: Any = sys.stdout
) -> int:
    """Serve one monitor's trains until its goodbye or ``duration_s``; the exit status (3: more
    probe bytes arrived than ``max_bytes``)."""
    family = socket.AF_INET6 if bind is not None and ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind((bind or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
    except OSError as exc:
        print(f"cannot bind port {port}: {exc.strerror} (address in use?)", file=out, flush=True)
        sock.close()
        return 1
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    # A whole train may arrive before this process is scheduled: hold it in the socket.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 21)
    print(f"{READY.decode()} port {port}", file=out, flush=True)
    deadline = time.monotonic() + duration_s
    sessions: dict[int, _Session] = {}
    received_bytes = 0
    user_stamps = 0
    with sock:
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                continue
            data, ancdata, _, peer = sock.recvmsg(65535, socket.CMSG_SPACE(TIMESPEC.size))
            stamp = kernel_stamp_ns(ancdata)
            if stamp is None:  # not seen on Linux; counted so that the log says so
                stamp = time.time_ns()
                user_stamps += 1
            magic = data[:4]
            if magic == MAGIC_PROBE and len(data) >= PROBE.size:
                _, sid, train, seq, _count = PROBE.unpack_from(data)
                received_bytes += len(data) + IP_UDP_HEADER_BYTES
                if received_bytes > max_bytes:
                    print(
                        f"cut: {received_bytes} probe bytes exceed the {max_bytes} granted",
                        file=out,
                        flush=True,
                    )
                    return 3
                session = sessions.setdefault(sid, _Session(peer[0]))
                if session.peer == peer[0] and len(session.stamps) < MAX_SESSION_STAMPS:
                    session.stamps.append((train, seq, stamp))
            elif magic == MAGIC_QUERY and len(data) >= QUERY.size:
                _, sid, offset = QUERY.unpack_from(data)
                session = sessions.get(sid)
                # Only the sender of the probes gets their stamps: no reflection to others.
                if session is None or session.peer != peer[0]:
                    continue
                # Every page from the offset on, back to back: one round trip for the lot.
                with contextlib.suppress(OSError):
                    for start in range(
                        offset, max(offset + 1, len(session.stamps)), MAX_REPORT_ENTRIES
                    ):
                        sock.sendto(report(sid, start, session.stamps), peer)
                print(f"query from stamp {offset}: {received_bytes} bytes so far", file=out)
            elif magic == MAGIC_BYE and len(data) >= BYE.size:
                _, sid = BYE.unpack_from(data)
                session = sessions.get(sid)
                if session is not None and session.peer == peer[0]:
                    clock = f"{user_stamps} user-space stamps" if user_stamps else "kernel stamps"
                    print(f"done: {received_bytes} bytes, {clock}", file=out, flush=True)
                    return 0
    print(f"deadline: {received_bytes} bytes received", file=out, flush=True)
    return 0


# --- maths -------------------------------------------------------------------------------------


@dataclass
class Train:
    """One train as sent and received: times in ns (the sender's clock for ``sent_ns``, the
    receiver's kernel clock for ``received``; only differences within one side are used)."""

    size_bytes: int
    rate_bps: float | None  # asked for; None: back to back
    sent_ns: list[int]
    received: list[tuple[int, int]]  # (seq, receive ns)
    # Packets per back-to-back burst when the train is several bursts (None: one).
    burst: int | None = None

    def bits(self) -> int:
        return self.size_bytes * 8

    def gaps(self) -> list[tuple[int, int]]:
        """(send gap, receive gap) in ns of consecutive packets that both arrived."""
        by_seq = dict(self.received)
        sent = self.sent_ns
        return [
            (sent[s + 1] - sent[s], by_seq[s + 1] - by_seq[s])
            for s in range(len(sent) - 1)
            if s in by_seq and s + 1 in by_seq
        ]


def capacity_bps(train: Train) -> float | None:
    """Bottleneck capacity from back-to-back bursts: the spacing the bottleneck leaves when
    no cross packet slips in. Spacings over two gaps (a receiver that takes two packets in one
    wake-up stamps them close, and the next one late: the pair's sum holds), of the pairs the
    bottleneck queued: sent in under half the time they took to leave (a sender descheduled
    within its train spaced those itself), else, when too few were (a sender barely faster than
    the link), sent faster than they left. Their median over all the bursts: cross traffic
    widens some, timing noise spreads them both ways, and a bottleneck (or a lab's delay line)
    stalled during one burst stretches that burst only."""
    by_seq = dict(train.received)
    sent = train.sent_ns
    burst = train.burst or len(sent)
    pairs = [
        (sent[s + 2] - sent[s], by_seq[s + 2] - by_seq[s])
        for s in range(len(sent) - 2)
        if s in by_seq and s + 1 in by_seq and s + 2 in by_seq and s // burst == (s + 2) // burst
    ]
    if train.burst:
        # Bursts sent by one sendmmsg call each: the send times are only spread evenly over the
        # call, so a preemption inside it makes every gap of that burst look slow and keeping
        # "queued" pairs by them would keep just the preempted ones. The kernel sends a burst
        # at gigabits per second: the bottleneck queued all but the pairs around a preemption,
        # and the median outvotes those.
        spacings = [g_out / 2 for _, g_out in pairs if g_out > 0]
        return train.bits() / (statistics.median(spacings) * 1e-9) if len(spacings) >= 3 else None
    for slack in (2, 1):
        spacings = [g_out / 2 for g_in, g_out in pairs if 0 < slack * g_in < g_out]
        if len(spacings) >= 3:
            return train.bits() / (statistics.median(spacings) * 1e-9)
    # None seen queued: the sender was preempted within its burst (the send times, spread
    # evenly over the call, then read slow), or the path is faster than the sender (loopback, a
    # fast LAN; then this is a floor of C). The median receive spacing of the bursts' pairs.
    spacings = [g_out / 2 for _, g_out in pairs if g_out > 0]
    if len(spacings) >= 3:
        return train.bits() / (statistics.median(spacings) * 1e-9)
    return None


def cross_bps(train: Train, capacity: float, stall: float = STALL) -> float | None:
    """Cross traffic seen by a train sent at (about) the capacity (Spruce): the link is busy
    with the first packet for the whole send gap, so a receive gap is the packet's own time
    plus the cross traffic that came in between, g_out = (S + X·g_in)/C, and over the gaps kept
    X = (C·Σg_out − n·S)/Σg_in. A gap where the sender was descheduled (g_in over ``stall`` ×
    S/C) is left out: the link may have idled in it. None when fewer than 2 gaps remain."""
    nominal_ns = train.bits() / capacity * 1e9
    kept = [(g_in, g_out) for g_in, g_out in train.gaps() if 0 < g_in <= stall * nominal_ns]
    if len(kept) < 2:
        return None
    sum_in_s = sum(g for g, _ in kept) * 1e-9
    sum_out_s = sum(g for _, g in kept) * 1e-9
    return max(0.0, (capacity * sum_out_s - len(kept) * train.bits()) / sum_in_s)


def one_way_delays_ns(
    train: Train, after_ns: int | None = None, before_ns: int | None = None
) -> list[int]:
    """Receive minus send time of each packet that arrived (an unknown clock offset included),
    of those sent after ``after_ns`` and before ``before_ns`` (sender's clock) if given."""
    return [
        ns - train.sent_ns[seq]
        for seq, ns in train.received
        if 0 <= seq < len(train.sent_ns)
        and (after_ns is None or train.sent_ns[seq] > after_ns)
        and (before_ns is None or train.sent_ns[seq] < before_ns)
    ]


def drained_ns(train: Train, capacity: float, utilisation: float = 0.0) -> int:
    """When (sender's clock) a back-to-back train sent before the probes has surely left the
    bottleneck: probes sent before would wait behind it and count its own load as the path's.
    Twice its time at C, stretched by 1/(1 − u): cross traffic keeps arriving while it drains."""
    stretch = 1.0 / max(0.1, 1.0 - utilisation)
    return train.sent_ns[0] + int(2 * stretch * len(train.sent_ns) * train.bits() / capacity * 1e9)


def floor_ns(delays: Sequence[int]) -> int:
    """The delay of a probe that found the queue empty: :data:`FLOOR_QUANTILE` of ``delays``."""
    return sorted(delays)[int(FLOOR_QUANTILE * len(delays))]


def busy_fraction(
    train: Train,
    capacity: float,
    noise_floor_ns: float = NOISE_FLOOR_NS,
    after_ns: int = 0,
    before_ns: int | None = None,
) -> tuple[float, int] | None:
    """Share of the probes that found the bottleneck busy, and how many probes count. A probe
    waited when its one-way delay exceeds the path's least (an empty queue) by more than
    :data:`BUSY_PACKET_SHARE` of a full-size packet's time at the bottleneck and the timing
    noise floor :data:`NOISE_FLOOR_NS`. Sent at Poisson moments, the probes see the link's
    time average (PASTA): the busy share is its utilisation."""
    delays = one_way_delays_ns(train, after_ns, before_ns)
    if len(delays) < MIN_PROBES:
        return None
    floor = floor_ns(delays)
    packet_ns = MTU_BYTES * 8 / capacity * 1e9
    threshold = max(noise_floor_ns, BUSY_PACKET_SHARE * packet_ns)
    waits = [d - floor for d in delays]
    busy = sum(1 for w in waits if w > threshold)
    if BUSY_PACKET_SHARE * packet_ns < noise_floor_ns:
        # Waits under the threshold are lost in the noise; the wait of a probe that meets a
        # packet in service is uniform over that packet's time, so the band just above the
        # threshold tells how many fell below it.
        busy += sum(1 for w in waits if threshold < w <= 2 * threshold)
    return min(1.0, busy / len(delays)), len(delays)


def ambiguous_share(
    train: Train,
    capacity: float,
    noise_floor_ns: float = NOISE_FLOOR_NS,
    after_ns: int = 0,
    before_ns: int | None = None,
) -> float:
    """Share of the probes whose wait is within a factor of two of :func:`busy_fraction`'s
    threshold either way: timing noise or a short queue, the stamps cannot tell which."""
    delays = one_way_delays_ns(train, after_ns, before_ns)
    if not delays:
        return 0.0
    floor = floor_ns(delays)
    threshold = max(noise_floor_ns, BUSY_PACKET_SHARE * MTU_BYTES * 8 / capacity * 1e9)
    return sum(1 for d in delays if threshold / 2 < d - floor <= 2 * threshold) / len(delays)


def train_capacity_bps(train: Train) -> float | None:
    """C from a capacity train: with two bursts or more, the largest of their own readings (a
    stall of the sender or of the bottleneck only stretches a burst, and under load two of
    three were stretched now and then: the median then read 4-54 of 100 Mbit/s; readings
    over C were at most 5 % high in 370 bursts, benchmarks/abw.py --offline), unless it is
    over :data:`BATCH_FACTOR` times the next: a burst the path delivered in one batch (once
    4,208 Mbit/s on a 50 Mbit/s path). Else the spacings of all of them pooled
    (:func:`capacity_bps`)."""
    bursts = sorted(burst_capacities(train), reverse=True)
    if len(bursts) < 2:
        return capacity_bps(train)
    return bursts[1] if bursts[0] > BATCH_FACTOR * bursts[1] else bursts[0]


def burst_capacities(train: Train) -> list[float]:
    """:func:`capacity_bps` of each back-to-back burst of a capacity train on its own."""
    burst = train.burst or len(train.sent_ns)
    out = []
    for first in range(0, len(train.sent_ns), burst):
        part = Train(
            train.size_bytes,
            None,
            train.sent_ns[first : first + burst],
            [(q - first, ns) for q, ns in train.received if first <= q < first + burst],
        )
        if (c := capacity_bps(part)) is not None:
            out.append(c)
    return out


@dataclass(frozen=True)
class Estimate:
    available_bps: float | None
    capacity_bps: float | None
    # 0..1: 1 − the estimate's relative uncertainty: the busy share's binomial error, the
    # probes the timing cannot classify, and the bursts' disagreement on C (see estimate()).
    quality: float
    probes_used: int
    error: str | None = None


def estimate(
    trains: Sequence[Train], noise_floor_ns: float = NOISE_FLOOR_NS, capacity: float | None = None
) -> Estimate:
    """Available bandwidth from a run: the capacity C from the back-to-back train (train 0),
    the utilisation u from the delays of the probes (train 1) sent before that train (or, in
    runs that sent it first, once it had left the bottleneck), A = C·(1 − u)."""
    if not trains:
        return Estimate(None, None, 0.0, 0, "no train was sent")
    capacity = capacity or train_capacity_bps(trains[0])
    if capacity is None:
        got = len(trains[0].received)
        return Estimate(None, None, 0.0, 0, f"the capacity train came back with {got} packets")
    busy = None
    window: tuple[int, int | None] = (0, None)
    if len(trains) > 1 and trains[0].sent_ns:
        # Probes sent before the capacity train (the tool's order)…
        window = (0, trains[0].sent_ns[0])
        busy = busy_fraction(trains[1], capacity, noise_floor_ns, *window)
        if busy is None:
            # …or, in runs that sent the train first, those sent once it had drained.
            first = busy_fraction(
                trains[1], capacity, noise_floor_ns, drained_ns(trains[0], capacity)
            )
            if first is not None:
                window = (drained_ns(trains[0], capacity, first[0]), None)
                busy = busy_fraction(trains[1], capacity, noise_floor_ns, *window) or first
    if busy is None:
        return Estimate(None, capacity, 0.0, 0, f"fewer than {MIN_PROBES} probes came back")
    share, count = busy
    # The probes see the link busy with each other too (PASTA counts all the load but a
    # probe's own), and the available bandwidth is what is left without them: add their rate.
    available = min(capacity, capacity * (1.0 - share) + probe_rate_bps(trains[1]))
    if available <= 0:
        return Estimate(0.0, capacity, 0.0, count)
    # Uncertainty (bit/s), three parts added in quadrature: the binomial error of the busy
    # share; half the probes the timing cannot classify (each may be busy or idle); and the
    # bursts' spread of C (a burst stretched by a stall, or cross traffic in it) carried to A.
    binomial = capacity * math.sqrt(max(share * (1 - share), 1.0 / count) / count)
    ambiguous = capacity * ambiguous_share(trains[1], capacity, noise_floor_ns, *window) / 2
    bursts = burst_capacities(trains[0])
    spread = (max(bursts) - min(bursts)) / 2 / capacity if len(bursts) > 1 else 0.0
    error = math.sqrt(binomial**2 + ambiguous**2 + (spread * available) ** 2)
    return Estimate(available, capacity, round(max(0.0, 1.0 - error / available), 3), count)


def probe_rate_bps(train: Train) -> float:
    """The probes' own load on the path: their bits over the time they were sent in."""
    sent = train.sent_ns
    if len(sent) < 2 or sent[-1] <= sent[0]:
        return 0.0
    return len(sent) * train.bits() / ((sent[-1] - sent[0]) * 1e-9)


def spruce_bps(trains: Sequence[Train]) -> float | None:
    """Spruce's estimate from trains 2…: C minus the mean cross traffic they saw."""
    capacity = train_capacity_bps(trains[0]) if trains else None
    if capacity is None:
        return None
    cross = [x for t in trains[2:] if (x := cross_bps(t, capacity)) is not None]
    return min(capacity, max(0.0, capacity - statistics.fmean(cross))) if cross else None


# --- sender ------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What one estimate sends: ``probes`` single packets of ``probe_size_bytes`` at random
    (Poisson) moments over about ``spread_s``, then ``capacity_trains`` back-to-back bursts of
    ``capacity_packets`` packets of ``size_bytes`` (IP), ``burst_gap_s`` apart; with
    ``trains`` > 0 also that many Spruce trains of ``train_packets`` at the capacity found (the
    method this one was chosen over)."""

    size_bytes: int = 1500
    capacity_packets: int = 16
    capacity_trains: int = 3
    burst_gap_s: float = 0.06
    probes: int = 400
    probe_size_bytes: int = 64
    spread_s: float = 0.5
    trains: int = 0
    train_packets: int = 5
    reply_timeout_s: float = 0.3
    tries: int = 3

    def total_bytes(self) -> int:
        return (
            self.size_bytes
            * (self.capacity_packets * self.capacity_trains + self.trains * self.train_packets)
            + self.probe_size_bytes * self.probes
        )


@contextlib.contextmanager
def _realtime() -> Iterator[bool]:
    """Run the block under SCHED_FIFO where the process may (root, CAP_SYS_NICE), with a timer
    slack of 1 ns, then restore both: on a loaded host a normal task wakes milliseconds late
    and misses the probes' moments (load 17: 253 of 400 more than 100 µs late; SCHED_FIFO 83
    of 400 at 200 µs spin). Yields whether it got it. The block must be short."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        yield False
        return
    libc = ctypes.CDLL(None, use_errno=True)
    slack = libc.prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0)
    libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)  # wake on time, not 50 µs late
    try:
        yield True
    finally:
        if slack > 0:
            libc.prctl(PR_SET_TIMERSLACK, slack, 0, 0, 0)
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, param)


def _pace_until(t_ns: int, spin_ns: int = 300_000) -> None:
    # Sleep while far away, spin the last stretch: sleep() wakes tens of µs late.
    while (left := t_ns - time.perf_counter_ns()) > spin_ns:
        time.sleep((left - spin_ns * 2 // 3) * 1e-9)
    while time.perf_counter_ns() < t_ns:
        pass


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(_IoVec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("len", ctypes.c_uint)]


def _libc_sendmmsg() -> Any:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.sendmmsg
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        fn.restype = ctypes.c_int
        return fn
    return None


_SENDMMSG = _libc_sendmmsg()


def send_burst(sock: socket.socket, datagrams: Sequence[bytes]) -> tuple[int, int, int]:
    """Send ``datagrams`` on a connected socket back to back: one ``sendmmsg`` call (libc, via
    ctypes), so the sender cannot be descheduled between packets; a ``send`` loop where libc has
    none. (first ns, last ns, datagrams sent): the clock before the call and after it."""
    count = len(datagrams)
    if _SENDMMSG is None:
        t0 = time.perf_counter_ns()
        for d in datagrams:
            sock.send(d)
        return t0, time.perf_counter_ns(), count
    bufs = [ctypes.create_string_buffer(d, len(d)) for d in datagrams]
    iovs = (_IoVec * count)(
        *[_IoVec(ctypes.addressof(b), len(d)) for b, d in zip(bufs, datagrams, strict=True)]
    )
    msgs = (_MMsgHdr * count)()
    for i in range(count):
        msgs[i].hdr.iov = ctypes.pointer(iovs[i])
        msgs[i].hdr.iovlen = 1
    done = 0
    t0 = time.perf_counter_ns()
    while done < count:
        n = _SENDMMSG(
            sock.fileno(), ctypes.addressof(msgs) + done * ctypes.sizeof(_MMsgHdr), count - done, 0
        )
        if n < 0:
            err = ctypes.get_errno()
            if err == 4:  # EINTR
                continue
            raise OSError(err, os.strerror(err))
        done += n
    return t0, time.perf_counter_ns(), done


def _send_train(
    sock: socket.socket,
    sid: int,
    index: int,
    count: int,
    size: int,
    rate_bps: float | None,
    burst: int = 0,
) -> list[int]:
    """Send one train; the packets' sequence numbers start at ``burst`` × ``count``."""
    pad = b"\0" * (size - IP_UDP_HEADER_BYTES - PROBE.size)
    first = burst * count
    if not rate_bps:
        # Back to back: one system call for the train. Each packet's send time is placed
        # evenly between the clock before and after the call (the kernel sends them in order
        # within it); only the spacing matters, and the bottleneck's is far wider.
        t0, t1, sent_count = send_burst(
            sock,
            [PROBE.pack(MAGIC_PROBE, sid, index, first + seq, count) + pad for seq in range(count)],
        )
        step = (t1 - t0) / max(1, sent_count)
        return [t0 + int(step * (i + 1)) for i in range(sent_count)]
    gap_ns = int(size * 8 / rate_bps * 1e9)
    sent: list[int] = []
    due = time.perf_counter_ns()
    for seq in range(count):
        now = time.perf_counter_ns()
        if now > due + gap_ns:
            # Descheduled for more than a gap: go on from now rather than catch up with a
            # burst faster than the rate asked (the stall shows in the send times).
            due = now
        _pace_until(due)
        due += gap_ns
        # Stamped as the send starts: the kernel queues the packet within the call.
        sent.append(time.perf_counter_ns())
        sock.send(PROBE.pack(MAGIC_PROBE, sid, index, seq, count) + pad)
    return sent


def _query(
    sock: socket.socket, sid: int, timeout_s: float, tries: int
) -> list[tuple[int, int, int]] | None:
    """Every stamp the receiver holds for the session: it sends all pages from the offset
    asked for; a page lost is asked for again (up to ``tries`` queries, ``timeout_s`` each).
    None if it never answers."""
    pages: dict[int, list[tuple[int, int, int]]] = {}
    total: int | None = None
    for _ in range(tries):
        have = _contiguous(pages)
        sock.send(QUERY.pack(MAGIC_QUERY, sid, len(have)))
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            try:
                data = sock.recv(65535)
            except ConnectionRefusedError:  # ICMP port unreachable: nobody listens
                return None
            if len(data) < REPORT.size:
                continue
            magic, rsid, offset, n, total = REPORT.unpack_from(data)
            if magic != MAGIC_REPORT or rsid != sid:
                continue
            body = data[REPORT.size : REPORT.size + n * ENTRY.size]
            count = len(body) // ENTRY.size
            pages[offset] = [ENTRY.unpack_from(body, i * ENTRY.size) for i in range(count)]
            if len(_contiguous(pages)) >= total:
                return _contiguous(pages)[:total]
    return None if total is None else _contiguous(pages)


def _contiguous(pages: dict[int, list[tuple[int, int, int]]]) -> list[tuple[int, int, int]]:
    """The stamps from 0 up to the first page missing."""
    out: list[tuple[int, int, int]] = []
    while len(out) in pages and pages[len(out)]:
        out += pages[len(out)]
    return out


def _sleep_exp(rng: random.Random, count: int, spread_s: float) -> None:
    # Exponential gaps: the packets sample the path at random moments (Poisson arrivals see
    # time averages), never in step with a periodic sender.
    time.sleep(min(rng.expovariate(count / spread_s), spread_s))


def send(host: str, port: int, plan: Plan, deadline_s: float) -> dict[str, Any]:
    """Send the plan's packets to a receiver and collect its stamps: the raw document that
    :func:`trains_from_doc` and :func:`estimate` read. Stops sending at ``deadline_s``."""
    started = time.monotonic()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sid = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(sid)
    problems: list[str] = []
    trains: list[Train] = []
    skipped = 0
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 21)
            sock.connect((host, port))
            # The probes first, the capacity train after them: a train sent first would leave
            # a queue behind it for a time that grows with the cross traffic (T/(1 − u)).
            probes = Train(plan.probe_size_bytes, None, [], [])
            capacity_train = Train(plan.size_bytes, None, [], [], plan.capacity_packets)
            trains += [capacity_train, probes]
            pad = b"\0" * (plan.probe_size_bytes - IP_UDP_HEADER_BYTES - PROBE.size)
            # Poisson moments on one clock, each met by spinning the last 60 µs (timer slack
            # 1 ns): a sender that sends the probes it owes at once after a late wake-up
            # samples the moments right after whatever held the CPU (in the lab: the cross
            # traffic's sender) and its probes queue behind each other; one that spins long
            # holds the CPU that other senders need just before each probe. Both biased the
            # busy share, measured with exact waits (README "Available bandwidth"). A probe
            # the sender is late for is skipped, not sent with the next ones.
            due = t_start = time.perf_counter_ns()
            t_offset_s = time.monotonic() - started
            late_ns = int(LATE_PROBE_S * 1e9)
            with _realtime():
                for _ in range(plan.probes):
                    due += int(rng.expovariate(plan.probes / plan.spread_s) * 1e9)
                    if (due - t_start) * 1e-9 + t_offset_s > deadline_s:
                        problems.append(f"stopped at the {deadline_s:g} s deadline")
                        break
                    _pace_until(due, PROBE_SPIN_NS)
                    now = time.perf_counter_ns()
                    if now - due > late_ns:
                        skipped += 1
                        continue
                    seq = len(probes.sent_ns)
                    probes.sent_ns.append(now)
                    sock.send(PROBE.pack(MAGIC_PROBE, sid, 1, seq, plan.probes) + pad)
            for burst in range(plan.capacity_trains):
                if burst:
                    # Until the last burst has left: at 10 Mbit/s with 70 % cross traffic that
                    # takes ~60 ms, and bursts piling up would fill a 50 ms queue.
                    time.sleep(plan.burst_gap_s)
                capacity_train.sent_ns += _send_train(
                    sock, sid, 0, plan.capacity_packets, plan.size_bytes, None, burst
                )
            if plan.trains:
                # Spruce needs the capacity before its trains: one round trip more.
                got = _query(sock, sid, plan.reply_timeout_s, plan.tries) or []
                capacity_train.received = [(s, t) for i, s, t in got if i == 0]
                capacity = train_capacity_bps(capacity_train)
                for index in range(2, 2 + plan.trains if capacity else 0):
                    if time.monotonic() - started > deadline_s:
                        break
                    _sleep_exp(rng, plan.trains, plan.spread_s)
                    sent = _send_train(
                        sock, sid, index, plan.train_packets, plan.size_bytes, capacity
                    )
                    trains.append(Train(plan.size_bytes, capacity, sent, []))
            got = _query(sock, sid, plan.reply_timeout_s, plan.tries)
            if got is None:
                problems.append("no answer from the receiver")
            # The wire's train numbers: 0 capacity, 1 the probes, 2… Spruce's trains.
            by_index = dict(enumerate(trains))
            for t in trains:
                t.received = []
            for index, seq, ns in got or []:
                if index in by_index and seq < len(by_index[index].sent_ns):
                    by_index[index].received.append((seq, ns))
            with contextlib.suppress(OSError):
                sock.send(BYE.pack(MAGIC_BYE, sid))
    except OSError as exc:
        # ICMP port unreachable (no receiver) or no route: what was sent so far is reported.
        problems.append(f"sending to {host} port {port} failed: {exc.strerror or exc}")
    return {
        "tool": VERSION,
        "plan": asdict(plan),
        "duration_s": round(time.monotonic() - started, 6),
        "problems": problems,
        "probes_skipped": skipped,
        "trains": [asdict(t) for t in trains],
    }


def trains_from_doc(doc: dict[str, Any]) -> list[Train]:
    """The trains of a :func:`send` document (KeyError/TypeError/ValueError if malformed)."""
    return [
        Train(
            int(t["size_bytes"]),
            None if t["rate_bps"] is None else float(t["rate_bps"]),
            [int(x) for x in t["sent_ns"]],
            [(int(s), int(r)) for s, r in t["received"]],
            None if t.get("burst") is None else int(t["burst"]),
        )
        for t in doc["trains"]
    ]


# --- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python iepm/abwtool.py")
    parser.add_argument("--version", action="version", version=VERSION)
    sub = parser.add_subparsers(dest="command", required=True)
    rx = sub.add_parser("receive")
    rx.add_argument("--port", type=int, required=True)
    rx.add_argument("--bind")
    rx.add_argument("--duration-s", type=float, default=10.0)
    rx.add_argument("--max-bytes", type=int, default=100_000)
    rx.add_argument("--grant", help="JSON file with duration_s and max_bytes (the agent's)")
    tx = sub.add_parser("send")
    tx.add_argument("host")
    tx.add_argument("port", type=int)
    tx.add_argument("--size-bytes", type=int, default=Plan.size_bytes)
    tx.add_argument("--capacity-packets", type=int, default=Plan.capacity_packets)
    tx.add_argument("--capacity-trains", type=int, default=Plan.capacity_trains)
    tx.add_argument("--trains", type=int, default=Plan.trains)
    tx.add_argument("--train-packets", type=int, default=Plan.train_packets)
    tx.add_argument("--spread-s", type=float, default=Plan.spread_s)
    tx.add_argument("--probes", type=int, default=Plan.probes)
    tx.add_argument("--probe-size-bytes", type=int, default=Plan.probe_size_bytes)
    tx.add_argument("--deadline-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    if args.command == "receive":
        duration_s, max_bytes = args.duration_s, args.max_bytes
        if args.grant:
            with open(args.grant) as fh:
                grant = json.load(fh)
            duration_s, max_bytes = float(grant["duration_s"]), int(grant["max_bytes"])
        return receive(args.port, args.bind, duration_s, max_bytes)
    plan = Plan(
        size_bytes=args.size_bytes,
        capacity_packets=args.capacity_packets,
        capacity_trains=args.capacity_trains,
        trains=args.trains,
        train_packets=args.train_packets,
        spread_s=args.spread_s,
        probes=args.probes,
        probe_size_bytes=args.probe_size_bytes,
    )
    doc = send(args.host, args.port, plan, args.deadline_s)
    print(json.dumps(doc, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
