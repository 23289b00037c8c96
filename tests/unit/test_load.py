"""The load probe: host facts from a procfs/sysfs snapshot, recorded fixtures and real runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from iepm.errors import ParseError, ToolFailed
from iepm.probes import load
from iepm.probes.base import ProbeContext
from iepm.rawlog import RawLog
from iepm.results import Outcome
from iepm.runner import RawRun

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "load"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def snapshot_raw(files: dict[str, str], errors: dict[str, str] | None = None) -> RawRun:
    doc = {"snapshot": 1, "files": files, "errors": errors or {}}
    return RawRun(argv=("python", "-c", "…"), stdout=json.dumps(doc))


def host_files() -> dict[str, str]:
    files: dict[str, str] = json.loads((FIXTURES / "procfs--host.out").read_text())["files"]
    return files


@pytest.mark.parametrize("case", CASES)
def test_recorded_snapshots_parse_to_the_reviewed_oracle(case: str) -> None:
    expected = json.loads((FIXTURES / f"{case}.json").read_text())
    raw = RawRun(
        argv=tuple(shlex.split(expected["command"])),
        stdout=(FIXTURES / f"{case}.out").read_text(),
    )
    data = load.parse(raw)
    assert data == expected["data"]
    assert load.check(data, load.Spec()) is None


def test_snapshot_in_a_namespace_keeps_per_namespace_sysctls() -> None:
    data = json.loads((FIXTURES / "procfs--netns-reno.json").read_text())["data"]
    assert data["tcp_congestion_control"] == "reno"
    assert data["tcp_rmem_bytes"] == [4096, 87380, 6291456]
    assert list(data["nics"]) == ["lo"]


def test_unreadable_nic_speed_and_minus_one_are_none() -> None:
    files = host_files()
    files["/sys/class/net/eth0/speed"] = "10000\n"
    files["/sys/class/net/eth1/speed"] = "-1\n"
    data = load.parse(snapshot_raw(files, {"/sys/class/net/lo/speed": "Invalid argument"}))
    assert data["nics"]["eth0"]["speed_mbps"] == 10000
    assert data["nics"]["eth1"] == {"speed_mbps": None, "mtu_bytes": None, "operstate": None}
    assert data["nics"]["lo"]["speed_mbps"] is None
    assert data["unreadable"] == {"/sys/class/net/lo/speed": "Invalid argument"}


def test_arm_style_cpuinfo_falls_back_to_cpufreq_and_the_online_list() -> None:
    # arm64 /proc/cpuinfo has neither "cpu MHz" nor "processor :" lines.
    files = {
        load.LOADAVG: "3.50 2.00 1.00 2/300 999\n",
        load.CPUINFO: "CPU implementer\t: 0x41\nCPU part\t: 0xd0c\n",
        load.CPU_ONLINE: "0-3,8-11\n",
        load.CPUFREQ_CUR: "2100000\n",
    }
    data = load.parse(snapshot_raw(files))
    assert data["cpu_count"] == 8
    assert data["cpu_mhz"] == 2100.0
    assert data["cpu_model"] is None
    assert (data["load_avg_1m"], data["load_avg_5m"], data["load_avg_15m"]) == (3.5, 2.0, 1.0)


def test_missing_files_give_none_not_failure() -> None:
    data = load.parse(snapshot_raw({load.LOADAVG: "0.10 0.20 0.30 1/2 3\n"}))
    assert data["load_avg_1m"] == 0.1
    for key in ("cpu_count", "cpu_mhz", "kernel_release", "tcp_rmem_bytes", "rmem_max_bytes"):
        assert data[key] is None, key
    assert data["nics"] == {}
    assert load.check(data, load.Spec()) is None


def test_an_integer_no_kernel_writes_is_none_not_a_traceback() -> None:
    # int() raises on more than 4,300 digits; a kernel integer has at most 20.
    huge = "9" * 5000
    files = {
        load.LOADAVG: f"{huge} 0.2 0.3 1/2 3\n",
        load.MEMINFO: f"MemTotal: {huge} kB\nMemAvailable: 1_000 kB\n",
        load.RMEM_MAX: huge + "\n",
        load.WMEM_MAX: "\u0661\u0662\n",  # Arabic-Indic digits: int() would take them
        load.TCP_RMEM: f"4096 {huge} 6291456\n",
        load.CPU_ONLINE: f"0-{huge}\n",
        load.CPUFREQ_CUR: huge,
        "/sys/class/net/eth0/speed": huge,
    }
    data = load.parse(snapshot_raw(files))
    for key in (
        "load_avg_1m",
        "memory_total_bytes",
        "memory_available_bytes",
        "rmem_max_bytes",
        "wmem_max_bytes",
        "tcp_rmem_bytes",
        "cpu_count",
        "cpu_mhz",
    ):
        assert data[key] is None, key
    assert data["nics"]["eth0"]["speed_mbps"] is None
    assert data["load_avg_5m"] == 0.2


def test_without_the_load_average_the_run_fails_with_the_reason() -> None:
    data = load.parse(snapshot_raw({}, {load.LOADAVG: "Permission denied"}))
    assert load.check(data, load.Spec()) == (
        "could not read the load average from /proc/loadavg: Permission denied"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cpu MHz\t\t: 2000.000\ncpu MHz\t\t: 3000.000\n", 2500.0),
        ("cpu MHz : 0\n", None),
        ("model name : x\n", None),
        ("cpu MHz : fast\ncpu MHz : 1200.5\n", 1200.5),
    ],
)
def test_cpu_mhz_from_cpuinfo(text: str, expected: float | None) -> None:
    assert load.cpu_mhz_from_cpuinfo(text) == expected


def test_local_cpu_mhz_matches_this_host() -> None:
    mhz = load.local_cpu_mhz()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    if "cpu MHz" in cpuinfo:
        assert mhz == load.cpu_mhz_from_cpuinfo(cpuinfo)
    assert mhz is None or mhz > 0


@pytest.mark.parametrize("stdout", ["", "not json", "[1, 2]", '{"files": []}', "[" * 100000])
def test_output_that_is_not_a_snapshot_is_rejected(stdout: str) -> None:
    with pytest.raises((ParseError, ToolFailed)):
        load.parse(RawRun(argv=("python",), stdout=stdout))


def test_spec_rejects_unknown_fields_and_out_of_range_timeouts() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        load.Spec.model_validate({"count": 3})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        load.Spec(timeout_s=0.1)


def test_argv_is_one_line_so_the_raw_log_keeps_it_intact() -> None:
    command = shlex.join(load.build_argv(load.Spec(), "ignored"))
    assert "\n" not in command


json_text = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
).map(json.dumps)
file_paths = st.sampled_from([*load.SNAPSHOT_PATHS[:13], "/sys/class/net/x/speed", "/x"])


@settings(max_examples=300, deadline=None)
@given(
    stdout=st.one_of(
        st.text(max_size=200),
        json_text,
        st.builds(
            lambda f, e: json.dumps({"files": f, "errors": e}),
            st.dictionaries(file_paths, st.text(max_size=60)),
            st.dictionaries(file_paths, st.one_of(st.text(max_size=10), st.integers())),
        ),
    )
)
def test_any_output_parses_or_raises_parse_error(stdout: str) -> None:
    try:
        data = load.parse(RawRun(argv=("python",), stdout=stdout))
    except (ParseError, ToolFailed):
        return
    load.check(data, load.Spec())


@pytest.mark.servers
def test_real_run_describes_this_host(tmp_path: Path) -> None:
    log = RawLog(tmp_path)
    ctx = ProbeContext(target="monitor-1", address="127.0.0.1", raw_log=log)
    result = asyncio.run(load.run(load.Spec(), ctx))
    assert result.succeeded, result.error
    assert (result.probe, result.tool, result.target) == ("load", "procfs", "monitor-1")
    assert result.data["cpu_count"] == os.cpu_count()
    assert result.data["load_avg_1m"] is not None
    assert result.data["kernel_release"] == os.uname().release
    assert result.data["cpu_mhz"] == pytest.approx(load.local_cpu_mhz(), rel=0.5)
    assert "-I -S -c" in result.diags
    # Re-extraction from the raw log gives the same facts.
    (logged,) = list(log.runs())
    assert load.parse(logged.raw) == result.data


@contextlib.contextmanager
def netns() -> Iterator[str]:
    name = f"iepm-t-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, timeout=10)
    if made.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {made.stderr.decode().strip()}")
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


@pytest.mark.lab
def test_real_run_inside_a_namespace_reads_that_namespace() -> None:
    with netns() as name:
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                name,
                "sysctl",
                "-q",
                "-w",
                "net.ipv4.tcp_congestion_control=reno",
            ],
            check=True,
            timeout=10,
        )
        ctx = ProbeContext(target="lab-mon", address="127.0.0.1", netns=name)
        result = asyncio.run(load.run(load.Spec(), ctx))
    assert result.outcome is Outcome.OK, result.error
    assert result.data["tcp_congestion_control"] == "reno"
    assert list(result.data["nics"]) == ["lo"]
    assert result.diags.startswith(f"ip netns exec {name} ")


def test_a_missing_netns_is_a_failed_result_not_an_exception() -> None:
    ctx = ProbeContext(target="lab-mon", address="127.0.0.1", netns="iepm-no-such-ns")
    result: Any = asyncio.run(load.run(load.Spec(), ctx))
    assert not result.succeeded
    assert result.error == (
        "the load snapshot printed nothing (exit 255): "
        'Cannot open network namespace "iepm-no-such-ns": No such file or directory'
    )
    assert "ip netns exec iepm-no-such-ns" in result.diags
