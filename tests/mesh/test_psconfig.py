"""``iepm mesh import`` on real pSConfig templates (tests/mesh/psconfig, perfSONAR's, Apache-2.0)
and on small templates written here for the shapes the real ones do not use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iepm.errors import ConfigError
from iepm.mesh import load_mesh_text
from iepm.mesh.psconfig import import_template, iso_seconds

HERE = Path(__file__).resolve().parent
REAL = HERE / "psconfig"
REPO = HERE.parents[1]


def imported(name: str) -> tuple[object, list[str]]:
    result = import_template(REAL / name)
    return load_mesh_text(result.text, name), result.unmapped


def test_example_1_simple_becomes_a_three_host_mesh_with_cycles_from_its_schedules() -> None:
    loaded, unmapped = imported("example-1-simple.json")
    mesh = loaded.mesh  # type: ignore[attr-defined]
    assert [h.address for h in mesh.hosts] == [
        "host-a.perfsonar.net",
        "host-b.perfsonar.net",
        "host-c.perfsonar.net",
    ]
    by_name = {t.name: t for t in mesh.tests}
    assert {n: t.probes for n, t in by_name.items()} == {
        "example-task-throughput": ["iperf3"],
        "example-task-latencybg": ["ping"],
        "example-task-trace": ["traceroute"],
    }
    # PT10M is the shortest repeat: the cycle; PT4H is every 24th cycle.
    assert mesh.monitor["cycle_interval_s"] == 600
    assert by_name["example-task-throughput"].every == 24
    assert by_name["example-task-throughput"].params == {"iperf3": {"duration_s": 30}}
    assert len(loaded.expansion.pairs) == 3 * 6  # type: ignore[attr-defined]
    assert (
        "tasks.example-task-latencybg: latencybg (one-way, OWAMP) measured as round-trip ping"
        in unmapped
    )


def test_example_2_testbed_leaves_out_what_it_cannot_measure_and_says_why() -> None:
    loaded, unmapped = imported("example-2-testbed.json")
    mesh = loaded.mesh  # type: ignore[attr-defined]
    names = mesh.host_names()
    assert "ma-dev2-bldc-grnoc-iu-edu" not in names  # disabled in the template
    assert "addresses.ma-dev2.bldc.grnoc.iu.edu: disabled, left out" in unmapped
    staging = mesh.host("antg-staging-es-net")
    assert staging.addresses == {"default": "antg-staging.es.net", "ipv6": "2001:400:210:151::25"}
    assert staging.site == "ESnet"
    assert [t.name for t in mesh.tests] == ["throughput-tcp-iperf3-v4", "trace-v4", "latencybg-v4"]
    notes = "\n".join(unmapped)
    assert "member 'pstest2.geant.carnet.hr' is not an (enabled) address, left out" in notes
    assert "tasks.throughput-udp-iperf3-v4: iperf3 already runs on 132 of its pairs" in notes
    assert (
        "tasks.throughput-udp-nuttcp-v4.tools: nuttcp not available, measured with iperf3" in notes
    )
    assert "tasks.throughput-tcp-iperf3-v6: disabled, left out" in notes
    assert "test parameter ip-version = 4 not mapped" in notes
    assert 'tasks.trace-v4: test parameter sendwait = "PT30S" not mapped' in notes
    trace = next(t for t in mesh.tests if t.name == "trace-v4")
    assert trace.params == {"traceroute": {"wait_s": 5.0}}
    assert "cycle: " in notes  # 12 one-minute pings outlast a 600 s cycle: said so


def test_example_3_circuits_disjoint_groups_both_ways_and_remote_addresses_noted() -> None:
    loaded, unmapped = imported("example-3-circuits.json")
    mesh = loaded.mesh  # type: ignore[attr-defined]
    throughput = next(t for t in mesh.tests if t.probes == ["iperf3"])
    assert (throughput.shape, throughput.directions) == ("disjoint", "both")
    assert throughput.a[0] == "lsvn-pt1-es-net" and throughput.b[-1] == "cern-513-pt1-es-net"
    pairs = {(p.source, p.destination) for p in loaded.expansion.pairs if p.test == 0}  # type: ignore[attr-defined]
    assert len(pairs) == 2 * 5 * 4
    assert ("ga-pt1-es-net", "lsvn-pt1-es-net") in pairs
    assert any("lsvn-pt1.es.net.remote-addresses: not mapped" in n for n in unmapped)


def test_a_task_repeating_another_on_the_same_pairs_is_left_out() -> None:
    loaded, unmapped = imported("tests-example.json")
    assert [t.name for t in loaded.mesh.tests] == ["throughput_task"]  # type: ignore[attr-defined]
    assert "tasks.latency_task: group 'latency_group' is not defined, left out" in unmapped
    assert any(n.startswith("tasks.throughput_task2: iperf3 already runs on 6") for n in unmapped)


def write(tmp_path: Path, doc: dict[str, object]) -> Path:
    path = tmp_path / "template.json"
    path.write_text(json.dumps(doc))
    return path


ADDRESSES = {
    "a.example.org": {"address": "198.18.0.1"},
    "b.example.org": {"address": "198.18.0.2"},
    "c.example.org": {"address": "198.18.0.3"},
}


def test_unidirectional_disjoint_list_group_and_unknown_types(tmp_path: Path) -> None:
    template = {
        "addresses": ADDRESSES,
        "groups": {
            "one-way": {
                "type": "disjoint",
                "unidirectional": True,
                "a-addresses": [{"name": "a.example.org"}],
                "b-addresses": [{"name": "b.example.org"}, {"name": "c.example.org"}],
            },
            "each": {"type": "list", "addresses": [{"name": "a.example.org"}]},
        },
        "tests": {
            "bw": {
                "type": "throughput",
                "spec": {
                    "source": "{% address[0] %}",
                    "dest": "{% address[1] %}",
                    "parallel": 4,
                    "omit": "PT2S",
                },
            },
            "out": {
                "type": "rtt",
                "spec": {"source": "{% address[0] %}", "dest": "www.example.net", "count": 5},
            },
            "dns": {"type": "dns", "spec": {"query": "example.net"}},
            "web": {"type": "rtt", "spec": {"dest": "http://www.example.net/"}},
        },
        "schedules": {"hourly": {"repeat": "PT1H", "start": "2026-01-01T00:00:00Z"}},
        "tasks": {
            "bw task": {"group": "one-way", "test": "bw", "schedule": "hourly"},
            "to-web": {"group": "each", "test": "out", "schedule": "hourly"},
            "dns-task": {"group": "each", "test": "dns"},
            "url-task": {"group": "each", "test": "web"},
        },
    }
    result = import_template(write(tmp_path, template))
    loaded = load_mesh_text(result.text)
    pairs = {(p.source, p.target, p.test) for p in loaded.expansion.pairs}
    assert pairs == {
        ("a-example-org", "b-example-org", 0),
        ("a-example-org", "c-example-org", 0),
        ("a-example-org", "www-example-net", 1),
    }
    bw = loaded.mesh.tests[0]
    assert bw.name == "bw-task"  # made a valid name
    assert bw.params == {"iperf3": {"streams": 4, "omit_s": 2}}
    assert loaded.mesh.host("www-example-net").address == "www.example.net"
    assert "tasks.dns-task: test type 'dns' has no iepm probe, left out" in result.unmapped
    assert "tasks.url-task: dest 'http://www.example.net/' is not an address, left out" in (
        result.unmapped
    )
    assert "schedules.hourly.start: not mapped (iepm runs in cycles)" in result.unmapped


def test_names_with_line_breaks_cannot_escape_the_comments(tmp_path: Path) -> None:
    template = {
        "addresses": ADDRESSES,
        "groups": {
            "g": {
                "type": "mesh",
                "addresses": [{"name": "a.example.org"}, {"name": "x\n[[hosts]]\nname='evil'"}],
            }
        },
        "tests": {"t": {"type": "rtt", "spec": {}}},
        "tasks": {
            "t": {"group": "g", "test": "t"},
            "u\n[[hosts]]\nname = 'evil'\naddress = '198.18.9.9'": {"group": "none", "test": "t"},
        },
    }
    result = import_template(write(tmp_path, template))
    assert "name = 'evil'" not in result.text.splitlines()
    assert all(h.name != "evil" for h in load_mesh_text(result.text).mesh.hosts)


def test_iso_durations() -> None:
    assert iso_seconds("PT4H") == 14400
    assert iso_seconds("P1DT30M") == 86400 + 1800
    assert iso_seconds("PT0.5S") == 0.5
    with pytest.raises(ValueError, match="not an ISO 8601 duration"):
        iso_seconds("4 hours")


def test_a_template_that_is_not_json_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "addresses": {,\n}')
    with pytest.raises(ConfigError, match=rf"^{path}:2: not a JSON pSConfig template"):
        import_template(path)


def iepm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iepm.cli", *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip


def test_cli_writes_a_mesh_that_validates_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "mesh.toml"
    done = iepm("mesh", "import", str(REAL / "example-1-simple.json"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "imported 3 hosts and 3 tests" in done.stderr
    assert "not mapped: tasks.example-task-latencybg: no schedule" in done.stderr
    checked = iepm("validate", str(out))
    assert checked.returncode == 0, checked.stderr
    assert "3 hosts, 3 tests" in checked.stdout
    again = iepm("mesh", "import", str(REAL / "example-1-simple.json"), "-o", str(out))
    assert again.returncode == 2
    assert f"{out} exists; give --force to overwrite it" in again.stderr
