"""Mesh files: shapes, one host's derived configuration, file:line errors, reload, the CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from iepm.errors import ConfigError
from iepm.mesh import MeshSource, load_mesh, load_mesh_text
from iepm.scheduler import CycleReport, Scheduler
from iepm.store import Archive

REPO = Path(__file__).resolve().parents[2]

HOSTS = """
[[hosts]]
name = "a"
address = "198.18.0.1"
group = "left"
[[hosts]]
name = "b"
addresses = { internet = "198.18.0.2", qos = "198.19.0.2" }
group = "left"
[[hosts]]
name = "c"
address = "198.18.0.3"
[[hosts]]
name = "d"
address = "198.18.0.4"
"""


def pairs(text: str) -> set[tuple[str, str]]:
    return {(p.source, p.target) for p in load_mesh_text(HOSTS + text).expansion.pairs}


def test_full_mesh_both_directions_is_every_ordered_pair() -> None:
    got = pairs('[[tests]]\nname = "t"\nprobes = ["ping"]\n')
    hosts = "abcd"
    assert got == {(x, y) for x in hosts for y in hosts if x != y}


@pytest.mark.parametrize(
    ("directions", "expected"),
    [
        ("forward", {("a", "b"), ("a", "c"), ("b", "c")}),
        ("reverse", {("b", "a"), ("c", "a"), ("c", "b")}),
    ],
)
def test_one_direction_of_a_mesh_follows_the_members_order(
    directions: str, expected: set[tuple[str, str]]
) -> None:
    text = '[[tests]]\nname = "t"\nprobes = ["ping"]\nmembers = ["a", "b", "c"]\n'
    text += f'directions = "{directions}"\n'
    assert pairs(text) == expected


def test_disjoint_is_a_cross_b_and_groups_expand() -> None:
    text = '[groups]\nright = ["c", "d"]\n[[tests]]\nname = "t"\nprobes = ["ping"]\n'
    text += 'shape = "disjoint"\na = ["left"]\nb = ["right"]\ndirections = "forward"\n'
    assert pairs(text) == {("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")}


def test_star_both_ways_from_its_center() -> None:
    text = '[[tests]]\nname = "t"\nprobes = ["ping"]\nshape = "star"\ncenter = "c"\n'
    assert pairs(text) == {(x, y) for h in "abd" for x, y in (("c", h), (h, "c"))}


def test_via_makes_one_target_per_route_and_a_single_address_serves_every_route() -> None:
    loaded = load_mesh_text(
        HOSTS + '[[tests]]\nname = "t"\nprobes = ["iperf3"]\nvia = ["qos", "internet"]\n'
        "[tests.iperf3]\nstreams = 4\n"
    )
    config = loaded.config_for("a")
    by_name = {t.name: t for t in config.targets}
    assert set(by_name) == {"b.qos", "b.internet", "c", "d"}
    assert by_name["b.qos"].address == "198.19.0.2"
    assert by_name["b.internet"].address == "198.18.0.2"
    assert config.spec_for(by_name["b.qos"], "iperf3").streams == 4  # type: ignore[attr-defined]
    assert config.monitor.name == "a"


def test_derived_target_carries_the_destinations_access_mode_and_site() -> None:
    text = """
