"""The sweep's rules: visiting order, choice, limits (refused before anything runs), Mathis."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from iepm.cli import app
from iepm.probes import iperf3
from iepm.store import Archive
from iepm.tuning.duration import DurationPlan, recommend
from iepm.tuning.duration import check_plan as check_duration
from iepm.tuning.early_stop import Decision, Detector, EarlyStopConfig, Sample, parse_ss
from iepm.tuning.mathis import C_PERIODIC, classify, predict_bps
from iepm.tuning.store import list_studies
from iepm.tuning.sweep import (
    StudyRefused,
    SweepLimits,
    SweepPlan,
    check_plan,
    choose,
    visit_order,
)


def test_visit_order_covers_grid_and_is_not_monotonic() -> None:
    plan = SweepPlan(windows=["8K", "64K", "1M"], streams=[1, 2, 4, 8, 16])
    order = visit_order(plan)
    assert sorted(order, key=str) == sorted(plan.grid(), key=str)
    streams = [n for _, n in order]
    assert streams != sorted(streams) and streams != sorted(streams, reverse=True)
    assert all(a != b for a, b in itertools.pairwise(streams))
    assert visit_order(plan) == order  # reproducible from the seed


def _p(order: int, window: str | None, streams: int, mbps: float | None) -> dict[str, object]:
    return {
        "order": order,
        "window": window,
        "streams": streams,
        "succeeded": mbps is not None,
        "throughput_bps": None if mbps is None else mbps * 1e6,
    }


def test_choice_is_fewest_streams_reaching_the_fraction() -> None:
    points = [
        _p(0, None, 1, 3),
        _p(1, "64K", 1, 9),
        _p(2, "64K", 4, 34),
        _p(3, "64K", 8, 40),
        _p(4, "1M", 4, 35),
        _p(5, "1M", 16, 39),
        _p(6, "1M", 2, None),
    ]
    pick = choose(points, 0.8)
    assert pick["best"]["order"] == 3
    assert pick["chosen"]["order"] == 4  # 4 streams, the higher of the two ≥ 32 Mbit/s
    assert choose([_p(0, None, 1, None)], 0.8)["chosen"] is None


def test_limits_refuse_before_starting_with_the_reason() -> None:
    base = iperf3.Spec()
    with pytest.raises(StudyRefused, match=r"exceeds the limit of 600 s total"):
        check_plan(SweepPlan(duration_s=10), SweepLimits(max_total_s=600), base)
    with pytest.raises(StudyRefused, match=r"stream counts \[200\] are outside 1…128"):
        check_plan(SweepPlan(streams=[1, 200]), SweepLimits(), base)
    with pytest.raises(StudyRefused, match=r"window 4M .* exceeds the window limit"):
        check_plan(SweepPlan(windows=["64K", "4M"]), SweepLimits(max_window_bytes=1 << 20), base)
    with pytest.raises(StudyRefused, match="measures TCP"):
        check_plan(SweepPlan(), SweepLimits(), iperf3.Spec(udp=True))
    with pytest.raises(StudyRefused, match="exceeds the limit"):
        check_duration(DurationPlan(max_total_s=100))


def test_cli_refuses_and_stores_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    result = CliRunner().invoke(
        app, ["tune", "198.18.0.9", "--db", url, "--streams", "1,4,500", "--duration", "2"]
    )
    assert result.exit_code == 2
    assert "sweep refused before it started" in result.output
    assert "stream counts [500]" in result.output
    with Archive.open(url) as archive:
        assert list_studies(archive) == []
        assert archive.count() == 0


def test_duration_recommendation_rule() -> None:
    points = [
        {"window_label": "default", "duration_s": d, "throughput_bps": v}
        for d, v in [(2, 50), (2, 54), (5, 80), (5, 84), (10, 93), (10, 95), (20, 100), (20, 98)]
    ]
    summary = recommend(points, 0.10)
    assert summary["recommended_duration_s"] == 10
    assert summary["windows"]["default"]["by_duration"]["5"]["median_bps"] == 82


def test_mathis_formula() -> None:
    # 1448-byte MSS, 100 ms RTT, 1% loss: 115840 B/s·8 … = 1.4188 Mbit/s.
    assert predict_bps(100, 0.01) == pytest.approx(1448 * 8 / 0.1 * math.sqrt(1.5) / 0.1)
    assert predict_bps(100, 0.0) is None
    assert pytest.approx(1.2247, abs=1e-4) == C_PERIODIC
    assert classify(0.2).startswith("measured ≪")
    assert classify(1.1).startswith("measured ≈")
    assert classify(5).startswith("measured ≫")


# Written in the layout of `ss -tinH` (iproute2 6.x): a control and a data connection. Real
# output is parsed by the early-stop lab test.
SS_OUTPUT = (
    "0      0      198.18.0.1:45678 198.18.0.2:5201\n"
    "\t cubic wscale:7,7 rto:204 rtt:0.208/0.104 ato:40 mss:1448 pmtu:1500 "
    "rcvmss:536 advmss:1448 cwnd:10 bytes_sent:180 bytes_acked:181 "
    "bytes_received:4 segs_out:8 segs_in:7 data_segs_out:4 send 557Mbps "
    "lastsnd:12 pacing_rate 1.11Gbps delivery_rate 35.5Mbps delivered:5 "
    "app_limited rcv_space:14480 rcv_ssthresh:64088 minrtt:0.07 "
    "snd_wnd:65536\n"
    "0      1523200 198.18.0.1:45680 198.18.0.2:5201\n"
    "\t cubic wscale:7,7 rto:224 rtt:21.3/0.5 mss:1448 pmtu:1500 rcvmss:536 "
    "advmss:1448 cwnd:180 ssthresh:120 bytes_sent:25403912 "
    "bytes_retrans:2896 bytes_acked:25001016 segs_out:17545 segs_in:8710 "
    "data_segs_out:17543 send 97.9Mbps pacing_rate 117Mbps delivery_rate "
    "95.1Mbps delivered:17267 busy:2080ms retrans:0/2 rcv_space:14480 "
    "minrtt:20.1 snd_wnd:3145728\n"
)


def test_parse_ss_reads_tcp_info() -> None:
    control, data = parse_ss(SS_OUTPUT)
    assert control["bytes_acked"] == 181 and "ssthresh" not in control
    assert data["srtt_ms"] == 21.3 and data["cwnd"] == 180 and data["ssthresh"] == 120
    assert data["bytes_acked"] == 25001016 and data["retrans_total"] == 2


def test_detector_stops_after_slow_start_once_stable() -> None:
    """A rate doubling every 0.2 s until 80 Mbit/s, then flat: the detector stops shortly after
    the plateau and predicts the full test's average."""
    cfg = EarlyStopConfig(full_duration_s=10, sample_s=0.1)
    det = Detector(cfg)
    acked, t, rate = 0.0, 0.0, 1e6
    decision = None
    while decision is None and t < 10:
        t += 0.1
        rate = min(80e6, rate * 2 ** (0.1 / 0.2))
        acked += rate * 0.1 / 8
        decision = det.add(Sample(t, int(acked), 20.0, None, False, 0))
    assert decision is not None and decision.slow_start_by == "rate stopped growing"
    assert decision.t_stop_s < 4
    full_avg = (acked * 8 + 80e6 * (10 - t)) / 10
    assert decision.estimate_bps == pytest.approx(full_avg, rel=0.02)


