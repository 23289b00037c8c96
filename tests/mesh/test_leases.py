"""Host leases in the archive (SQLite and a real PostgreSQL): all-or-nothing, released, expired
after a crash, refused as a skipped result; and monitors of one mesh writing to one PostgreSQL
archive never run two bandwidth tests at one host at once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from iepm.config import TargetConfig
from iepm.mesh.leases import HostLeases, LeaseRefused
from iepm.store import Archive
from testkit.net import iperf3_server, stop

# Real iperf3 servers and PostgreSQL; the lab tests are marked lab as well.
pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(archive_url: str) -> str:
    Archive.open(archive_url).close()  # migrated, host_leases included
    return archive_url


def leases(url: str, holder: str, wait_s: float = 0.0) -> HostLeases:
    return HostLeases(
        url, holder, lambda t: t.partition(".")[0], wait_s=wait_s, rng=random.Random(7)
    )


def target(name: str) -> TargetConfig:
    return TargetConfig(name=name, address="198.18.0.9")


def test_a_lease_is_all_or_nothing_and_free_again_when_released(url: str) -> None:
    a, b = leases(url, "a"), leases(url, "b")
    try:
        token = a.take(["a", "x"], "x", "iperf3", 60)
        assert token is not None
        assert b.take(["b", "x"], "x", "iperf3", 60) is None
        # The refused take held nothing: b is still free for anyone.
        other = leases(url, "c")
        assert other.take(["b"], "b", "iperf3", 60) is not None
        assert a.holders(["x", "y"]) == [("x", "a", "x")]
        a.release(token)
        assert b.take(["x"], "x", "iperf3", 60) is not None
        other.close()
    finally:
        a.close()
        b.close()


def test_an_expired_lease_is_taken_over(url: str) -> None:
    crashed, live = leases(url, "crashed"), leases(url, "live")
    try:
        assert crashed.take(["x"], "x", "iperf3", -1.0) is not None  # its expiry is past
        assert live.take(["x"], "x", "iperf3", 60) is not None
        assert live.holders(["x"]) == [("x", "live", "x")]
    finally:
        crashed.close()
        live.close()


def test_hosts_busy_past_the_wait_are_refused_naming_the_holder(url: str) -> None:
    holder, waiter = leases(url, "a"), leases(url, "b", wait_s=0.5)

    async def attempt() -> None:
        async with waiter(target("x.qos"), "iperf3", 10):
            raise AssertionError("the lease should have been refused")

    try:
        assert holder.take(["x"], "x.qos", "iperf3", 60) is not None
        with pytest.raises(LeaseRefused, match=r"hosts b, x stayed busy for 0.5 s; x held by a"):
            asyncio.run(attempt())
        assert waiter.refused == 1
    finally:
        holder.close()
        waiter.close()


def test_a_waiting_test_gets_the_hosts_when_the_holder_releases(url: str) -> None:
    holder, waiter = leases(url, "a"), leases(url, "b", wait_s=30)
    token = holder.take(["x"], "x", "iperf3", 60)
    assert token is not None

    async def scenario() -> str:
        async def take() -> str:
            async with waiter(target("x"), "iperf3", 10) as note:
                return note

        task = asyncio.create_task(take())
        while waiter.busy == 0:  # until the waiter has found x leased
            await asyncio.sleep(0.02)
        await asyncio.to_thread(holder.release, token)
        return await task

    try:
        note = asyncio.run(scenario())
        assert note.startswith("[host lease on b, x: waited ")
        assert waiter.holders(["b", "x"]) == []  # released after the body
    finally:
        holder.close()
        waiter.close()


def test_a_killed_monitors_lease_outlives_it_only_until_its_expiry(url: str) -> None:
    """kill -9 while holding: the row stays until its expiry, then another monitor takes it."""
    code = (
        "import sys, time, random\n"
        "from iepm.mesh.leases import HostLeases\n"
        "l = HostLeases(sys.argv[1], 'doomed', str, wait_s=0)\n"
        "assert l.take(['doomed', 'x'], 'x', 'iperf3', 3.0)\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    waiter = leases(url, "b", wait_s=30)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert waiter.take(["x"], "x", "iperf3", 60) is None  # still held after the crash
        t0 = time.monotonic()

        async def take() -> None:
            async with waiter(target("x"), "iperf3", 10):
                pass

        asyncio.run(take())
        assert time.monotonic() - t0 < 3.0 + 6.0  # within its expiry, plus polling slack
        assert waiter.holders(["doomed", "x"]) == []  # the expired row was removed
    finally:
        stop(proc)
        waiter.close()


MESH = """
[mesh]
name = "lease-test"
lease_wait_s = 120
leases = {leases}

