"""Engine tests run with the archive on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# pg_server is a session fixture: importing it makes it available here.
from tests.pg import PgServer, pg_server  # noqa: F401


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def archive_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a new, empty archive: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'archive.db'}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = f"iepm_engine_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name)
    try:
        yield url
    finally:
        server.drop_database(name)
