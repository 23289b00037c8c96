"""Every archive test runs against a SQLite file and a real PostgreSQL server (``archive_url``
in tests/conftest.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.store import Archive


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A temporary directory removed when the test ends (pytest's tmp_path keeps old ones)."""
    with tempfile.TemporaryDirectory(prefix="iepm-store-test-") as path:
        yield Path(path)


@pytest.fixture
def archive(archive_url: str) -> Iterator[Archive]:
    with Archive.open(archive_url) as opened:
        yield opened
