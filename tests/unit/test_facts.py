"""The facts probe's parser on recorded real outputs (an agent's /v1/facts answer, the snapshot
run over SSH), its clear failures on bad input, and attribution to the target's host."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from iepm.analysis.cause import attribute
from iepm.errors import ParseError, ToolFailed
from iepm.probes import facts
from iepm.results import Result
from iepm.runner import RawRun
from iepm.store import Archive

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
LOAD_FIXTURES = FIXTURES.parent / "load"
OUTPUTS = sorted(FIXTURES.glob("*.out"))


@pytest.mark.parametrize("path", OUTPUTS, ids=[p.stem for p in OUTPUTS])
def test_recorded_outputs_parse_to_their_expected_facts(path: Path) -> None:
    expected = json.loads(path.with_suffix(".json").read_text())
    data = facts.parse(RawRun(argv=("recorded",), stdout=path.read_text()))
    assert data == expected
    assert facts.check(data, facts.Spec()) is None


def test_both_ways_of_reading_agree_on_the_facts_attribution_compares() -> None:
    agent, ssh = (json.loads(p.with_suffix(".json").read_text()) for p in OUTPUTS)
    for key in ("kernel_release", "cpu_count", "tcp_rmem_bytes", "tcp_congestion_control"):
        assert agent[key] == ssh[key], key


@pytest.mark.parametrize(
    ("stdout", "stderr", "code", "error", "message"),
    [
        (
            "",
            "bash: line 1: python3: command not found",
            127,
            ToolFailed,
            "python3 is not installed",
        ),
        ("", "", 255, ToolFailed, r"gave nothing \(exit 255\)"),
        ("<html>", "", 0, ParseError, "not a JSON document"),
        ("[1, 2]", "", 0, ParseError, "not a JSON object"),
        ('{"x": 1}', "", 0, ParseError, "neither an agent's /v1/facts nor a snapshot"),
        ('{"agent": "a", "nics": 3}', "", 0, ParseError, "no 'nics' object"),
    ],
)
def test_bad_outputs_fail_with_a_clear_reason(
    stdout: str, stderr: str, code: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        facts.parse(RawRun(argv=("x",), stdout=stdout, stderr=stderr, returncode=code))


def _result(probe: str, when: datetime, data: dict[str, Any]) -> Result:
    return Result(probe=probe, tool=probe, monitor="mon", target="tgt", started_at=when, data=data)


def _facts(**over: Any) -> dict[str, Any]:
    data = json.loads(OUTPUTS[0].with_suffix(".json").read_text())
    data.update(over)
    return data


def _load(name: str) -> dict[str, Any]:
    return dict(json.loads((LOAD_FIXTURES / f"{name}.json").read_text())["data"])


@pytest.mark.parametrize("monitor_changed", [False, True])
def test_a_change_in_the_targets_facts_names_the_host_at_the_target_end(
    tmp_path: Path, monitor_changed: bool
) -> None:
    t0 = datetime(2026, 11, 25, 1, tzinfo=UTC)
    step = timedelta(minutes=1)
    small = [4096, 16384, 32768]
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        for i in range(7):
            after = i >= 4
            target = _facts(tcp_rmem_bytes=small) if after else _facts()
            archive.add(_result("facts", t0 + i * step, target))
            load = "procfs--netns-reno" if after and monitor_changed else "procfs--host"
            archive.add(_result("load", t0 + i * step, _load(load)))
        cause, details = attribute(
            archive,
            monitor="mon",
            target="tgt",
            probe="iperf3",
            last_before=t0 + 3 * step,
            change_at=t0 + 4 * step,
            now=t0 + 6 * step,
        )
    assert cause == "host", details
    host = details["host"]
    rmem = [_facts()["tcp_rmem_bytes"], small]
    if not monitor_changed:
        assert host["end"] == "target" and host["probe"] == "facts"
        assert host["changed"] == {"tcp_rmem_bytes": rmem}
    else:
        assert host["end"] == "both"
        assert host["target"]["changed"] == {"tcp_rmem_bytes": rmem}
        assert host["changed"]["target.tcp_rmem_bytes"] == rmem
        assert host["monitor"]["changed"]["tcp_congestion_control"][1] == "reno"
        assert host["changed"]["monitor.tcp_congestion_control"][1] == "reno"