[monitor]
cycle_interval_s = 600
log_dir = "/tmp/iepm-{host}"
[[hosts]]
name = "m"
address = "198.18.0.1"
[hosts.monitor]
netns = "lab-m"
[[hosts]]
name = "t"
address = "198.18.0.2"
site = "CERN"
mode = "ssh"
ping_expected = false
[hosts.ssh]
user = "iepm"
key_file = "/k"
[[tests]]
name = "x"
probes = ["ping", "iperf3"]
shape = "star"
center = "m"
directions = "forward"
"""
    loaded = load_mesh_text(text)
    config = loaded.config_for("m")
    (target,) = config.targets
    assert (target.name, target.mode, target.site, target.ping_expected) == (
        "t",
        "ssh",
        "CERN",
        False,
    )
    assert target.ssh is not None and target.ssh.user == "iepm"
    assert config.monitor.netns == "lab-m" and config.monitor.log_dir == "/tmp/iepm-m"
    assert config.monitor.cycle_interval_s == 600
    assert loaded.config_for("t").targets == []  # forward star: t measures nothing


def test_every_n_cycles_schedules_a_test_in_its_cycles_only() -> None:
    loaded = load_mesh_text(
        HOSTS
        + '[[tests]]\nname = "p"\nprobes = ["ping"]\n'
        + '[[tests]]\nname = "bw"\nprobes = ["iperf3"]\nevery = 3\n'
    )
    probes = [
        {t.name: tuple(t.probes) for t in loaded.config_for("a", cycle).targets}["c"]
        for cycle in range(1, 8)
    ]
    with_bw = [i + 1 for i, p in enumerate(probes) if "iperf3" in p]
    assert with_bw == [1, 4, 7]
    assert all("ping" in p for p in probes)


BAD = [
    (
        '[[tests]]\nname = "t"\nprobes = ["ping"]\nmembers = ["europa"]\n',
        ":19: tests[0].members: 'europa' is neither a host nor a group",
    ),
    (
        '[[tests]]\nname = "t"\nprobes = ["iperf3"]\n[tests.iperf3]\nstreams = 500\n',
        ":20: tests[0].iperf3.streams: Input should be less than or equal to 128 (got 500)",
    ),
    (
        '[[tests]]\nname = "t"\nprobes = ["ping"]\nshape = "disjoint"\na = ["a"]\n',
        ":16: tests[0]: shape = 'disjoint' needs b",
    ),
    (
        '[[tests]]\nname = "t"\nprobes = ["pong"]\n',
        ":18: tests[0].probes: unknown probe 'pong'",
    ),
    (
        '[[tests]]\nname = "t"\nprobes = ["ping"]\n[[tests]]\nname = "u"\nprobes = ["ping"]\n'
        'members = ["a", "c"]\n',
        ":21: tests[1].probes: ping from a to c is already in test 't'",
    ),
    (
        '[[hosts]]\nname = "a.b"\naddress = "198.18.0.9"\n',
        ":17: hosts[4].name: host names are 1-48 letters",
    ),
    (
        '[[hosts]]\nname = "e"\n',
        ":16: hosts[4]: give either address or addresses",
    ),
    (
        '[[hosts]]\nname = "a"\naddress = "198.18.0.9"\n',
        ":17: hosts[4].name: duplicate host name 'a'",
    ),
    (
        '[[tests]]\nname = "t"\nprobes = ["ping"]\n[tests.iperf3]\nstreams = 2\n',
        ":16: tests[0]: [tests.iperf3] is given but iperf3 is not in probes",
    ),
    (
        '[defaults.iperf3]\nduration_s = 5000\n[[tests]]\nname = "t"\nprobes = ["iperf3"]\n',
        ":17: defaults.iperf3.duration_s: Input should be less than or equal to",
    ),
    (
        '[[tests]]\nname = "t"\nprobes = ["iperf3"]\niperf3 = 5\n',
        ":19: tests[0].iperf3: Input should be a valid dictionary",
    ),
    (
        '[[tests]]\nname = "t"\nprobes = ["ping"]\nparams = {}\n',
        ":16: tests[0]: params: unknown field",
    ),
    (
        "[monitor]\ncycle_interval_s = 0\n",
        ":17: monitor.cycle_interval_s: Input should be greater than or equal to 1",
    ),
]


@pytest.mark.parametrize(("tail", "expected"), BAD)
def test_bad_mesh_names_file_line_and_field(tmp_path: Path, tail: str, expected: str) -> None:
    path = tmp_path / "mesh.toml"
    path.write_text(HOSTS + tail)
    with pytest.raises(ConfigError) as caught:
        load_mesh(path)
    assert f"{path}{expected}" in str(caught.value)


def test_unknown_host_is_refused_with_the_hosts_named(tmp_path: Path) -> None:
    path = tmp_path / "mesh.toml"
    path.write_text(HOSTS)
    with pytest.raises(ConfigError, match=r"no host named 'z' \(hosts: a, b, c, d\)"):
        MeshSource(path, "z")


def test_a_changed_file_is_picked_up_and_an_invalid_edit_keeps_the_last_good(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mesh.toml"
    path.write_text(HOSTS + '[[tests]]\nname = "t"\nprobes = ["ping"]\nmembers = ["a", "c"]\n')
    source = MeshSource(path, "a")
    assert [t.name for t in source(1).targets] == ["c"]
    path.write_text(HOSTS + '[[tests]]\nname = "t"\nprobes = ["ping"]\nmembers = ["a", "d"]\n')
    assert [t.name for t in source(2).targets] == ["d"]
    path.write_text(HOSTS + '[[tests]]\nname = "t"\nprobes = ["ping"]\nmembers = ["zz"]\n')
    assert [t.name for t in source(3).targets] == ["d"]
    assert [t.name for t in source(4).targets] == ["d"]
    assert (source.reloads, source.rejected) == (1, 1)  # the bad edit is reported once
    assert f"{path}:19: tests[0].members: 'zz' is neither a host nor a group" in caplog.text


def test_scheduler_runs_the_edited_mesh_in_its_next_cycle(tmp_path: Path) -> None:
    """A running monitor (no restart) measures the new target from the cycle after the edit."""

    def mesh(target: str) -> str:
        return f"""
