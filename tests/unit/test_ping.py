"""The ping probe: argv, parsing of real iputils output, failure messages, real loopback runs."""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from iepm.errors import ParseError, ToolFailed
from iepm.probes import ping
from iepm.probes.base import ProbeContext
from iepm.runner import RawRun
from testkit.outputs import mutate_output

REPO = Path(__file__).resolve().parents[2]
JC_DIR = REPO / "../shared/data/fixtures/linux-ping-traceroute"
OWN_DIR = REPO / "tests/fixtures/ping"

JC_OUTPUTS = sorted(JC_DIR.glob("*ping*.out"))
OWN_OUTPUTS = sorted(OWN_DIR.glob("*.out"))
ALL_TEXTS = [p.read_text() for p in JC_OUTPUTS + OWN_OUTPUTS]
ARGV = ("ping", "-n", "-O", "-c", "10", "--", "198.18.3.2")
HAVE_PING = shutil.which("ping") is not None


def raw(stdout: str, stderr: str = "", returncode: int | None = 0) -> RawRun:
    return RawRun(argv=ARGV, stdout=stdout, stderr=stderr, returncode=returncode)


def parse_quietly(text: str, spec: ping.Spec | None = None) -> dict[str, Any] | None:
    """Parse; the only exceptions allowed for any text are ParseError and ToolFailed."""
    try:
        return ping.parse(raw(text), spec)
    except (ParseError, ToolFailed):
        return None


def expand(ranges: list[list[int]]) -> set[int]:
    return {s for lo, hi in ranges for s in range(lo, hi + 1)}


# --- the upstream (jc) fixtures --------------------------------------------------------------


@pytest.mark.parametrize("path", JC_OUTPUTS, ids=lambda p: p.name)
def test_jc_fixture_figures_agree(path: Path) -> None:
    data = ping.parse(raw(path.read_text()))
    jc = json.loads(path.with_suffix(".json").read_text())
    pairs = {
        "packets_sent": "packets_transmitted",
        "packets_received": "packets_received",
        "duplicates": "duplicates",
        "errors": "errors",
        "rtt_min_ms": "round_trip_ms_min",
        "rtt_avg_ms": "round_trip_ms_avg",
        "rtt_max_ms": "round_trip_ms_max",
        "rtt_mdev_ms": "round_trip_ms_stddev",
        "destination_address": "destination_ip",
    }
    for ours, theirs in pairs.items():
        if theirs in jc:
            assert data[ours] == jc[theirs], ours
    assert data["loss_percent"] == pytest.approx(jc["packet_loss_percent"])
    assert data["rtt_source"] == ("summary" if "round_trip_ms_avg" in jc else None)
    # jc lists every reply line; a second line for the same icmp_seq is a duplicate even
    # without "(DUP!)" (ubuntu-22.04_ping6-ip-source-ip): ping's own summary counts it so.
    first_replies: dict[int, float] = {}
    for r in jc["responses"]:
        if r["type"] == "reply" and not r["duplicate"]:
            first_replies.setdefault(r["icmp_seq"], r["time_ms"])
    assert data["rtts_ms"] == list(first_replies.values())
    assert data["seqs"] == list(first_replies)
    everything = set(range(1, data["packets_sent"] + 1))
    assert expand(data["lost_seq_ranges"]) == everything - set(first_replies)
    assert not data["truncated"]


def test_jc_fixtures_are_there() -> None:
    assert len(JC_OUTPUTS) >= 25, f"expected the jc ping fixtures in {JC_DIR}"


def test_duplicates_stay_out_of_rtts_but_in_ping_summary() -> None:
    data = ping.parse(raw((JC_DIR / "centos-7.7_ping-ip-dup.out").read_text()))
    assert data["duplicates"] == 19
    assert data["rtts_ms"] == [0.586, 0.861]
    # ping's summary includes the duplicates: 504 ms is no mean of 0.586 and 0.861.
    assert data["rtt_avg_ms"] == 504.26
    assert data["rtt_source"] == "summary"


