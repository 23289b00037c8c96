"""The xrdcp copy probes: recorded xrdcp 5.5.3 debug logs against their reviewed oracles, the
spec's ranges, and real copies to a plain xrootd on loopback (success, missing tool, hang)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from pathlib import Path
from typing import Any

import psutil
import pytest
from pydantic import ValidationError

from iepm.errors import ParseError, ToolFailed
from iepm.probes import PROBES, xrdcp, xrdcp_mem
from iepm.probes.base import ProbeContext
from iepm.results import Outcome
from iepm.runner import RawRun
from testkit.xrootd_plain import plain_xrootd, silent_listener

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "xrdcp"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))
HOST = "127.0.0.1"


def fixture_raw(case: str) -> RawRun:
    oracle = json.loads((FIXTURES / f"{case}.json").read_text())
    return RawRun(
        argv=tuple(shlex.split(oracle["command"])),
        stdout="",
        stderr=(FIXTURES / f"{case}.out").read_text(),
        returncode=oracle["returncode"],
        timed_out=oracle["timed_out"],
    )


def spec_of(raw: RawRun) -> xrdcp_mem.Spec:
    streams = int(raw.argv[raw.argv.index("--streams") + 1])
    size = "256M" if streams == 4 else "64M"
    return xrdcp_mem.Spec(size=size, streams=streams)


# --- recorded outputs ---------------------------------------------------------------------------


def test_every_recorded_case_has_its_oracle() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.out")) == CASES
    assert len(CASES) >= 6


@pytest.mark.parametrize("case", CASES)
def test_recorded_outputs_parse_to_the_reviewed_oracle(case: str) -> None:
    expected = json.loads((FIXTURES / f"{case}.json").read_text())
    raw = fixture_raw(case)
    spec = spec_of(raw)
    if "data" in expected:
        data = xrdcp.parse(raw, spec)
        assert data == expected["data"]
        assert xrdcp.check(data, spec) == (None if data["complete"] else data["tool_error"])
    else:
        error = {"ToolFailed": ToolFailed, "ParseError": ParseError}[expected["raises"]]
        with pytest.raises(error) as caught:
            xrdcp.parse(raw, spec)
        assert str(caught.value) == expected["message"]


@pytest.mark.parametrize("case", ["xrdcp-5.5.3--mem-1stream", "xrdcp-5.5.3--mem-4streams"])
def test_the_timers_partition_the_run_and_rates_follow_from_them(case: str) -> None:
    data = xrdcp.parse(fixture_raw(case))
    phases = data["setup_s"] + data["transfer_s"] + data["commit_s"]
    assert 0 < phases <= data["elapsed_s"] + 1e-6
    assert data["connect_s"] < data["setup_s"]
    assert data["throughput_bps"] == pytest.approx(data["bytes"] * 8 / data["transfer_s"], 1e-6)
    # Set-up counted in: the end-to-end rate is the lower one, as a stopwatch would show it.
    assert data["end_to_end_throughput_bps"] < data["throughput_bps"]


def test_the_four_stream_copy_connected_four_data_streams() -> None:
    data = xrdcp.parse(fixture_raw("xrdcp-5.5.3--mem-4streams"))
    assert (data["streams"], data["connected_streams"]) == (4, 4)


def test_a_copy_killed_mid_transfer_keeps_its_set_up_and_says_where_it_stopped() -> None:
    raw = fixture_raw("xrdcp-5.5.3--mem-4streams")
    lines = raw.stderr.splitlines()
    cut = RawRun(
        argv=raw.argv, stdout="", stderr="\n".join(lines[: len(lines) // 2]),
        returncode=-15, timed_out=True,
    )  # fmt: skip
    data = xrdcp.parse(cut)
    assert data["complete"] is False
    assert data["setup_s"] is not None and data["transfer_s"] is None
    assert data["throughput_bps"] is None
    assert data["tool_error"] == "xrdcp to 127.0.0.1:{} did not finish: it was copying".format(
        xrdcp.where(raw.argv).rsplit(":", 1)[1]
    )


def test_output_that_is_no_xrdcp_log_is_a_parse_error_or_names_what_was_said() -> None:
    argv = tuple(xrdcp.build_argv(xrdcp_mem.Spec(), HOST))
    with pytest.raises(ParseError, match="wrote no debug log"):
        xrdcp.parse(RawRun(argv=argv, stdout="", stderr="", returncode=-9, timed_out=True))
    with pytest.raises(ToolFailed, match="it said: xrdcp: unrecognized option"):
        xrdcp.parse(
            RawRun(argv=argv, stdout="", stderr="xrdcp: unrecognized option\n", returncode=50)
        )


# --- spec and argv ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size", "512K", "size '512K' must be between 1M and 64G"),
        ("size", "65G", "size '65G' must be between 1M and 64G"),
        ("size", "lots", "size 'lots' is not a size like 64M or 1G"),
        ("streams", 16, "less than or equal to 15"),
        ("remote_dir", "/tmp/../etc", "no '..'"),
        ("remote_dir", "tmp", "must be an absolute path"),
        ("duration_s", 0.5, "greater than or equal to 1"),
        ("chunk_size", "32K", "chunk_size '32K' must be between 64K and 64M"),
        ("chunk_size", "big", "chunk_size 'big' is not a size like 1M or 8M"),
        ("parallel_chunks", 0, "greater than or equal to 1"),
    ],
)
def test_the_spec_rejects_values_out_of_range(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        xrdcp_mem.Spec.model_validate({field: value})


def test_the_argv_bounds_connection_retries_and_brackets_ipv6() -> None:
    spec = xrdcp_mem.Spec(streams=4, connect_timeout_s=3, duration_s=20)
    argv = xrdcp.build_argv(spec, "fd00::2", source="/dev/shm/s", path="/d/x.dat", port=1095)
    text = shlex.join(argv)
    assert "--streams 4" in text and "--debug 2" in text
    assert "-DIConnectionWindow 3 -DIConnectionRetry 1 -DIRequestTimeout 20" in text
    assert argv[-2:] == ["/dev/shm/s", "root://[fd00::2]:1095//d/x.dat"]
    # The copy's pipeline is written out at xrdcp's own defaults, so the raw log says what ran.
    assert "-DICPChunkSize 8388608 -DICPParallelChunks 4 -DICpUsePgWrtRd 1" in text
    tuned = spec.model_copy(update={"chunk_size": "2M", "parallel_chunks": 8})
    tuned = tuned.model_copy(update={"page_checksums": False})
    text = shlex.join(xrdcp.build_argv(tuned, HOST))
    assert "-DICPChunkSize 2097152 -DICPParallelChunks 8 -DICpUsePgWrtRd 0" in text


def log_line(at: str, text: str, topic: str = "ExDbgMsg") -> str:
    return f"[2026-11-27 21:00:{at} +0000][Debug  ][{topic:<18}] {text}"


def test_the_write_pipeline_is_read_from_the_request_handlers() -> None:
    """Two requests queued, answered one by one, a pause with none, a third: the mean number
    awaiting the server over the transfer and the time with none follow from the stamps."""
    dest = "[0x1@root://h:1//f.dat?oss.asize=3145728] "
    sent = "[h:1] MsgHandler created: 0x{} (message: kXR_write (handle: 0x0, offset: 0, size: 1) )."
    done = "[h:1] Calling MsgHandler: 0x{} (message: kXR_write (handle: 0x0) ) with status: [OK] ."
    log = "\n".join(
        [
            log_line("00.000000", "[h:1] Logged in, session: 1", "XRootDTransport"),
            log_line("01.000000", dest + "successfully opened at h:1", "File"),
            log_line("01.000000", sent.format("a")),
            log_line("01.000000", sent.format("b")),
            log_line("02.000000", done.format("a")),
            log_line("03.000000", done.format("b")),
            log_line("04.000000", sent.format("c")),
            log_line("05.000000", done.format("c")),
            log_line("05.000000", dest + "Sending a close command for handle 0x0", "File"),
            log_line("05.100000", dest + "Close returned from h:1 with: [SUCCESS]", "File"),
        ]
    )
    data = xrdcp.parse(RawRun(argv=("xrdcp", "root://h:1//f.dat"), stdout="", stderr=log))
    assert data["transfer_s"] == 4.0 and data["write_requests"] == 3
    # 2 for 1 s, 1 for 1 s, none for 1 s, 1 for 1 s: 4 request-seconds over 4 s.
    assert data["writes_in_flight"] == 1.0
    assert data["pipeline_empty_s"] == 1.0
    assert data["page_checksums"] is False


def test_the_probe_is_registered_and_needs_an_xrootd_server() -> None:
    assert PROBES["xrdcp_mem"] is xrdcp_mem
    assert xrdcp_mem.META.server == "xrootd"
    assert {m.key for m in xrdcp_mem.METRICS} <= {c.name for c in xrdcp_mem.COLUMNS}


# --- real copies on loopback --------------------------------------------------------------------


def xrdcp_processes(port: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.info["name"] == "xrdcp" and any(f":{port}/" in a for a in proc.info["cmdline"]):
            found.append(proc)
    return found


def memory_sources() -> set[str]:
    # This process's own (another test run on the machine makes and removes its own meanwhile).
    return {p.name for p in Path(xrdcp.MEMORY_DIR).glob(f"iepm-xrdcp-{os.getpid()}-*")}


def test_a_memory_copy_to_a_plain_endpoint_succeeds_and_leaves_nothing() -> None:
    before = memory_sources()
    with plain_xrootd() as server:
        spec = xrdcp_mem.Spec(size="32M", port=server.port, remote_dir=str(server.export))
        result = asyncio.run(xrdcp_mem.run(spec, ProbeContext(target="lo", address=HOST)))
        assert result.succeeded, result.error
        assert result.data["bytes"] == 32 * 1024**2
        assert result.data["transfer_s"] > 0 and result.data["setup_s"] > 0
        assert result.data["page_checksums"] is True  # xrdcp 5's kXR_pgwrite
        assert result.data["write_requests"] == 4  # 32M in xrdcp's 8M chunks
        assert "[removed /" in result.diags
        assert server.files() == []
    assert memory_sources() == before


def test_a_copy_without_page_checksums_sends_plain_writes_of_the_chunk_size() -> None:
    with plain_xrootd() as server:
        spec = xrdcp_mem.Spec(
            size="8M", port=server.port, remote_dir=str(server.export), chunk_size="1M",
            page_checksums=False,
        )  # fmt: skip
        result = asyncio.run(xrdcp_mem.run(spec, ProbeContext(target="lo", address=HOST)))
        assert result.succeeded, result.error
        assert result.data["page_checksums"] is False
        assert result.data["write_requests"] == 8
        assert server.files() == []


def test_a_write_the_server_refuses_is_a_failed_result_and_leaves_nothing() -> None:
    with plain_xrootd() as server:
        spec = xrdcp_mem.Spec(size="8M", port=server.port, remote_dir=str(server.readonly))
        result = asyncio.run(xrdcp_mem.run(spec, ProbeContext(target="lo", address=HOST)))
        assert result.outcome == Outcome.FAILED
        assert result.error is not None and "permission denied" in result.error
        assert server.files() == []


def test_a_missing_xrdcp_is_a_failed_result_naming_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    before = memory_sources()
    result = asyncio.run(xrdcp_mem.run(xrdcp_mem.Spec(size="8M"), ProbeContext("t", HOST)))
    assert result.outcome == Outcome.FAILED
    assert result.error is not None and "apt-get install xrootd-client" in result.error
    assert memory_sources() == before


@pytest.mark.servers
def test_a_server_that_never_answers_ends_at_the_deadline_with_nothing_left() -> None:
    before = memory_sources()
    with silent_listener() as port:
        spec = xrdcp_mem.Spec(size="8M", port=port, duration_s=2, connect_timeout_s=1)
        result = asyncio.run(xrdcp_mem.run(spec, ProbeContext(target="hung", address=HOST)))
        assert result.outcome == Outcome.TIMEOUT
        assert result.error is not None
        assert "did not finish within its 2 s deadline" in result.error
        assert "connecting and logging in" in result.error
        assert xrdcp_processes(port) == []
    assert memory_sources() == before
