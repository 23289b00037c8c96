"""Schemathesis against the agent's own OpenAPI document, over HTTP to a real ``iepm agent``:
whatever it is sent, authenticated or not, it never answers 5xx and keeps running."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings

from iepm.remote.agent import create_app
from iepm.remote.trust import AgentConfig
from tests.remote.conftest import RunningAgent

# Built at import (schemathesis makes its tests then); the document does not depend on config.
schema = schemathesis.openapi.from_dict(create_app(AgentConfig()).openapi())


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case, loopback_agent: RunningAgent) -> None:
    # "strict" may start short tests: fuzzed slots are real, and die at their deadline.
    headers = {"Authorization": f"Bearer {loopback_agent.tokens['strict']}"}
    response = case.call(base_url=loopback_agent.url, headers=headers, timeout=15)
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} {case.body!r} -> {response.status_code}: "
        f"{response.text[:300]}"
    )
    assert loopback_agent.proc is not None and loopback_agent.proc.poll() is None


def test_the_agent_survived_the_fuzzing(loopback_agent: RunningAgent) -> None:
    import httpx

    assert httpx.get(f"{loopback_agent.url}/v1/health", timeout=5).json()["status"] == "ok"
    assert "Traceback" not in loopback_agent.log_text()