def _feed(
    det: Detector, rate_at: Callable[[float], float], *, idle_s: float = 0.0
) -> tuple[Decision | None, float]:
    """Samples every 0.1 s (20 ms RTT): ``idle_s`` of control-connection chatter (236 bytes),
    then data at ``rate_at(seconds since data began)``. Returns (decision, true full average)."""
    acked, t, decision, data_bits = 236.0, 0.0, None, 0.0
    while t < idle_s + 10:
        t += 0.1
        if t > idle_s:
            step = rate_at(t - idle_s) * 0.1
            acked += step / 8
            data_bits += step
        if decision is None:
            decision = det.add(Sample(t, int(acked), 20.0, None, False, 0))
    return decision, data_bits / 10


def test_early_stop_waits_out_a_creeping_rate_and_ignores_control_chatter() -> None:
    """Slow start to 40 Mbit/s in 1 s, then the rate keeps creeping up 4%/s (receive-window
    autotuning on long paths); data begins 1.5 s after the control connection. The estimate
    from the latest windows, on the data's clock, stays within 10% of the full average."""
    cfg = EarlyStopConfig(full_duration_s=10, sample_s=0.1)
    decision, full_avg = _feed(
        Detector(cfg), lambda s: 40e6 * min(1.0, 2 ** (8 * (s - 1))) * (1 + 0.04 * s), idle_s=1.5
    )
    assert decision is not None
    assert decision.estimate_bps == pytest.approx(full_avg, rel=0.1)
    assert decision.t_stop_s < 8.5  # clock from the data's start, not the control connection's


def test_early_stop_waits_on_a_steady_ramp() -> None:
    """A rate rising 30%/s never settles: the detector holds on until the rest of the test is
    too short for the trend to matter, and then is still within 10% of the full average."""
    cfg = EarlyStopConfig(full_duration_s=10, sample_s=0.1)
    decision, full_avg = _feed(Detector(cfg), lambda s: 5e6 * (1 + 0.3 * s))
    assert decision is None or decision.t_stop_s > 6
    if decision is not None:
        assert decision.estimate_bps == pytest.approx(full_avg, rel=0.1)
