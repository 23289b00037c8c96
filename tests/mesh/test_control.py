"""RTPL's model: one control host runs the whole mesh through the hosts' agents
(``iepm run --mesh FILE --control``); the hosts run only ``iepm agent``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from iepm.config import TargetConfig
from iepm.errors import ConfigError
from iepm.mesh import load_mesh_text
from iepm.mesh.control import AgentExecutor, describe_control
from iepm.probes import PROBES
from iepm.probes.base import ProbeContext, failed_result
from iepm.remote.access import AgentAccess
from iepm.remote.trust import new_token, token_digest
from iepm.results import Outcome
from iepm.store import Archive
from testkit.agent import RunningAgent
from testkit.net import free_port

# A real PostgreSQL server and the CLI in subprocesses; the lab test is marked lab as well.
pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parents[2]

MESH = """
[mesh]
name = "ctl"
[mesh.control]
{control}

[monitor]
archive = "{url}"
log_dir = "{tmp}/raw"
cycle_interval_s = 15
alerts = false
live = false

{hosts}

[[tests]]
name = "all"
probes = ["ping", "iperf3"]
[tests.ping]
count = 3
interval_s = 0.2
[tests.iperf3]
duration_s = 2
"""


def host_table(name: str, address: str, url: str, credential: Path) -> str:
    return (
        f'\n[[hosts]]\nname = "{name}"\naddress = "{address}"\nmode = "agent"\n'
        f'[hosts.agent]\nurl = "{url}"\ncredential_file = "{credential}"\nslot_wait_s = 5\n'
    )


def agent_config(
    name: str,
    address: str,
    state: Path,
    control_token: str,
    host_tokens: dict[str, str],
    own_token_file: Path,
    destinations: str,
) -> str:
    """Host ``name``'s agent.toml: the control host may have it run ping and iperf3 towards the
    lab's addresses; every other host may ask it for an iperf3 server."""
    low = 20000 + (os.getpid() * 13 + sum(map(ord, name))) % 20000
    lines = [
        "[agent]",
        f'name = "{name}"',
        f'state_dir = "{state}"',
        f"server_ports = [{low}, {low + 40}]",
        f'server_bind = "{address}"',
        "slot_grace_s = 5",
        f'run_credential_file = "{own_token_file}"',
        "",
        "[[monitors]]",
        'name = "control"',
        f'token_sha256 = "{token_digest(control_token)}"',
        "probes = []",
        "[monitors.runs]",
        'probes = ["ping", "iperf3"]',
        f'destinations = ["{destinations}"]',
        "max_duration_s = 120",
        "tests_per_hour = 1000",
    ]
    for other, token in host_tokens.items():
        if other == name:
            continue
        lines += [
            "",
            "[[monitors]]",
            f'name = "{other}"',
            f'token_sha256 = "{token_digest(token)}"',
            'probes = ["iperf3"]',
            "[monitors.limits]",
            "max_duration_s = 30",
            "tests_per_hour = 1000",
        ]
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def agents(
    tmp: Path, addresses: dict[str, str], netns: Callable[[str], str | None], destinations: str
) -> Iterator[tuple[dict[str, RunningAgent], Path]]:
    """One ``iepm agent`` per host (in its namespace), each enrolling the control host and
    every other host; yields them and the control host's credential file."""
    control_token = new_token()
    control_file = tmp / "control.token"
    control_file.write_text(control_token + "\n")
    control_file.chmod(0o600)
    host_tokens = {name: new_token() for name in addresses}
    running: dict[str, RunningAgent] = {}
    try:
        for name, address in addresses.items():
            home = tmp / name
            home.mkdir()
            own = home / "own.token"
            own.write_text(host_tokens[name] + "\n")
            own.chmod(0o600)
            config = home / "agent.toml"
            config.write_text(
                agent_config(
                    name, address, home / "state", control_token, host_tokens, own, destinations
                )
            )
            port = free_port()
            argv = [sys.executable, "-m", "iepm.cli", "agent", "--listen", f"{address}:{port}"]
            argv += ["--config", str(config)]
            ns = netns(name)
            if ns:
                argv = ["ip", "netns", "exec", ns, *argv]
            agent = RunningAgent(
                url=f"http://{address}:{port}",
                address=address,
                port=port,
                dir=home,
                config_path=config,
                log_path=home / "agent.log",
                tokens={"control": control_token},
                netns=ns,
                argv=argv,
            )
            agent.start()
            running[name] = agent
        yield running, control_file
    finally:
        for agent in running.values():
            agent.stop()


