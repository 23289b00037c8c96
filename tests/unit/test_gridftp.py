"""The GridFTP copy probes: recorded outputs (globus-url-copy 10.12 against globus-gridftp-server
13.24, stamped) against their reviewed oracles, a property test of the parser, the spec's
ranges, the command line, and the agent's server kind (configuration and guard)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from iepm.errors import ParseError, ToolFailed
from iepm.probes import PROBES, gridftp, gridftp_disk, gridftp_mem
from iepm.remote.servers import GRIDFTP, KINDS, Grant
from iepm.runner import RawRun

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gridftp"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))
VERSION = "globus-url-copy-10.12_gridftp-server-13.24"


def fixture_raw(case: str) -> tuple[RawRun, gridftp.TransferSpec, dict[str, object]]:
    oracle = json.loads((FIXTURES / f"{case}.json").read_text())
    raw = RawRun(
        argv=tuple(shlex.split(oracle["command"])),
        stdout=(FIXTURES / f"{case}.out").read_text(),
        stderr=(FIXTURES / f"{case}.err").read_text(),
        returncode=oracle["returncode"],
        timed_out=oracle["timed_out"],
    )
    spec = gridftp_mem.Spec(size=oracle["size"], streams=oracle["streams"], window=oracle["window"])
    return raw, spec, oracle


def test_every_recorded_case_has_its_oracle() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.out")) == CASES
    assert sorted(p.stem for p in FIXTURES.glob("*.err")) == CASES
    assert len(CASES) >= 8 and all(c.startswith(f"{VERSION}--") for c in CASES)


@pytest.mark.parametrize("case", CASES)
def test_recorded_outputs_parse_to_the_reviewed_oracle(case: str) -> None:
    raw, spec, expected = fixture_raw(case)
    if "data" in expected:
        assert gridftp.parse(raw, spec) == expected["data"]
    else:
        error = ToolFailed if expected["raises"] == "ToolFailed" else ParseError
        with pytest.raises(error) as caught:
            gridftp.parse(raw, spec)
        assert str(caught.value) == expected["message"]


def test_a_complete_copy_passes_its_check_and_its_timers_add_up() -> None:
    raw, spec, _ = fixture_raw(f"{VERSION}--mem-4streams")
    data = gridftp.parse(raw, spec)
    assert gridftp.check(data, spec) is None
    assert data["bytes"] == 256 * 1024**2 and data["streams"] == 4
    assert data["window_bytes"] == 1024**2
    assert 0 < data["connect_s"] <= data["setup_s"]
    parts = data["setup_s"] + data["transfer_s"] + data["commit_s"]
    assert parts == pytest.approx(data["elapsed_s"], abs=0.01)
    # globus-url-copy's own rate (from the server's 0.1 s markers) agrees on a 1 s+ copy...
    assert data["tool_throughput_bps"] == pytest.approx(data["throughput_bps"], rel=0.1)
    # ...while end to end the set-up counts (the bbftp-like bias, small on loopback).
    assert data["end_to_end_throughput_bps"] < data["throughput_bps"]


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("refused", "is globus-gridftp-server (Debian: globus-gridftp-server-progs)"),
        ("permission-denied", "refused to write the file: permission denied"),
        ("disk-full", "its file system is full"),
        ("stalled", "did not answer: nothing moved for the stall timeout"),
    ],
)
def test_failures_name_their_reason_and_keep_the_tools_words(case: str, words: str) -> None:
    raw, spec, _ = fixture_raw(f"{VERSION}--{case}")
    with pytest.raises(ToolFailed) as caught:
        gridftp.parse(raw, spec)
    assert words in str(caught.value) and "(globus-url-copy: " in str(caught.value)


def test_a_copy_killed_at_its_deadline_says_where_it_was() -> None:
    raw, spec, _ = fixture_raw(f"{VERSION}--hang")
    assert raw.timed_out
    data = gridftp.parse(raw, spec)
    assert gridftp.check(data, spec) == (
        f"globus-url-copy to {gridftp.where(raw.argv)} did not finish: it was connecting and "
        "logging in"
    )


def test_a_copy_of_the_wrong_size_is_a_failure() -> None:
    raw, _, _ = fixture_raw(f"{VERSION}--mem-1stream")
    spec = gridftp_mem.Spec(size="128M")
    assert gridftp.check(gridftp.parse(raw, spec), spec) == (
        f"globus-url-copy copied {64 * 1024**2} bytes, the spec asked for {128 * 1024**2}"
    )


def test_unstamped_output_is_not_taken_for_a_run() -> None:
    raw = RawRun(
        argv=("python3", "stamp.py", "globus-url-copy"), stdout="", returncode=-9, timed_out=True
    )
    with pytest.raises(ParseError, match="printed nothing stamped"):
        gridftp.parse(raw)


# --- property: the timers are the differences of the stamps the log carries --------------------


def synthetic(times: list[float], nbytes: int, blocks: int) -> RawRun:
    """A stamped globus-url-copy log of the recorded shape with the given event times."""
    start, login, begin, sent, done = times
    host = "198.18.0.2:2811"
    err = [
        (start, "stamp: start globus-url-copy"),
        (start, f"debug: connecting to ftp://{host}/x.dat"),
        (login, "230 User anonymous logged in."),
        (login, "STOR x.dat"),
        (begin, "150 Beginning transfer."),
        (begin, " Timestamp:  1795803282.4"),
        (begin, " Stripe Bytes Transferred: 0"),
    ]
    step = (sent - begin) / (blocks + 1)
    for i in range(blocks):
        at = begin + step * (i + 1)
        err.append(
            (at, f"debug: data callback, no error, buffer 0x1, length 1, offset={i}, eof=false")
        )
    err += [
        (sent, f"debug: data callback, no error, buffer 0x1, length 0, offset={nbytes}, eof=true"),
        (done, " Timestamp:  1795803284.4"),
        (done, f" Stripe Bytes Transferred: {nbytes}"),
        (done, f"111 Range Marker 0-{nbytes}"),
        (done, "226 Transfer Complete."),
        (done, "debug: operation complete"),
    ]
    out = (
        f"[{done:.6f}]   {nbytes} bytes   {nbytes / 2 / 2**20:.2f} MB/sec avg   1.00 MB/sec inst\n"
    )
    argv = ("python3", "stamp.py", "globus-url-copy", "-p", "3", "x", f"ftp://{host}/x.dat")
    stderr = "".join(f"[{at:.6f}] {text}\n" for at, text in err)
    return RawRun(argv=argv, stdout=out, stderr=stderr, returncode=0)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    start=st.floats(min_value=1.7e9, max_value=1.9e9),
    gaps=st.lists(st.floats(min_value=0.0, max_value=500.0), min_size=4, max_size=4),
    nbytes=st.integers(min_value=1, max_value=64 * 1024**3),
    blocks=st.integers(min_value=0, max_value=20),
)
def test_the_parser_reads_the_phases_from_any_stamped_log(
    start: float, gaps: list[float], nbytes: int, blocks: int
) -> None:
    # Stamps carry microseconds: round them as stamp.py writes them.
    times = [round(start + sum(gaps[:i]), 6) for i in range(5)]
    data = gridftp.parse(synthetic(times, nbytes, blocks))
    assert data["complete"] and data["bytes"] == nbytes and data["streams"] == 3
    assert data["connect_s"] == pytest.approx(times[1] - times[0], abs=2e-6)
    assert data["setup_s"] == pytest.approx(times[2] - times[0], abs=2e-6)
    assert data["transfer_s"] == pytest.approx(times[3] - times[2], abs=2e-6)
    assert data["commit_s"] == pytest.approx(times[4] - times[3], abs=2e-6)
    assert data["tool_transfer_s"] == 2.0
    assert data["tool_throughput_bps"] == pytest.approx(nbytes / 2 * 8, rel=1e-2, abs=1e5)
    if data["transfer_s"]:
        assert data["throughput_bps"] == pytest.approx(
            nbytes * 8 / data["transfer_s"], rel=1e-6, abs=0.06
        )
    else:
        assert data["throughput_bps"] is None


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    text=st.text(max_size=400),
    returncode=st.integers(min_value=-15, max_value=3),
    stamp=st.booleans(),
)
def test_the_parser_never_fails_but_with_its_own_errors(
    text: str, returncode: int, stamp: bool
) -> None:
    lines = text.splitlines()
    stderr = (
        "".join(f"[1795803282.{i:06d}] {ln}\n" for i, ln in enumerate(lines)) if stamp else text
    )
    raw = RawRun(argv=("globus-url-copy",), stdout="", stderr=stderr, returncode=returncode)
    try:
        data = gridftp.parse(raw)
    except (ToolFailed, ParseError):
        return
    assert data["complete"] is False or returncode == 0


# --- spec and command --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size", "512K", "must be between 1M and 64G"),
        ("size", "lots", "is not a size like 64M or 1G"),
        ("streams", 17, "less than or equal to 16"),
        ("streams", 0, "greater than or equal to 1"),
        ("window", "32K", "must be between 64K and 256M"),
        ("window", "wide", "is not a size like 256K or 4M"),
        ("duration_s", 0, "greater than or equal to 1"),
        ("connect_timeout_s", 121, "less than or equal to 120"),
        ("remote_dir", "/tmp/../etc", "no '..'"),
    ],
)
def test_the_spec_rejects_out_of_range_values(field: str, value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        gridftp_mem.Spec.model_validate({field: value})


def test_the_disk_probe_offers_no_commit_it_cannot_measure() -> None:
    assert gridftp_disk.Spec().commit == "none"
    with pytest.raises(ValidationError, match="Input should be 'none'"):
        gridftp_disk.Spec.model_validate({"commit": "at_end"})


def test_the_command_is_stamped_and_carries_streams_window_and_stall_timeout() -> None:
    spec = gridftp_mem.Spec(size="1G", streams=4, window="2M", connect_timeout_s=7)
    argv = gridftp.build_argv(spec, "198.18.0.2", source="/dev/shm/s", path="iepm-1.dat", port=5001)
    assert argv[:3] == [gridftp.copy.STAMP_PYTHON, "-I", gridftp.copy.STAMP_SCRIPT]
    assert argv[3] == "globus-url-copy" and {"-dbg", "-vb", "-rp"} <= set(argv)
    assert argv[argv.index("-p") + 1] == "4"
    assert argv[argv.index("-tcp-bs") + 1] == str(2 * 1024**2)
    assert argv[argv.index("-stall-timeout") + 1] == "7"
    assert argv[-2:] == ["file:///dev/shm/s", "ftp://198.18.0.2:5001/iepm-1.dat"]
    # A plain endpoint's absolute directory is root-relative under -rp; IPv6 in brackets.
    plain = gridftp.build_argv(gridftp_mem.Spec(remote_dir="/data/in"), "fd00::2")
    assert plain[-1] == "ftp://[fd00::2]:2811/%2Fdata/in/iepm-gridftp.dat"
    assert "-tcp-bs" not in plain


def test_both_probes_are_registered_against_the_agents_gridftp_kind() -> None:
    for name, storage in (("gridftp_mem", "memory"), ("gridftp_disk", "disk")):
        assert PROBES[name].META.server == "gridftp" and PROBES[name].META.copy == storage
        assert PROBES[name].META.scheduling == "exclusive"
    assert KINDS["gridftp"] is GRIDFTP and GRIDFTP.package == "globus-gridftp-server-progs"


# --- the agent's server kind -------------------------------------------------------------------


def grant(**changes: object) -> Grant:
    base: dict[str, object] = {
        "streams": 4, "test_s": 30, "udp": False, "window_bytes": 1024**2,
        "window_granted": True, "rate_bps": None, "size_bytes": 64 * 1024**2,
    }  # fmt: skip
    return Grant(**{**base, **changes})  # type: ignore[arg-type]


def test_the_kind_confines_the_server_to_the_slots_directory(tmp_path: Path) -> None:
    assert GRIDFTP.setup is not None
    GRIDFTP.setup(tmp_path, grant())
    config = dict(
        line.split(" ", 1) for line in (tmp_path / "gridftp.conf").read_text().splitlines()
    )
    data = str(tmp_path / "data")
    assert config["home_dir"] == data and config["restrict_paths"] == data
    assert config["allow_anonymous"] == "1" and config["anonymous_user"] != "root"
    assert (tmp_path / "data").is_dir()
    argv = GRIDFTP.argv("globus-gridftp-server", 5301, None, None)
    assert argv == ["globus-gridftp-server", "-c", "gridftp.conf", "-p", "5301", "-single"]
    # PASV names the agent's server_bind address (not what the host name resolves to).
    bound = GRIDFTP.argv("globus-gridftp-server", 5301, "198.18.0.2", None)
    assert bound[-2:] == ["-data-interface", "198.18.0.2"]
    assert GRIDFTP.is_ready(b"[9] Fri Nov 27 18:09:41 2026 :: Server started in daemon mode.\n")
    assert not GRIDFTP.is_ready(b"[9] Fri Nov 27 18:09:41 2026 :: Configuration read from x.\n")


def test_the_guard_cuts_a_second_session_a_larger_file_and_a_wider_window() -> None:
    prefix = b"[13353] Fri Nov 27 18:10:06 2026 :: [::ffff:127.0.0.1]:40396: [CLIENT]: "
    connected = b"[13353] Fri Nov 27 18:10:06 2026 :: New connection from: [::1]:4\n"
    guard = GRIDFTP.guard(grant())
    assert guard.line(connected) is None
    assert guard.line(prefix + b"SITE STORBUFSIZE 1048576\n") is None
    assert guard.line(prefix + b"ALLO 67108864\n") is None
    assert guard.line(prefix + b"ALLO 67108865\n") == (
        "the client announced a 67108865-byte file, the slot granted 67108864"
    )
    assert guard.line(prefix + b"SITE STORBUFSIZE 2097152\n") == (
        "the client asked for a 2097152-byte window, the slot granted 1048576"
    )
    assert guard.line(connected) == "connection 2 to a slot granted one copy"
    # A window the request did not name is the server's and the kernel's business.
    assert (
        GRIDFTP.guard(grant(window_granted=False)).line(prefix + b"SITE STORBUFSIZE 9999999\n")
        is None
    )
