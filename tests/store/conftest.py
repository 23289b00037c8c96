"""Every archive test runs against a SQLite file and a real PostgreSQL server."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.store import Archive

# pg_server is a session fixture: importing it makes it available here.
from tests.pg import PgServer, pg_server  # noqa: F401


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A temporary directory removed when the test ends (pytest's tmp_path keeps old ones)."""
    with tempfile.TemporaryDirectory(prefix="iepm-store-test-") as path:
        yield Path(path)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def archive_url(request: pytest.FixtureRequest, workdir: Path) -> Iterator[str]:
    """The URL of a new, empty archive: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{workdir / 'archive' / 'iepm.db'}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = f"iepm_test_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name)
    try:
        yield url
    finally:
        server.drop_database(name)


@pytest.fixture
def archive(archive_url: str) -> Iterator[Archive]:
    with Archive.open(archive_url) as opened:
        yield opened
