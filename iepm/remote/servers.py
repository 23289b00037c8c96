"""The server kinds an agent can start for a slot, and how it holds each to what it granted.

A kind says how to start its one-shot server (argv from the granted request, never from free
text), how it says it is listening, and how to read its output while a test runs: a ``Guard``
that names a reason to cut the test when what connects exceeds the grant. A kind whose server
needs files (xrootd's configuration) writes them into the slot's work directory in ``setup``.
The next kinds (a packet-pair receiver) are added to ``KINDS`` and nothing else.

This module is the agent's and must not import the monitor's probes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

# How long an agent waits by default for a new server to listen (agent.toml's
# server_start_timeout_s). Generous: a busy host (load 15 on 2 cores) was seen to miss 5 s, and a
# server that cannot start exits at once, so only one that hangs before listening costs this.
# A monitor's slot request waits this much longer than its other requests.
SERVER_START_TIMEOUT_S = 30.0

# Where a slot's files live: "memory" on a memory file system (a copy's sink that never touches
# a disk), "disk" under the agent's state directory.
Storage = Literal["memory", "disk"]


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
    # Largest file a copy may write (a transfer server's kinds), bytes; None: no limit.
    size_bytes: int | None = None


class Guard(Protocol):
    """Reads a running server's output, line by line."""

    def line(self, line: bytes) -> str | None:
        """A reason to cut the test now, or None."""
        ...

    def inspect_sockets(self, line: bytes) -> bool:
        """Whether this line is a moment to compare the server's socket buffers with the grant
        (a stream just connected, the test starts)."""
        ...

    def carries_data(self, peer_port: int) -> bool:
        """Whether the connection from this client port is a test stream (a control
        connection's buffers autotune freely and are not the test's window)."""
        ...


@dataclass(frozen=True)
class ServerKind:
    name: str
    # Program run when agent.toml names no other (``[agent] programs``).
    program: str
    version_argv: tuple[str, ...]
    # A line of the server's output that says it accepts connections.
    ready: bytes
    # (program, port, bind address, total rate limit in bit/s) → the one-shot server's argv.
    argv: Callable[[str, int, str | None, int | None], list[str]]
    guard: Callable[[Grant], Guard]
    # Writes what the server reads into the slot's (empty) work directory before it starts.
    setup: Callable[[Path, Grant], None] | None = None
    # When ``ready`` alone cannot tell (it also starts a line that says the start failed).
    ready_pattern: re.Pattern[bytes] | None = None
    # The Debian package that installs ``program``: what a target lacking it is told to install.
    package: str = ""

    def is_ready(self, line: bytes) -> bool:
        if self.ready_pattern is not None:
            return self.ready_pattern.search(line) is not None
        return self.ready in line


# --- iperf3 ------------------------------------------------------------------------------------

IPERF3_STREAM = re.compile(rb"^\[\s*\d+\] local \S+ port \d+ connected to \S+ port (\d+)")
# -V prints it once every stream is connected, just before the data flows.
IPERF3_START = re.compile(
    rb"^Starting Test: protocol: (?P<proto>\w+), (?P<streams>\d+) streams, .*?"
    rb"omitting (?P<omit>\d+) seconds?, (?P<time>\d+) seconds? test"
)


def _iperf3_argv(program: str, port: int, bind: str | None, rate_bps: int | None) -> list[str]:
    # -V: the server names each stream as it connects and the test's parameters as it starts.
    argv = [program, "-s", "-1", "-V", "-p", str(port), "--forceflush"]
    if bind is not None:
        argv += ["-B", bind]
    if rate_bps is not None:
        # iperf3 ends a test whose average total rate exceeds this.
        argv += ["--server-bitrate-limit", str(rate_bps)]
    return argv


