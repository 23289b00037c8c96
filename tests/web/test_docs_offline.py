"""`/docs` renders with no route out: the web server and chromium run in a network namespace
of the test's own that has only its loopback (no default route, no other interface), so a
Swagger UI or ReDoc asset fetched from a CDN could not load and the page would stay blank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from iepm.lab.testing import lab_unavailable
from iepm.runner import start_process_sync
from testkit.browser import CHROMIUM, SCREENSHOTS

pytestmark = [pytest.mark.lab, pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
RUN_S = 120.0  # server start, chromium start and Swagger UI drawing, on a loaded machine


def ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=15, check=check)


@pytest.fixture
def no_route_out() -> Any:
    """A namespace with only ``lo`` up: ``dash2-docs-PID``, removed by its name afterwards."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian: apt-get install chromium)")
    name = f"dash2-docs-{os.getpid()}"
    ip("netns", "add", name)
    try:
        ip("-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        ip("netns", "del", name, check=False)


def test_docs_render_in_a_namespace_with_no_route_out(no_route_out: str, tmp_path: Path) -> None:
    ns = no_route_out
    # Nothing but loopback: no route to anywhere off the host (asked of the kernel; no packet).
    links = json.loads(ip("-n", ns, "-j", "link", "show").stdout)
    assert [link["ifname"] for link in links] == ["lo"]
    assert ip("-n", ns, "route", "show").stdout.strip() == ""
    unreachable = ip("-n", ns, "route", "get", "198.18.0.1", check=False)
    assert unreachable.returncode != 0 and "unreachable" in unreachable.stderr.lower()
    SCREENSHOTS.mkdir(exist_ok=True)
    shot = SCREENSHOTS / "docs-offline.png"
    out, err = tmp_path / "out.json", tmp_path / "err.txt"
    with out.open("w") as sink, err.open("w") as errors:
        proc = start_process_sync(
            [
                *("ip", "netns", "exec", ns, sys.executable, "-m", "tests.web.docs_offline"),
                *(f"sqlite:///{tmp_path}/a.db", "8080", str(shot)),
            ],
            stdout=sink,
            stderr=errors,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
        try:
            code = proc.wait(RUN_S)
        finally:
            proc.stop()
    stderr = err.read_text()
    assert code == 0, stderr[-3000:]
    seen = json.loads(out.read_text())
    # Swagger UI drew the API's operations, from nothing but the server itself.
    assert seen["operations"] >= 5
    assert seen["requests"] and all(
        u.startswith("http://127.0.0.1:8080/") for u in seen["requests"]
    ), seen["requests"]
    assert any("/static/docs/" in u for u in seen["requests"])
    assert seen["failed"] == [] and seen["errors"] == [], seen
