"""The traceroute probe: argv, parsing of real Linux traceroute output, checks, loopback runs."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from iepm.errors import ParseError, ToolFailed
from iepm.probes import traceroute
from iepm.probes.base import ProbeContext
from iepm.runner import RawRun
from testkit.outputs import mutate_output

REPO = Path(__file__).resolve().parents[2]
JC_DIR = REPO / "../shared/data/fixtures/linux-ping-traceroute"
OWN_DIR = REPO / "tests/fixtures/traceroute"

JC_OUTPUTS = sorted(JC_DIR.glob("*traceroute*.out"))
TRACEPATH_OUTPUTS = sorted(JC_DIR.glob("*tracepath*.out"))
OWN_OUTPUTS = sorted(OWN_DIR.glob("*.out"))
ALL_TEXTS = [p.read_text() for p in JC_OUTPUTS + OWN_OUTPUTS]
ARGV = ("traceroute", "-n", "-q", "1", "--", "198.18.3.2")
HAVE_TRACEROUTE = shutil.which("traceroute") is not None


def raw(stdout: str, stderr: str = "", returncode: int | None = 0) -> RawRun:
    return RawRun(argv=ARGV, stdout=stdout, stderr=stderr, returncode=returncode)


def parse_quietly(text: str) -> dict[str, Any] | None:
    """Parse; the only exceptions allowed for any text are ParseError and ToolFailed."""
    try:
        return traceroute.parse(raw(text))
    except (ParseError, ToolFailed):
        return None


# --- the upstream (jc) fixtures --------------------------------------------------------------


@pytest.mark.parametrize("path", JC_OUTPUTS, ids=lambda p: p.name)
def test_jc_fixture_hops_agree(path: Path) -> None:
    data = traceroute.parse(raw(path.read_text()))
    jc = json.loads(path.with_suffix(".json").read_text())
    assert data["destination_address"] == jc["destination_ip"]
    assert data["destination_name"] == jc["destination_name"]
    assert data["hop_count"] == len(jc["hops"]) == len(data["hops"])
    for theirs, ours in zip(jc["hops"], data["hops"], strict=True):
        probes = theirs["probes"]
        assert ours["ttl"] == theirs["hop"]
        assert [(r["address"], r["rtt_ms"]) for r in ours["responses"]] == [
            (p["ip"], p["rtt"]) for p in probes
        ]
        assert ours["rtts_ms"] == [p["rtt"] for p in probes]
        assert ours["address"] == (probes[0]["ip"] if probes else None)
        # jc repeats the address as the name when traceroute printed "addr (addr)".
        assert [r["hostname"] for r in ours["responses"]] == [
            p["name"] if p["name"] != p["ip"] else None for p in probes
        ]
        assert [r["annotation"] for r in ours["responses"]] == [p["annotation"] for p in probes]
    last = jc["hops"][-1]["probes"]
    assert data["reached"] == any(p["ip"] == jc["destination_ip"] for p in last)
    assert data["unparsed_lines"] == 0


def test_jc_fixtures_are_there() -> None:
    assert len(JC_OUTPUTS) >= 8, f"expected the jc traceroute fixtures in {JC_DIR}"


@pytest.mark.parametrize("path", TRACEPATH_OUTPUTS, ids=lambda p: p.name)
def test_tracepath_output_is_refused_cleanly(path: Path) -> None:
    with pytest.raises(ParseError, match="this is tracepath output, not traceroute"):
        traceroute.parse(raw(path.read_text()))


def test_silent_hops_and_partly_silent_hops() -> None:
    data = traceroute.parse(raw((JC_DIR / "generic_traceroute2.out").read_text()))
    first, second = data["hops"][0], data["hops"][1]
    # " 1  name (addr)  198.574 ms  *  198.650 ms": the address is not repeated after "*".
    assert first["rtts_ms"] == [198.574, 198.65]
    assert (first["probes"], first["lost"]) == (3, 1)
    assert first["hostname"] == "216-230-231-141.static.houston.tx.oplink.net"
    assert second == {
        "ttl": 2,
        "address": None,
        "hostname": None,
        "rtts_ms": [],
        "responses": [],
        "probes": 3,
        "lost": 3,
        "annotations": [],
        "extensions": [],
    }
    assert data["silent_hops"] == 3 and data["reached"]


def test_several_addresses_answer_one_hop() -> None:
    data = traceroute.parse(raw((JC_DIR / "generic_traceroute-n-ipv6.out").read_text()))
    hop = data["hops"][
        6
    ]  # " 7  2001:4860:0:1127::2  9.110 ms 2001:5a0:400:700::17  8.476 ms  8.380 ms"
    assert [r["address"] for r in hop["responses"]] == [
        "2001:4860:0:1127::2",
        "2001:5a0:400:700::17",
        "2001:5a0:400:700::17",
    ]
    assert hop["address"] == "2001:4860:0:1127::2"


def test_unreached_trace_says_where_it_went_dark() -> None:
    data = traceroute.parse(raw((JC_DIR / "centos-7.7_traceroute.out").read_text()))
    assert not data["reached"] and not data["truncated"]
    assert (data["hop_count"], data["max_hops"], data["silent_hops"]) == (30, 30, 24)
    assert traceroute.check(data, traceroute.Spec()) == (
        "destination 151.101.197.67 not reached within 30 hops: the last answer came from hop 7 "
        "(12.123.215.161), the hops after it are silent — a firewall may drop udp probes; try "
        "method=icmp or tcp"
    )


# --- our own recordings (loopback, traceroute 2.1.2) -----------------------------------------


@pytest.mark.parametrize("path", OWN_OUTPUTS, ids=lambda p: p.name)
def test_recorded_fixture(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text())
    err = path.with_suffix(".err")
    run = RawRun(
        argv=tuple(expected["argv"]),
        stdout=path.read_text(),
        stderr=err.read_text() if err.exists() else "",
        returncode=expected["returncode"],
    )
    if "raises" in expected:
        kind = {"ParseError": ParseError, "ToolFailed": ToolFailed}[expected["raises"]]
        with pytest.raises(kind) as caught:
            traceroute.parse(run)
        assert str(caught.value) == expected["message"]
    else:
        assert traceroute.parse(run) == expected["data"]


def test_recorded_fixtures_are_there() -> None:
    assert len(OWN_OUTPUTS) >= 8


def test_killed_midrun_is_marked_truncated() -> None:
    data = traceroute.parse(raw((OWN_DIR / "traceroute-2.1.2--killed-midrun.out").read_text()))
    assert data["truncated"] and data["hop_count"] == 16
    assert traceroute.check(data, traceroute.Spec()) == (
        "traceroute to 127.0.0.1 ended at hop 16 of 30 without reaching it: the run was cut "
        "short (see diags)"
    )


def test_all_silent_trace() -> None:
    data = traceroute.parse(raw((OWN_DIR / "traceroute-2.1.2--silent-hops.out").read_text()))
    assert traceroute.check(data, traceroute.Spec(method="tcp")) == (
        "destination 127.0.0.1 not reached: no hop answered in 4 hops — the monitor's own "
        "network drops tcp probes or their ICMP replies; try method=icmp or udp"
    )


# --- hand-written edge cases (traceroute 2.1.2 print formats) --------------------------------

ANNOTATED = """traceroute to 10.9.9.9 (10.9.9.9), 30 hops max, 60 byte packets
 1  10.0.0.1  0.412 ms  0.380 ms  0.377 ms
 2  10.0.1.1 <MPLS:L=24001,E=0,S=1,T=1>  5.101 ms  5.022 ms 10.0.1.5 <MPLS:L=24002,E=0,S=1,T=1>  5.310 ms
 3  10.0.2.1 F=1500 '-2'  6.001 ms !H  *  6.120 ms !H
