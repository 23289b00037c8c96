"""Fixtures shared by every test directory: ``lab_factory`` builds labs with unique names and
always tears them down.

Tests marked ``lab`` need root (network namespaces, TUN devices); they are skipped otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from iepm.lab.testing import LabFactory, lab_unavailable, sweep_stale_labs


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lab") is not None:
        reason = lab_unavailable()
        if reason is not None:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def _stale_labs_swept() -> list[str]:
    """Labs left by earlier test processes that were killed are torn down once per session."""
    return sweep_stale_labs()


@pytest.fixture
def lab_factory(_stale_labs_swept: list[str]) -> Iterator[LabFactory]:
    """``lab_factory(topology_dict_or_path, name=None, prefix="t") -> Lab``; every lab is torn
    down after the test, pass or fail. Names are unique per process so parallel runs coexist."""
    with LabFactory() as factory:
        yield factory


@pytest.fixture(scope="module")
def module_lab_factory(_stale_labs_swept: list[str]) -> Iterator[LabFactory]:
    """Like ``lab_factory`` but the labs live for the whole module (expensive shared labs)."""
    with LabFactory() as factory:
        yield factory
