"""Fixtures for the tuning studies: labs (tests marked ``lab`` need root) and archives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.lab.testing import LabFactory, lab_unavailable, sweep_stale_labs
from iepm.store import Archive


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lab") is not None:
        reason = lab_unavailable()
        if reason is not None:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def _stale_labs_swept() -> list[str]:
    return sweep_stale_labs()


@pytest.fixture
def lab_factory(_stale_labs_swept: list[str]) -> Iterator[LabFactory]:
    with LabFactory() as factory:
        yield factory


@pytest.fixture(scope="module")
def module_lab_factory(_stale_labs_swept: list[str]) -> Iterator[LabFactory]:
    with LabFactory() as factory:
        yield factory


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[Archive]:
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as opened:
        yield opened
