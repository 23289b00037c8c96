"""Up/down lifecycle: idempotence, clean teardown after kill -9, CLI, privileges, bad input.

Behaviour tests (namespaces, processes, files), not tagged ``timing``: they run beside other
tests and wait on conditions. The one that holds an RTT against the lab's truth is tagged and
measures it on a fit host (testkit.fitness)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from iepm.errors import ConfigError, LabError
from iepm.lab import Lab, down, netns
from iepm.lab.cli import lab_app
from iepm.lab.lab import read_state, state_dir_default
from iepm.lab.testing import TEST_LAB_NAME, LabFactory, unique_lab_name
from iepm.lab.topology import LAB_NAME_RE
from testkit.fitness import on_a_fit_host
from testkit.labtools import ping_rtts

SMALL = {
    "lab": {"name": "small"},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "r", "role": "router"},
        {"name": "far", "role": "target"},
    ],
    "links": [
        {"name": "l1", "a": "mon", "b": "r", "delay_ms": 1},
        {"name": "l2", "a": "r", "b": "far", "delay_ms": 2, "rate_mbit": 50},
    ],
}
WITH_LOAD = {
    **SMALL,
    "events": [{"at_s": 600, "action": "link", "link": "l2", "delay_ms": 5}],
    "traffic": [{"src": "far", "dst": "mon", "protocol": "udp", "rate_mbit": 1}],
}


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10).stdout
    return {line.split(":")[1].strip() for line in out.splitlines()}


def lab_namespaces(name: str) -> list[str]:
    return [ns for ns in netns.list_netns() if ns.startswith(name + "-")]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int, start: int | None) -> bool:
    return start is not None and netns.start_time(pid) == start and not netns._zombie(pid)


@pytest.mark.lab
def test_down_after_kill_9_leaves_nothing_behind() -> None:
    links_before = root_links()
    name = unique_lab_name("k")
    lab = Lab.up(WITH_LOAD, name=name)
    try:
        deadline = time.monotonic() + 60  # a busy host starts them late
        while True:  # wait for the conductor's iperf3 server and client
            in_ns = {pid for ns in lab_namespaces(name) for pid in netns.netns_pids(ns)}
            iperf = [p for p in in_ns if b"iperf3" in cmdline(p)]
            if len(iperf) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(iperf) >= 2, "cross traffic server and client should run"
        status = lab.status()
        procs = [(p["pid"], p["start"], p["role"]) for p in status["processes"]]
        watched = [(p, s) for p, s, _ in procs] + [(p, netns.start_time(p)) for p in in_ns]
        assert len(lab_namespaces(name)) == 3
        killed = [(pid, start) for pid, start, role in procs if role == "delayline"]
        for pid, _ in killed:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(alive(pid, start) for pid, start in killed):  # until the kills have landed
            assert time.monotonic() < deadline, "SIGKILLed delay lines still run"
            time.sleep(0.05)
        report = down(name)
    except BaseException:
        down(name)
        raise
    assert sorted(report["namespaces_removed"]) == sorted(f"{name}-{n}" for n in SMALL_NODES)
    assert lab_namespaces(name) == []
    assert root_links() == links_before
    assert not [pid for pid, start in watched if alive(pid, start)]
    assert read_state(name) is None
    assert not (state_dir_default() / name).exists()


SMALL_NODES = ("mon", "r", "far")


@pytest.mark.lab
def test_down_without_state_file_sweeps_by_name() -> None:
    name = unique_lab_name("s")
    lab = Lab.up(SMALL, name=name)
    pids = [(p.pid, p.start) for p in lab._records()]
    (state_dir_default() / f"{name}.json").unlink()  # as if the state were lost
    down(name)
    assert lab_namespaces(name) == []
    assert not [pid for pid, start in pids if alive(pid, start)]


@pytest.mark.lab
def test_up_is_idempotent_and_refuses_to_clobber(lab_factory: LabFactory) -> None:
    name = unique_lab_name("i")
    lab = lab_factory(SMALL, name=name)
    again = Lab.up(SMALL, name=name)  # same topology: attaches, builds nothing
    assert lab.created and not again.created
    assert again.status()["processes"] == lab.status()["processes"]
    changed = {**SMALL, "links": [SMALL["links"][0], {**SMALL["links"][1], "delay_ms": 9}]}
    with pytest.raises(LabError, match="different topology"):
        Lab.up(changed, name=name)
    # a second lab with the same hosts and addresses coexists in its own namespaces
    other = lab_factory(SMALL)
    for each in (lab, other):
        run = each.exec("mon", ["ping", "-n", "-c", "2", "-i", "0.1", each.address("far")])
        assert "2 received" in run.stdout


@pytest.mark.lab
def test_bad_topology_creates_nothing(tmp_path: Path) -> None:
    name = unique_lab_name("b")
    bad = {**SMALL, "links": [*SMALL["links"], {"a": "mon", "b": "nowhere"}]}
    with pytest.raises(ConfigError, match=r"links\[2\]\.b: unknown host 'nowhere'"):
        Lab.up(bad, name=name)
    assert lab_namespaces(name) == []
    assert not (state_dir_default() / f"{name}.json").exists()


def test_without_root_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(netns, "effective_caps", lambda: 0)
    with pytest.raises(LabError, match=r"needs root.*CAP_NET_ADMIN.*sudo iepm lab up"):
        Lab.up(SMALL, name="noroot")


@pytest.mark.lab
@pytest.mark.timing  # the RTT after the named event, against the lab's truth within 2 ms
def test_cli_up_status_event_exec_down(tmp_path: Path) -> None:
    name = unique_lab_name("c")
    path = tmp_path / "lab.toml"
    path.write_text(
        f'[lab]\nname = "{name}"\n\n[[hosts]]\nname = "mon"\nrole = "monitor"\n\n'
        '[[hosts]]\nname = "far"\n\n[[links]]\nname = "wan"\na = "mon"\nb = "far"\n'
        "delay_ms = 5\n\n"
        '[[events]]\nname = "slow"\nat_s = 3600\naction = "link"\nlink = "wan"\ndelay_ms = 50\n'
    )
    runner = CliRunner()
    try:
        res = runner.invoke(lab_app, ["up", str(path)])
        assert res.exit_code == 0, res.output
        assert f"netns {name}-mon" in res.output
        res = runner.invoke(lab_app, ["up", str(path)])  # idempotent
        assert res.exit_code == 0, res.output
        assert "already up, unchanged" in res.output
        res = runner.invoke(lab_app, ["event", name, "link", "link=wan", "delay_ms=20"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(lab_app, ["status", name, "--json"])
        status = json.loads(res.output)
        assert status["links"]["wan"]["a_to_b"]["params"]["delay_ms"] == 20
        assert all(p["alive"] for p in status["processes"] if p["role"] == "delayline")
        res = runner.invoke(lab_app, ["event", name, "slow"])  # a named event from the file
        assert res.exit_code == 0, res.output
        res = runner.invoke(lab_app, ["event", name, "link", "link=nope", "up=false"])
        assert res.exit_code == 2 and "unknown link 'nope'" in res.output
        code = "import sys; from iepm.lab.cli import lab_app; lab_app()"
        argv = [sys.executable, "-c", code, "exec", "--lab", name, "mon", "--"]
        argv += ["ping", "-n", "-c", "1", "198.18.0.2"]
        fit = on_a_fit_host(
            lambda: subprocess.run(argv, capture_output=True, text=True, timeout=30),
            "100 ms of RTT within 2 ms",
        )
        run = fit.value
        assert run.returncode == 0, run.stderr
        rtt = ping_rtts(run.stdout)[0]
        assert abs(rtt - 100) < 2, fit.explain(rtt)  # the named event set 50 ms each way
        res = runner.invoke(lab_app, ["down", name])
        assert res.exit_code == 0, res.output
        assert lab_namespaces(name) == []
    finally:
        if read_state(name) is not None:
            down(name)


def test_cli_reports_bad_file_with_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[lab]\nname = "x"\n\n[[hosts]]\nname = "a"\naddress = "10.1.1.1"\n')
    res = CliRunner().invoke(lab_app, ["up", str(path)])
    assert res.exit_code == 2
    assert f"{path}:6: hosts[0].address: 10.1.1.1 is outside the lab range" in res.output


def test_unique_test_lab_names_are_valid_and_carry_the_pid() -> None:
    a, b = unique_lab_name("q"), unique_lab_name("q")
    assert a != b
    for name in (a, b):
        assert re.fullmatch(LAB_NAME_RE, name)
        m = re.fullmatch(TEST_LAB_NAME, name)
        assert m and int(m.group(1)) == os.getpid()
    with pytest.raises(ValueError):
        unique_lab_name("bad-prefix")


@pytest.mark.lab
def test_same_seed_same_losses(lab_factory: LabFactory) -> None:
    def lossy(seed: int) -> dict[str, object]:
        return {
            "lab": {"name": "seed", "seed": seed},
            "hosts": [{"name": "a", "role": "monitor"}, {"name": "b"}],
            "links": [{"a": "a", "b": "b", "delay_ms": 1, "loss_percent": 10}],
        }

    def replies(lab: Lab) -> str:
        argv = ["ping", "-n", "-c", "300", "-i", "0.002", "-W", "1", lab.address("b")]
        out = lab.exec("a", argv, 30).stdout
        return " ".join(re.findall(r"icmp_seq=(\d+)", out))  # which packets came back

    first, second, other = (lab_factory(lossy(s)) for s in (5, 5, 6))
    assert replies(first) == replies(second)
    assert replies(first) != replies(other)
