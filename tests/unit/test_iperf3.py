"""The iperf3 probe: spec checks, argv, recorded 3.12 reports, fuzzing, real loopback runs."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from iepm.errors import ParseError, ToolFailed
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.rawlog import RawLog
from iepm.runner import RawRun
from testkit.net import free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "iperf3"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))
HOST = "127.0.0.1"


def fixture_raw(case: str) -> RawRun:
    command = json.loads((FIXTURES / f"{case}.json").read_text())["command"]
    return RawRun(argv=tuple(shlex.split(command)), stdout=(FIXTURES / f"{case}.out").read_text())


def fixture_doc(case: str) -> dict[str, Any]:
    # iperf3's report; an early-stopped record has the samples line after it.
    doc: dict[str, Any] = json.JSONDecoder().raw_decode((FIXTURES / f"{case}.out").read_text())[0]
    return doc


def with_doc(case: str, doc: Any) -> RawRun:
    return RawRun(argv=fixture_raw(case).argv, stdout=json.dumps(doc))


# --- recorded outputs ---------------------------------------------------------------------------


def test_every_recorded_case_has_its_oracle() -> None:
    outs = sorted(p.stem for p in FIXTURES.glob("*.out"))
    assert outs == CASES
    assert len(CASES) >= 10


@pytest.mark.parametrize("case", CASES)
def test_recorded_outputs_parse_to_the_reviewed_oracle(case: str) -> None:
    expected = json.loads((FIXTURES / f"{case}.json").read_text())
    raw = fixture_raw(case)
    if "data" in expected:
        data = iperf3.parse(raw)
        assert data == expected["data"]
        problem = iperf3.check(data, iperf3.Spec())
        assert problem == (None if data["complete"] else data["tool_error"])
    else:
        error = {"ToolFailed": ToolFailed, "ParseError": ParseError}[expected["raises"]]
        with pytest.raises(error) as caught:
            iperf3.parse(raw)
        assert str(caught.value) == expected["message"]


def test_reverse_mode_reports_missing_sender_tcp_info_as_none() -> None:
    data = iperf3.parse(fixture_raw("iperf3-3.12--tcp-reverse"))
    assert data["reverse"] is True
    assert data["mean_rtt_ms"] is None
    assert data["streams"][0]["max_snd_cwnd_bytes"] is None
    assert data["throughput_bps"] > 0


def test_window_and_omit_are_reported() -> None:
    data = iperf3.parse(fixture_raw("iperf3-3.12--tcp-4streams-window-omit"))
    assert data["window_bytes"] == 256 * 1024
    assert data["sndbuf_actual_bytes"] == 2 * 256 * 1024  # Linux doubles SO_SNDBUF
    assert data["stream_count"] == 4
    # One omitted (-O 1) interval is dropped, one measured interval remains.
    assert len(data["interval_throughput_bps"]) == 1


def test_mhz_per_mbps_follows_the_formula() -> None:
    data = iperf3.parse(fixture_raw("iperf3-3.12--tcp-1stream"))
    expected = data["local_cpu_percent"] / 100 * data["cpu_mhz"] / (data["throughput_bps"] / 1e6)
    assert data["mhz_per_mbps"] == pytest.approx(expected, rel=1e-5)
    assert iperf3.mhz_per_mbps(100.0, 2000.0, 1e9) == 2.0
    assert iperf3.mhz_per_mbps(50.0, None, 1e9) is None
    assert iperf3.mhz_per_mbps(50.0, 2000.0, 0.0) is None


def test_a_report_without_extra_data_has_no_mhz_figures() -> None:
    doc = fixture_doc("iperf3-3.12--tcp-1stream")
    del doc["extra_data"]
    data = iperf3.parse(with_doc("iperf3-3.12--tcp-1stream", doc))
    assert data["cpu_mhz"] is None
    assert data["mhz_per_mbps"] is None
    assert data["throughput_bps"] > 0


def test_pre_3_10_udp_layout_estimates_the_receiver_rate() -> None:
    # Before esnet/iperf#1174 a UDP report had only end.sum: sender rate, receiver loss.
    doc = fixture_doc("iperf3-3.12--udp-rate")
    del doc["end"]["sum_sent"], doc["end"]["sum_received"]
    doc["end"]["sum"].update(lost_percent=10.0, lost_packets=19)
    data = iperf3.parse(with_doc("iperf3-3.12--udp-rate", doc))
    sender = doc["end"]["sum"]["bits_per_second"]
    assert data["sender_throughput_bps"] == sender
    assert data["throughput_bps"] == pytest.approx(sender * 0.9)
    assert data["bytes_received"] is None
    assert (data["loss_percent"], data["lost_packets"]) == (10.0, 19)


def test_3_0_style_error_prefix_is_dropped() -> None:
    doc = fixture_doc("iperf3-3.12--refused")
    doc["error"] = "error - unable to connect to server: Connection refused"
    with pytest.raises(ToolFailed, match=r"^nothing listening on 127\.0\.0\.1:\d+ — is the"):
        iperf3.parse(with_doc("iperf3-3.12--refused", doc))


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            "unable to connect to server: Connection timed out",
            "no answer from 198.18.3.2:5201 within the 3000 ms connect timeout",
        ),
        ("unable to connect to server: No route to host", "198.18.3.2:5201 is unreachable"),
        (
            "control socket has closed unexpectedly",
            "the iperf3 server on 198.18.3.2:5201 went away",
        ),
        ("something new", "iperf3 to 198.18.3.2:5201 failed: something new"),
    ],
)
def test_error_messages_say_what_to_do(error: str, expected: str) -> None:
    spec = iperf3.Spec()
    argv = tuple(iperf3.build_argv(spec, "198.18.3.2"))
    message = iperf3.explain_error(error, iperf3.ClientArgs.from_argv(argv))
    assert message.startswith(expected)


def test_ipv6_targets_are_bracketed_in_messages() -> None:
    argv = tuple(iperf3.build_argv(iperf3.Spec(port=5202), "2001:db8::1"))
    message = iperf3.explain_error(
        "unable to connect to server: Connection refused", iperf3.ClientArgs.from_argv(argv)
    )
    assert message.startswith("nothing listening on [2001:db8::1]:5202")


def test_zero_throughput_is_flagged() -> None:
    doc = fixture_doc("iperf3-3.12--tcp-1stream")
    doc["end"]["sum_received"].update(bits_per_second=0, bytes=0)
    data = iperf3.parse(with_doc("iperf3-3.12--tcp-1stream", doc))
    assert iperf3.check(data, iperf3.Spec()) == (
        "iperf3 measured zero throughput at the receiver — the data connections were "
        "blocked or stalled (firewall on the data port? path MTU black hole?)"
    )


def test_udp_with_every_datagram_lost_is_flagged() -> None:
    doc = fixture_doc("iperf3-3.12--udp-rate")
    doc["end"]["sum_received"].update(
        bits_per_second=0, bytes=0, lost_packets=191, lost_percent=100
    )
    data = iperf3.parse(with_doc("iperf3-3.12--udp-rate", doc))
    assert iperf3.check(data, iperf3.Spec(udp=True)).startswith(  # type: ignore[union-attr]
        "UDP throughput was zero: 191 of 191 datagrams were lost"
    )


@pytest.mark.parametrize(
    ("stdout", "stderr", "error", "message"),
    [
        ("", "", ParseError, "printed no report (exit 0); it was killed or crashed"),
        (
            "",
            "iperf3: parameter error - must either be a client (-c) or server (-s)\n",
            ToolFailed,
            "it said: iperf3: parameter error - must either be a client",
        ),
        ("[1, 2]", "", ParseError, "is not a complete JSON report"),
        ('{"start": {}, "intervals": []}', "", ParseError, "has no 'end' summary"),
        ("Segmentation fault", "", ParseError, "is not a complete JSON report"),
    ],
)
def test_non_reports(stdout: str, stderr: str, error: type[Exception], message: str) -> None:
    raw = RawRun(argv=("iperf3", "-c", HOST, "-J"), stdout=stdout, stderr=stderr)
    with pytest.raises(error, match=re.escape(message)):
        iperf3.parse(raw)


def test_a_report_cut_short_is_a_parse_error_naming_the_cause() -> None:
    raw = fixture_raw("iperf3-3.12--tcp-1stream")
    cut = RawRun(argv=raw.argv, stdout=raw.stdout[: len(raw.stdout) // 2])
    with pytest.raises(ParseError, match=r"not a complete JSON report \(\d+ chars; cut short"):
        iperf3.parse(cut)


def test_text_before_the_report_is_skipped() -> None:
    raw = fixture_raw("iperf3-3.12--tcp-1stream")
    noisy = RawRun(argv=raw.argv, stdout="warning: something\n" + raw.stdout + "\ntrailer")
    assert iperf3.parse(noisy) == iperf3.parse(raw)


def test_reextraction_from_the_raw_log_reproduces_everything(tmp_path: Path) -> None:
    raw = fixture_raw("iperf3-3.12--tcp-4streams-window-omit")
    log = RawLog(tmp_path)
    log.append("t1", "iperf3", raw)
    (logged,) = list(log.runs())
    assert iperf3.parse(logged.raw) == iperf3.parse(raw)


# --- spec and argv -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"port": 0}, "port\n  Input should be greater than or equal to 1"),
        ({"port": 65536}, "port\n  Input should be less than or equal to 65535"),
        ({"streams": 0}, "streams\n  Input should be greater than or equal to 1"),
        ({"streams": 129}, "streams\n  Input should be less than or equal to 128"),
        ({"duration_s": 0.5}, "duration_s\n  Input should be greater than or equal to 1"),
        ({"duration_s": 3601}, "duration_s\n  Input should be less than or equal to 3600"),
        ({"duration_s": 2.5}, "duration_s must be a whole number of seconds, not 2.5"),
        ({"omit_s": 61}, "omit_s\n  Input should be less than or equal to 60"),
        ({"connect_timeout_ms": 10}, "connect_timeout_ms\n  Input should be greater than"),
        ({"window": "lots"}, "window 'lots' is not like iperf3's -w"),
        ({"window": "256KB"}, "window '256KB' is not like iperf3's -w"),
        ({"window": "0K"}, "window '0K' must be between 1 byte and 512M"),
        ({"window": "1G"}, "window '1G' must be between 1 byte and 512M"),
        ({"rate": "fast"}, "rate 'fast' is not like iperf3's -b"),
        ({"congestion": "BBR"}, "congestion 'BBR' is not a congestion-control name"),
        ({"congestion": "cubic; rm -rf"}, "is not a congestion-control name"),
        ({"congestion": "a" * 16}, "is not a congestion-control name"),
        ({"udp": True, "congestion": "bbr"}, "congestion applies to TCP only"),
        ({"bind": "eth0"}, "bind 'eth0' must be a local IPv4 or IPv6 address"),
        ({"parallel": 4}, "parallel\n  Extra inputs are not permitted"),
    ],
)
def test_spec_rejections(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        iperf3.Spec.model_validate(fields)
    assert message in str(caught.value)


def test_spec_defaults_and_sizes() -> None:
    spec = iperf3.Spec()
    assert (spec.port, spec.streams, spec.duration_s, spec.connect_timeout_ms) == (
        5201,
        1,
        10,
        3000,
    )
    assert spec.rate is None and spec.window_bytes is None
    udp = iperf3.Spec(udp=True)
    assert udp.rate == "1M" and udp.rate_bps == 1_000_000  # iperf3's own UDP default, recorded
    assert iperf3.Spec(window="2M").window_bytes == 2 * 1024 * 1024
    assert iperf3.Spec(window="1.5k").window_bytes == 1536
    assert iperf3.Spec(rate="2.5G").rate_bps == 2_500_000_000


def test_deadline_covers_test_connect_and_a_margin() -> None:
    spec = iperf3.Spec(duration_s=10, omit_s=2, connect_timeout_ms=3000)
    assert spec.deadline_s() == pytest.approx(12 + 3 + 4 + 0.6)


def test_argv_minimal() -> None:
    argv = iperf3.build_argv(iperf3.Spec(), "198.18.3.2")
    # This host's clock rides along when it can be read (it is read at build time).
    if "--extra-data" in argv:
        at = argv.index("--extra-data")
        assert argv[at + 1].startswith("cpu_mhz=")
        del argv[at : at + 2]
    assert argv == [
        *("iperf3", "-c", "198.18.3.2", "-p", "5201", "-J", "-t", "10", "-O", "0", "-P", "1"),
        *("--connect-timeout", "3000"),
    ]


def test_argv_everything() -> None:
    spec = iperf3.Spec(
        port=5300,
        streams=4,
        window="256K",
        duration_s=20,
        omit_s=2,
        congestion="reno",
        reverse=True,
        rate="900M",
        connect_timeout_ms=1500,
        bind="198.18.0.1",
    )
    assert iperf3.build_argv(spec, "cern-1.example", cpu_mhz=2445.4) == [
        *("iperf3", "-c", "cern-1.example", "-p", "5300", "-J", "-t", "20", "-O", "2"),
        *("-P", "4", "-w", "256K", "-C", "reno", "-R", "-b", "900M", "-B", "198.18.0.1"),
        *("--connect-timeout", "1500", "--extra-data", "cpu_mhz=2445.400"),
    ]


def test_argv_udp() -> None:
    argv = iperf3.build_argv(iperf3.Spec(udp=True, duration_s=1), HOST)
    assert argv[argv.index("-u") :][:3] == ["-u", "-b", "1M"]


# --- fuzzing: nothing but ParseError / ToolFailed ----------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


REAL_DOCS = {case: fixture_doc(case) for case in CASES}
REAL_PATHS = {case: list(_paths(doc))[1:] for case, doc in REAL_DOCS.items()}


def _parse_never_crashes(raw: RawRun) -> None:
    try:
        data = iperf3.parse(raw)
    except (ParseError, ToolFailed) as exc:
        assert str(exc)
        return
    iperf3.check(data, iperf3.Spec())
    json.dumps(data)  # the envelope must stay serialisable


@settings(max_examples=300, deadline=None)
@given(stdout=st.text(max_size=300), stderr=st.text(max_size=40))
def test_random_text(stdout: str, stderr: str) -> None:
    _parse_never_crashes(RawRun(argv=("iperf3", "-c", HOST), stdout=stdout, stderr=stderr))


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), cut=st.floats(min_value=0, max_value=1))
def test_truncated_real_reports(case: str, cut: float) -> None:
    raw = fixture_raw(case)
    _parse_never_crashes(RawRun(argv=raw.argv, stdout=raw.stdout[: int(len(raw.stdout) * cut)]))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_real_reports(data: st.DataObject) -> None:
    case = data.draw(st.sampled_from(CASES))
    doc = copy.deepcopy(REAL_DOCS[case])
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        path = data.draw(st.sampled_from(REAL_PATHS[case]))
        parent: Any = doc
        with contextlib.suppress(KeyError, IndexError, TypeError):
            for key in path[:-1]:
                parent = parent[key]
            if data.draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = data.draw(json_values)
    _parse_never_crashes(with_doc(case, doc))


# --- real runs against a loopback server -------------------------------------------------------


def listening(port: int) -> bool:
    # Read /proc/net/tcp rather than connecting: a probe connection would use up a -1 server.
    needle = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(row[1] == needle and row[3] == "0A" for row in rows)


@pytest.fixture
def server() -> Iterator[int]:
    """A one-off iperf3 server on a free loopback port; stopped by PID."""
    port = free_port()
    proc = subprocess.Popen(
        ["iperf3", "-s", "-1", "-p", str(port), "-B", HOST],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 5
        while not listening(port):
            assert proc.poll() is None, "iperf3 server exited at start"
            assert time.monotonic() < deadline, "iperf3 server did not start listening"
            time.sleep(0.02)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=3)


@pytest.mark.parametrize(
    "fields",
    [
        {"streams": 1},
        {"streams": 3, "window": "512K", "congestion": "reno"},
        {"streams": 2, "reverse": True},
        {"udp": True, "rate": "20M"},
    ],
    ids=["tcp", "tcp-3streams-window-reno", "tcp-reverse", "udp"],
)
@pytest.mark.servers
def test_real_run(server: int, fields: dict[str, Any], tmp_path: Path) -> None:
    spec = iperf3.Spec(port=server, duration_s=1, **fields)
    log = RawLog(tmp_path)
    ctx = ProbeContext(target="loopback", address=HOST, raw_log=log)
    result = asyncio.run(iperf3.run(spec, ctx))
    assert result.succeeded, result.error
    assert result.tool_version and result.tool_version.startswith("iperf 3.")
    assert result.params == spec.model_dump(mode="json")
    data = result.data
    assert data["complete"] is True
    assert data["throughput_bps"] > 0
    assert data["stream_count"] == len(data["streams"]) == spec.streams
    assert data["cpu_mhz"] > 0  # handed to iperf3 by run(), echoed back in its report
    argv = iperf3.build_argv(spec, HOST, cpu_mhz=result.data["cpu_mhz"])
    assert result.diags.startswith(shlex.join(argv))
    assert "--extra-data cpu_mhz=" in result.diags
    if not spec.udp:
        assert data["mhz_per_mbps"] > 0
        assert data["congestion"] == (spec.congestion or current_congestion())
    if spec.window:
        assert data["window_bytes"] == spec.window_bytes
    (logged,) = list(log.runs())
    assert iperf3.parse(logged.raw) == data


def current_congestion() -> str:
    return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