def test_unparsable_lines_are_counted_not_fatal() -> None:
    data = ping.parse(raw((JC_DIR / "centos-7.7_ping-ip-O-unparsedlines.out").read_text()))
    assert data["unparsed_lines"] == 3
    assert data["packets_received"] == 20  # ping's count; seq 4's line was garbled
    assert data["lost_seq_ranges"] == [[4, 4]]  # "no parsable reply", not "lost on the wire"


def test_destination_unreachable_is_a_failure_that_names_the_router() -> None:
    data = ping.parse(raw((JC_DIR / "ubuntu-22.04_ping-dest-unreachable.out").read_text()))
    assert data["icmp_errors"] == [
        {"from": "10.0.0.1", "message": "Destination Host Unreachable", "count": 3}
    ]
    assert ping.check(data, ping.Spec()) == (
        "no reply from 10.0.3.22: 3 sent, 0 received (100% loss), 3 errors — 10.0.0.1 reports "
        "'Destination Host Unreachable': the last router gets no answer from the host: it is "
        "down or the address is wrong"
    )


# --- our own recordings (loopback, iputils 20221126) -----------------------------------------


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
    spec = ping.Spec(**expected["parse_kwargs"]) if "parse_kwargs" in expected else None
    if "raises" in expected:
        kind = {"ParseError": ParseError, "ToolFailed": ToolFailed}[expected["raises"]]
        with pytest.raises(kind) as caught:
            ping.parse(run, spec)
        assert str(caught.value) == expected["message"]
    else:
        assert ping.parse(run, spec) == expected["data"]


def test_recorded_fixtures_are_there() -> None:
    assert len(OWN_OUTPUTS) >= 10


def test_killed_midrun_counts_what_it_saw() -> None:
    data = ping.parse(raw((OWN_DIR / "ping-20221126--killed-midrun.out").read_text()))
    assert data["truncated"] is True
    assert data["packets_sent"] == data["packets_received"] == 6
    assert data["rtt_source"] == "replies"
    rtts = data["rtts_ms"]
    assert data["rtt_avg_ms"] == round(statistics.fmean(rtts), 3)
    assert data["rtt_mdev_ms"] == round(statistics.pstdev(rtts), 3)


def test_local_send_error_explains_itself() -> None:
    out = (OWN_DIR / "ping-20221126--message-too-long.out").read_text()
    err = (OWN_DIR / "ping-20221126--message-too-long.err").read_text()
    data = ping.parse(raw(out, err, 1))
    assert ping.check(data, ping.Spec()) == (
        "no reply from 127.0.0.1: 2 sent, 0 received (100% loss) — ping reports 'local error: "
        "message too long, mtu=65535' locally: the path MTU is below the packet size: lower "
        "size_bytes"
    )


# --- hand-written edge cases (iputils 20221126 print formats) --------------------------------

ALL_LOST = """PING 198.18.3.2 (198.18.3.2) 56(84) bytes of data.
no answer yet for icmp_seq=1
no answer yet for icmp_seq=2
no answer yet for icmp_seq=3
no answer yet for icmp_seq=4
no answer yet for icmp_seq=5
no answer yet for icmp_seq=6
no answer yet for icmp_seq=7
no answer yet for icmp_seq=8
no answer yet for icmp_seq=9

--- 198.18.3.2 ping statistics ---
10 packets transmitted, 0 received, 100% packet loss, time 9212ms

"""


def test_total_loss_message() -> None:
    data = ping.parse(raw(ALL_LOST, returncode=1))
    assert data["lost_seq_ranges"] == [[1, 10]]
    assert ping.check(data, ping.Spec()) == (
        "no reply from 198.18.3.2: 10 sent, 0 received (100% loss) — host down, or ICMP "
        "filtered; set ping_expected=false for this target if it never answers ping"
    )