"""  # noqa: E501


def test_annotations_extensions_and_marks() -> None:
    data = traceroute.parse(raw(ANNOTATED))
    mpls, last = data["hops"][1], data["hops"][2]
    assert [r["address"] for r in mpls["responses"]] == ["10.0.1.1", "10.0.1.1", "10.0.1.5"]
    assert mpls["extensions"] == ["MPLS:L=24001,E=0,S=1,T=1", "MPLS:L=24002,E=0,S=1,T=1"]
    assert last["rtts_ms"] == [6.001, 6.12] and last["lost"] == 1
    assert last["annotations"] == ["!H"]
    assert [r["annotation"] for r in last["responses"]] == ["!H", "!H"]
    assert not data["reached"] and not data["truncated"] and data["unparsed_lines"] == 0
    assert traceroute.check(data, traceroute.Spec()) == (
        "traceroute to 10.9.9.9 stopped at hop 3: 10.0.2.1 answered !H (host unreachable) — "
        "the route ends there; check the target's address and the filters on that router"
    )


def test_destination_compared_as_an_address() -> None:
    text = (
        "traceroute to 2001:0db8::1 (2001:0db8::1), 30 hops max, 80 byte packets\n"
        " 1  2001:db8::1  0.100 ms !X\n"
    )
    data = traceroute.parse(raw(text))
    assert data["reached"]  # the same address, written two ways; !X came from the target
    assert traceroute.check(data, traceroute.Spec()) is None


def test_line_cut_after_the_address() -> None:
    data = traceroute.parse(raw("traceroute to 10.9.9.9 (10.9.9.9), 3 hops max\n 1  10.0.0.1"))
    assert data["hops"][0]["address"] == "10.0.0.1"
    assert data["hops"][0]["responses"] == [
        {"address": "10.0.0.1", "hostname": None, "rtt_ms": None, "annotation": None}
    ]
    assert data["hops"][0]["rtts_ms"] == []


def test_no_hops_at_all() -> None:
    data = traceroute.parse(
        raw("traceroute to 10.9.9.9 (10.9.9.9), 30 hops max, 60 byte packets\n")
    )
    assert data["hop_count"] == 0 and data["truncated"]
    message = traceroute.check(data, traceroute.Spec())
    assert message is not None and "printed no hop" in message


@pytest.mark.parametrize(
    ("stderr", "kind", "message"),
    [
        (
            "nope.example: Name or service not known\n"
            'Cannot handle "host" cmdline arg `nope.example\' on position 1 (argc 6)\n',
            ToolFailed,
            "the name 'nope.example' could not be resolved (Name or service not known)",
        ),
        (
            "You do not have enough privileges to use this traceroute method.\n",
            ToolFailed,
            "methods icmp and tcp need root or CAP_NET_RAW",
        ),
        ("", ParseError, "printed nothing"),
    ],
)
def test_failures_before_probing(stderr: str, kind: type[Exception], message: str) -> None:
    with pytest.raises(kind) as caught:
        traceroute.parse(raw("", stderr, 2))
    assert message in str(caught.value)


def test_ping_output_is_not_traceroute() -> None:
    with pytest.raises(ParseError, match="not traceroute output"):
        traceroute.parse(raw((JC_DIR / "centos-7.7_ping-ip-O.out").read_text()))


# --- the Spec and the command line -----------------------------------------------------------


SPORT = f"--sport={traceroute.paris_source_port('198.18.3.2')}"


@pytest.mark.parametrize(
    ("fields", "tail"),
    [
        ({}, ["-U", SPORT, "-p", "33434"]),  # Paris by default: one flow per target
        ({"paris": False}, []),
        ({"method": "icmp"}, ["-I"]),
        ({"method": "tcp", "port": 443}, ["-T", SPORT, "-p", "443"]),
        ({"method": "udp", "port": 40000}, ["-U", SPORT, "-p", "40000"]),
        ({"method": "udp", "port": 40000, "paris": False}, ["-p", "40000"]),
    ],
)
def test_argv(fields: dict[str, Any], tail: list[str]) -> None:
    spec = traceroute.Spec(**fields)
    argv = traceroute.build_argv(spec, "198.18.3.2")
    # Paris mode's gap limit reads hops as they come: traceroute's output line-buffered.
    line_buffered = ["stdbuf", "-oL"] if spec.one_flow() else []
    head = [*line_buffered, "traceroute", "-n", "-q", "1", "-w", "2", "-m", "30"]
    assert argv == [*head, *tail, "--", "198.18.3.2"]


def test_paris_source_port_is_fixed_per_target_and_in_its_range() -> None:
    ports = {traceroute.paris_source_port(f"198.18.{i // 250}.{i % 250 + 1}") for i in range(500)}
    assert traceroute.paris_source_port("198.18.3.2") == traceroute.paris_source_port("198.18.3.2")
    assert len(ports) > 400 and all(40000 <= p < 48000 for p in ports)


def test_deadline_covers_a_fully_silent_trace() -> None:
    # traceroute keeps 16 probes in flight; each batch waits at most wait_s.
    assert traceroute.Spec(paris=False).deadline_s() == 2 * 2.0 + 10
    assert traceroute.Spec(max_hops=255, queries=10, wait_s=10, paris=False).deadline_s() == (
        160 * 10 + 10
    )
    # Paris mode's fixed source port means one probe at a time (--sport implies -N 1).
    assert traceroute.Spec().deadline_s() == 30 * 2.0 + 10
    assert traceroute.Spec(method="icmp").deadline_s() == 2 * 2.0 + 10


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_hops": 0}, "Input should be greater than or equal to 1"),
        ({"max_hops": 256}, "Input should be less than or equal to 255"),
        ({"queries": 11}, "Input should be less than or equal to 10"),
        ({"wait_s": 0.05}, "Input should be greater than or equal to 0.1"),
        ({"method": "sctp"}, "Input should be 'icmp', 'udp' or 'tcp'"),
        ({"method": "icmp", "port": 80}, "port has no meaning for method='icmp'"),
        ({"port": 0}, "Input should be greater than or equal to 1"),
        ({"first_hop": 2}, "Extra inputs are not permitted"),
    ],
)
def test_spec_rejections(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        traceroute.Spec(**fields)


def test_contract() -> None:
    assert (traceroute.NAME, traceroute.TOOL) == ("traceroute", "traceroute")
    assert traceroute.META.scheduling == "background"
    assert traceroute.META.version_argv == ("traceroute", "--version")
    data = traceroute.parse(raw((OWN_DIR / "traceroute-2.1.2--loopback-udp.out").read_text()))
    for column in traceroute.COLUMNS:
        assert column.name in data
        assert isinstance(data[column.name], bool | int | str)


@pytest.mark.parametrize(
    "text",
    [
        "traceroute to " + " " * 20_000 + "(",
        "traceroute to a (1.1.1.1), 30 hops max\n 1 " + "<traceroute to " * 2000,
        "traceroute to a (1.1.1.1), 30 hops max\n 1 " + "[x " * 5000,
        "traceroute to a (1.1.1.1), 30 hops max\n 1 x" + " " * 20_000,
    ],
    ids=["header-spaces", "open-angles", "open-brackets", "trailing-spaces"],
)
def test_long_malformed_lines_parse_in_linear_time(text: str) -> None:
    # These once made a regex backtrack for seconds; a hung parser is as bad as a crash.
    # CPU time, not wall time: backtracking burns CPU, while other work on a busy host only
    # delays the wall clock.
    started = time.process_time()
    parse_quietly(text)
    assert time.process_time() - started < 1.0


# --- properties ------------------------------------------------------------------------------

TRACE_WORDS = [
    "traceroute to ", "x (10.0.0.1), 30 hops max, 60 byte packets", " 1 ", " 12 ", "  ",
    "10.0.0.1", "2001:db8::1", "name.example", " (10.0.0.1)", "(", ")", " ms", "*", "!H", "!",
    "!<10>", "[AS1]", "[*]", "<MPLS:L=1>", "F=1500", "'-3'", "\n", " ",
]  # fmt: skip
trace_like = st.lists(
    st.one_of(st.sampled_from(TRACE_WORDS), st.integers(0, 400).map(str), st.text(max_size=5)),
    max_size=80,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=500), trace_like, trace_like.map(lambda t: TRACE_WORDS[0] + t)))
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    data = parse_quietly(text)
    if data is not None:
        assert all(1 <= h["ttl"] <= 255 for h in data["hops"])
        assert all(len(h["rtts_ms"]) <= len(h["responses"]) for h in data["hops"])


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALL_TEXTS), st.floats(0, 1), st.floats(0, 1))
def test_truncated_real_outputs(text: str, start: float, end: float) -> None:
    lo, hi = sorted((int(start * len(text)), int(end * len(text))))
    for piece in (text[:hi], text[lo:], text[lo:hi]):
        parse_quietly(piece)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_TEXTS), st.data())
def test_mutated_real_outputs(text: str, draw: st.DataObject) -> None:
    text = mutate_output(draw, text, trace_like, "0123456789.*!()<>[]")
    parse_quietly(text)


# --- real runs on loopback -------------------------------------------------------------------

needs_traceroute = pytest.mark.skipif(not HAVE_TRACEROUTE, reason="traceroute is not installed")


def trace(method: str, address: str) -> Any:
    # traceroute -T reads its replies through a raw TCP socket, which loses them while other
    # suites push bulk TCP (iperf3) through loopback: hops then show "*" (seen 5 runs in 15).
    # Such a loss is never a wrong answer, so each attempt is checked and TCP gets retries.
    spec = traceroute.Spec(method=method, queries=2, wait_s=1, max_hops=5)
    for _ in range(3 if method == "tcp" else 1):
        result = asyncio.run(traceroute.run(spec, ProbeContext(target="lo", address=address)))
        hops = result.data.get("hops", [])
        assert all(r["address"] == address for hop in hops for r in hop["responses"])
        if result.succeeded and result.data["hop_count"] == 1:
            break
    return result


@needs_traceroute
@pytest.mark.parametrize("method", ["udp", "icmp", "tcp"])
@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_real_traceroute_to_loopback(method: str, address: str) -> None:
    result = trace(method, address)
    assert result.succeeded, result.error
    assert result.tool_version is not None and "traceroute" in result.tool_version
    data = result.data
    assert data["reached"] and data["hop_count"] == 1
    assert data["destination_address"] == address
    assert data["hops"][0]["address"] == address
    assert len(data["hops"][0]["rtts_ms"]) == 2
    assert all(0 < rtt < 100 for rtt in data["hops"][0]["rtts_ms"])


@needs_traceroute
def test_real_traceroute_to_an_unresolvable_name() -> None:
    ctx = ProbeContext(target="ghost", address="nonexistent.invalid")
    result = asyncio.run(traceroute.run(traceroute.Spec(), ctx))
    assert not result.succeeded
    assert result.error is not None
    assert "'nonexistent.invalid' could not be resolved" in result.error


def test_the_gap_limit_fires_on_complete_silent_lines_only() -> None:
    spec = traceroute.Spec(gap_limit=3)
    enough = traceroute.stop_when(spec)
    assert enough is not None
    head = b"traceroute to 198.18.0.4 (198.18.0.4), 30 hops max, 60 byte packets\n"
    answered = b" 1  198.18.0.2  2.020 ms\n"
    assert not enough(head + answered + b" 2  *\n 3  *\n")
    assert not enough(head + answered + b" 2  *\n 3  *\n 4  *")  # the last line is not done
    assert enough(head + answered + b" 2  *\n 3  * *\n 4  *\n")
    assert not enough(head + b" 2  *\n 3  198.18.0.9  1.0 ms\n 4  *\n 5  *\n")
    # Off when there is nothing to limit: plain mode, ICMP, or a limit of 0.
    for fields in ({"paris": False}, {"method": "icmp"}, {"gap_limit": 0}):
        assert traceroute.stop_when(traceroute.Spec(**fields)) is None


def test_a_trace_stopped_by_its_gap_limit_is_finished_not_cut() -> None:
    spec = traceroute.Spec(gap_limit=3)
    text = (
        "traceroute to 198.18.0.4 (198.18.0.4), 30 hops max, 60 byte packets\n"
        " 1  198.18.0.2  2.020 ms\n 2  *\n 3  *\n 4  *\n"
    )
    data = traceroute.parse(raw(text), spec)
    assert (data["gap_stopped"], data["truncated"], data["reached"]) == (True, False, False)
    message = traceroute.check(data, spec)
    assert message is not None and "the hops after it are silent" in message
    # Without a gap limit the same output is a cut run.
    cut = traceroute.parse(raw(text), traceroute.Spec(paris=False))
    assert (cut["gap_stopped"], cut["truncated"]) == (False, True)
