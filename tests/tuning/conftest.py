"""Fixtures for the tuning studies (the lab fixtures come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.store import Archive


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[Archive]:
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as opened:
        yield opened