class Iperf3Guard:
    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.peers: set[int] = set()

    def line(self, line: bytes) -> str | None:
        grant = self.grant
        stream = IPERF3_STREAM.match(line)
        if stream is not None:
            self.peers.add(int(stream[1]))
            if len(self.peers) > grant.streams:
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
            ran, granted = ("UDP", "TCP") if udp else ("TCP", "UDP")
            return f"the client runs {ran}, the slot granted {granted}"
        test_s = int(start["time"]) + int(start["omit"])
        if test_s > grant.test_s:
            return f"the client runs a {test_s} s test, the slot granted {grant.test_s} s"
        return None

    def inspect_sockets(self, line: bytes) -> bool:
        return bool(IPERF3_STREAM.match(line) or IPERF3_START.match(line))

    def carries_data(self, peer_port: int) -> bool:
        return peer_port in self.peers


IPERF3 = ServerKind(
    name="iperf3",
    program="iperf3",
    version_argv=("--version",),
    ready=b"Server listening on",
    argv=_iperf3_argv,
    guard=Iperf3Guard,
    package="iperf3",
)

# --- xrootd ------------------------------------------------------------------------------------

# The slot's work directory holds the configuration, xrootd's admin files and ``data/``, the
# only directory it exports (as "/", through oss.localroot): a client writes
# root://host:port//NAME and the file lands in <work>/data/NAME, removed with the slot.
XROOTD_CONFIG = "xrootd.cf"
XROOTD_DATA = "data"
# One xrdcp logs in once, whatever its --streams (the extra streams bind to that session); a
# disk copy's commit step logs in once more.
XROOTD_LOGIN = re.compile(rb"XrootdXeq: \S+ \S+ \S+ login")
# xrootd refuses to run as root; an agent started as root runs it as this user.
XROOTD_USER = "nobody"


def _xrootd_argv(program: str, port: int, bind: str | None, rate_bps: int | None) -> list[str]:
    # The configuration sits in the server's working directory (the slot's); -l -: log lines on
    # the agent's pipe, where the guard reads them.
    # Short instance name: it is part of the admin socket's path (108 bytes at most).
    argv = [program, "-c", XROOTD_CONFIG, "-n", "x", "-p", str(port), "-l", "-"]
    # bind is not used: xrootd 5.5 listens on all addresses and has no option for one.
    if os.geteuid() == 0:
        argv += ["-R", XROOTD_USER]
    return argv


def _xrootd_setup(workdir: Path, grant: Grant) -> None:
    data = workdir / XROOTD_DATA
    admin = workdir / "a"
    data.mkdir()
    admin.mkdir()
    lines = [
        f"oss.localroot {data}",
        "all.export /",
        f"all.adminpath {admin}",
        f"all.pidpath {admin}",
        # No third-party copies, no stage-in: one client writing one file.
        "xrootd.async off",
    ]
    if grant.size_bytes is not None:
        # The server refuses an open whose announced size (xrdcp's oss.asize) exceeds it.
        lines.append(f"oss.maxsize {grant.size_bytes}")
    (workdir / XROOTD_CONFIG).write_text("\n".join(lines) + "\n")
    if os.geteuid() == 0:
        for path in (workdir, data, admin):
            shutil.chown(path, XROOTD_USER)


XROOTD_LOGINS = 2


