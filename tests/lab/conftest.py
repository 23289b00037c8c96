"""Fixtures for lab tests: ``lab_factory`` builds labs with unique names and always tears down.

Tests marked ``lab`` need root (network namespaces, TUN devices); they are skipped otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from labtools import LabFactory, unique_lab_name

from iepm.errors import LabError
from iepm.lab import Lab
from iepm.lab.netns import require_privileges


def _lab_unavailable() -> str | None:
    try:
        require_privileges()
    except LabError as exc:
        return str(exc)
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lab") is not None:
        reason = _lab_unavailable()
        if reason is not None:
            pytest.skip(reason)


class _Factory:
    def __init__(self) -> None:
        self.labs: list[Lab] = []

    def __call__(
        self,
        topology: Mapping[str, Any] | str | Path,
        *,
        name: str | None = None,
        prefix: str = "t",
    ) -> Lab:
        lab = Lab.up(topology, name=name or unique_lab_name(prefix))
        self.labs.append(lab)
        return lab

    def teardown(self) -> None:
        errors = []
        for lab in reversed(self.labs):
            try:
                lab.down()
            except LabError as exc:
                errors.append(str(exc))
        if errors:
            raise LabError("; ".join(errors))


@pytest.fixture
def lab_factory() -> Iterator[LabFactory]:
    """``lab_factory(topology_dict_or_path, name=None) -> Lab``; every lab is torn down after
    the test, pass or fail. Names are unique per process so parallel runs coexist."""
    factory = _Factory()
    try:
        yield factory
    finally:
        factory.teardown()


@pytest.fixture(scope="module")
def module_lab_factory() -> Iterator[LabFactory]:
    """Like ``lab_factory`` but labs live for the whole module (expensive shared labs)."""
    factory = _Factory()
    try:
        yield factory
    finally:
        factory.teardown()
