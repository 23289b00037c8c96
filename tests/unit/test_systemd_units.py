"""The systemd units in deploy/systemd: `systemd-analyze verify` finds nothing to say about them,
and every ExecStart is a command line that iepm's own CLI accepts."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Starts real tools and servers on loopback (the servers tier).
pytestmark = pytest.mark.servers

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
IEPM = Path(sys.executable).with_name("iepm")


def _units() -> list[Path]:
    return sorted(p for p in UNITS.iterdir() if p.suffix in {".service", ".timer"})


def test_the_units_are_there() -> None:
    names = {p.name for p in _units()}
    assert {"iepm-run.service", "iepm-serve.service", "iepm-agent.service",
            "iepm-flows.service", "iepm-prune.service", "iepm-prune.timer"} <= names  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="a private mount namespace needs root")
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_analyze_verify_is_silent() -> None:
    # verify insists that ExecStart's program exists: /opt/iepm/bin/iepm is put there in a
    # private mount namespace (a tmpfs over /opt that dies with the shell), never on the host.
    script = (
        "mount -t tmpfs iepm-unit-test /opt && mkdir -p /opt/iepm/bin && "
        f"ln -s {shlex.quote(str(IEPM))} /opt/iepm/bin/iepm && "
        "systemd-analyze verify --man=no " + " ".join(shlex.quote(str(p)) for p in _units())
    )
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # verify exits 0 on unknown keys and bad values too: any output at all is a finding.
    assert run.returncode == 0 and run.stdout + run.stderr == "", run.stdout + run.stderr


def _exec_starts() -> list[tuple[Path, list[str]]]:
    found = []
    for unit in _units():
        text = unit.read_text()
        env = dict(
            re.findall(r"(\w+)=(\S+)", " ".join(re.findall(r"^Environment=(.*)$", text, re.M)))
        )
        for line in re.findall(r"^ExecStart=(.*)$", text, re.M):
            argv = [
                re.sub(r"\$\{(\w+)\}", lambda m, env=env: env[m[1]], a) for a in shlex.split(line)
            ]
            found.append((unit, argv))
    return found


@pytest.mark.parametrize("unit,argv", _exec_starts(), ids=lambda v: getattr(v, "name", ""))
def test_every_exec_start_is_accepted_by_the_cli(unit: Path, argv: list[str]) -> None:
    assert argv[0] == "/opt/iepm/bin/iepm"
    # --help is eager, but click parses the whole line first: an unknown option still fails.
    run = subprocess.run(
        [str(IEPM), *argv[1:], "--help"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"{unit.name}: {run.stderr}"
    assert "Usage: iepm" in run.stdout