class XrootdGuard:
    """One copy per slot: a login beyond the copy's and its commit's is another client's."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.logins = 0

    def line(self, line: bytes) -> str | None:
        if XROOTD_LOGIN.search(line):
            self.logins += 1
            if self.logins > XROOTD_LOGINS:
                return f"login {self.logins} to a slot granted one copy (and its commit)"
        return None

    def inspect_sockets(self, line: bytes) -> bool:
        return False

    def carries_data(self, peer_port: int) -> bool:
        return True


XROOTD = ServerKind(
    name="xrootd",
    program="xrootd",
    version_argv=("-v",),
    ready=b"------ xrootd ",
    # "------ xrootd NAME@HOST:PORT initialization completed." — or "... failed."
    ready_pattern=re.compile(rb"^------ xrootd \S+ initialization completed\."),
    argv=_xrootd_argv,
    guard=XrootdGuard,
    setup=_xrootd_setup,
    package="xrootd-server",
)

# --- gridftp -----------------------------------------------------------------------------------

# globus-gridftp-server in anonymous mode (no certificates: control and data in clear), for one
# connection (-single: it exits when the copy's session ends). The slot's work directory holds
# its configuration and ``data/``, the anonymous user's home and the only path it may touch: a
# client writes ftp://host:port/NAME with globus-url-copy -rp (paths relative to the home) and
# the file lands in <work>/data/NAME, removed with the slot.
GRIDFTP_CONFIG = "gridftp.conf"
GRIDFTP_DATA = "data"
# An agent started as root maps the anonymous login to this user (never root).
GRIDFTP_USER = "nobody"
# What the server logs of the client (log_level ALL): "... [CLIENT]: ALLO 1048576".
GRIDFTP_CLIENT = re.compile(rb"\[CLIENT\]: (?P<command>[A-Z]+)(?: (?P<arg>.*?))?\s*$")
GRIDFTP_CONNECTION = re.compile(rb":: New connection from: ")


def _gridftp_argv(program: str, port: int, bind: str | None, rate_bps: int | None) -> list[str]:
    # The configuration sits in the server's working directory (the slot's): it is read before
    # the server changes to "/". -single: one session, then exit.
    argv = [program, "-c", GRIDFTP_CONFIG, "-p", str(port), "-single"]
    # The control socket listens on all addresses: with -control-interface the 13.24 server
    # must name the address (getnameinfo) and will not start when it has no name (a lab's
    # 198.18.x.y). The data address matters more: PASV answers with -data-interface, else with
    # what the host's name resolves to (127.0.1.1 on a stock Debian), which a monitor cannot
    # reach — an agent serving gridftp sets server_bind.
    if bind is not None:
        argv += ["-data-interface", bind]
    return argv


def _gridftp_setup(workdir: Path, grant: Grant) -> None:
    data = workdir / GRIDFTP_DATA
    data.mkdir()
    user = GRIDFTP_USER if os.geteuid() == 0 else _current_user()
    lines = [
        "allow_anonymous 1",
        f"anonymous_user {user}",
        f"home_dir {data}",
        # Nothing outside the slot's data directory, whatever path the client names.
        f"restrict_paths {data}",
        # The guard reads the client's commands on the agent's pipe, unbuffered.
        "log_level ALL",
        "log_single /dev/stdout",
        "log_module stdio:buffer=0",
        "disable_usage_stats 1",
    ]
    (workdir / GRIDFTP_CONFIG).write_text("\n".join(lines) + "\n")
    if os.geteuid() == 0:
        shutil.chown(data, GRIDFTP_USER)


def _current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


class GridftpGuard:
    """One session per slot (the server runs -single; a second connection is another client's),
    a file no larger than granted (the client announces it: ALLO), a receive buffer no larger
    than the granted window (globus-url-copy -tcp-bs sends SITE STORBUFSIZE)."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.connections = 0

    def line(self, line: bytes) -> str | None:
        if GRIDFTP_CONNECTION.search(line):
            self.connections += 1
            if self.connections > 1:
                return f"connection {self.connections} to a slot granted one copy"
            return None
        found = GRIDFTP_CLIENT.search(line)
        if found is None:
            return None
        command, arg = found["command"], (found["arg"] or b"").split()
        size = self.grant.size_bytes
        announced = int(arg[0]) if command == b"ALLO" and arg and arg[0].isdigit() else None
        if announced is not None and size is not None and announced > size:
            return f"the client announced a {announced}-byte file, the slot granted {size}"
        if command == b"SITE" and len(arg) > 1 and arg[0].upper() == b"STORBUFSIZE":
            window = int(arg[1]) if arg[1].isdigit() else 0
            if self.grant.window_granted and window > self.grant.window_bytes:
                return (
                    f"the client asked for a {window}-byte window, the slot granted "
                    f"{self.grant.window_bytes}"
                )
        return None

    def inspect_sockets(self, line: bytes) -> bool:
        return False

    def carries_data(self, peer_port: int) -> bool:
        return True


GRIDFTP = ServerKind(
    name="gridftp",
    program="globus-gridftp-server",
    version_argv=("-version",),
    ready=b"Server started in",
    # "[PID] DATE :: Server started in daemon mode." — after it listens.
    ready_pattern=re.compile(rb":: Server started in \w+ mode\."),
    argv=_gridftp_argv,
    guard=GridftpGuard,
    setup=_gridftp_setup,
    package="globus-gridftp-server-progs",
)

# --- abw: the packet-train receiver ------------------------------------------------------------

# The tool is one stdlib-only file shared with the monitor (iepm/abwtool.py: probes may not
# import remote/), run by path: the receiver needs no iepm on the server's path.
ABW_TOOL = str(Path(__file__).parent.parent / "abwtool.py")
ABW_GRANT = "abw.json"
ABW_CUT = re.compile(rb"^cut: (.*)")


def _abw_argv(program: str, port: int, bind: str | None, rate_bps: int | None) -> list[str]:
    # Its limits come from the grant, through the file _abw_setup writes in its directory.
    argv = [program, ABW_TOOL, "receive", "--port", str(port), "--grant", ABW_GRANT]
    return argv + (["--bind", bind] if bind is not None else [])


def _abw_setup(workdir: Path, grant: Grant) -> None:
    # The receiver stops itself (exit 3, "cut: …") past the byte budget the request named.
    limits = {"duration_s": grant.test_s, "max_bytes": grant.size_bytes or ABW_DEFAULT_BYTES}
    (workdir / ABW_GRANT).write_text(json.dumps(limits))


ABW_DEFAULT_BYTES = 100_000


class AbwGuard:
    """The receiver counts the probe bytes itself and says when they exceed the grant."""

    def __init__(self, grant: Grant) -> None:
        self.grant = grant

    def line(self, line: bytes) -> str | None:
        cut = ABW_CUT.match(line)
        return None if cut is None else cut[1].decode(errors="replace").strip()

    def inspect_sockets(self, line: bytes) -> bool:
        return False

    def carries_data(self, peer_port: int) -> bool:
        return True


ABW = ServerKind(
    name="abw",
    program=sys.executable,
    version_argv=(ABW_TOOL, "--version"),
    ready=b"iepm abw receiver listening on",
    argv=_abw_argv,
    guard=AbwGuard,
    setup=_abw_setup,
)

KINDS: dict[str, ServerKind] = {kind.name: kind for kind in (IPERF3, XROOTD, GRIDFTP, ABW)}
DEFAULT_KIND = IPERF3.name


def kind_of(name: str) -> ServerKind | None:
    return KINDS.get(name)


# --- socket buffers ----------------------------------------------------------------------------

SKMEM = re.compile(r"skmem:\(([^)]*)\)")
PEER_PORT = re.compile(r":(\d+)$")


def buffer_sizes(ss_output: str) -> list[tuple[int, int, int]]:
    """(peer port, receive buffer, send buffer) of each socket in ``ss -tumnH state
    established`` output: a line ``tcp 0 0 LOCAL PEER`` then its ``skmem:(…rbN,…tbN…)``."""
    sizes = []
    peer = None
    for line in ss_output.splitlines():
        if line and not line[0].isspace():
            fields = line.split()
            found = PEER_PORT.search(fields[-1]) if fields else None
            peer = int(found[1]) if found else None
        skmem = SKMEM.search(line)
        if skmem and peer is not None:
            values = dict(re.findall(r"([a-z]+)(\d+)", skmem[1]))
            if "rb" in values and "tb" in values:
                sizes.append((peer, int(values["rb"]), int(values["tb"])))
    return sizes


def buffer_excess(
    sizes: list[tuple[int, int, int]], guard: Guard, grant: Grant, defaults: tuple[int, int]
) -> str | None:
    """Why a test stream's buffers exceed the grant, or None. Linux doubles SO_RCVBUF and
    SO_SNDBUF (a window W shows as 2W); an untouched socket starts at tcp_rmem/tcp_wmem's
    default and, when the request named no window, may autotune up to their maximum
    (``defaults``)."""
    allowed = max(2 * grant.window_bytes, *defaults)
    for peer, rb, tb in sizes:
        if guard.carries_data(peer) and max(rb, tb) > allowed:
            return (
                f"a test stream uses a window of {max(rb, tb) // 2} bytes, the slot granted "
                f"{grant.window_bytes}"
            )
    return None
