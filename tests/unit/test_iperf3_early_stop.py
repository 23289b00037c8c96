"""iperf3's early-stop mode: the Spec's rules, the parse of an early-stopped raw record recorded
in the lab (tests/fixtures/iperf3/iperf3-3.12--early-stop.out: iperf3's report, then the
``% iepm-convergence`` TCP_INFO samples), re-extraction from the raw log and the stored
result's fields."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from iepm.config import load_config
from iepm.errors import ConfigError, ParseError
from iepm.extract import extract
from iepm.probes import convergence, iperf3
from iepm.probes.base import ProbeContext, result_from_raw
from iepm.rawlog import RawLog
from iepm.results import Outcome
from iepm.runner import RawRun
from iepm.store import Archive

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "iperf3"
CASE = "iperf3-3.12--early-stop"


def early_raw(stdout: str | None = None) -> RawRun:
    command = json.loads((FIXTURES / f"{CASE}.json").read_text())["command"]
    text = (FIXTURES / f"{CASE}.out").read_text() if stdout is None else stdout
    return RawRun(argv=tuple(shlex.split(command)), stdout=text, returncode=0)


def split(stdout: str) -> tuple[str, str]:
    """iperf3's own output and the samples line."""
    head, _, line = stdout.rpartition(convergence.SAMPLES_PREFIX)
    return head, convergence.SAMPLES_PREFIX + line


