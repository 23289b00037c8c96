"""A test server on an agent or SSH target for the length of one probe run."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from iepm.config import AgentAccess, SshAccess
from iepm.errors import RemoteError


@dataclass(frozen=True)
class RemoteServer:
    port: int
    # One line for the result's diags: who started the server, where, how fast.
    note: str


def iperf3_request(spec: Any, label: str | None = None) -> dict[str, Any]:
    """What the agent needs to know (and checks against this monitor's limits)."""
    return {
        "probe": "iperf3",
        "duration_s": int(spec.duration_s),
        "omit_s": int(spec.omit_s),
        "streams": spec.streams,
        "window": spec.window,
        "udp": spec.udp,
        "rate": spec.rate,
        "reverse": spec.reverse,
        "label": label,
    }


@contextlib.asynccontextmanager
async def iperf3_server(
    remote: AgentAccess | SshAccess, spec: Any, *, target: str, address: str, netns: str | None
) -> AsyncIterator[RemoteServer]:
    """Obtain a one-shot iperf3 server for ``spec`` and always release it afterwards."""
    if isinstance(remote, AgentAccess):
        from iepm.remote.client import AgentClient

        client = AgentClient.from_access(remote, netns=netns)
        async with client.held(iperf3_request(spec, target), wait_s=remote.slot_wait_s) as slot:
            yield RemoteServer(
                slot.port,
                f"[agent {client.url}: slot {slot.slot_id}, port {slot.port}, server ready in "
                f"{slot.ready_ms:.0f} ms, killed by the agent at +{slot.deadline_s:.0f} s]",
            )
    elif isinstance(remote, SshAccess):
        from iepm.remote import ssh

        test_s = float(spec.duration_s + spec.omit_s)
        async with ssh.iperf3_server(remote, address, test_s, netns=netns) as server:
            yield RemoteServer(
                server.port,
                f"[ssh {remote.user}@{address}:{remote.port}: iperf3 -s on port {server.port} "
                f"in {server.workdir} ready in {server.ready_ms:.0f} ms]",
            )
    else:
        raise RemoteError(f"unknown remote access {type(remote).__name__}")
