"""The agent's server kinds: every probe's server is one the agent can start; the iperf3 guard
and the socket-buffer reading on real outputs (iperf3 3.12 -V, iproute2 ss -m)."""

from __future__ import annotations

from pathlib import Path

from iepm.probes import PROBES
from iepm.probes.base import SSH_LOGIN
from iepm.remote.servers import (
    IPERF3,
    KINDS,
    XROOTD,
    Grant,
    Iperf3Guard,
    XrootdGuard,
    buffer_excess,
    buffer_sizes,
)

# iperf3 3.12 -s -V, a client with -P 2 -w 64K (recorded on loopback).
SERVER_OUTPUT = b"""\
Server listening on 25998 (test #1)
Accepted connection from 127.0.0.1, port 37788
      TCP MSS: 0 (default)
[  5] local 127.0.0.1 port 25998 connected to 127.0.0.1 port 37796
[  8] local 127.0.0.1 port 25998 connected to 127.0.0.1 port 37804
Starting Test: protocol: TCP, 2 streams, 131072 byte blocks, omitting 0 seconds, \
2 second test, tos 0
"""
# ss -tumnH state established '( sport = :25998 )' at that moment: the control connection
# (peer 37788) has autotuned its send buffer; the streams hold their 64K window (2 × 64K).
SS_OUTPUT = """\
tcp 49279  0      127.0.0.1:25998 127.0.0.1:37804
\t skmem:(r121066,rb131072,t0,tb131072,f1814,w0,o0,bl0,d2)
tcp 0      0      127.0.0.1:25998 127.0.0.1:37788
\t skmem:(r0,rb131072,t0,tb3939840,f0,w0,o0,bl0,d0)
tcp 49279  0      [::ffff:127.0.0.1]:25998 [::ffff:127.0.0.1]:37796
\t skmem:(r121066,rb131072,t0,tb131072,f1814,w0,o0,bl0,d2)
"""
DEFAULTS = (131072, 16384)


def grant(**changes: object) -> Grant:
    fields: dict[str, object] = dict(
        streams=2, test_s=2, udp=False, window_bytes=65536, window_granted=True, rate_bps=None
    )
    return Grant(**{**fields, **changes})  # type: ignore[arg-type]


def feed(guard: Iperf3Guard | XrootdGuard, output: bytes) -> list[str]:
    return [r for line in output.splitlines(keepends=True) if (r := guard.line(line))]


def test_every_probe_server_is_a_kind_the_agent_declares() -> None:
    # SSH_LOGIN is not a server the agent starts: copies over SSH (rsync_*) log in through
    # the target's [targets.ssh] access itself (iepm/remote/lease.py).
    needed = {m.META.server for m in PROBES.values() if m.META.server is not None}
    assert SSH_LOGIN in needed
    assert needed - {SSH_LOGIN} and needed - {SSH_LOGIN} <= set(KINDS)


def test_a_test_within_its_grant_passes_the_guard() -> None:
    guard = Iperf3Guard(grant())
    assert feed(guard, SERVER_OUTPUT) == []
    assert guard.peers == {37796, 37804}
    assert buffer_excess(buffer_sizes(SS_OUTPUT), guard, guard.grant, DEFAULTS) is None


def test_the_guard_names_what_exceeds_the_grant() -> None:
    assert feed(Iperf3Guard(grant(streams=1)), SERVER_OUTPUT)[0] == (
        "a stream beyond the 1 granted connected"
    )
    assert feed(Iperf3Guard(grant(udp=True)), SERVER_OUTPUT)[0] == (
        "the client runs TCP, the slot granted UDP"
    )
    assert "2 s test, the slot granted 1 s" in feed(Iperf3Guard(grant(test_s=1)), SERVER_OUTPUT)[0]
    guard = Iperf3Guard(grant(window_bytes=16384))
    feed(guard, SERVER_OUTPUT)
    # A 64K window is tcp_rmem's untouched default here, so against a 16K grant it passes (it
    # cannot be told from a socket nobody set); a 1M window cannot pass.
    assert buffer_excess(buffer_sizes(SS_OUTPUT), guard, guard.grant, DEFAULTS) is None
    big = SS_OUTPUT.replace("rb131072,t0,tb131072", "rb2097152,t0,tb2097152")
    assert buffer_excess(buffer_sizes(big), guard, guard.grant, DEFAULTS) == (
        "a test stream uses a window of 1048576 bytes, the slot granted 16384"
    )


def test_ss_output_is_read_per_socket_with_its_peer_port() -> None:
    assert buffer_sizes(SS_OUTPUT) == [
        (37804, 131072, 131072),
        (37788, 131072, 3939840),
        (37796, 131072, 131072),
    ]
    assert buffer_sizes("") == []


def test_the_iperf3_server_argv_has_no_request_text() -> None:
    argv = IPERF3.argv("iperf3", 5301, "198.18.0.10", 20_000_000)
    assert argv == [
        "iperf3", "-s", "-1", "-V", "-p", "5301", "--forceflush",
        "-B", "198.18.0.10", "--server-bitrate-limit", "20000000",
    ]  # fmt: skip


# xrootd 5.5.3 -l - as a copy and its commit log in (recorded on loopback).
XROOTD_LOGINS = b"""\
261124 23:15:11 3434 XrootdXeq: root.3571:27@[::ffff:127.0.0.1] pvt IP46 login
261124 23:15:12 3433 XrootdXeq: root.3571:27@[::ffff:127.0.0.1] disc 0:00:01
261124 23:15:21 3413 XrootdXeq: root.3880:23@[::ffff:127.0.0.1] pvt IP46 login
"""


def test_the_xrootd_guard_allows_a_copy_and_its_commit_and_cuts_a_third_login() -> None:
    guard = XrootdGuard(grant())
    assert feed(guard, XROOTD_LOGINS) == []
    third = b"261124 23:15:30 3413 XrootdXeq: root.4000:25@[::ffff:198.18.0.9] pvt IP46 login\n"
    assert guard.line(third) == "login 3 to a slot granted one copy (and its commit)"


def test_xrootd_is_ready_only_when_it_says_it_completed() -> None:
    assert XROOTD.is_ready(b"------ xrootd x@vm:31555 initialization completed.\n")
    assert not XROOTD.is_ready(b"------ xrootd x@vm:31555 initialization failed.\n")
    assert not XROOTD.is_ready(b"------ xroot protocol initialization completed.\n")


def test_the_xrootd_slot_exports_only_its_data_directory_within_the_size_grant(
    tmp_path: Path,
) -> None:
    XROOTD.setup(tmp_path, grant(size_bytes=1 << 30))
    config = (tmp_path / "xrootd.cf").read_text().splitlines()
    assert f"oss.localroot {tmp_path / 'data'}" in config and "all.export /" in config
    assert "oss.maxsize 1073741824" in config
    assert XROOTD.argv("xrootd", 5301, None, None)[:8] == [
        "xrootd", "-c", "xrootd.cf", "-n", "x", "-p", "5301", "-l",
    ]  # fmt: skip