# --- the Spec -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"udp": True}, "early_stop needs a TCP test sent by this host"),
        ({"reverse": True}, "early_stop needs a TCP test sent by this host"),
        ({"omit_s": 2}, "early_stop estimates the whole test, slow start included; set omit_s"),
    ],
)
def test_spec_rejects_what_early_stop_cannot_measure(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        iperf3.Spec(early_stop=True, **fields)  # type: ignore[arg-type]
    iperf3.Spec(early_stop=False, **fields)  # type: ignore[arg-type]  # fine without it


def test_targets_toml_rejection_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "targets.toml"
    path.write_text(
        '[monitor]\nname = "m"\n\n[[targets]]\nname = "t"\naddress = "198.18.3.2"\n'
        "[targets.iperf3]\nearly_stop = true\nreverse = true\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value).replace(str(tmp_path) + "/", "")
    assert message.startswith("targets.toml:7: targets[0].iperf3: "), message
    assert "early_stop needs a TCP test sent by this host" in message
    assert "\n" not in message


def test_spec_default_is_the_full_test() -> None:
    assert iperf3.Spec().early_stop is False
    assert iperf3.Spec(early_stop=True).early_stop is True


# --- parse --------------------------------------------------------------------------------------


def test_early_stopped_record_is_a_successful_run_with_the_full_test_estimate() -> None:
    raw = early_raw()
    data = iperf3.parse(raw)
    assert iperf3.check(data, iperf3.Spec(early_stop=True)) is None
    conv = convergence.read_samples(raw.stdout)
    assert conv is not None and conv.stop_signal_s is not None
    decision = convergence.replay(conv.cfg, conv.samples)
    assert decision is not None
    assert data["early_stopped"] is True
    assert data["throughput_bps"] == decision.estimate_bps
    assert data["stopped_after_s"] == decision.t_stop_s < conv.cfg.full_duration_s / 2
    # iperf3's own figure is kept: the sender's rate over the part that ran.
    doc = json.loads(split(raw.stdout)[0])
    assert doc["error"].startswith("interrupt")
    assert data["measured_throughput_bps"] == doc["end"]["sum_sent"]["bits_per_second"]
    assert data["bytes_sent"] == doc["end"]["sum_sent"]["bytes"]
    assert data["bytes_saved"] == data["estimated_full_bytes"] - data["bytes_sent"] > 0
    assert data["bytes_sent"] < 0.5 * data["estimated_full_bytes"]
    # A 30 Mbit/s lab path: the estimate is the path's rate, not the send-buffer-inflated one.
    assert 24e6 < data["throughput_bps"] < 30e6 < data["measured_throughput_bps"]
    assert data["bytes_received"] is None  # not exchanged on an interrupt


def test_the_same_report_without_its_samples_is_an_interrupted_failure() -> None:
    iperf3_only, _ = split(early_raw().stdout)
    data = iperf3.parse(early_raw(iperf3_only))
    assert "early_stopped" not in data
    assert iperf3.check(data, iperf3.Spec()) == data["tool_error"]
    assert "interrupted before the test finished" in data["tool_error"]


def test_samples_that_no_longer_decide_fail_the_run_and_say_why() -> None:
    head, line = split(early_raw().stdout)
    body = json.loads(line[len(convergence.SAMPLES_PREFIX) :])
    body["samples"] = body["samples"][:5]  # cut before the decision
    text = head + convergence.SAMPLES_PREFIX + json.dumps(body) + "\n"
    data = iperf3.parse(early_raw(text))
    assert data["early_stopped"] is False
    problem = iperf3.check(data, iperf3.Spec(early_stop=True))
    assert problem is not None and "no longer reach a decision" in problem


def test_an_unreadable_samples_line_is_a_parse_error() -> None:
    head, _ = split(early_raw().stdout)
    with pytest.raises(ParseError, match=r"early-stop record for 198\.18\.0\.2:5201: unreadable"):
        iperf3.parse(early_raw(head + convergence.SAMPLES_PREFIX + '{"samples": [[1, 2]]}\n'))


def test_a_test_that_ran_out_is_the_full_result() -> None:
    """early_stop on, no decision before the end: iperf3's complete report, marked not
    stopped (the samples line says no stop signal was sent)."""
    complete = (FIXTURES / "iperf3-3.12--tcp-1stream.out").read_text()
    conv = convergence.Convergence(convergence.EarlyStopConfig(full_duration_s=1), [], None)
    text = complete.rstrip("\n") + "\n" + convergence.samples_line(conv)
    data = iperf3.parse(early_raw(text))
    plain = iperf3.parse(early_raw(complete))
    assert data["early_stopped"] is False and data["complete"] is True
    assert data["throughput_bps"] == plain["throughput_bps"] == data["measured_throughput_bps"]


# --- re-extraction and the stored result --------------------------------------------------------


def test_reextraction_from_the_raw_log_reproduces_the_stored_result(tmp_path: Path) -> None:
    spec = iperf3.Spec(early_stop=True)
    raw = early_raw()
    log = RawLog(tmp_path / "raw")
    log.append("cern-1", iperf3.NAME, raw, params=spec.model_dump(mode="json"))
    ctx = ProbeContext(target="cern-1", address="198.18.0.2", monitor="slac-mon")
    first = result_from_raw(iperf3, spec, ctx, raw, "iperf 3.12")
    assert first.outcome is Outcome.OK and first.error is None
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    with Archive.open(url) as archive:
        archive.add(first)
    counts = extract(log, url, monitor="slac-mon")
    assert counts["updated"] == 1 and counts["failed"] == 0
    with Archive.open(url) as archive:
        (stored,) = archive.results(probe="iperf3")
    assert stored.id == first.id and stored.outcome is Outcome.OK
    assert stored.params["early_stop"] is True
    assert stored.data == json.loads(json.dumps(first.data))
    d = stored.data
    assert d["early_stopped"] is True and d["throughput_bps"] == first.data["throughput_bps"]
    for key in ("measured_throughput_bps", "bytes_saved", "bytes_sent", "stopped_after_s"):
        assert d[key] is not None and d[key] > 0, key


def test_summary_says_the_run_was_stopped_early() -> None:
    line = iperf3.summary(iperf3.parse(early_raw()))
    assert line.startswith("27.8 Mbit/s estimated for the full test, early-stopped after 3.36 s")
    assert "measured 31.0 Mbit/s sent, 21.5 MB saved" in line
