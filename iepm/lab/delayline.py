"""User-space delay line: one process per emulated link.

The kernel here has no netem, so a link between nodes A and B is two TUN devices, one in each
node's namespace. The node's routes point at its TUN; this process reads every IP packet the kernel
sends into one TUN and writes it into the other after the link's delay, as if it had arrived there
from a wire. No kernel forwarding happens on the way, so only real routers decrement TTL and answer
traceroute with ICMP time-exceeded; the link is invisible at the IP layer.

Per direction the model is a drop-tail bottleneck queue followed by propagation delay:

    start   = max(now, link_free)            # wait behind packets still being serialised
    drop if start - now > queue_s            # tail drop: the queue is full
    link_free = start + size * 8 / rate      # serialisation at the bottleneck rate
    deliver = link_free + delay + N(0, jitter)

Delivery stays FIFO unless ``reorder`` is set (then jitter may reorder, like netem). Loss is drawn
per packet, Bernoulli or Gilbert-Elliott, from a seeded generator so runs are reproducible.
Parameters change at run time through a control socket (JSON lines), which is how events apply.

Run as ``python -m iepm.lab.delayline SPEC.json``; it is started and stopped by ``iepm.lab.lab``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
CLONE_NEWNET = 0x40000000
PR_SET_TIMERSLACK = 29
READ_BATCH = 64  # packets read per wake-up and fd: fewer select() calls under load
MAX_PACKET = 65535
CTRL_TIMEOUT_S = 0.2  # a stuck control client must not stall forwarding for long
# select() sleeping several ms here wakes ~120 us late (VM timer + idle exit); sleep until this
# much before the next delivery and poll the rest, so the configured delay is met to ~10 us.
SPIN_S = 0.0002


@dataclass
class Params:
    """One direction of a link. Units in names; ``rate_mbit=None`` means no bottleneck."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    rate_mbit: float | None = None
    queue_ms: float | None = None
    queue_bytes: int | None = None
    reorder: bool = False
    up: bool = True
    # Gilbert-Elliott: per-packet transition probabilities good->bad (p) and bad->good (r) and
    # the loss probability in each state; when set it replaces loss_percent.
    ge_p_percent: float | None = None
    ge_r_percent: float | None = None
    ge_loss_bad_percent: float = 100.0
    ge_loss_good_percent: float = 0.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Params:
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown link parameter(s): {', '.join(sorted(unknown))}")
        return cls(**raw)

    def updated(self, changes: dict[str, Any]) -> Params:
        merged = asdict(self)
        merged.update(changes)
        return Params.from_dict(merged)

    def queue_limit_s(self) -> float | None:
        """How long a packet may wait for the bottleneck before it is tail-dropped."""
        if self.rate_mbit is None:
            return None
        if self.queue_bytes is not None:
            return self.queue_bytes * 8 / (self.rate_mbit * 1e6)
        return (self.queue_ms if self.queue_ms is not None else 50.0) / 1000.0


@dataclass
class Stats:
    received: int = 0
    delivered: int = 0
    lost: int = 0  # random / Gilbert-Elliott loss
    queue_drops: int = 0  # bottleneck queue full
    down_drops: int = 0  # link administratively down
    write_errors: int = 0
    bytes_delivered: int = 0


