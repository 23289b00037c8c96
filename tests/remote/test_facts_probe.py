"""The target-facts probe against real targets on loopback: an ``iepm agent`` (its /v1/facts)
and a private sshd (the load snapshot run over SSH). Both read this same host, so their facts
must agree with each other and with /proc; a plain target is skipped with the reason."""

from __future__ import annotations

import asyncio
import json
import platform
from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.probes import facts, get_probe
from iepm.probes.base import ProbeContext
from iepm.rawlog import RawLog, read_log
from iepm.remote.access import AgentAccess
from iepm.remote.lease import AgentServers, SshServers
from iepm.results import Outcome, Result
from testkit.agent import RunningAgent
from testkit.net import free_port
from testkit.sshd import Sshd, private_sshd

pytestmark = pytest.mark.servers

KEYS = ("kernel_release", "cpu_count", "tcp_rmem_bytes", "tcp_wmem_bytes", "rmem_max_bytes")
KEYS += ("wmem_max_bytes", "tcp_congestion_control", "tcp_rmem_max_bytes")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with private_sshd(tmp_path_factory.mktemp("sshd"), "127.0.0.1", free_port()) as server:
        yield server


def run(ctx: ProbeContext) -> Result:
    return asyncio.run(get_probe("facts").run(facts.Spec(timeout_s=20), ctx))


def proc_ints(name: str) -> list[int]:
    return [int(x) for x in Path(f"/proc/sys/net/ipv4/{name}").read_text().split()]


def agent_access(agent: RunningAgent, **changes: object) -> AgentAccess:
    fields: dict[str, object] = {
        "url": agent.url,
        "credential_file": str(agent.token_file("mon1")),
        "request_timeout_s": 10.0,
    }
    return AgentAccess(**{**fields, **changes})


def test_an_agent_targets_facts_are_its_hosts_and_reparse_from_the_raw_log(
    loopback_agent: RunningAgent, tmp_path: Path
) -> None:
    log = RawLog(tmp_path / "raw")
    ctx = ProbeContext(
        "here", "127.0.0.1", raw_log=log, servers=AgentServers(agent_access(loopback_agent))
    )
    result = run(ctx)
    assert result.succeeded, (result.error, result.diags)
    data = result.data
    assert data["via"] == "agent" and result.tool_version and "iepm agent" in result.tool_version
    assert data["kernel_release"] == platform.release()
    assert data["tcp_rmem_bytes"] == proc_ints("tcp_rmem")
    assert data["tcp_rmem_max_bytes"] == proc_ints("tcp_rmem")[2]
    assert data["nics"]["lo"]["mtu_bytes"] == int(Path("/sys/class/net/lo/mtu").read_text())
    assert f"GET {loopback_agent.url}/v1/facts" in result.diags
    # parse() is pure: the raw log's document gives the same data again.
    (logged,) = [p for p in (tmp_path / "raw").rglob("*") if p.is_file()]
    (record,) = read_log(logged)
    assert facts.parse(record.raw) == data


def test_an_ssh_targets_facts_agree_with_its_agents(
    sshd: Sshd, loopback_agent: RunningAgent
) -> None:
    over_ssh = run(ProbeContext("here", "127.0.0.1", servers=SshServers(sshd.access())))
    assert over_ssh.succeeded, (over_ssh.error, over_ssh.diags)
    assert over_ssh.data["via"] == "ssh"
    assert over_ssh.diags.startswith(f"ssh -p {sshd.port} root@127.0.0.1 python3 -I -S -c")
    agent = run(
        ProbeContext("here", "127.0.0.1", servers=AgentServers(agent_access(loopback_agent)))
    )
    assert agent.succeeded, agent.error
    for key in KEYS:
        assert over_ssh.data[key] == agent.data[key], key
    mtus = {name: nic["mtu_bytes"] for name, nic in over_ssh.data["nics"].items()}
    assert mtus == {name: nic["mtu_bytes"] for name, nic in agent.data["nics"].items()}


def test_a_plain_target_is_skipped_with_the_reason() -> None:
    result = run(ProbeContext("plain-host", "127.0.0.1"))
    assert result.outcome == Outcome.SKIPPED
    assert result.error is not None and "plain endpoint" in result.error
    assert "plain-host" in result.error


def test_an_agent_that_does_not_answer_is_a_failed_run_naming_it(
    loopback_agent: RunningAgent,
) -> None:
    port = free_port()  # nothing listens there
    access = agent_access(loopback_agent, url=f"http://127.0.0.1:{port}", request_timeout_s=2.0)
    result = run(ProbeContext("gone", "127.0.0.1", servers=AgentServers(access)))
    assert result.outcome == Outcome.FAILED
    assert result.error is not None and f"http://127.0.0.1:{port}" in result.error


def test_a_refused_token_is_a_failed_run_with_the_agents_answer(
    loopback_agent: RunningAgent, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.token"
    wrong.write_text("x" * 43 + "\n")
    wrong.chmod(0o600)
    access = agent_access(loopback_agent, credential_file=str(wrong))
    result = run(ProbeContext("here", "127.0.0.1", servers=AgentServers(access)))
    assert result.outcome == Outcome.FAILED
    assert result.error is not None and "HTTP 401" in result.error, result.error
    assert json.dumps("unauthorized") in (result.error or "")
