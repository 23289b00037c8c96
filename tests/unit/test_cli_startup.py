"""Every `iepm` command line imports iepm.cli; the heavy libraries must wait for the commands
that use them (`iepm --help` took 1.6–2.6 s when they did not; see benchmarks/cli_startup.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Starts real tools and servers on loopback (the servers tier).
pytestmark = pytest.mark.servers

HEAVY = ("numpy", "scipy", "statsmodels", "sqlalchemy", "alembic", "uvicorn", "fastapi", "httpx")


def test_the_command_line_loads_no_heavy_library_before_a_command_needs_it() -> None:
    code = (
        f"import sys, json, iepm.cli; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_help_lists_every_command_without_them() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "iepm.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for command in ("probe", "forecast", "changes", "diurnal", "alerts", "serve", "demo", "tune"):
        assert command in out.stdout


def test_a_command_still_gets_what_it_needs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "iepm.cli", "forecast", "--csv", "/nonexistent.csv"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "/nonexistent.csv" in out.stderr
    assert "Traceback" not in out.stderr