def test_partial_loss_is_data_not_failure() -> None:
    data = ping.parse(raw((JC_DIR / "fedora32_ping6-ip-O-p.out").read_text()))
    assert data["loss_percent"] == 15.0
    assert data["lost_seq_ranges"] == [[3, 3], [11, 11], [16, 16]]
    assert ping.check(data, ping.Spec()) is None


def test_killed_before_any_reply() -> None:
    data = ping.parse(raw("PING 198.18.3.2 (198.18.3.2) 56(84) bytes of data.\n", "", None))
    assert data["packets_sent"] == 0 and data["truncated"]
    message = ping.check(data, ping.Spec())
    assert message is not None and "stopped right after starting" in message


def test_discard_first_drops_packets_not_replies() -> None:
    # The first packet was lost (warm-up): discarding it leaves a clean 0 % loss window.
    text = """PING 10.1.1.1 (10.1.1.1) 56(84) bytes of data.
no answer yet for icmp_seq=1
64 bytes from 10.1.1.1: icmp_seq=2 ttl=60 time=10.1 ms
64 bytes from 10.1.1.1: icmp_seq=3 ttl=60 time=10.3 ms
64 bytes from 10.1.1.1: icmp_seq=4 ttl=60 time=10.2 ms

--- 10.1.1.1 ping statistics ---
4 packets transmitted, 3 received, 25% packet loss, time 3004ms
rtt min/avg/max/mdev = 10.100/10.200/10.300/0.081 ms
"""
    whole = ping.parse(raw(text))
    assert (whole["loss_percent"], whole["rtt_source"]) == (25.0, "summary")
    kept = ping.parse(raw(text), ping.Spec(discard_first=1))
    assert kept["packets_sent"] == 3 and kept["packets_received"] == 3
    assert kept["loss_percent"] == 0.0
    assert kept["discarded"] == 1 and kept["discarded_rtts_ms"] == []
    assert kept["rtt_source"] == "replies"
    assert (kept["rtt_min_ms"], kept["rtt_avg_ms"], kept["rtt_max_ms"]) == (10.1, 10.2, 10.3)
    assert kept["seqs"] == [2, 3, 4]
    two = ping.parse(raw(text), ping.Spec(discard_first=2))
    assert two["packets_sent"] == 2 and two["discarded_rtts_ms"] == [10.1]


def test_sequence_numbers_unwrap_past_65535() -> None:
    seqs = [65533, 65534, 65535, 0, 1, 2]
    lines = [f"64 bytes from 10.1.1.1: icmp_seq={s} ttl=60 time=1.00 ms" for s in seqs]
    text = "PING 10.1.1.1 (10.1.1.1) 56(84) bytes of data.\n" + "\n".join(lines) + "\n"
    data = ping.parse(raw(text))  # killed: no summary
    assert data["seqs"] == [65533, 65534, 65535, 65536, 65537, 65538]
    assert data["packets_sent"] == 65538
    assert data["lost_seq_ranges"] == [[1, 65532]]


def test_icmp_errors_with_timestamps_and_names() -> None:
    text = """PING 10.9.9.9 (10.9.9.9) 56(84) bytes of data.
[1700000000.000001] From 10.0.0.1 icmp_seq=1 Destination Net Unreachable
[1700000001.000001] From gw.example (10.0.0.1) icmp_seq=2 Destination Net Unreachable
"""
    data = ping.parse(raw(text))
    assert data["icmp_errors"] == [
        {"from": "10.0.0.1", "message": "Destination Net Unreachable", "count": 2}
    ]
    assert data["errors"] == 2 and data["packets_sent"] == 2 and data["truncated"]
    message = ping.check(data, ping.Spec())
    assert message is not None and "no route" in message


def test_unknown_host_says_the_name_could_not_be_resolved() -> None:
    with pytest.raises(ToolFailed, match=r"the name 'nope\.example' could not be resolved"):
        ping.parse(raw("", "ping: nope.example: Temporary failure in name resolution\n", 2))