@dataclass
class Direction:
    """Scheduling state of one direction; pure apart from its seeded random generator."""

    params: Params
    rng: random.Random
    stats: Stats = field(default_factory=Stats)
    link_free: float = 0.0
    last_deliver: float = 0.0
    ge_bad: bool = False
    fifo: deque[tuple[float, bytes]] = field(default_factory=deque)
    heap: list[tuple[float, int, bytes]] = field(default_factory=list)
    seq: int = 0
    # Our own fixed forwarding latency, taken off the configured delay (never below zero).
    compensation_s: float = 0.0
    # Ground truth for measurement tools: (arrival s, queue wait s, bytes queued for the link
    # before it) of the next ``trace_left`` packets of ``trace_size`` bytes (request ``trace``).
    trace_size: int = 0
    trace_left: int = 0
    trace: list[tuple[float, float, int]] = field(default_factory=list)
    arrived_bytes: int = 0

    def set_params(self, params: Params) -> None:
        self.params = params

    def _lost(self) -> bool:
        p = self.params
        if p.ge_p_percent is not None and p.ge_r_percent is not None:
            # Transition first, then draw loss in the new state.
            if self.ge_bad:
                if self.rng.random() * 100.0 < p.ge_r_percent:
                    self.ge_bad = False
            elif self.rng.random() * 100.0 < p.ge_p_percent:
                self.ge_bad = True
            rate = p.ge_loss_bad_percent if self.ge_bad else p.ge_loss_good_percent
            return rate > 0.0 and self.rng.random() * 100.0 < rate
        return p.loss_percent > 0.0 and self.rng.random() * 100.0 < p.loss_percent

    def admit(self, size: int, now: float) -> float | None:
        """Delivery time for a packet of ``size`` bytes arriving at ``now``, or None if dropped."""
        p = self.params
        self.stats.received += 1
        if not p.up:
            self.stats.down_drops += 1
            return None
        if p.rate_mbit is not None:
            start = self.link_free if self.link_free > now else now
            limit = p.queue_limit_s()
            if limit is not None and start - now > limit:
                self.stats.queue_drops += 1
                return None
            self.link_free = start + size * 8 / (p.rate_mbit * 1e6)
            sent = self.link_free
        else:
            start = sent = now
        if self.trace_left and size == self.trace_size:
            self.trace_left -= 1
            self.trace.append((now, start - now, self.arrived_bytes))
        self.arrived_bytes += size
        # Loss after the queue: a lost packet still used the bottleneck, as on a real lossy hop.
        if self._lost():
            self.stats.lost += 1
            return None
        delay = p.delay_ms / 1000.0 - self.compensation_s
        deliver = sent + delay if delay > 0.0 else sent
        if p.jitter_ms > 0.0:
            deliver += self.rng.gauss(0.0, p.jitter_ms / 1000.0)
            deliver = max(deliver, sent)
        if not p.reorder:
            deliver = max(deliver, self.last_deliver)
            self.last_deliver = deliver
        return deliver

    def push(self, deliver: float, packet: bytes) -> None:
        # Without reordering delivery times are monotonic, so a deque beats a heap.
        if self.params.reorder or self.heap:
            self.seq += 1
            heapq.heappush(self.heap, (deliver, self.seq, packet))
        else:
            self.fifo.append((deliver, packet))

    def next_due(self) -> float | None:
        due = [q[0][0] for q in (self.fifo, self.heap) if q]
        return min(due) if due else None

    def pop_due(self, now: float) -> list[bytes]:
        out: list[bytes] = []
        fifo, heap = self.fifo, self.heap
        while fifo and fifo[0][0] <= now:
            out.append(fifo.popleft()[1])
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        return out

    def queued(self) -> int:
        return len(self.fifo) + len(self.heap)


def steady_state_loss_percent(p: Params) -> float:
    """Long-run loss rate a direction's parameters produce (ground truth for tests)."""
    if not p.up:
        return 100.0
    if p.ge_p_percent is not None and p.ge_r_percent is not None:
        total = p.ge_p_percent + p.ge_r_percent
        if total == 0:
            return p.ge_loss_good_percent
        bad = p.ge_p_percent / total
        return bad * p.ge_loss_bad_percent + (1 - bad) * p.ge_loss_good_percent
    return p.loss_percent