[monitor]
cycle_interval_s = 300
archive = "{url}"
log_dir = "{tmp}/raw/{{host}}"

[defaults.ping]
count = 1
interval_s = 0.2

[defaults.traceroute]
max_hops = 3
wait_s = 0.5

[defaults.iperf3]
port = {port}
duration_s = 1
{hosts}
[[tests]]
name = "all"
probes = ["ping", "traceroute", "iperf3"]
"""


HOSTS = 6


def archive_results(url: str, probe: str) -> list[Any]:
    with Archive.open(url) as archive:
        return list(archive.results(probe=probe))


@contextlib.contextmanager
def servers(addresses: list[str], port: int) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for address in addresses:
            stack.enter_context(iperf3_server(address, port))
        yield


def run_mesh_and_check(db: str, path: Path, n: int) -> dict[str, float]:
    """Run ``iepm run --mesh path --as hI --once`` for every host at once; check every pair was
    measured by every probe, every iperf3 test succeeded and none shared a host in time.
    Returns figures for the report (tests, wall time)."""
    procs: list[subprocess.Popen[str]] = []
    t0 = time.monotonic()
    try:
        for i in range(1, n + 1):
            argv = ["run", "--mesh", str(path), "--as", f"h{i}", "--once", "--no-live"]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "iepm.cli", *argv],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env={**os.environ, "PYTHONPATH": str(REPO)},
                    start_new_session=True,
                )
            )
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            stop(p)  # type: ignore[arg-type]
    wall_s = time.monotonic() - t0
    assert all(p.returncode == 0 for p in procs), outputs
    pairs = {(f"h{i}", f"h{j}") for i in range(1, n + 1) for j in range(1, n + 1) if i != j}
    runs = archive_results(db, "iperf3")
    assert sorted((r.monitor, r.target) for r in runs) == sorted(pairs)
    assert {(r.monitor, r.target) for r in archive_results(db, "ping")} == pairs
    assert {(r.monitor, r.target) for r in archive_results(db, "traceroute")} == pairs
    failed = [(r.monitor, r.target, r.error) for r in runs if not r.succeeded]
    assert failed == []
    assert all("[host lease on " in (r.diags or "") for r in runs)
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
    return {"iperf3_tests": len(runs), "wall_s": wall_s}


@pytest.mark.pg
def test_monitors_of_a_mesh_never_meet_at_a_host(pg_server: Any, tmp_path: Path) -> None:
    """Six `iepm run` processes, one PostgreSQL archive, a full two-way mesh (ping, traceroute,
    iperf3) on loopback addresses: every pair measured, every iperf3 test succeeds (a server
    refuses a second client, so an overlap would fail too), no two share a host in time."""
    from testkit.net import free_port

    name = f"iepm_mesh_{os.getpid()}"
    db = pg_server.create_database(name)
    try:
        Archive.open(db).close()
        addresses = [f"127.0.0.{i}" for i in range(1, HOSTS + 1)]
        hosts = "".join(
            f'\n[[hosts]]\nname = "h{i}"\naddress = "{a}"\n' for i, a in enumerate(addresses, 1)
        )
        port = free_port()
        path = tmp_path / "mesh.toml"
        path.write_text(MESH.format(url=db, tmp=tmp_path, port=port, hosts=hosts, leases="true"))
        with servers(addresses, port):
            print(f"loopback mesh: {run_mesh_and_check(db, path, HOSTS)}")
    finally:
        pg_server.drop_database(name)


@pytest.mark.pg
@pytest.mark.lab
def test_lab_mesh_of_six_hosts_never_meets_at_a_host(
    pg_server: Any, lab_factory: Any, tmp_path: Path
) -> None:
    """The same in the WAN lab: six hosts in their own network namespaces behind one router
    (2-12 ms, 100 Mbit/s), each host's probes run in its namespace, one PostgreSQL archive."""
    topology = {
        "lab": {"name": "x", "seed": 3},
        "hosts": [{"name": "core", "role": "router"}]
        + [{"name": f"h{i}", "role": "target"} for i in range(1, HOSTS + 1)],
        "links": [
            {"name": f"l{i}", "a": "core", "b": f"h{i}", "delay_ms": 2 * i, "rate_mbit": 100}
            for i in range(1, HOSTS + 1)
        ],
    }
    lab = lab_factory(topology, prefix="mesh")
    servers = [
        lab.popen(f"h{i}", ["iperf3", "-s", "-B", lab.address(f"h{i}")])
        for i in range(1, HOSTS + 1)
    ]
    name = f"iepm_labmesh_{os.getpid()}"
    db = pg_server.create_database(name)
    try:
        for i in range(1, HOSTS + 1):
            lab.wait_listening(f"h{i}")
        Archive.open(db).close()
        hosts = "".join(
            f'\n[[hosts]]\nname = "h{i}"\naddress = "{lab.address(f"h{i}")}"\n'
            f'[hosts.monitor]\nnetns = "{lab.netns(f"h{i}")}"\n'
            for i in range(1, HOSTS + 1)
        )
        path = tmp_path / "mesh.toml"
        path.write_text(MESH.format(url=db, tmp=tmp_path, port=5201, hosts=hosts, leases="true"))
        print(f"lab mesh: {run_mesh_and_check(db, path, HOSTS)}")
    finally:
        for server in servers:
            lab.stop(server)
        pg_server.drop_database(name)


