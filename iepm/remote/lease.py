"""Server leases for probes: the ``ServerSource`` a caller (scheduler, CLI) puts in a probe's
context for an agent or SSH target. A probe asks ``ctx.server(need)`` and gets an address and
port for the length of its run; it never imports this package."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from iepm.errors import RemoteError
from iepm.probes.base import SSH_LOGIN, ServerLease, ServerNeed, ServerSource, SshLogin
from iepm.remote.access import AgentAccess, SshAccess
from iepm.remote.protocol import SlotRequest
from iepm.results import utcnow
from iepm.runner import RawRun


def slot_request(need: ServerNeed, label: str | None = None) -> SlotRequest:
    """What the agent needs to know (and checks against this monitor's limits)."""
    return SlotRequest(
        server=need.kind,
        duration_s=need.duration_s,
        omit_s=need.omit_s,
        streams=need.streams,
        window=None if need.window_bytes is None else str(need.window_bytes),
        udp=need.udp,
        rate=None if need.rate_bps is None else str(need.rate_bps),
        reverse=need.reverse,
        size=None if need.size_bytes is None else str(need.size_bytes),
        storage=need.storage,
        label=label,
    )


@dataclass(frozen=True)
class AgentServers:
    """Slots on the target's ``iepm agent``: it starts the server and holds it to the grant."""

    access: AgentAccess

    @contextlib.asynccontextmanager
    async def lease(
        self, need: ServerNeed, *, target: str, address: str, netns: str | None
    ) -> AsyncIterator[ServerLease]:
        from iepm.remote.client import AgentClient

        if need.kind == SSH_LOGIN:
            raise RemoteError(
                f"a copy over SSH needs an SSH target ([targets.ssh]); {target} runs the iepm "
                "agent, which leases xrootd and iperf3 servers only"
            )
        client = AgentClient.from_access(self.access, netns=netns)
        request = slot_request(need, target)
        async with client.held(request, wait_s=self.access.slot_wait_s) as slot:
            yield ServerLease(
                address,
                slot.port,
                f"[agent {client.url}: slot {slot.slot_id}, port {slot.port}, server ready in "
                f"{slot.ready_ms:.0f} ms, killed by the agent at +{slot.deadline_s:.0f} s]",
            )

    async def facts(
        self, argv: list[str], *, target: str, address: str, netns: str | None, deadline_s: float
    ) -> RawRun:
        """The agent's ``/v1/facts`` answer as the raw run (``argv`` is for SSH targets)."""
        from iepm.remote.client import AgentClient

        client = AgentClient.from_access(self.access, netns=netns)
        client.timeout_s = min(client.timeout_s, deadline_s)
        started_at, t0 = utcnow(), time.monotonic()
        status, body = await client.request("GET", "/v1/facts")
        ok = status < 300
        return RawRun(
            argv=("GET", f"{client.url}/v1/facts"),
            stdout=json.dumps(body) if ok else "",
            stderr="" if ok else f"HTTP {status}: {json.dumps(body)[:500]}",
            returncode=0 if ok else status,
            started_at=started_at,
            duration_s=time.monotonic() - t0,
        )


@dataclass(frozen=True)
class SshServers:
    """Agentless: the monitor starts the server over SSH for each run and stops it after."""

    access: SshAccess

    @contextlib.asynccontextmanager
    async def lease(
        self, need: ServerNeed, *, target: str, address: str, netns: str | None
    ) -> AsyncIterator[ServerLease]:
        from iepm.remote import ssh

        access = self.access
        test_s = float(need.duration_s + need.omit_s)
        if need.kind == SSH_LOGIN:
            base = access.memory_dir if need.storage == "memory" else access.work_dir
            async with ssh.directory(access, address, base, test_s, netns=netns) as made:
                yield ServerLease(
                    address,
                    access.port,
                    f"[ssh {access.user}@{address}:{access.port}: {made.path} for the copy, "
                    f"ready in {made.ready_ms:.0f} ms]",
                    directory=made.path,
                    login=SshLogin(
                        access.user,
                        access.port,
                        str(Path(access.key_file).expanduser()),
                        str(Path(access.known_hosts).expanduser()),
                        access.step_timeout_s,
                        access.rsync_path,
                    ),
                )
            return
        async with ssh.server(access, need.kind, address, test_s, netns=netns) as server:
            yield ServerLease(
                address,
                server.port,
                f"[ssh {access.user}@{address}:{access.port}: {need.kind} -s on port "
                f"{server.port} in {server.workdir} ready in {server.ready_ms:.0f} ms]",
            )

    async def facts(
        self, argv: list[str], *, target: str, address: str, netns: str | None, deadline_s: float
    ) -> RawRun:
        """``argv`` (the facts snapshot) run on the target; its output as the raw run."""
        from iepm.remote import ssh

        access = self.access
        started_at, t0 = utcnow(), time.monotonic()
        conn = await ssh.connect(access, address, netns)
        try:
            done = await ssh.run_remote(conn, argv, deadline_s)
        finally:
            conn.close()
        return RawRun(
            argv=("ssh", "-p", str(access.port), f"{access.user}@{address}", *argv),
            stdout=str(done.stdout or ""),
            stderr=str(done.stderr or ""),
            returncode=done.exit_status,
            started_at=started_at,
            duration_s=time.monotonic() - t0,
        )


def server_source(access: AgentAccess | SshAccess | None) -> ServerSource | None:
    """The lease source for a target's access mode (None: a plain endpoint, nothing to start)."""
    if access is None:
        return None
    if isinstance(access, AgentAccess):
        return AgentServers(access)
    if isinstance(access, SshAccess):
        return SshServers(access)
    raise RemoteError(f"unknown remote access {type(access).__name__}")