def test_no_route_from_the_monitor() -> None:
    with pytest.raises(ToolFailed, match=r"no route to 198\.18\.3\.2"):
        ping.parse(raw("", "ping: connect: Network is unreachable\n", 2))


def test_empty_output_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="printed nothing"):
        ping.parse(raw("", "", None))


def test_tracepath_is_not_ping() -> None:
    with pytest.raises(ParseError, match="not ping output"):
        ping.parse(raw((JC_DIR / "centos-7.7_tracepath.out").read_text()))


# --- the Spec and the command line -----------------------------------------------------------


def test_default_argv_and_deadlines() -> None:
    spec = ping.Spec()
    assert ping.build_argv(spec, "198.18.3.2") == [
        "ping", "-n", "-O", "-c", "10", "-i", "1", "-s", "56", "-W", "5", "--", "198.18.3.2",
    ]  # fmt: skip
    assert spec.deadline_s() == 20.0


def test_explicit_deadline_is_rounded_up_for_ping() -> None:
    spec = ping.Spec(count=3, interval_s=0.2, deadline=7.2, ipv6=True, size_bytes=1400)
    argv = ping.build_argv(spec, "host.example")
    assert argv[:4] == ["ping", "-n", "-O", "-6"]
    assert argv[argv.index("-w") + 1] == "8"  # iputils rejects "-w 7.2"
    assert argv[argv.index("-i") + 1] == "0.2"
    assert spec.deadline_s() == 13.0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"count": 0}, "Input should be greater than or equal to 1"),
        ({"count": 100_001}, "Input should be less than or equal to 100000"),
        ({"interval_s": 0.001}, "Input should be greater than or equal to 0.002"),
        ({"size_bytes": 65508}, "Input should be less than or equal to 65507"),
        ({"deadline": 0.5}, "Input should be greater than or equal to 1"),
        ({"discard_first": 1001, "count": 2000}, "Input should be less than or equal to 1000"),
        (
            {"count": 3, "discard_first": 3},
            "discard_first (3) must be smaller than count (3), or no packet is left to measure",
        ),
        ({"ttl": 5}, "Extra inputs are not permitted"),
    ],
)
def test_spec_rejections(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ping.Spec(**fields)


def test_contract() -> None:
    assert (ping.NAME, ping.TOOL) == ("ping", "ping")
    assert ping.META.scheduling == "background"
    assert ping.META.version_argv == ("ping", "-V")
    data = ping.parse(raw((OWN_DIR / "ping-20221126--loopback.out").read_text()))
    for column in ping.COLUMNS:
        assert column.name in data
        assert data[column.name] is None or isinstance(data[column.name], int | float)


@pytest.mark.parametrize(
    "text",
    [
        "PING " + " from x" * 4000,
        "From x " + " " * 20_000 + "y",
        "ping: unknown host " + " " * 20_000 + "y",
        "64 bytes from " + "a: " * 8000,
        "--- " + "x " * 10_000,
    ],
    ids=["header-froms", "icmp-error-spaces", "unknown-host-spaces", "reply-colons", "title"],
)
def test_long_malformed_lines_parse_in_linear_time(text: str) -> None:
    # These once made a regex backtrack for seconds; a hung parser is as bad as a crash.
    # CPU time, not wall time: backtracking burns CPU, while other work on a busy host only
    # delays the wall clock.
    started = time.process_time()
    parse_quietly(text)
    assert time.process_time() - started < 1.0


# --- properties ------------------------------------------------------------------------------

PING_WORDS = [
    "PING ", "64 bytes from ", "10.0.0.1", "::1", " (10.0.0.1)", ": ", "icmp_seq=", " ttl=",
    " time=", " ms", " (DUP!)", " (BAD CHECKSUM!)", " (truncated)", "no answer yet for ",
    "From ", " Destination Host Unreachable", "--- x ping statistics ---",
    " packets transmitted, ", " received", ", +2 duplicates", ", +1 errors", "% packet loss",
    ", time 10ms", "rtt min/avg/max/mdev = ", "/", " 56(84) bytes of data.", " data bytes",
    "[1700000000.123456] ", "ping: ", ": Name or service not known", "\n", " ",
]  # fmt: skip
ping_like = st.lists(
    st.one_of(st.sampled_from(PING_WORDS), st.integers(0, 70000).map(str), st.text(max_size=5)),
    max_size=80,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=500), ping_like))
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    parse_quietly(text)
    parse_quietly(text, ping.Spec(discard_first=2))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALL_TEXTS), st.floats(0, 1), st.floats(0, 1))
