"""The forecast API on a lab run: the scheduler measures four lab paths with the real tools, the
API answers for every path, and the intervals it gives before each cycle are checked against
the results that cycle then measures.

The coverage of those intervals over many cycles (30 checked cycles after 30 of history,
expected within 0.70–0.90 of the nominal 80%) is ``benchmarks/predict_api.py --lab`` (JSON keys
``coverage``, ``in_band``, ``per_target``); it holds the lab and the run used here with few
cycles.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.predict_api import (
    FULL_CYCLES,
    RATE_BPS,
    RTT,
    RTT_MS,
    THROUGHPUT,
    lab_forecasts,
)
from iepm.analysis.forecast import ConformalBand
from iepm.analysis.methods import START
from iepm.lab.testing import LabFactory

pytestmark = [pytest.mark.lab, pytest.mark.timing]

# History enough for the conformal band's own interval (its first ``min_errors`` forecast errors
# come from the samples after the first forecast, at START), then a few checked cycles.
WARM_CYCLES = START + ConformalBand().min_errors - FULL_CYCLES
CHECKED_CYCLES = 5


def test_the_forecast_api_answers_for_every_lab_path_and_its_intervals_hold_the_next_runs(
    lab_factory: LabFactory, tmp_path: Path
) -> None:
    run = lab_forecasts(
        lab_factory, tmp_path, warm_cycles=WARM_CYCLES, checked_cycles=CHECKED_CYCLES
    )
    # Every path answered for every metric it measures, from its own monitor, about its level.
    assert len(run.answers) == len(RTT_MS) + len(RATE_BPS)
    assert set(run.answers) == {(t, RTT) for t in RTT_MS} | {(t, THROUGHPUT) for t in RATE_BPS}
    for (target, metric), body in run.answers.items():
        assert body["monitor"] == "labmon" and body["metric"] == metric
        assert body["samples"] == FULL_CYCLES
        now = body["now"]
        assert now["lower"] <= now["value"] <= now["upper"]
        if metric == THROUGHPUT:
            # TCP gets ~85–95% of the bottleneck in goodput.
            assert 0.7 * RATE_BPS[target] < now["value"] < RATE_BPS[target], body
        else:
            assert RTT_MS[target] - 1 < now["value"] < RTT_MS[target] + 4, body
    # Before each checked cycle, an interval for every path, about the path's level; the RTT the
    # cycle then measured falls inside it for most runs (the share: the benchmark's figure).
    assert len(run.checks) == CHECKED_CYCLES * len(RTT_MS)
    assert {t for t, *_ in run.checks} == set(RTT_MS)
    for target, lower, _rtt, upper in run.checks:
        assert lower < upper and lower < RTT_MS[target] + 4 and upper > RTT_MS[target] - 1
    covered = run.coverage()
    print(f"lab RTT 80% interval coverage {covered:.3f} over {len(run.checks)} next runs")  # -s
    assert covered >= 0.5, run.checks