# --- process side -------------------------------------------------------------------------------


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def enter_netns(name: str) -> None:
    """setns(2) into a named namespace (Python 3.11 has no os.setns)."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc().setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def open_tun(netns: str, device: str) -> int:
    """Attach to the persistent TUN ``device`` in ``netns``; the fd keeps working after we leave."""
    enter_netns(netns)  # /dev/net/tun binds to the caller's namespace at open()
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    ifr = struct.pack("16sH22x", device.encode(), IFF_TUN | IFF_NO_PI)
    fcntl.ioctl(fd, TUNSETIFF, ifr)
    os.set_blocking(fd, False)
    return fd


def set_priority(priority: str) -> None:
    """Keep delivery on time when other work competes for the CPUs.

    ``realtime``: SCHED_FIFO (preempts everything; the kernel's RT throttling still leaves 5%
    to others). ``high``: nice -20. ``normal``: unchanged.
    """
    with contextlib.suppress(OSError):
        if priority == "realtime":
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        elif priority == "high":
            os.setpriority(os.PRIO_PROCESS, 0, -20)


class DelayLine:
    """Shuttles packets between two TUN fds with per-direction ``Direction`` scheduling."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        seed = spec.get("seed", 0)
        comp = float(spec.get("compensation_us", 0.0)) / 1e6
        self.dirs = {
            d: Direction(
                Params.from_dict(spec[d]), random.Random(f"{seed}:{d}"), compensation_s=comp
            )
            for d in ("ab", "ba")
        }
        self.fd_a = -1
        self.fd_b = -1
        self.ctrl: socket.socket | None = None
        self.clock: Callable[[], float] = time.monotonic
        self.running = True

    def open(self) -> None:
        with contextlib.suppress(OSError):
            _libc().prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)  # wake on time, not 50 us late
        set_priority(self.spec.get("priority", "high"))
        self.fd_a = open_tun(self.spec["ns_a"], self.spec["dev_a"])
        self.fd_b = open_tun(self.spec["ns_b"], self.spec["dev_b"])
        path = self.spec["ctrl"]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        ctrl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ctrl.bind(path)
        ctrl.listen(8)
        ctrl.setblocking(False)
        self.ctrl = ctrl

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one control request: ``get`` or ``set`` (``dir``: ab, ba or both)."""
        cmd = request.get("cmd")
        if cmd == "set":
            targets = ["ab", "ba"] if request.get("dir", "both") == "both" else [request["dir"]]
            if any(t not in self.dirs for t in targets):
                return {"ok": False, "error": f"bad dir {request.get('dir')!r}"}
            try:
                new = {t: self.dirs[t].params.updated(request.get("params", {})) for t in targets}
            except (TypeError, ValueError) as exc:
                return {"ok": False, "error": str(exc)}
            for t, params in new.items():
                self.dirs[t].set_params(params)
        elif cmd == "trace":
            # Start (count > 0) or read and clear (count 0) a trace of one direction's packets
            # of one IP size: their arrival and queue wait, as this model scheduled them.
            direction = self.dirs.get(request.get("dir", "ab"))
            if direction is None:
                return {"ok": False, "error": f"bad dir {request.get('dir')!r}"}
            trace, direction.trace = direction.trace, []
            direction.trace_size = int(request.get("size", 0))
            direction.trace_left = min(int(request.get("count", 0)), 100_000)
            return {"ok": True, "trace": trace}
        elif cmd != "get":
            return {"ok": False, "error": f"unknown cmd {cmd!r}"}
        return {
            "ok": True,
            "pid": os.getpid(),
            "link": self.spec.get("link"),
            **{
                name: {
                    "params": asdict(d.params),
                    "stats": asdict(d.stats),
                    "queued": d.queued(),
                }
                for name, d in self.dirs.items()
            },
        }

    def _serve_ctrl(self) -> None:
        assert self.ctrl is not None
        try:
            conn, _ = self.ctrl.accept()
        except BlockingIOError:
            return
        with conn:
            conn.settimeout(CTRL_TIMEOUT_S)
            try:
                data = b""
                while not data.endswith(b"\n") and len(data) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                try:
                    reply = self.handle(json.loads(data))
                except (json.JSONDecodeError, KeyError, AttributeError) as exc:
                    reply = {"ok": False, "error": f"bad request: {exc}"}
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass

    def _read_batch(self, fd: int, direction: Direction, now: float) -> None:
        admit, push = direction.admit, direction.push
        for _ in range(READ_BATCH):
            try:
                packet = os.read(fd, MAX_PACKET)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EIO, errno.EBADFD):  # device down: nothing to read
                    return
                raise
            deliver = admit(len(packet), now)
            if deliver is not None:
                push(deliver, packet)

    def _release(self, direction: Direction, fd: int, now: float) -> None:
        stats = direction.stats
        for packet in direction.pop_due(now):
            try:
                os.write(fd, packet)
            except OSError:
                stats.write_errors += 1
                continue
            stats.delivered += 1
            stats.bytes_delivered += len(packet)

    def run(self) -> None:
        assert self.ctrl is not None
        ab, ba = self.dirs["ab"], self.dirs["ba"]
        fd_a, fd_b, ctrl_fd = self.fd_a, self.fd_b, self.ctrl.fileno()
        rlist = [fd_a, fd_b, ctrl_fd]
        clock = self.clock
        while self.running:
            now = clock()
            due = [d for d in (ab.next_due(), ba.next_due()) if d is not None]
            if due:
                wait = min(due) - now
                timeout = wait - SPIN_S if wait > SPIN_S else 0.0
            else:
                timeout = 1.0
            try:
                ready, _, _ = select.select(rlist, [], [], timeout)
            except InterruptedError:
                continue
            now = clock()
            for fd in ready:
                if fd == fd_a:
                    self._read_batch(fd_a, ab, now)  # the kernel of A sent it: A -> B
                elif fd == fd_b:
                    self._read_batch(fd_b, ba, now)
                else:
                    self._serve_ctrl()
            now = clock()
            self._release(ab, fd_b, now)
            self._release(ba, fd_a, now)

    def close(self) -> None:
        for fd in (self.fd_a, self.fd_b):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self.ctrl is not None:
            self.ctrl.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spec["ctrl"])


def control(path: str | Path, request: dict[str, Any], timeout_s: float = 2.0) -> dict[str, Any]:
    """Send one request to a delay line's control socket and return its reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    reply: dict[str, Any] = json.loads(data)
    return reply


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m iepm.lab.delayline SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    line = DelayLine(spec)

    def stop(signum: int, frame: object) -> None:
        # Raising (not setting a flag) interrupts select() at once; PEP 475 would retry it.
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        line.open()
        print(f"ready pid={os.getpid()} link={spec.get('link')}", flush=True)
        line.run()
    finally:
        line.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