def test_truncated_real_outputs(text: str, start: float, end: float) -> None:
    lo, hi = sorted((int(start * len(text)), int(end * len(text))))
    for piece in (text[:hi], text[lo:], text[lo:hi]):
        data = parse_quietly(piece)
        if data is not None and data["truncated"]:
            # Without a summary every figure comes from lines actually seen.
            assert data["packets_received"] <= data["packets_sent"]
            assert data["rtt_source"] in ("replies", None)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_TEXTS), st.data())
def test_mutated_real_outputs(text: str, draw: st.DataObject) -> None:
    text = mutate_output(draw, text, ping_like, "0123456789.-+/%")
    parse_quietly(text)
    parse_quietly(text, ping.Spec(discard_first=1))


def iputils_time(us: int) -> str:
    """An RTT in microseconds printed the way iputils 20221126 prints it."""
    if us >= 100_000:
        return f"{(us + 500) // 1000}"
    if us >= 10_000:
        return f"{(us + 50) // 1000}.{((us + 50) % 1000) // 100}"
    if us >= 1_000:
        return f"{(us + 5) // 1000}.{((us + 5) % 1000) // 10:02d}"
    return f"{us // 1000}.{us % 1000:03d}"


@st.composite
def ping_runs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 40))
    fates = draw(st.lists(st.sampled_from(["ok", "ok", "lost", "dup"]), min_size=n, max_size=n))
    times = [iputils_time(draw(st.integers(1, 400_000))) for _ in range(2 * n)]
    return {
        "fates": fates,
        "times": times,
        "summary": draw(st.booleans()),
        "stamps": draw(st.booleans()),
        "discard": draw(st.integers(0, n - 1)),
    }


