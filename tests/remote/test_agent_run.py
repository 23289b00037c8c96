"""The agent's third-party test endpoint (``POST /v1/runs``): a control host has the agent's host
run one probe. Auth before the body, [monitors.runs] limits named in refusals, bad input a
one-line 422 naming the field, a real ``iepm probe`` run with its raw log, and the deadline
killing the run's whole process group."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from iepm.rawlog import read_log
from iepm.remote.agent import create_app
from iepm.remote.protocol import RunAnswer
from iepm.remote.trust import load_agent_config_text, new_token, token_digest
from testkit.net import wait_until

pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parents[2]


def agent_toml(state: Path, tokens: dict[str, str], **agent: Any) -> str:
    settings = "".join(f"{k} = {json.dumps(v)}\n" for k, v in agent.items())
    return f"""
[agent]
name = "h1"
state_dir = "{state}"
{settings}
[[monitors]]
name = "control"
token_sha256 = "{token_digest(tokens["control"])}"
[monitors.runs]
probes = ["ping"]
destinations = ["127.0.0.0/8", "198.18.0.0/15"]
max_duration_s = 20
tests_per_hour = 3

[[monitors]]
name = "plain"
token_sha256 = "{token_digest(tokens["plain"])}"
"""


@pytest.fixture
def tokens() -> dict[str, str]:
    return {"control": new_token(), "plain": new_token()}


def post(
    tmp_path: Path, tokens: dict[str, str], body: Any, who: str | None = "control", **agent: Any
) -> httpx.Response:
    config = load_agent_config_text(agent_toml(tmp_path / "state", tokens, **agent))
    app = create_app(config)
    headers = {"Content-Type": "application/json"}
    if who is not None:
        headers["Authorization"] = f"Bearer {tokens[who]}"

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return await http.post("/v1/runs", content=content, headers=headers, timeout=60)

    return asyncio.run(call())


PING = {"probe": "ping", "target": "lo", "address": "127.0.0.1", "deadline_s": 15}


def test_no_or_unknown_credential_is_401_before_the_body(
    tmp_path: Path, tokens: dict[str, str]
) -> None:
    assert post(tmp_path, tokens, PING, who=None).status_code == 401
    response = post(tmp_path, tokens, b"{not json", who=None)
    assert response.status_code == 401
    assert not (tmp_path / "state" / "runs").exists() or not any(
        (tmp_path / "state" / "runs").iterdir()
    )


@pytest.mark.parametrize(
    ("who", "change", "status", "words"),
    [
        ("plain", {}, 403, "may not have this host run tests"),
        ("control", {"probe": "iperf3"}, 403, "may not have this host run iperf3"),
        ("control", {"address": "192.0.2.7"}, 403, "outside the destinations"),
        ("control", {"deadline_s": 60}, 403, "max_duration_s = 20"),
        (
            "control",
            {"server_agent": {"url": "http://192.0.2.9:8700"}},
            403,
            "server_agent.url: 192.0.2.9",
        ),
        ("control", {"server_agent": {"url": "http://127.0.0.2:8700"}}, 403, "run_credential"),
    ],
)
def test_limits_are_refused_naming_the_limit_before_anything_runs(
    tmp_path: Path,
    tokens: dict[str, str],
    who: str,
    change: dict[str, Any],
    status: int,
    words: str,
) -> None:
    response = post(tmp_path, tokens, {**PING, **change}, who=who)
    assert response.status_code == status, response.text
    assert words in response.json()["message"]
    assert not (tmp_path / "state" / "runs").exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"address": "example.org"}, "address"),
        ({"address": "127.0.0.1; reboot"}, "address"),
        ({"target": "a b"}, "target"),
        ({"probe": "Ping!"}, "probe"),
        ({"deadline_s": 0}, "deadline_s"),
        ({"params": {"count": {"nested": 1}}}, "params.count"),
        ({"params": {"Bad-Key": 1}}, "params"),
        ({"params": {"note": "two\nlines"}}, "params"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_input_is_one_line_422_naming_the_field(
    tmp_path: Path, tokens: dict[str, str], change: dict[str, Any], field: str
) -> None:
    response = post(tmp_path, tokens, {**PING, **change})
    assert response.status_code == 422, response.text
    message = response.json()["message"]
    assert "\n" not in message
    assert message.startswith(field), message


def test_a_run_is_iepm_probe_with_its_envelope_and_raw_log(
    tmp_path: Path, tokens: dict[str, str]
) -> None:
    body = {**PING, "params": {"count": 2, "interval_s": 0.2}}
    response = post(tmp_path, tokens, body)
    assert response.status_code == 200, response.text
    answer = RunAnswer.model_validate(response.json())
    assert answer.state == "finished" and answer.exit_code == 0, answer.stderr
    assert answer.envelope is not None
    assert answer.envelope["probe"] == "ping" and answer.envelope["target"] == "lo"
    assert answer.envelope["outcome"] == "ok"
    assert answer.envelope["data"]["packets_sent"] == 2
    log = tmp_path / "raw.log"
    log.write_text(answer.raw_log)
    (run,) = list(read_log(log))
    assert run.raw.token == answer.envelope["raw_token"]
    assert run.params is not None and run.params["count"] == 2
    # The work directory is gone; the rate limit counts the run.
    assert list((tmp_path / "state" / "runs").iterdir()) == []


def test_a_bad_parameter_is_the_commands_own_one_line_error(
    tmp_path: Path, tokens: dict[str, str]
) -> None:
    response = post(tmp_path, tokens, {**PING, "params": {"count": -3}})
    assert response.status_code == 200, response.text
    answer = RunAnswer.model_validate(response.json())
    assert answer.exit_code not in (0, None)
    assert answer.envelope is None
    assert "count" in answer.stderr


def test_tests_per_hour_is_enforced_with_retry_after(
    tmp_path: Path, tokens: dict[str, str]
) -> None:
    # What is counted is the run, not what it measured: a command that does nothing at once.
    config = load_agent_config_text(
        agent_toml(tmp_path / "state", tokens, iepm_command=[shutil.which("true") or "true"])
    )
    app = create_app(config)
    headers = {"Authorization": f"Bearer {tokens['control']}"}
    body = {**PING, "params": {"count": 1, "interval_s": 0.2}}

    async def calls() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
            return [await http.post("/v1/runs", json=body, headers=headers) for _ in range(4)]

    responses = asyncio.run(calls())
    assert [r.status_code for r in responses] == [200, 200, 200, 429]
    refusal = responses[-1].json()
    assert refusal["limit"] == "tests_per_hour" and refusal["retry_after_s"] > 0


HANGS = """#!/bin/sh
# Stands in for a probe that never ends: it and its child record their PIDs, then wait.
echo $$ > {pids}/leader
sleep 300 &
echo $! > {pids}/child
wait
"""


def test_the_deadline_kills_the_runs_whole_process_group(
    tmp_path: Path, tokens: dict[str, str]
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    script = tmp_path / "hangs.sh"
    script.write_text(HANGS.format(pids=pids))
    script.chmod(0o755)
    response = post(tmp_path, tokens, {**PING, "deadline_s": 2}, iepm_command=[str(script)])
    assert response.status_code == 200, response.text
    answer = RunAnswer.model_validate(response.json())
    assert answer.state == "killed_at_deadline"
    assert answer.envelope is None
    leader, child = (int((pids / n).read_text()) for n in ("leader", "child"))

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert wait_until(lambda: gone(leader) and gone(child), 10)
    assert list((tmp_path / "state" / "runs").iterdir()) == []


def test_the_run_command_defaults_to_this_python() -> None:
    from iepm.remote.runs import Runs
    from iepm.remote.trust import AgentSettings

    argv = Runs(AgentSettings()).argv(
        __import__("iepm.remote.protocol", fromlist=["RunRequest"]).RunRequest.model_validate(PING),
        Path("/x/run.toml"),
        Path("/x/logs"),
    )
    assert argv[:3] == [sys.executable, "-m", "iepm.cli"]
    assert argv[3:6] == ["probe", "ping", "lo"]
    assert os.path.basename(argv[argv.index("--config") + 1]) == "run.toml"


def test_the_last_hours_runs_survive_an_agent_restart(
    tmp_path: Path, tokens: dict[str, str]
) -> None:
    from iepm.remote.agent import Agent

    # What survives is the run's stamp, not what it measured: a command that does nothing.
    config = load_agent_config_text(
        agent_toml(tmp_path / "state", tokens, iepm_command=[shutil.which("true") or "true"])
    )
    first = Agent(config)
    first.sweep_orphans()
    body = {**PING, "params": {"count": 1, "interval_s": 0.2}}
    monitor = config.monitors[0]
    from iepm.remote.protocol import RunRequest

    answer = asyncio.run(first.runs.run(monitor, RunRequest.model_validate(body)))
    assert answer.exit_code == 0, answer.stderr
    second = Agent(config)
    second.sweep_orphans()
    assert len(second.runs.stamps["control"]) == 1
