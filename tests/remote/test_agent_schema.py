"""Schemathesis against the agent's own OpenAPI document, over HTTP to a real ``iepm agent``:
whatever it is sent, authenticated or not, it never answers 5xx, every answer is one its
document describes (status, content type, headers, body schema), and it keeps running."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from iepm.remote.agent import create_app
from iepm.remote.trust import AgentConfig
from testkit.agent import RunningAgent

# Schemathesis's items share one node id, which xdist would run once: run with the lab tests.
pytestmark = [pytest.mark.servers, pytest.mark.serial]

# Built at import (schemathesis makes its tests then); the document does not depend on config.
schema = schemathesis.openapi.from_dict(create_app(AgentConfig()).openapi())

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_server_errors_and_every_answer_conforms(
    case: schemathesis.Case, loopback_agent: RunningAgent
) -> None:
    # "strict" may start short tests: fuzzed slots are real, and die at their deadline.
    headers = {"Authorization": f"Bearer {loopback_agent.tokens['strict']}"}
    case.call_and_validate(base_url=loopback_agent.url, headers=headers, timeout=15, checks=CHECKS)
    assert loopback_agent.proc is not None and loopback_agent.proc.poll() is None


@schema.parametrize()
@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_unauthenticated_answers_conform(
    case: schemathesis.Case, loopback_agent: RunningAgent
) -> None:
    # No credential at all: 401 (described) everywhere but /v1/health.
    case.call_and_validate(base_url=loopback_agent.url, timeout=15, checks=CHECKS)


@pytest.mark.parametrize(
    ("method", "path", "content", "auth", "status"),
    [
        ("POST", "/v1/slots", b'{"duration_s": NaN}', True, 400),
        ("POST", "/v1/slots", b"{not json", True, 400),
        ("POST", "/v1/slots", b'{"duration_s": 2}', False, 401),
        ("GET", "/v1/facts", None, False, 401),
        ("POST", "/v1/slots", b'{"label": "' + b"x" * 20000 + b'"}', True, 413),
        ("POST", "/v1/slots", b'{"streams": 500}', True, 422),
        ("POST", "/v1/slots", b'{"server": "xrootd"}', True, 403),
        ("GET", "/v1/slots/" + "0" * 32, None, True, 404),
        ("GET", "/v1/slots/not-an-id", None, True, 422),
    ],
)
def test_refusals_are_described_by_the_document(
    loopback_agent: RunningAgent,
    method: str,
    path: str,
    content: bytes | None,
    auth: bool,
    status: int,
) -> None:
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = f"Bearer {loopback_agent.tokens['strict']}"
    response = httpx.request(
        method, loopback_agent.url + path, content=content, headers=headers, timeout=10
    )
    assert response.status_code == status, response.text
    template = "/v1/slots/{slot_id}" if path.startswith("/v1/slots/") else path
    operation = schema[template][method]
    assert str(status) in operation.definition.raw["responses"]
    operation.validate_response(response)  # raises when the body does not match
    assert response.json()["message"] and "\n" not in response.json()["message"]


def test_the_agent_survived_the_fuzzing(loopback_agent: RunningAgent) -> None:
    assert httpx.get(f"{loopback_agent.url}/v1/health", timeout=5).json()["status"] == "ok"
    assert "Traceback" not in loopback_agent.log_text()
