"""Step changes: known steps found with size and direction, outliers ignored, real data.

The real-data tests use files of the *tune* half of ../shared/data/rtt-changes/ (see
benchmarks/changes.py): the detectors' defaults were chosen there, so these pin that behaviour;
the test half is kept for the benchmark.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iepm.analysis.changes import (
    KernelDetector,
    OnlineDetector,
    _bandwidth,
    crops,
    default_penalty,
    detect_online,
    finite_samples,
    kernel_pelt_cost,
    noise_scale,
    segment,
    unit_scaled,
)
from iepm.analysis.series import read_series
from tests.analysis.conftest import DATA

RTT_CHANGES = DATA / "rtt-changes"


def noisy(levels: list[tuple[int, float]], sd: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = np.concatenate([np.full(n, lvl) for n, lvl in levels])
    return y + rng.normal(0, sd, y.size)


@pytest.mark.parametrize(("before", "after"), [(100.0, 80.0), (100.0, 130.0), (515.0, 315.0)])
def test_step_found_with_size_and_direction(before: float, after: float) -> None:
    y = noisy([(150, before), (100, after)], sd=2.0)
    cps = segment(y)
    assert len(cps) == 1
    cp = cps[0]
    assert abs(cp.index - 150) <= 2
    assert cp.direction == ("up" if after > before else "down")
    assert cp.size == pytest.approx(after - before, abs=2.0)
    assert cp.change_percent == pytest.approx((after - before) / before * 100, abs=2.0)

    alerts = detect_online(y)
    assert len(alerts) == 1
    a = alerts[0]
    assert abs(a.index - 150) <= 2 and a.alert_index is not None
    # The 3rd sample of a step of >= ~25 noise sd; a smaller one needs more evidence (10 sd: ~9).
    assert 0 <= a.alert_index - 150 <= (3 if abs(after - before) >= 50 else 12)
    assert a.direction == cp.direction
    assert a.size == pytest.approx(after - before, abs=4.0)


def test_single_outliers_raise_no_alert() -> None:
    y = noisy([(300, 100.0)], sd=1.0, seed=1)
    y[[50, 120, 121 + 30, 250]] = [400.0, 0.5, 180.0, 30.0]
    assert detect_online(y) == []
    assert segment(y) == []


def test_no_change_no_alert_over_200_cycles() -> None:
    for seed in range(5):
        y = noisy([(200, 50.0)], sd=5.0, seed=seed)
        assert detect_online(y) == [], seed
        assert segment(y) == [], seed


def test_missing_samples_are_skipped_and_indices_kept() -> None:
    y = noisy([(100, 10.0), (100, 20.0)], sd=0.3)
    y[[10, 99, 150]] = np.nan
    cps = segment(y)
    assert len(cps) == 1 and abs(cps[0].index - 100) <= 1
    alerts = detect_online(y)
    assert len(alerts) == 1 and abs(alerts[0].index - 100) <= 1


@pytest.mark.parametrize("detector", [KernelDetector, OnlineDetector])
def test_detector_is_incremental(detector: type[KernelDetector] | type[OnlineDetector]) -> None:
    det = detector()
    raised = [det.update(v) for v in noisy([(60, 5.0), (20, 9.0)], sd=0.1)]
    hits = [i for i, r in enumerate(raised) if r is not None]
    assert len(hits) == 1 and 60 <= hits[0] <= 63
    with pytest.raises(ValueError):
        detector(confirm=0)


def test_pending_while_a_change_awaits_confirmation() -> None:
    det = KernelDetector()
    for v in noisy([(60, 5.0)], sd=0.1):
        det.update(v)
    assert not det.pending
    assert det.update(9.0) is None and det.update(9.0) is None
    assert det.pending  # two samples of a new level: suspected, not yet an alert
    cp = det.update(9.0)
    assert cp is not None and cp.index == 60 and cp.alert_index == 62 and not det.pending


def test_small_changes_below_the_floors_are_not_reported() -> None:
    y = noisy([(100, 100.0), (100, 102.0)], sd=0.01)  # 200 noise sd, 2% of the level
    assert len(segment(y)) == 1 and len(detect_online(y)) == 1
    assert segment(y, min_change=0.05) == [] and detect_online(y, min_relative=0.05) == []
    # Quieter than 0.1% of the level counts as 0.1%: 0.3% steps are then ~3 "noise" sd.
    assert segment(noisy([(100, 100.0), (100, 100.3)], sd=0.001)) == []
    assert detect_online(noisy([(100, 0.0), (100, 1.0)], sd=0.01), min_absolute=2.0) == []


@pytest.mark.parametrize("value", [0.0, 7.25, -3.0])
def test_constant_series_has_no_change(value: float) -> None:
    y = np.full(300, value)
    assert segment(y) == [] and detect_online(y) == []
    assert noise_scale(y) == 0.0


def test_all_missing_or_nearly_so() -> None:
    assert segment(np.full(50, np.nan)) == [] and detect_online(np.full(50, np.nan)) == []
    assert segment([]) == [] and detect_online([]) == []
    y = np.full(200, np.nan)
    y[::7] = 5.0
    assert segment(y) == [] and detect_online(y) == []


def test_huge_values_are_analysed_exactly() -> None:
    y = noisy([(80, 1.0), (80, 2.0)], sd=0.01) * 1e307
    for cps in (segment(y), detect_online(y)):
        assert len(cps) == 1 and abs(cps[0].index - 80) <= 1 and cps[0].direction == "up"


def test_real_step_515_to_315_on_2023_08_21(step_file: Path) -> None:
    s = read_series(step_file)
    day = datetime(2023, 8, 21, tzinfo=UTC).timestamp()

    def near(idx: int) -> bool:
        return abs(s.t[idx] - day) < 2 * 86400

    offline = [cp for cp in segment(s.y) if near(cp.index)]
    assert len(offline) == 1
    cp = offline[0]
    assert cp.direction == "down"
    assert cp.before == pytest.approx(515, rel=0.05) and cp.after == pytest.approx(315, rel=0.05)
    online = [a for a in detect_online(s.y) if near(a.index)]
    assert len(online) == 1 and online[0].direction == "down"
    assert online[0].alert_index is not None and online[0].alert_index - cp.index <= 3


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(st.floats(), st.floats(-1e3, 1e3), st.sampled_from([0.0, 1.0])),
        max_size=60,
    )
)
def test_any_series_no_exception(values: list[float]) -> None:
    y = np.array(values, dtype=np.float64)
    for cp in segment(y) + detect_online(y):
        assert 0 <= cp.index < y.size
        assert cp.direction in ("up", "down")


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    level=st.floats(1.0, 1e4),
    spikes=st.lists(st.floats(-1e6, 1e6).filter(lambda v: abs(v) > 1e-3), min_size=1, max_size=6),
)
def test_single_outliers_never_make_a_change(seed: int, level: float, spikes: list[float]) -> None:
    rng = np.random.default_rng(seed)
    y = level + rng.normal(0, 0.01 * level, 240)
    # Isolated: at least 12 samples apart, so each is a single outlier whatever its size.
    at = rng.choice(np.arange(10, 230, 12), size=len(spikes), replace=False)
    y[at] = y[at] + np.array(spikes) * level
    assert segment(y) == []
    assert detect_online(y) == []


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    level=st.floats(1.0, 1e4),
    n_before=st.integers(30, 150),
    n_after=st.integers(30, 150),
    size=st.floats(20.0, 200.0),  # in noise standard deviations
    up=st.booleans(),
)
def test_clean_step_is_found_where_it_is(
    seed: int, level: float, n_before: int, n_after: int, size: float, up: bool
) -> None:
    sd = 0.002 * level  # the step, ≥ 20 sd, is then ≥ 4% of the level: above every floor
    after = level + (size if up else -size) * sd
    y = noisy([(n_before, level), (n_after, after)], sd=sd, seed=seed)
    cps = segment(y)
    assert len(cps) == 1 and abs(cps[0].index - n_before) <= 2
    alerts = detect_online(y)
    assert len(alerts) == 1 and abs(alerts[0].index - n_before) <= 2
    assert alerts[0].direction == cps[0].direction == ("up" if up else "down")
    assert alerts[0].alert_index is not None
    assert alerts[0].alert_index - n_before <= (3 if size >= 40 else 10)


def rtt_trace(name: str) -> tuple[np.ndarray, list[int]]:
    path = RTT_CHANGES / name
    if not path.exists():
        pytest.skip(f"real data not found: {path}")
    s = read_series(path, check_order=False)
    labels = [i for i, e in enumerate(s.extra) if e and e[0].strip() == "1"]
    return np.where(s.y > 0, s.y, np.nan), labels  # RTT <= 0: RIPE Atlas's failed measurement


def test_real_rtt_trace_labels_found() -> None:
    # 16154.csv (tune half): ten hand-labelled route changes and congestion episodes in 4000
    # RTT samples with many single spikes; both detectors find every label and nothing else.
    y, labels = rtt_trace("16154.csv")
    assert len(labels) == 10
    for found in ([cp.index for cp in segment(y)], [a.index for a in detect_online(y)]):
        assert len(found) == len(labels)
        assert all(abs(f - lab) <= 5 for f, lab in zip(found, labels, strict=True)), found


def test_default_penalty_grows_with_log_of_the_finite_samples() -> None:
    y = noisy([(300, 10.0), (300, 14.0), (300, 9.0)], sd=0.5, seed=3)
    y[::7] = np.nan  # missing samples do not count in n
    n = int(np.isfinite(y).sum())
    assert default_penalty(n) == pytest.approx(0.5 * np.log(n))
    assert default_penalty(10_000) > default_penalty(1_600) > default_penalty(100)
    assert segment(y) == segment(y, penalty=default_penalty(n))
    assert [cp.index for cp in segment(y)] == [300, 600]


def test_real_short_trace_gains_from_the_log_penalty() -> None:
    # 17783.csv (tune half, 1,645 valid samples): ln n gives penalty 3.7 instead of the fixed 4,
    # and a labelled excursion (two changes, 7 samples apart) that a penalty of 4 leaves out is
    # found, with nothing else added.
    y, labels = rtt_trace("17783.csv")
    x, _ = finite_samples(y)
    assert default_penalty(x.size) < 4.0

    def hits(found: list[int]) -> int:
        return sum(any(abs(f - lab) <= 5 for f in found) for lab in labels)

    fixed = [cp.index for cp in segment(y, penalty=4.0)]
    log_n = [cp.index for cp in segment(y)]
    assert hits(log_n) == hits(fixed) + 2 == len(log_n) == len(fixed) + 2


def test_crops_gives_the_optimal_segmentation_at_every_penalty() -> None:
    # CROPS must find, for any penalty in its range, the segmentation PELT gives at that penalty.
    y, _ = rtt_trace("17783.csv")
    x = unit_scaled(finite_samples(y)[0])
    hull = crops(x, 12.0, 2.0, 32.0)
    assert len(hull) >= 3 and all(len(cps) == k for k, (_, cps) in hull.items())
    h = _bandwidth(x, 12.0)
    for penalty in (2.0, 2.7, 4.0, 5.5, 9.0, 17.0, 32.0):
        best = min(hull, key=lambda k: hull[k][0] + penalty * k)
        cps, cost = kernel_pelt_cost(x, penalty, h)
        # Ties in Σ cost + penalty·k are possible at the hull's own breakpoints only.
        assert hull[best][0] + penalty * best == pytest.approx(cost + penalty * len(cps))
        assert hull[best][1] == cps
