"""Lab helpers for test suites (no pytest import): unique names, guaranteed teardown, sweeping.

``tests/lab/conftest.py`` turns these into the ``lab_factory`` / ``module_lab_factory``
fixtures; another test directory can do the same in a few lines::

    @pytest.fixture
    def lab_factory():
        with LabFactory() as factory:
            yield factory
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from iepm.errors import LabError
from iepm.lab.lab import Lab, down, running_labs
from iepm.lab.netns import require_privileges
from iepm.lab.topology import Topology

# Test labs are named <letters><creator pid>x<n>, so a later run can spot those whose creator died.
TEST_LAB_NAME = r"[a-z]+(\d+)x\d+"
_counter = itertools.count()


def unique_lab_name(prefix: str = "t") -> str:
    """A lab name no other process uses (labs of parallel test runs must not collide)."""
    if not re.fullmatch(r"[a-z]+", prefix):
        raise ValueError(f"prefix {prefix!r}: letters a-z only")
    return f"{prefix}{os.getpid()}x{next(_counter)}"


def lab_unavailable() -> str | None:
    """Why labs cannot be built here (no root, no TUN, no ip), or None if they can."""
    try:
        require_privileges()
    except LabError as exc:
        return str(exc)
    return None


def sweep_stale_labs() -> list[str]:
    """Tear down test labs whose creating process is gone (a killed test run)."""
    swept = []
    for name in running_labs():
        m = re.fullmatch(TEST_LAB_NAME, name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            down(name)
            swept.append(name)
    return swept


class LabFactory:
    """Builds labs with unique names; :meth:`close` (or leaving ``with``) tears all of them down.

    ``factory(topology, name=None, prefix="t") -> Lab`` where ``topology`` is a dict in the TOML's
    shape, a Topology or a TOML path.
    """

    def __init__(self) -> None:
        self.labs: list[Lab] = []

    def __call__(
        self,
        topology: Topology | Mapping[str, Any] | str | Path,
        *,
        name: str | None = None,
        prefix: str = "t",
    ) -> Lab:
        lab = Lab.up(topology, name=name or unique_lab_name(prefix))
        self.labs.append(lab)
        return lab

    def close(self) -> None:
        """Tear down every lab built, all of them even if one fails; then report failures."""
        errors = []
        for lab in reversed(self.labs):
            try:
                lab.down()
            except LabError as exc:
                errors.append(str(exc))
        self.labs.clear()
        if errors:
            raise LabError("; ".join(errors))

    def __enter__(self) -> LabFactory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
