"""Who may test whom: credentials, limits, slots and injection, against a real ``iepm agent``
on loopback. Every refusal must come before anything starts (no iperf3 child appears)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.rawlog import RawLog
from iepm.remote.agent import Agent
from iepm.remote.lease import server_source
from iepm.remote.trust import load_agent_config
from testkit.agent import RunningAgent, running_agent
from testkit.net import wait_until

pytestmark = pytest.mark.servers


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory name, so that commands naming it fit in a 128-character label."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="m") as name:
        yield Path(name)


def post_slot(agent: RunningAgent, body: dict[str, Any], token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.post(f"{agent.url}/v1/slots", json=body, headers=headers, timeout=10)


def release_all(agent: RunningAgent, monitor: str, response: httpx.Response) -> None:
    if response.status_code == 201:
        slot = response.json()["slot_id"]
        httpx.delete(
            f"{agent.url}/v1/slots/{slot}",
            headers={"Authorization": f"Bearer {agent.tokens[monitor]}"},
            timeout=10,
        )


@pytest.mark.parametrize(
    ("token", "why"),
    [
        (None, "no credential"),
        ("iepm1.not-a-token-this-agent-knows", "unknown credential"),
        ("Basic bW9uMTpwYXNzd29yZA==", "no credential"),
    ],
)
def test_missing_or_wrong_credential_is_refused_and_starts_nothing(
    loopback_agent: RunningAgent, token: str | None, why: str
) -> None:
    headers = {}
    if token is not None:
        headers["Authorization"] = token if token.startswith("Basic") else f"Bearer {token}"
    for method, path in [("POST", "/v1/slots"), ("GET", "/v1/facts"), ("GET", "/v1/usage")]:
        response = httpx.request(
            method, f"{loopback_agent.url}{path}", json={"duration_s": 2}, headers=headers
        )
        assert response.status_code == 401, response.text
        assert response.json()["error"] == "unauthorized"
        assert why in response.json()["message"]
        assert response.headers["WWW-Authenticate"] == "Bearer"
    assert loopback_agent.servers() == []


def test_a_monitor_not_allowed_to_run_iperf3_is_forbidden(loopback_agent: RunningAgent) -> None:
    response = post_slot(loopback_agent, {"duration_s": 2}, loopback_agent.tokens["nobody"])
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert "nobody may not run iperf3" in response.json()["message"]
    assert loopback_agent.servers() == []


def test_another_monitors_slot_cannot_be_seen_or_released(loopback_agent: RunningAgent) -> None:
    granted = post_slot(loopback_agent, {"duration_s": 2}, loopback_agent.tokens["mon1"])
    assert granted.status_code == 201, granted.text
    slot = granted.json()["slot_id"]
    try:
        other = {"Authorization": f"Bearer {loopback_agent.tokens['mon2']}"}
        for method in ("GET", "DELETE"):
            response = httpx.request(method, f"{loopback_agent.url}/v1/slots/{slot}", headers=other)
            assert response.status_code == 404, response.text
        # mon1's server is untouched by mon2's attempt.
        assert len(loopback_agent.servers()) == 1
    finally:
        release_all(loopback_agent, "mon1", granted)
    assert wait_until(lambda: loopback_agent.servers() == [], 20.0)


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        ({"duration_s": 6}, "max_duration_s"),
        ({"duration_s": 4, "omit_s": 2}, "max_duration_s"),
        ({"duration_s": 2, "streams": 3}, "max_streams"),
        ({"duration_s": 2, "window": "2M"}, "max_window"),
        ({"duration_s": 2, "udp": True, "rate": "100M"}, "max_rate"),
        ({"duration_s": 2, "udp": True, "rate": "0"}, "max_rate"),
    ],
)
def test_limits_are_refused_naming_the_limit_before_anything_starts(
    loopback_agent: RunningAgent, body: dict[str, Any], limit: str
) -> None:
    response = post_slot(loopback_agent, body, loopback_agent.tokens["strict"])
    assert response.status_code == 403, response.text
    refusal = response.json()
    assert refusal["error"] == "limit"
    assert refusal["limit"] == limit
    assert limit in refusal["message"] and "strict" in refusal["message"]
    assert loopback_agent.servers() == []


def test_tests_per_hour_is_enforced_with_retry_after(loopback_agent: RunningAgent) -> None:
    first = post_slot(loopback_agent, {"duration_s": 1}, loopback_agent.tokens["hourly"])
    assert first.status_code == 201, first.text
    release_all(loopback_agent, "hourly", first)
    assert wait_until(lambda: loopback_agent.servers() == [], 20.0)
    second = post_slot(loopback_agent, {"duration_s": 1}, loopback_agent.tokens["hourly"])
    assert second.status_code == 429, second.text
    assert second.json()["limit"] == "tests_per_hour"
    assert 3500 <= int(second.headers["Retry-After"]) <= 3600
    assert loopback_agent.servers() == []


def test_slots_are_exclusive_and_busy_answers_say_when_to_retry(
    loopback_agent: RunningAgent,
) -> None:
    first = post_slot(loopback_agent, {"duration_s": 3}, loopback_agent.tokens["mon1"])
    assert first.status_code == 201, first.text
    try:
        busy = post_slot(loopback_agent, {"duration_s": 3}, loopback_agent.tokens["mon2"])
        assert busy.status_code == 409
        assert busy.json()["error"] == "busy"
        assert "another monitor" in busy.json()["message"]
        assert 1 <= int(busy.headers["Retry-After"]) <= 6
        assert len(loopback_agent.servers()) == 1
    finally:
        release_all(loopback_agent, "mon1", first)
    # Released: the server is gone, its work directory removed, the next monitor gets a slot.
    assert wait_until(lambda: loopback_agent.servers() == [], 20.0)
    assert list((loopback_agent.dir / "state" / "work").iterdir()) == []
    again = post_slot(loopback_agent, {"duration_s": 1}, loopback_agent.tokens["mon2"])
    assert again.status_code == 201, again.text
    release_all(loopback_agent, "mon2", again)


@pytest.mark.parametrize("field", ["window", "rate"])
def test_shell_metacharacters_in_sizes_are_rejected(
    loopback_agent: RunningAgent, field: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    body = {"duration_s": 1, field: f"1M; touch {marker}"}
    response = post_slot(loopback_agent, body, loopback_agent.tokens["mon1"])
    assert response.status_code == 422
    assert not marker.exists()
    assert loopback_agent.servers() == []


def test_a_label_with_shell_metacharacters_is_kept_as_data(
    loopback_agent: RunningAgent, short_tmp: Path
) -> None:
    marker = short_tmp / "p"
    label = f"x$(touch {marker})`touch {marker}`;touch {marker}|&'\""
    response = post_slot(
        loopback_agent, {"duration_s": 1, "label": label}, loopback_agent.tokens["mon1"]
    )
    assert response.status_code == 201, response.text
    try:
        assert response.json()["label"] == label
        (server,) = loopback_agent.servers()
        # The server's command line is the agent's own argv: nothing of the request in it.
        assert all(label not in arg and "touch" not in arg for arg in server.cmdline())
    finally:
        release_all(loopback_agent, "mon1", response)
    assert not marker.exists()


def test_credentials_never_reach_logs_raw_logs_or_results(
    loopback_agent: RunningAgent, tmp_path: Path
) -> None:
    """A real test through the agent, plus refusals: the token appears nowhere."""
    from iepm.config import AgentAccess

    access = AgentAccess(
        url=loopback_agent.url, credential_file=str(loopback_agent.token_file("mon1"))
    )
    raw_log = RawLog(tmp_path / "raw")
    ctx = ProbeContext(
        target="loop",
        address="127.0.0.1",
        monitor="mon1",
        raw_log=raw_log,
        servers=server_source(access),
    )
    result = asyncio.run(iperf3.run(iperf3.Spec(duration_s=1), ctx))
    assert result.succeeded, result.error
    assert "agent http://127.0.0.1" in result.diags and "slot" in result.diags
    # A refused run (limit) and a wrong token also produce results/errors to search.
    refused = asyncio.run(iperf3.run(iperf3.Spec(duration_s=1, streams=64), ctx))
    assert not refused.succeeded and "max_streams" in (refused.error or "")
    bad = tmp_path / "bad.token"
    bad.write_text("iepm1.wrong-token-value\n")
    wrong_ctx = ProbeContext(
        target="loop",
        address="127.0.0.1",
        servers=server_source(AgentAccess(url=loopback_agent.url, credential_file=str(bad))),
    )
    wrong = asyncio.run(iperf3.run(iperf3.Spec(duration_s=1), wrong_ctx))
    assert not wrong.succeeded and "401" in (wrong.error or "")
    texts = [json.dumps(r.envelope()) for r in (result, refused, wrong)] + [
        p.read_text() for p in (tmp_path / "raw").rglob("*") if p.is_file()
    ]
    texts.append(loopback_agent.log_text())
    texts.append(loopback_agent.config_path.read_text())
    for token in [*loopback_agent.tokens.values(), "iepm1.wrong-token-value"]:
        for text in texts:
            assert token not in text


def test_orphans_of_a_previous_agent_run_are_killed_at_start(tmp_path: Path) -> None:
    """The state file names a live server (as after a crash that PDEATHSIG did not cover, e.g.
    a server that changed its parent); a new agent kills it by PID + start time."""
    from iepm.remote.agent import process_start_ticks

    state_dir = tmp_path / "state"
    (state_dir / "work" / "old").mkdir(parents=True)
    (state_dir / "work" / "old" / "leftover.dat").write_bytes(b"x" * 1000)
    orphan = subprocess.Popen(
        ["iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        state = {
            "servers": [
                {
                    "slot_id": "old",
                    "pid": orphan.pid,
                    "start_ticks": process_start_ticks(orphan.pid),
                },
                # Same PID field but another start time: a reused PID must not be killed.
                {"slot_id": "x", "pid": bystander.pid, "start_ticks": 1},
            ],
            "grants": {"mon1": [__import__("time").time() - 10]},
        }
        (state_dir / "state.json").write_text(json.dumps(state))
        config = load_agent_config_text_for(state_dir)
        agent = Agent(config)
        assert agent.sweep_orphans() == [orphan.pid]
        assert orphan.wait(timeout=5) is not None
        assert bystander.poll() is None
        assert list((state_dir / "work").iterdir()) == []
        assert json.loads((state_dir / "state.json").read_text())["servers"] == []
        assert len(agent.grants["mon1"]) == 1  # the hour's count survives a restart
    finally:
        for proc in (orphan, bystander):
            proc.kill()
            proc.wait(timeout=5)


def load_agent_config_text_for(state_dir: Path) -> Any:
    path = state_dir.parent / "agent.toml"
    path.write_text(f'[agent]\nstate_dir = "{state_dir}"\n')
    return load_agent_config(path)


def test_a_server_that_never_says_ready_is_refused_with_the_reason(tmp_path: Path) -> None:
    """A server that hangs silently before listening, or ends without a word: the refusal
    still says why (not an empty reason)."""
    mode = tmp_path / "mode"
    fake = tmp_path / "iperf3"
    fake.write_text(f'#!/bin/sh\n[ "$(cat {mode})" = hang ] && exec sleep 60\nexit 3\n')
    fake.chmod(0o755)
    settings = {"programs": {"iperf3": str(fake)}, "server_start_timeout_s": 1.0}
    with running_agent(tmp_path / "agent", settings=settings) as agent:
        for how, why in [("hang", "no answer within 1 s"), ("end", "ended without a word")]:
            mode.write_text(how)
            response = post_slot(agent, {"duration_s": 1}, agent.tokens["mon1"])
            assert response.status_code == 503, response.text
            message = response.json()["message"]
            assert "the iperf3 server did not start: port " in message and why in message, message
            assert wait_until(lambda: agent.servers() == [], 20.0)
            assert list((agent.dir / "state" / "work").iterdir()) == []
