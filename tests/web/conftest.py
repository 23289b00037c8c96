"""One archive for every web test: synthetic 35 days (tests/web/data.py) plus real ping and
load results measured on this host, served by a TestClient or by uvicorn on a free port."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from iepm.probes import load, ping
from iepm.probes.base import ProbeContext
from iepm.results import Result
from iepm.store import Archive
from iepm.web.app import create_app
from testkit.browser import browser, page  # noqa: F401  (fixtures for the browser tests)
from tests.web import data

LOOPBACK = "loopback"


def _real_results() -> list[Result]:
    """Real runs of iepm's probes against 127.0.0.1 (nothing to start: ping and /proc)."""
    out: list[Result] = []
    if shutil.which("ping"):
        ctx = ProbeContext(target=LOOPBACK, address="127.0.0.1", monitor="slac-mon")
        for _ in range(3):
            out.append(asyncio.run(ping.run(ping.Spec(count=3, interval_s=0.2), ctx)))
    ctx = ProbeContext(target=LOOPBACK, address="127.0.0.1", monitor="slac-mon")
    out.append(asyncio.run(load.run(load.Spec(), ctx)))
    return out


@pytest.fixture(scope="session")
def archive_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="iepm-web-test-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'archive.db'}"
        data.fill(url, extra=_real_results()).close()
        yield url


@pytest.fixture(scope="session")
def archive(archive_url: str) -> Iterator[Archive]:
    with Archive.open(archive_url) as opened:
        yield opened


@pytest.fixture(scope="session")
def client(archive_url: str) -> Iterator[TestClient]:
    # cache_ttl_s=0: every request reads the archive, as the tests compare against it.
    with TestClient(create_app(archive_url, cache_ttl_s=0)) as test_client:
        yield test_client
