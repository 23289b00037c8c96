"""Schemathesis against the app's own OpenAPI document: no generated input causes a server
error, and every response conforms to the document (status code, content type, body schema).
Derandomized and bounded per endpoint, so a run is short and a failure replays."""

from __future__ import annotations

import tempfile
from pathlib import Path

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

# A module-level app: schemathesis builds its tests at import. A small archive is enough: the
# point is the input handling, not the figures.
_TMP = tempfile.TemporaryDirectory(prefix="iepm-web-schema-")
_URL = f"sqlite:///{Path(_TMP.name) / 'archive.db'}"
data.fill(_URL).close()
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_URL, cache_ttl_s=0))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_responses_conform_to_the_openapi_document(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS)
