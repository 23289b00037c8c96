"""Fixtures shared by every test directory: ``lab_factory`` builds labs with unique names and
always tears them down.

Tests marked ``lab`` need root (network namespaces, TUN devices); they are skipped otherwise.
"""

from __future__ import annotations

import os
import signal
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from iepm.lab.testing import LabFactory, lab_unavailable, sweep_stale_labs

# pg_server is a session fixture: importing it makes it available to every test directory.
from testkit.pg import PgServer, pg_server  # noqa: F401

# Property tests draw the same examples on every run (seeded from each test's source), so a
# failure replays; HYPOTHESIS_PROFILE=explore draws new examples.
settings.register_profile("replay", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "replay"))


def tier_of(item: pytest.Item) -> str:
    """The test's cost tier: timing (lab tests run alone), lab (namespaces), browser, servers
    (real servers on loopback, PostgreSQL included) or fast (pure Python)."""
    for tier in ("timing", "lab", "browser", "servers"):
        if item.get_closest_marker(tier) is not None:
            return tier
    return "fast"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # xdist hands tests out by node id: two items with one id would silently run once.
    if getattr(config.option, "numprocesses", None):
        ids = Counter(i.nodeid for i in items if i.get_closest_marker("serial") is None)
        twice = sorted(nodeid for nodeid, n in ids.items() if n > 1)
        if twice:
            raise pytest.UsageError(
                f"{len(twice)} node ids stand for several tests, which xdist would run once "
                f"(mark their module serial): {', '.join(twice[:5])}"
            )
    for item in items:
        # A timing test is a lab test (root, namespaces) whatever its module says.
        if item.get_closest_marker("timing") is not None:
            item.add_marker(pytest.mark.lab)
        # A test on a real PostgreSQL server starts one: it is not fast.
        if item.get_closest_marker("pg") is not None:
            item.add_marker(pytest.mark.servers)
        # JUnit XML carries it, so testkit.report can give the time per tier.
        item.user_properties.append(("tier", tier_of(item)))
    if getattr(config.option, "numprocesses", None):
        # Costliest files first (a file's cost: its costliest tier), so the long lab files do
        # not start last and leave the other workers idle at the end; a file stays contiguous.
        cost = {"timing": 0, "lab": 0, "browser": 1, "servers": 2, "fast": 3}
        rank: dict[str, int] = {}
        for item in items:
            file = item.nodeid.split("::", 1)[0]
            rank[file] = min(rank.get(file, 3), cost[tier_of(item)])
        items.sort(key=lambda i: rank[i.nodeid.split("::", 1)[0]])


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("lab") is not None:
        reason = lab_unavailable()
        if reason is not None:
            pytest.skip(reason)


# A shell that starts the suite in the background without job control (`cmd &` in a script, nohup)
# hands it SIGINT ignored, every child inherits that, and Python then never turns Ctrl-C into
# KeyboardInterrupt: the tests that press Ctrl-C on `iepm demo` or `iepm tune` would see them carry
# on. The suite's children get the default behaviour whatever started the suite.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def archive_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a new, empty archive: a SQLite file, or a fresh database on a real
    PostgreSQL server (testkit/pg.py); both removed afterwards."""
    if request.param == "sqlite":
        with tempfile.TemporaryDirectory(prefix="iepm-test-archive-") as path:
            yield f"sqlite:///{Path(path) / 'archive' / 'iepm.db'}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = f"iepm_test_{uuid.uuid4().hex[:12]}"
    url = server.create_database(name)
    try:
        yield url
    finally:
        server.drop_database(name)