def descendants(agent: RunningAgent) -> list[str]:
    """What the agent still runs (its runs' `iepm probe`, their tools, iperf3 servers)."""
    assert agent.proc is not None
    found = []
    with contextlib.suppress(psutil.NoSuchProcess):
        # Under `ip netns exec` the agent is the child of that exec'd process (same PID).
        for child in psutil.Process(agent.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() != psutil.STATUS_ZOMBIE:
                    found.append(" ".join(child.cmdline())[:120])
    return found


def run_control(path: Path, cycles: int) -> str:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "iepm.cli",
            "run",
            "--mesh",
            str(path),
            "--control",
            "--cycles",
            str(cycles),
            "--no-live",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def check_archive(url: str, hosts: list[str], cycles: int) -> dict[str, Any]:
    """Every ordered pair measured by ping and iperf3 in every cycle, all ok, stored with the
    source host as monitor; no two iperf3 tests overlapped at any host."""
    with Archive.open(url) as archive:
        pings = list(archive.results(probe="ping"))
        runs = list(archive.results(probe="iperf3"))
    pairs = sorted((a, b) for a in hosts for b in hosts if a != b)
    for results in (pings, runs):
        failed = [(r.monitor, r.target, r.error) for r in results if not r.succeeded]
        assert failed == []
        assert sorted((r.monitor, r.target) for r in results) == sorted(pairs * cycles)
    assert all("[host lease on " in r.diags and "on " + r.monitor in r.diags for r in runs)
    spans: dict[str, list[tuple[Any, Any, str]]] = {}
    for r in runs:
        end = r.started_at + timedelta(seconds=r.duration_s)
        for host in (r.monitor, r.target):
            spans.setdefault(host, []).append((r.started_at, end, f"{r.monitor}->{r.target}"))
    overlaps = []
    for host, items in spans.items():
        items.sort()
        for (_s1, e1, n1), (s2, _e2, n2) in itertools.pairwise(items):
            if s2 < e1:
                overlaps.append((host, n1, n2))
    assert overlaps == []
    mbps = sorted(r.data["throughput_bps"] / 1e6 for r in runs)
    return {"iperf3": len(runs), "ping": len(pings), "median_mbps": mbps[len(mbps) // 2]}


def check_raw_logs(tmp: Path, url: str, hosts: list[str], cycles: int) -> None:
    """The control host kept each run's raw record, and `iepm extract` re-reads it into the
    same results (none added, none failing to parse)."""
    for host in hosts:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "iepm.cli",
                "extract",
                "--log-dir",
                str(tmp / "raw" / host),
                "--db",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.returncode == 0, proc.stderr
        runs = 2 * cycles * (len(hosts) - 1)  # ping and iperf3 to every other host
        assert f"re-extracted {runs} runs" in proc.stdout, proc.stdout
        assert " 0 added, 0 failed to parse" in proc.stdout, proc.stdout


# ---------------------------------------------------------------------------------------------
# checks without agents


def mesh_text(hosts: str, control: str = "") -> str:
    return MESH.format(control=control, url="sqlite:////tmp/x.db", tmp="/tmp/x", hosts=hosts)


def test_control_mode_needs_every_source_on_an_agent_naming_file_and_line() -> None:
    hosts = host_table("h1", "198.18.1.1", "http://198.18.1.1:8700", Path("/c")) + (
        '\n[[hosts]]\nname = "h2"\naddress = "198.18.1.2"\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_mesh_text(mesh_text(hosts), "mesh.toml")
    message = str(caught.value)
    # h2 gives no mode: the error points at its [[hosts]] table.
    line = mesh_text(hosts).splitlines().index('name = "h2"')
    assert f"mesh.toml:{line}: hosts[1].mode: h2 runs tests and the mesh has [mesh.control]" in (
        message
    )


def test_validate_and_mesh_show_describe_control_mode(tmp_path: Path) -> None:
    hosts = "".join(
        host_table(f"h{i}", f"198.18.1.{i}", f"http://198.18.1.{i}:8700", Path("/c"))
        for i in (1, 2, 3)
    )
    loaded = load_mesh_text(mesh_text(hosts), "mesh.toml")
    lines = describe_control(loaded)
    assert "control mode" in lines[0] and "3 hosts" in lines[0]
    assert "h2" in lines[2] and "http://198.18.1.2:8700" in lines[2] and "(2 pairs)" in lines[2]
    path = tmp_path / "mesh.toml"
    path.write_text(mesh_text(hosts))
    for args in (["validate", str(path)], ["mesh", "show", str(path)]):
        out = subprocess.run(
            [sys.executable, "-m", "iepm.cli", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert out.returncode == 0, out.stderr
        assert "control mode" in out.stdout and "http://198.18.1.3:8700" in out.stdout


def test_run_control_needs_a_control_table(tmp_path: Path) -> None:
    path = tmp_path / "mesh.toml"
    text = mesh_text(host_table("h1", "198.18.1.1", "http://198.18.1.1:8700", Path("/c")))
    path.write_text(text.replace("[mesh.control]\n", ""))
    out = subprocess.run(
        [sys.executable, "-m", "iepm.cli", "run", "--mesh", str(path), "--control", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode != 0
    assert "[mesh.control]" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def executor_run(url: str, credential: Path, address: str = "127.0.0.1") -> Any:
    executor = AgentExecutor("h1", AgentAccess(url=url, credential_file=str(credential)))
    module = PROBES["ping"]
    spec = module.Spec.model_validate({"count": 1, "interval_s": 0.2})
    target = TargetConfig.model_validate({"name": "h2", "address": address, "probes": ["ping"]})
    ctx = ProbeContext(target="h2", address=address, monitor="h1")
    return asyncio.run(executor(module, spec, ctx, target))


def test_an_unreachable_agent_is_a_failed_result_saying_so(tmp_path: Path) -> None:
    credential = tmp_path / "c.token"
    credential.write_text(new_token() + "\n")
    result = executor_run(f"http://127.0.0.1:{free_port()}", credential)
    assert result.outcome is Outcome.FAILED
    assert result.monitor == "h1" and result.target == "h2"
    assert "h1's agent could not run ping" in (result.error or "")


def test_refusals_are_failed_results_naming_the_limit(tmp_path: Path) -> None:
    with agents(tmp_path, {"h1": "127.0.0.1"}, lambda _: None, "127.0.0.0/8") as (found, cred):
        # Outside the agent's destinations:
        result = executor_run(found["h1"].url, cred, "198.18.0.9")
        assert result.outcome is Outcome.FAILED
        assert "h1's agent refused ping to h2" in (result.error or "")
        assert "403 limit" in (result.error or "") and "destinations" in (result.error or "")
        # A wrong credential:
        wrong = tmp_path / "wrong.token"
        wrong.write_text(new_token() + "\n")
        result = executor_run(found["h1"].url, wrong)
        assert "401" in (result.error or "") and result.outcome is Outcome.FAILED
        # And one that is allowed runs there:
        result = executor_run(found["h1"].url, cred)
        assert result.succeeded, result.error
        assert result.monitor == "h1" and "on h1's agent h1: finished" in result.diags


# ---------------------------------------------------------------------------------------------
# whole meshes


def run_mesh(
    tmp: Path,
    url: str,
    addresses: dict[str, str],
    netns: Callable[[str], str | None],
    destinations: str,
    control_netns: str | None,
    cycles: int = 2,
) -> dict[str, Any]:
    with agents(tmp, addresses, netns, destinations) as (running, credential):
        hosts = "".join(
            host_table(name, addresses[name], agent.url, credential)
            for name, agent in running.items()
        )
        control = f'netns = "{control_netns}"' if control_netns else ""
        path = tmp / "mesh.toml"
        path.write_text(MESH.format(control=control, url=url, tmp=tmp, hosts=hosts))
        t0 = time.monotonic()
        out = run_control(path, cycles)
        wall_s = time.monotonic() - t0
        assert out.count(" -> ") >= 2 * cycles * len(addresses) * (len(addresses) - 1)
        left = {name: descendants(agent) for name, agent in running.items()}
        assert left == {name: [] for name in running}
        for agent in running.values():
            assert "run " in agent.log_text()
    figures = check_archive(url, list(addresses), cycles)
    check_raw_logs(tmp, url, list(addresses), cycles)
    return {**figures, "wall_s": round(wall_s, 1)}


def test_control_host_runs_a_loopback_mesh_through_agents(tmp_path: Path) -> None:
    """Three agents on loopback addresses; one control process, two cycles of ping + iperf3
    both directions, stored under each source host, no iperf3 tests meeting at a host. On
    SQLite: the same run on PostgreSQL is tests/mesh/test_lab_control.py's."""
    archive_url = f"sqlite:///{tmp_path / 'archive.db'}"
    Archive.open(archive_url).close()
    addresses = {f"h{i}": f"127.0.0.{i + 1}" for i in (1, 2, 3)}
    figures = run_mesh(tmp_path, archive_url, addresses, lambda _: None, "127.0.0.0/8", None)
    print(f"loopback control mesh: {json.dumps(figures)}")


def test_the_commented_example_validates_with_its_agent_tables() -> None:
    from iepm.mesh import load_mesh
    from iepm.remote.trust import load_agent_config_text

    example = REPO / "examples" / "mesh-control.toml"
    loaded = load_mesh(example)
    assert loaded.mesh.mesh.control is not None and len(describe_control(loaded)) == 4
    lines = example.read_text().splitlines()
    start = lines.index("#   [agent]")
    agent = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        agent.append(line[4:].replace('"…"', f'"{token_digest(new_token())}"'))
    config = load_agent_config_text("\n".join(agent))
    runs = config.monitors[0].runs
    assert runs is not None and runs.allows("198.18.3.2") and not runs.allows("192.0.2.1")


def test_the_scheduler_runs_each_probe_through_execute_with_its_overhead_in_the_lease(
    tmp_path: Path,
) -> None:
    """The scheduler's ``execute`` hook: every probe goes through it (none runs here), its
    result is stored, and the host lease and deadline include its ``overhead_s``."""
    from collections.abc import AsyncIterator

    from iepm.config import Config
    from iepm.scheduler import Scheduler

    calls: list[tuple[str, str]] = []
    holds: list[float] = []

    class Elsewhere:
        overhead_s = 40.0

        async def __call__(
            self, module: Any, spec: Any, ctx: ProbeContext, target: TargetConfig
        ) -> Any:
            calls.append((module.NAME, target.name))
            return failed_result(module, spec, ctx, f"ran elsewhere: {module.NAME}")

    @contextlib.asynccontextmanager
    async def lease(target: TargetConfig, probe: str, hold_s: float) -> AsyncIterator[str]:
        holds.append(hold_s)
        yield "[lease]"

    config = Config.model_validate(
        {
            "monitor": {
                "name": "h1",
                "archive": f"sqlite:///{tmp_path}/a.db",
                "log_dir": str(tmp_path / "raw"),
            },
            "targets": [
                {
                    "name": "h2",
                    "address": "127.0.0.1",
                    "probes": ["ping", "iperf3"],
                    "ping_expected": False,
                    "iperf3": {"duration_s": 2},
                }
            ],
        }
    )
    with Archive.open(config.monitor.archive) as archive:
        scheduler = Scheduler(config, archive, watchers=[], host_lease=lease, execute=Elsewhere())
        report = asyncio.run(scheduler.run_cycle())
        stored = sorted((r.probe, r.error) for r in archive.results())
    assert sorted(calls) == [("iperf3", "h2"), ("ping", "h2")]
    assert [r.error for r in report.results] != [] and stored == [
        ("iperf3", "ran elsewhere: iperf3"),
        ("ping", "ran elsewhere: ping"),
    ]
    deadline = PROBES["iperf3"].Spec.model_validate({"duration_s": 2}).deadline_s()
    assert holds == [pytest.approx(deadline + 15.0 + 40.0)]
