"""Schemathesis against the app's own OpenAPI document: no generated input may cause a 500."""

from __future__ import annotations

import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings

from iepm.web.app import create_app
from tests.web import data

# A module-level app: schemathesis builds its tests at import. A small archive is enough: the
# point is the input handling, not the figures.
_TMP = tempfile.TemporaryDirectory(prefix="iepm-web-schema-")
_URL = f"sqlite:///{Path(_TMP.name) / 'archive.db'}"
data.fill(_URL).close()
schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(_URL, cache_ttl_s=0))


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case) -> None:
    response = case.call()
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} {case.query} -> {response.status_code}: "
        f"{response.text[:300]}"
    )
