"""Raw logs: records round-trip exactly, even when the output looks like a frame."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from iepm.rawlog import RawLog, read_log
from iepm.runner import RawRun

MOMENT = datetime(2026, 11, 22, 11, 4, 21, 123000, tzinfo=UTC)


def make_run(stdout: str, stderr: str = "", **kwargs: object) -> RawRun:
    return RawRun(
        argv=("ping", "-c", "10", "198.18.3.2"),
        stdout=stdout,
        stderr=stderr,
        started_at=MOMENT,
        duration_s=9.012,
        **kwargs,  # type: ignore[arg-type]
    )


def test_one_file_per_target_probe_and_day(tmp_path: Path) -> None:
    log = RawLog(tmp_path)
    path = log.append("cern-1", "ping", make_run("64 bytes\n"))
    assert path == tmp_path / "2026-11-22" / "cern-1.ping.log"
    log.append("cern-1", "ping", make_run("second\n"))
    runs = list(read_log(path))
    assert [r.raw.stdout for r in runs] == ["64 bytes\n", "second\n"]
    first = runs[0]
    assert first.target == "cern-1" and first.probe == "ping" and first.line == 1
    assert first.raw.argv == ("ping", "-c", "10", "198.18.3.2")
    assert first.raw.started_at == MOMENT
    assert first.raw.duration_s == 9.012


def test_timeout_and_exit_are_kept(tmp_path: Path) -> None:
    log = RawLog(tmp_path)
    log.append("t", "iperf3", make_run("partial", "boom", returncode=None, timed_out=True))
    (run,) = list(log.runs())
    assert run.raw.timed_out and run.raw.returncode is None
    assert run.raw.stdout == "partial\n" and run.raw.stderr == "boom\n"


def test_a_record_cut_by_a_crash_is_skipped(tmp_path: Path) -> None:
    log = RawLog(tmp_path)
    path = log.append("t", "ping", make_run("complete\n"))
    log.append("t", "ping", make_run("will be cut\n"))
    text = path.read_text()
    path.write_text(text[: text.rindex("==== end")])
    assert [r.raw.stdout for r in read_log(path)] == ["complete\n"]


def test_unsafe_names_become_safe_file_names(tmp_path: Path) -> None:
    path = RawLog(tmp_path).append("../../etc/passwd", "ping", make_run("x"))
    assert path.parent.parent == tmp_path


@settings(max_examples=200, deadline=None)
@given(
    stdout=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=300),
    stderr=st.text(max_size=100),
)
def test_any_output_round_trips(tmp_path_factory, stdout: str, stderr: str) -> None:  # type: ignore[no-untyped-def]
    # Outputs may contain lines that look like our frames: only the run's own token ends it.
    directory = tmp_path_factory.mktemp("raw")
    log = RawLog(directory)
    decoy = "==== end token=0000\n---- stderr token=0000\n"
    log.append("t", "p", make_run(decoy + stdout, stderr))
    (run,) = list(log.runs())
    normalised = (decoy + stdout).replace("\r\n", "\n").replace("\r", "\n")
    expected = normalised if normalised.endswith("\n") or not normalised else normalised + "\n"
    assert run.raw.stdout == expected