[monitor]
cycle_interval_s = 60
archive = "sqlite:///{tmp_path}/archive.db"
log_dir = "{tmp_path}/raw"
[defaults.ping]
count = 1
interval_s = 0.2
[[hosts]]
name = "me"
address = "127.0.0.1"
[[hosts]]
name = "one"
address = "127.0.0.1"
[[hosts]]
name = "two"
address = "127.0.0.2"
[[tests]]
name = "t"
probes = ["ping"]
shape = "star"
center = "me"
members = ["{target}"]
directions = "forward"
"""

    path = tmp_path / "mesh.toml"
    path.write_text(mesh("one"))
    source = MeshSource(path, "me")
    seen: list[list[str]] = []

    def on_cycle(report: CycleReport) -> None:
        seen.append(sorted(r.target for r in report.results))
        path.write_text(mesh("two"))

    async def two_cycles(scheduler: Scheduler) -> None:
        for _ in range(2):  # run_cycle, not run(): no waiting out the interval in a test
            on_cycle(await scheduler.run_cycle())

    with Archive.open(f"sqlite:///{tmp_path}/archive.db") as archive:
        scheduler = Scheduler(source(1), archive, watchers=[], configure=source)
        asyncio.run(two_cycles(scheduler))
        assert seen == [["one"], ["two"]]
        stored = {(r.monitor, r.target, r.succeeded) for r in archive.results(probe="ping")}
    assert stored == {("me", "one", True), ("me", "two", True)}


def iepm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iepm.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )


def test_validate_recognises_the_example_mesh_and_reports_a_bad_one(tmp_path: Path) -> None:
    done = iepm("validate", "examples/mesh.toml")
    assert done.returncode == 0, done.stderr
    assert "mesh rtpl-demo, 4 hosts, 4 tests" in done.stdout
    bad = tmp_path / "mesh.toml"
    bad.write_text(HOSTS + '[[tests]]\nname = "t"\nprobes = ["ping"]\nmembers = ["europa"]\n')
    done = iepm("validate", str(bad))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: {bad}:19: tests[0].members: 'europa' is neither a host nor a group"
    )


def test_run_needs_config_or_mesh_with_as(tmp_path: Path) -> None:
    done = iepm("run", "--mesh", "examples/mesh.toml")
    assert done.returncode == 2
    assert "give either --config FILE or --mesh FILE --as HOST" in done.stderr


def test_iepm_run_as_one_host_of_a_mesh_stores_its_pairs(tmp_path: Path) -> None:
    path = tmp_path / "mesh.toml"
    path.write_text(f"""
[monitor]
cycle_interval_s = 60
archive = "sqlite:///{tmp_path}/archive.db"
log_dir = "{tmp_path}/raw/{{host}}"
[defaults.ping]
count = 1
interval_s = 0.2
[[hosts]]
name = "x"
address = "127.0.0.1"
[[hosts]]
name = "y"
address = "127.0.0.2"
[[tests]]
name = "t"
probes = ["ping"]
""")
    done = iepm("run", "--mesh", str(path), "--as", "y", "--once", "--no-live")
    assert done.returncode == 0, done.stderr
    with Archive.open(f"sqlite:///{tmp_path}/archive.db") as archive:
        stored = [(r.monitor, r.target, r.target_address) for r in archive.results()]
    assert stored == [("y", "x", "127.0.0.1")]
    assert (tmp_path / "raw" / "y").is_dir()
