"""Schemathesis against the app's own OpenAPI document: no generated input causes a server
error, and every response conforms to the document (status code, content type, body schema).
Derandomized and bounded per endpoint, so a run is short and a failure replays. The
prediction endpoints are also called with valid queries, so their answers are checked too."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from iepm.web.app import create_app
from tests.web import data

# Schemathesis's items share one node id, which xdist would run once: run with the lab tests.
pytestmark = pytest.mark.serial

# A module-level app: schemathesis builds its tests at import. A small archive is enough: the
# point is the input handling, not the figures. It is filled before the first test, not at
# import: every pytest process collects this module, most never run it.
_TMP = tempfile.TemporaryDirectory(prefix="iepm-web-schema-")
_URL = f"sqlite:///{Path(_TMP.name) / 'archive.db'}"
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_URL, cache_ttl_s=0))
# Schemathesis's own 10 s per request is a deadline a busy host misses on the heavier queries
# (advice over several destinations); the checks are about what comes back, not how fast.
REQUEST_TIMEOUT_S = 60.0
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module", autouse=True)
def _filled_archive() -> None:
    data.fill(_URL).close()


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_responses_conform_to_the_openapi_document(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S)


# Generated input rarely names a target the archive has: the prediction endpoints' answers
# (not only their 404/422) are checked against the document with valid queries too.
UNTIL = "2026-11-20T12:00:00Z"
PREDICTIONS = [
    ("/api/v1/forecast", {"target": "cern-1", "metric": "iperf3.throughput_bps", "until": UNTIL}),
    ("/api/v1/forecast", {"target": "bnl-2", "metric": "rtt_avg_ms", "horizon": "6h"}),
    ("/api/v1/diurnal", {"target": "kek-3", "metric": "ping.rtt_avg_ms", "until": UNTIL}),
    ("/api/v1/advice", {"destination": ["cern-1", "kek-3"], "until": UNTIL, "horizon": "1d"}),
    ("/api/v1/advice", {"destination": "bnl-2", "source": ["fnal-mon", "nobody"]}),
    ("/forecasts", {"window": "7d", "until": UNTIL}),
    ("/forecasts/tables/{name}", {"window": "1d", "until": UNTIL, "format": "tsv"}),
]


@pytest.mark.parametrize(("path", "query"), PREDICTIONS)
def test_prediction_answers_conform_to_the_openapi_document(
    path: str, query: dict[str, Any]
) -> None:
    names = {"name": "forecast_errors"} if "{name}" in path else None
    case = schema[path]["GET"].Case(query=query, path_parameters=names)
    response = case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 200, response.text
