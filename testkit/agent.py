"""Real agents for the tests: ``iepm agent`` processes on loopback or inside a lab namespace,
each with its own agent.toml, state directory and per-monitor tokens; stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from iepm.remote.client import AgentClient
from iepm.remote.trust import new_token, token_digest
from testkit.net import free_port, wait_listening

# A server under test may take this long to listen on a loaded host (Python's start-up alone was
# seen past 10 s at load 20 on 2 cores); one that fails exits, and is reported at once.
START_BOUND_S = 120.0


def await_listening(
    proc: subprocess.Popen[bytes],
    address: str,
    port: int,
    netns: str | None,
    bound_s: float = START_BOUND_S,
) -> float:
    """Wait until ``proc`` listens on ``address:port``; AssertionError at once if it exits, or
    after ``bound_s``, with the figures. Returns the seconds it took."""
    t0 = time.monotonic()
    while True:
        try:
            wait_listening(address, port, timeout_s=0.5, netns=netns)
            return time.monotonic() - t0
        except TimeoutError:
            pass
        waited_s = time.monotonic() - t0
        code = proc.poll()
        if code is not None:
            raise AssertionError(
                f"it exited with code {code} after {waited_s:.1f} s, before listening on "
                f"{address}:{port}"
            )
        if waited_s > bound_s:
            load = " ".join(f"{x:.1f}" for x in os.getloadavg())
            raise AssertionError(
                f"not listening on {address}:{port} after {waited_s:.0f} s (load {load})"
            )


# Monitors every test agent knows, with their limits. "strict" has tight limits to trip;
# "nobody" may run nothing; "hourly" may run one test per hour.
MONITORS: dict[str, dict[str, Any]] = {
    "mon1": {"max_duration_s": 30, "max_streams": 8, "max_window": "4M", "tests_per_hour": 100},
    "mon2": {"max_duration_s": 30, "max_streams": 8, "max_window": "4M", "tests_per_hour": 100},
    "strict": {
        "max_duration_s": 5,
        "max_streams": 2,
        "max_window": "1M",
        "max_rate": "20M",
        "tests_per_hour": 100,
    },
    "hourly": {"max_duration_s": 5, "tests_per_hour": 1},
    # Long, large copies (benchmarks/commit_at_end.py's 1 GB onto a slow disk).
    "bulk": {"max_duration_s": 900, "max_size": "2G", "tests_per_hour": 100},
    "nobody": {},
}


@dataclass
class RunningAgent:
    url: str
    address: str
    port: int
    dir: Path
    config_path: Path
    log_path: Path
    tokens: dict[str, str]
    netns: str | None
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Any] = field(default_factory=list)

    def client(self, monitor: str, *, netns: str | None = None) -> AgentClient:
        return AgentClient(self.url, self.tokens[monitor], timeout_s=10.0, netns=netns)

    def token_file(self, monitor: str) -> Path:
        path = self.dir / f"{monitor}.token"
        if not path.exists():
            path.write_text(self.tokens[monitor] + "\n")
            path.chmod(0o600)
        return path

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.logs.append(log)
        self.proc = subprocess.Popen(
            self.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
        try:
            await_listening(self.proc, self.address, self.port, self.netns)
        except AssertionError as exc:
            self.stop()
            raise AssertionError(f"agent did not start: {exc}\n{self.log_text()}") from None

    def kill9(self) -> None:
        """The agent dies without cleaning up (its servers die with it: PDEATHSIG)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.proc = None
        for log in self.logs:
            log.close()
        self.logs.clear()

    def servers(self) -> list[psutil.Process]:
        """iperf3 processes the agent started that are still alive."""
        if self.proc is None:
            return []
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        alive = []
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.name() == "iperf3" and child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(child)
        return alive

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.dir / "state" / "state.json").read_text())
        return data

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _toml(value: Any) -> str:
    """A TOML value: JSON's scalars and arrays are TOML; a table is written inline."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def agent_toml(
    state_dir: Path,
    tokens: dict[str, str],
    *,
    bind: str | None,
    grace_s: float,
    ports: str,
    tls: dict[str, str] | None = None,
    settings: dict[str, Any] | None = None,
    kinds: list[str] | None = None,
) -> str:
    lines = [
        "[agent]",
        'name = "test-agent"',
        f'state_dir = "{state_dir}"',
        f"server_ports = {ports}",
        f"slot_grace_s = {grace_s}",
    ]
    lines += [f'{key} = "{value}"' for key, value in (tls or {}).items()]
    lines += [f"{key} = {_toml(value)}" for key, value in (settings or {}).items()]
    if bind:
        lines.append(f'server_bind = "{bind}"')
    for name, limits in MONITORS.items():
        lines += [
            "",
            "[[monitors]]",
            f'name = "{name}"',
            f'token_sha256 = "{token_digest(tokens[name])}"',
        ]
        allowed = [] if name == "nobody" else kinds or ["iperf3"]
        lines.append(f"probes = {json.dumps(allowed)}")
        if limits:
            lines.append("[monitors.limits]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in limits.items()]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running_agent(
    tmp: Path,
    *,
    address: str = "127.0.0.1",
    port: int | None = None,
    netns: str | None = None,
    grace_s: float = 3.0,
    tls: dict[str, str] | None = None,
    settings: dict[str, Any] | None = None,
    nofile: int | None = None,
    kinds: tuple[str, ...] = ("iperf3",),
) -> Iterator[RunningAgent]:
    """``tls``: agent.toml's tls_cert, tls_key and (mutual TLS) tls_client_ca; ``settings``:
    more of its [agent] table; ``nofile``: the agent's file-descriptor limit; ``kinds``: the server
    kinds its monitors may ask for."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    tokens = {name: new_token() for name in MONITORS}
    low = 20000 + (os.getpid() * 7 + port) % 20000
    config = tmp / "agent.toml"
    config.write_text(
        agent_toml(
            tmp / "state",
            tokens,
            bind=address,
            grace_s=grace_s,
            ports=f"[{low}, {low + 50}]",
            tls=tls,
            settings=settings,
            kinds=list(kinds),
        )
    )
    argv = [sys.executable, "-m", "iepm.cli", "agent", "--listen", f"{address}:{port}"]
    argv += ["--config", str(config)]
    if nofile is not None:
        argv = ["prlimit", f"--nofile={nofile}:{nofile}", "--", *argv]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    agent = RunningAgent(
        url=f"{'https' if tls else 'http'}://{address}:{port}",
        address=address,
        port=port,
        dir=tmp,
        config_path=config,
        log_path=tmp / "agent.log",
        tokens=tokens,
        netns=netns,
        argv=argv,
    )
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


@contextlib.contextmanager
def copy_agent(memory_dir: Path, kinds: tuple[str, ...], prefix: str) -> Iterator[RunningAgent]:
    """An agent leasing copy servers: its state on disk under /var/tmp and its memory slots
    under ``memory_dir``, both reachable by the servers' user (nobody, under root) all the way
    down — pytest's own temporary directories are 0700."""
    base = Path(tempfile.mkdtemp(prefix=f"iepm-{prefix}-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        with running_agent(
            base, settings={"memory_dir": str(memory_dir / "slots")}, kinds=kinds
        ) as agent:
            (base / "state").chmod(0o755)
            yield agent
    finally:
        shutil.rmtree(base, ignore_errors=True)


def files_under(root: Path) -> list[Path]:
    """Everything below ``root``, listed again when the agent removes a directory while it is
    being listed."""
    while True:
        try:
            return list(root.rglob("*")) if root.exists() else []
        except FileNotFoundError:
            continue