@settings(max_examples=100, deadline=None)
@given(ping_runs())
def test_well_formed_outputs_give_exact_figures(run: dict[str, Any]) -> None:
    fates, times, discard = run["fates"], run["times"], run["discard"]
    stamp = "[1700000000.000000] " if run["stamps"] else ""
    lines = ["PING 192.0.2.7 (192.0.2.7) 56(84) bytes of data."]
    first: dict[int, float] = {}
    every: list[float] = []  # what ping's own summary is computed over (duplicates too)
    for seq, fate in enumerate(fates, start=1):
        if fate == "lost":
            lines.append(f"{stamp}no answer yet for icmp_seq={seq}")
            continue
        reply = f"{stamp}64 bytes from 192.0.2.7: icmp_seq={seq} ttl=57 time={{}} ms"
        lines.append(reply.format(times[2 * seq - 2]))
        first[seq] = float(times[2 * seq - 2])
        every.append(first[seq])
        if fate == "dup":
            lines.append(reply.format(times[2 * seq - 1]) + " (DUP!)")
            every.append(float(times[2 * seq - 1]))
    n, received, dups = len(fates), len(first), fates.count("dup")
    if run["summary"]:
        lines += ["", "--- 192.0.2.7 ping statistics ---"]
        dup_text = f", +{dups} duplicates" if dups else ""
        lines.append(
            f"{n} packets transmitted, {received} received{dup_text}, "
            f"{100 * (n - received) / n:g}% packet loss, time {n * 1000}ms"
        )
        if every:
            figures = (min(every), statistics.fmean(every), max(every), statistics.pstdev(every))
            lines.append("rtt min/avg/max/mdev = " + "/".join(f"{f:.3f}" for f in figures) + " ms")
    data = ping.parse(
        raw("\n".join(lines) + "\n"), ping.Spec.model_construct(discard_first=discard)
    )

    kept = {s: t for s, t in first.items() if s > discard}
    assert data["rtts_ms"] == list(kept.values())
    assert data["seqs"] == list(kept)
    assert data["discarded_rtts_ms"] == [t for s, t in first.items() if s <= discard]
    # Every packet has a line (reply or "no answer yet"), so even without the summary the
    # highest sequence number seen is the number sent.
    sent = n
    assert data["packets_sent"] == sent - discard
    assert data["packets_received"] == len(kept)
    assert data["duplicates"] == dups
    assert data["loss_percent"] == pytest.approx(
        100 * (sent - discard - len(kept)) / (sent - discard)
    )
    assert expand(data["lost_seq_ranges"]) == set(range(discard + 1, sent + 1)) - set(kept)
    assert data["ttl"] == (57 if kept else None)
    if run["summary"] and discard == 0 and every:
        assert data["rtt_source"] == "summary"
        assert data["rtt_avg_ms"] == float(f"{statistics.fmean(every):.3f}")
        assert data["rtt_mdev_ms"] == float(f"{statistics.pstdev(every):.3f}")
    elif kept:
        values = list(kept.values())
        assert data["rtt_source"] == "replies"
        assert data["rtt_min_ms"] == min(values)
        assert data["rtt_max_ms"] == max(values)
        assert data["rtt_avg_ms"] == pytest.approx(statistics.fmean(values), abs=5e-4 + 1e-9)
        assert data["rtt_mdev_ms"] == pytest.approx(statistics.pstdev(values), abs=5e-4 + 1e-9)
    else:
        assert data["rtt_source"] is None and data["rtt_avg_ms"] is None


# --- real runs on loopback -------------------------------------------------------------------

needs_ping = pytest.mark.skipif(not HAVE_PING, reason="iputils ping is not installed")


@needs_ping
def test_real_ping_to_loopback() -> None:
    ctx = ProbeContext(target="lo", address="127.0.0.1")
    result = asyncio.run(ping.run(ping.Spec(count=3, interval_s=0.2), ctx))
    assert result.succeeded, result.error
    assert result.tool_version is not None and "iputils" in result.tool_version
    data = result.data
    assert (data["packets_sent"], data["packets_received"], data["loss_percent"]) == (3, 3, 0.0)
    assert 0 < data["rtt_min_ms"] <= data["rtt_avg_ms"] <= data["rtt_max_ms"] < 100
    assert len(data["rtts_ms"]) == 3
    assert result.diags.startswith("ping -n -O -c 3 -i 0.2 -s 56 -W 5 -- 127.0.0.1")


@needs_ping
def test_real_ping_ipv6_loopback_with_discard() -> None:
    ctx = ProbeContext(target="lo6", address="::1")
    result = asyncio.run(ping.run(ping.Spec(count=3, interval_s=0.2, discard_first=1), ctx))
    assert result.succeeded, result.error
    assert result.data["discarded"] == 1
    assert len(result.data["discarded_rtts_ms"]) == 1
    assert result.data["packets_sent"] == 2 and result.data["seqs"] == [2, 3]
    assert result.params["discard_first"] == 1


@needs_ping
def test_real_ping_to_an_unresolvable_name() -> None:
    ctx = ProbeContext(target="ghost", address="nonexistent.invalid")
    result = asyncio.run(ping.run(ping.Spec(count=1), ctx))
    assert not result.succeeded
    assert result.error is not None
    assert "'nonexistent.invalid' could not be resolved" in result.error
    assert "nonexistent.invalid" in result.diags