def test_mesh_leases_lists_who_holds_which_host(url: str, tmp_path: Path) -> None:
    path = tmp_path / "mesh.toml"
    path.write_text(
        f'[monitor]\narchive = "{url}"\nlog_dir = "{tmp_path}"\n'
        '[[hosts]]\nname = "a"\naddress = "198.18.0.1"\n'
        '[[hosts]]\nname = "x"\naddress = "198.18.0.2"\n'
    )
    holder = leases(url, "a")
    try:
        assert holder.take(["a", "x"], "x.qos", "iperf3", 60) is not None
        done = subprocess.run(
            [sys.executable, "-m", "iepm.cli", "mesh", "leases", str(path), "--as", "x"],
            capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
        )  # fmt: skip
    finally:
        holder.close()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "2 host leases held"
    pattern = r"x +held by a +testing iperf3 to x\.qos \((\d+) s left\)"
    match = re.fullmatch(pattern, lines[2].strip())
    assert match is not None and 0 < int(match[1]) <= 60


@pytest.mark.pg
def test_iepm_run_killed_mid_test_leaves_no_lease_after_its_expiry(
    pg_server: Any, tmp_path: Path
) -> None:
    """kill -9 of a real `iepm run` while its iperf3 test holds the hosts: the rows stay (the
    monitor could not release them), then expire on their own and another monitor gets them."""
    from testkit.net import free_port

    name = f"iepm_kill_{os.getpid()}"
    db = pg_server.create_database(name)
    Archive.open(db).close()
    port = free_port()
    hosts = '\n[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\n'
    hosts += '\n[[hosts]]\nname = "h2"\naddress = "127.0.0.2"\n'
    path = tmp_path / "mesh.toml"
    text = MESH.format(url=db, tmp=tmp_path, port=port, hosts=hosts, leases="true")
    path.write_text(text.replace("duration_s = 1", "duration_s = 20"))
    watcher = leases(db, "h2", wait_s=120)
    proc = None
    try:
        with servers(["127.0.0.2"], port):
            proc = subprocess.Popen(
                [sys.executable, "-m", "iepm.cli", "run", "--mesh", str(path), "--as", "h1",
                 "--once", "--no-live"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            held: list[tuple[str, str, str, str, float]] = []
            while not held and time.monotonic() < deadline and proc.poll() is None:
                held = watcher.current()
                time.sleep(0.1)  # polling the archive for the lease row, not a fixed wait
            assert [h[:2] for h in held] == [("h1", "h1"), ("h2", "h1")]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            left = held[0][4]
            assert [h[:2] for h in watcher.current()] == [("h1", "h1"), ("h2", "h1")]
            t0 = time.monotonic()

            async def take() -> None:
                async with watcher(target("h1"), "iperf3", 10):
                    assert [h[1] for h in watcher.current()] == ["h2", "h2"]

            asyncio.run(take())
            assert time.monotonic() - t0 < left + 6.0  # expiry plus polling slack
        assert watcher.current() == []  # released: nothing is left behind
    finally:
        if proc is not None:
            stop(proc)  # type: ignore[arg-type]
        watcher.close()
        pg_server.drop_database(name)


def test_held_leases_are_on_metrics_until_released(url: str) -> None:
    from iepm.web.metrics import metrics_text
    from iepm.web.queries import Queries

    holder = leases(url, "mon-a")
    queries = Queries(url, cache_ttl_s=0.0)
    try:
        token = holder.take(["a", "x"], "x", "iperf3", 60)
        assert token is not None
        text = metrics_text(queries, None)[0].decode()
        held = re.findall(
            r'^iepm_host_lease_seconds_left\{holder="mon-a",host="(\w+)",probe="iperf3"\} (\S+)$',
            text,
            re.M,
        )
        assert sorted(h for h, _ in held) == ["a", "x"]
        assert all(0 < float(left) <= 60 for _, left in held)
        holder.release(token)
        queries.close()
        queries = Queries(url, cache_ttl_s=0.0)
        assert "iepm_host_lease_seconds_left{" not in metrics_text(queries, None)[0].decode()
    finally:
        queries.close()
        holder.close()
