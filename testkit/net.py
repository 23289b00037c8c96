"""Ports, waits and processes for tests and benchmarks: free loopback ports, waiting on a
condition (never a fixed sleep), loopback iperf3 servers and small namespaces, all cleaned up
by their own PID or name."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import psutil


def free_port(host: str = "127.0.0.1", *, udp: bool = False) -> int:
    """A port nobody listens on now (TCP, or UDP for collectors)."""
    kind = socket.SOCK_DGRAM if udp else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_listening(host: str, port: int, timeout_s: float = 5.0, netns: str | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if netns is None:
            with socket.socket() as sock:
                sock.settimeout(0.2)
                if sock.connect_ex((host, port)) == 0:
                    return
        else:
            out = subprocess.run(
                ["ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{port}"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            ).stdout
            if out.strip():
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s} s")


def wait_until(predicate: Callable[[], object], timeout_s: float, step_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process we started, and its group, by PID."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=3)


@contextlib.contextmanager
def iperf3_server(
    host: str = "127.0.0.1", port: int | None = None, netns: str | None = None
) -> Iterator[int]:
    port = port or free_port(host if netns is None else "127.0.0.1")
    argv = ["iperf3", "-s", "-B", host, "-p", str(port)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        wait_listening(host, port, netns=netns)
        yield port
    finally:
        stop(proc)


def descendants_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive


@contextlib.contextmanager
def blackhole_netns(prefix: str = "iepmt") -> Iterator[tuple[str, str]]:
    """A namespace whose only route leads to a dummy interface, which drops every packet.

    Yields (namespace, address that never answers). Both live in 198.18.0.0/15 and inside the
    namespace, so no packet leaves it.
    """
    name = f"{prefix}-bh-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=10)
    try:

        def ns(*args: str) -> None:
            subprocess.run(["ip", "-n", name, *args], check=True, timeout=10)

        ns("link", "set", "lo", "up")
        # A veth pair inside the namespace; a permanent neighbour entry sends the frames for
        # the dead address to a MAC that nobody has, so they vanish with no ICMP error.
        ns("link", "add", "bh0", "type", "veth", "peer", "name", "bh1")
        ns("addr", "add", "198.18.250.1/24", "dev", "bh0")
        ns("link", "set", "bh0", "up")
        ns("link", "set", "bh1", "up")
        ns(
            "neigh",
            "add",
            "198.18.250.2",
            "lladdr",
            "02:00:5e:00:00:02",
            "dev",
            "bh0",
            "nud",
            "permanent",
        )
        yield name, "198.18.250.2"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, timeout=10)


def is_root() -> bool:
    return os.geteuid() == 0
