"""The server kinds an agent can start for a slot, and how it holds each to what it granted.

A kind says how to start its one-shot server (argv from the granted request, never from free
text), how it says it is listening, and how to read its output while a test runs: a ``Guard``
that names a reason to cut the test when what connects exceeds the grant. The next kinds
(an xrootd server, a packet-pair receiver) are added to ``KINDS`` and nothing else.

This module is the agent's and must not import the monitor's probes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Grant:
    """What one slot allows, in the units the guards compare: bytes, bit/s, seconds."""

    streams: int
    test_s: int
    udp: bool
    # Largest socket buffer a stream may use (granted window, else the monitor's max_window).
    window_bytes: int
    # The request named a window: buffers must stay at it (autotuning past it is a bigger window).
    window_granted: bool
    rate_bps: int | None


class Guard(Protocol):
    """Reads a running server's output, line by line."""

    def line(self, line: bytes) -> str | None:
        """A reason to cut the test now, or None."""
        ...

    def inspect_sockets(self, line: bytes) -> bool:
        """Whether this line is a moment to compare the server's socket buffers with the grant
        (a stream just connected, the test starts)."""
        ...


@dataclass(frozen=True)
class ServerKind:
    name: str
    # Program run when agent.toml names no other (``[agent] programs``).
    program: str
    version_argv: tuple[str, ...]
    # A line of the server's output that says it accepts connections.
    ready: bytes
    argv: Callable[[str, int, str | None, Grant], list[str]]
    guard: Callable[[Grant], Guard]


# --- iperf3 ------------------------------------------------------------------------------------

IPERF3_STREAM = re.compile(rb"^\[\s*\d+\] local \S+ port \d+ connected to ")
# -V prints it once every stream is connected, just before the data flows.
IPERF3_START = re.compile(
    rb"^Starting Test: protocol: (?P<proto>\w+), (?P<streams>\d+) streams, .*?"
    rb"omitting (?P<omit>\d+) seconds?, (?P<time>\d+) seconds? test"
)


def _iperf3_argv(program: str, port: int, bind: str | None, grant: Grant) -> list[str]:
    # -V: the server names each stream as it connects and the test's parameters as it starts.
    argv = [program, "-s", "-1", "-V", "-p", str(port), "--forceflush"]
    if bind is not None:
        argv += ["-B", bind]
    if grant.rate_bps is not None:
        # iperf3 ends a test whose average total rate exceeds this.
        argv += ["--server-bitrate-limit", str(grant.rate_bps)]
    return argv


class Iperf3Guard:
    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.streams = 0

    def line(self, line: bytes) -> str | None:
        grant = self.grant
        if IPERF3_STREAM.match(line):
            self.streams += 1
            if self.streams > grant.streams:
                return f"a stream beyond the {grant.streams} granted connected"
            return None
        start = IPERF3_START.match(line)
        if start is None:
            return None
        streams = int(start["streams"])
        if streams > grant.streams:
            return f"the client runs {streams} streams, the slot granted {grant.streams}"
        udp = start["proto"].upper() == b"UDP"
        if udp != grant.udp:
            return f"the client runs {'UDP' if udp else 'TCP'}, the slot granted the other"
        test_s = int(start["time"]) + int(start["omit"])
        if test_s > grant.test_s:
            return f"the client runs a {test_s} s test, the slot granted {grant.test_s} s"
        return None

    def inspect_sockets(self, line: bytes) -> bool:
        return bool(IPERF3_STREAM.match(line) or IPERF3_START.match(line))


IPERF3 = ServerKind(
    name="iperf3",
    program="iperf3",
    version_argv=("--version",),
    ready=b"Server listening on",
    argv=_iperf3_argv,
    guard=Iperf3Guard,
)

KINDS: dict[str, ServerKind] = {kind.name: kind for kind in (IPERF3,)}
DEFAULT_KIND = IPERF3.name


def kind_of(name: str) -> ServerKind | None:
    return KINDS.get(name)


# --- socket buffers ----------------------------------------------------------------------------

SKMEM = re.compile(r"skmem:\(([^)]*)\)")


def buffer_sizes(ss_output: str) -> list[tuple[int, int]]:
    """(receive, send) buffer bytes of each socket in ``ss -tumnH`` output (``skmem`` rb/tb)."""
    sizes = []
    for match in SKMEM.finditer(ss_output):
        fields = dict(re.findall(r"([a-z]+)(\d+)", match.group(1)))
        if "rb" in fields and "tb" in fields:
            sizes.append((int(fields["rb"]), int(fields["tb"])))
    return sizes


def buffer_excess(
    sizes: list[tuple[int, int]], grant: Grant, defaults: tuple[int, int]
) -> str | None:
    """Why a socket's buffers exceed the grant, or None. Linux doubles SO_RCVBUF/SO_SNDBUF (a
    window W shows as 2W); an untouched socket starts at tcp_rmem/tcp_wmem's default and, when
    the request named no window, may autotune up to their maximum (``defaults``)."""
    allowed = 2 * grant.window_bytes
    for rb, tb in sizes:
        biggest = max(rb, tb)
        if biggest > max(allowed, *defaults):
            return (
                f"a socket uses a {biggest // 2} byte window, the slot granted "
                f"{grant.window_bytes} bytes"
            )
    return None
