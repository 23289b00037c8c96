"""`iepm target bootstrap` against a lab host running sshd: the host ends up answering as an
agent target with this monitor's token, and a second run changes nothing. A lab host shares this
machine's file system and runs no systemd, so iepm goes into a prefix under the test's directory
and the agent is started directly (its PID in STATE/agent.pid, stopped by it afterwards)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.remote.bootstrap import wheelhouse
from testkit.net import wait_until
from testkit.sshd import Sshd, private_sshd

pytestmark = pytest.mark.lab

TOPOLOGY = {
    "lab": {"name": "bs", "seed": 3},
    "hosts": [{"name": "mon", "role": "monitor"}, {"name": "tb", "role": "target"}],
    "links": [{"a": "mon", "b": "tb", "delay_ms": 1.0}],
}
SSH_PORT = 2222
AGENT_PORT = 8711


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Lab:
    lab = module_lab_factory(TOPOLOGY, prefix="bs")
    lab.wait_reachable("mon", ["tb"])
    return lab


@pytest.fixture(scope="module")
def sshd(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with private_sshd(
        tmp_path_factory.mktemp("bssshd"), lab.address("tb"), SSH_PORT, lab.netns("tb")
    ) as server:
        yield server


def _stop_agent(pidfile: Path) -> None:
    with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
        pid = int(pidfile.read_text().strip())
        os.killpg(pid, signal.SIGTERM)  # the agent's own session: it and its servers
        if not wait_until(lambda: not Path(f"/proc/{pid}").exists(), 15.0):
            os.killpg(pid, signal.SIGKILL)


def test_bootstrap_leaves_an_agent_target_and_a_second_run_changes_nothing(
    lab: Lab, sshd: Sshd, tmp_path: Path
) -> None:
    # Built once per iepm version and kept (~/.cache/iepm): the wheels of iepm and its pins.
    wheels = wheelhouse(Path.home() / ".cache" / "iepm" / "wheelhouse-test")
    root = tmp_path / "target"
    token = tmp_path / "monitor" / "tb.token"
    argv = [
        sys.executable, "-m", "iepm.cli", "target", "bootstrap", lab.address("tb"),
        "--name", "tb", "--monitor", "mon", "--token-file", str(token),
        "--key-file", str(sshd.client_key), "--known-hosts", str(sshd.known_hosts),
        "--ssh-port", str(SSH_PORT), "--port", str(AGENT_PORT),
        "--prefix", str(root / "opt"), "--etc", str(root / "etc"), "--state", str(root / "var"),
        "--service", "auto", "--wheelhouse", str(wheels), "--netns", lab.netns("mon"),
    ]  # fmt: skip
    try:
        first = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
        assert first.returncode == 0, first.stdout + first.stderr
        out = first.stdout
        assert "changes" in out.splitlines()[0]
        assert "changed: installed iepm" in out
        assert "changed: made this monitor's token" in out
        assert "enrolled monitor mon" in out
        assert "changed: started the agent (no service manager)" in out  # no systemd in a lab
        assert f"agent answers at http://{lab.address('tb')}:{AGENT_PORT}" in out
        assert 'mode = "agent"' in out and f'credential_file = "{token}"' in out
        assert token.stat().st_mode & 0o777 == 0o600
        pid = int((root / "var" / "agent.pid").read_text())
        # The agent runs inside the target's namespace, started over its sshd.
        netns_pids = subprocess.run(
            ["ip", "netns", "pids", lab.netns("tb")], capture_output=True, text=True, timeout=10
        ).stdout.split()
        assert str(pid) in netns_pids

        second = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stdout + second.stderr
        assert second.stdout.splitlines()[0].endswith("nothing changed"), second.stdout
        assert "changed:" not in second.stdout
        assert int((root / "var" / "agent.pid").read_text()) == pid  # the same agent
    finally:
        _stop_agent(root / "var" / "agent.pid")
