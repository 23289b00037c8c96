"""The rsync-over-SSH copy probes: recorded outputs (rsync 3.5.0, OpenSSH 9.2p1, stamped) against
their reviewed oracles, the spec's ranges, the command line, and the stamping wrapper."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from iepm.errors import ParseError, ToolFailed
from iepm.probes import PROBES, rsync, rsync_disk, rsync_mem
from iepm.probes.base import SshLogin
from iepm.runner import RawRun

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rsync"
CASES = sorted(p.stem for p in FIXTURES.glob("*.json"))


def fixture_raw(case: str) -> tuple[RawRun, rsync.CopySpec, dict[str, object]]:
    oracle = json.loads((FIXTURES / f"{case}.json").read_text())
    raw = RawRun(
        argv=tuple(shlex.split(oracle["command"])),
        stdout=(FIXTURES / f"{case}.out").read_text(),
        stderr=(FIXTURES / f"{case}.err").read_text(),
        returncode=oracle["returncode"],
        timed_out=oracle["timed_out"],
    )
    return raw, rsync_mem.Spec(size=oracle["size"]), oracle


def test_every_recorded_case_has_its_oracle() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.out")) == CASES
    assert sorted(p.stem for p in FIXTURES.glob("*.err")) == CASES
    assert len(CASES) >= 8


@pytest.mark.parametrize("case", CASES)
def test_recorded_outputs_parse_to_the_reviewed_oracle(case: str) -> None:
    raw, spec, expected = fixture_raw(case)
    if "data" in expected:
        assert rsync.parse(raw, spec) == expected["data"]
    else:
        error = ToolFailed if expected["raises"] == "ToolFailed" else ParseError
        with pytest.raises(error) as caught:
            rsync.parse(raw, spec)
        assert str(caught.value) == expected["message"]


def test_a_complete_copy_passes_its_check_and_a_hang_does_not() -> None:
    raw, spec, _ = fixture_raw("rsync-3.5.0_openssh-9.2p1--mem")
    data = rsync.parse(raw, spec)
    assert rsync.check(data, spec) is None
    # The stamps tell the phases; rsync's own figures agree with ours on the transfer...
    assert data["tool_throughput_bps"] == pytest.approx(data["throughput_bps"], rel=0.01)
    # ...while its summary counts whole seconds of its whole run (the bbftp-like bias).
    assert data["summary_throughput_bps"] < 0.5 * data["throughput_bps"]
    hung, spec, _ = fixture_raw("rsync-3.5.0_openssh-9.2p1--hang")
    why = rsync.check(rsync.parse(hung, spec), spec)
    assert why == "rsync to root@127.0.0.1 did not finish: it was copying"


def test_a_copy_of_the_wrong_size_is_a_failure() -> None:
    raw, _, _ = fixture_raw("rsync-3.5.0_openssh-9.2p1--mem")
    spec = rsync_mem.Spec(size="128M")
    data = rsync.parse(raw, spec)
    assert rsync.check(data, spec) == (
        f"rsync copied {64 * 1024**2} bytes, the spec asked for {128 * 1024**2}"
    )


def test_unstamped_output_is_not_taken_for_a_run() -> None:
    raw = RawRun(argv=("python3", "stamp.py", "rsync"), stdout="", returncode=-9, timed_out=True)
    with pytest.raises(ParseError, match="printed nothing stamped"):
        rsync.parse(raw)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size", "512K", "must be between 1M and 64G"),
        ("size", "lots", "is not a size like 64M or 1G"),
        ("duration_s", 0, "greater than or equal to 1"),
        ("cipher", "3des-cbc", "Input should be"),
        ("connect_timeout_s", 121, "less than or equal to 120"),
    ],
)
def test_the_spec_rejects_out_of_range_values(field: str, value: object, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        rsync_mem.Spec.model_validate({field: value})


def test_the_command_holds_ssh_to_the_lease_and_the_target_to_the_deadline() -> None:
    login = SshLogin("mon", 2222, "/k/id", "/k/known", 3.0, rsync_path="/opt/bin/rsync")
    spec = rsync_disk.Spec(size="1G", duration_s=30, connect_timeout_s=4)
    argv = rsync.build_argv(
        spec, "198.18.0.2", source="/var/tmp/s", directory="/d/iepm-x", login=login, fsync=True
    )
    ssh = shlex.split(argv[argv.index("-e") + 1])
    assert ssh[:3] == ["ssh", "-F", "none"] and "BatchMode=yes" in ssh and "-v" in ssh
    assert ssh[ssh.index("-c") + 1] == "aes128-gcm@openssh.com"
    # The spec's connect timeout replaces the lease's step deadline.
    assert "ConnectTimeout=4" in ssh and "ConnectTimeout=3" not in ssh
    remote = argv[argv.index("--rsync-path") + 1]
    assert remote == (
        "echo $$ >> /d/iepm-x/.iepm-pids 2>/dev/null; exec timeout -s KILL 35 /opt/bin/rsync"
    )
    assert "--fsync" in argv and "--outbuf=N" in argv
    assert argv[-1] == "mon@198.18.0.2:/d/iepm-x/iepm-copy.dat"


def test_both_probes_are_registered_as_ssh_copies() -> None:
    for name in ("rsync_mem", "rsync_disk"):
        assert PROBES[name].META.server == "ssh"
        assert PROBES[name].META.scheduling == "exclusive"


def test_the_wrapper_stamps_every_line_and_each_progress_update() -> None:
    program = "printf 'a\\rb\\nc'; printf 'oops\\n' >&2; exit 3"
    done = subprocess.run(
        ["/usr/bin/python3", "-I", rsync.STAMP_SCRIPT, "sh", "-c", program],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 3
    assert [text for _, text in rsync.stamped(done.stdout)] == ["a", "b", "c"]
    err = [text for _, text in rsync.stamped(done.stderr)]
    assert err == ["stamp: start sh", "oops"]
    times = [at for at, _ in rsync.stamped(done.stderr + done.stdout)]
    assert max(times) - min(times) < 5


def test_the_wrapper_reports_a_program_it_cannot_run() -> None:
    done = subprocess.run(
        ["/usr/bin/python3", "-I", rsync.STAMP_SCRIPT, "/nonexistent/rsync"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert done.returncode == 127
    assert "stamp: cannot run /nonexistent/rsync: No such file or directory" in done.stderr
