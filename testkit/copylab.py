"""What the copy probes' lab tests share: a target's agent in its lab namespace with slot
directories the copy servers (run as nobody) can reach, and the probe context through it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from iepm.config import AgentAccess
from iepm.lab import Lab
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from testkit.agent import RunningAgent, running_agent


@contextlib.contextmanager
def lab_agent(
    lab: Lab, host: str, port: int, kinds: Sequence[str], prefix: str
) -> Iterator[RunningAgent]:
    """An agent on ``host`` (its lab address and namespace) leasing ``kinds``; its state under
    /var/tmp and its memory slots under /dev/shm, both removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=f"iepm-{prefix}-", dir="/var/tmp"))
    memory = Path(tempfile.mkdtemp(prefix=f"iepm-{prefix}-mem-", dir="/dev/shm"))
    for path in (base, memory):
        path.chmod(0o755)  # the copy servers run as nobody, who must reach the slots
    try:
        with running_agent(
            base,
            address=lab.address(host),
            port=port,
            netns=lab.netns(host),
            settings={"memory_dir": str(memory / "slots")},
            kinds=tuple(kinds),
        ) as running:
            (base / "state").chmod(0o755)
            yield running
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(memory, ignore_errors=True)


def agent_context(
    agent: RunningAgent, target: str, address: str = "127.0.0.1", netns: str | None = None
) -> ProbeContext:
    """Monitor ``mon1``'s context for ``target``, its servers leased from ``agent``."""
    access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("mon1")))
    return ProbeContext(
        target=target, address=address, monitor="mon1", netns=netns, servers=server_source(access)
    )
