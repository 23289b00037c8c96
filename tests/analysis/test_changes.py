"""Step changes: known steps found with size and direction, outliers ignored, real data."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iepm.analysis.changes import OnlineDetector, detect_online, segment
from iepm.analysis.series import read_series


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
    assert 0 <= a.alert_index - 150 <= 3  # within a few samples of the shift
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


def test_detector_is_incremental() -> None:
    det = OnlineDetector()
    raised = [det.update(v) for v in noisy([(60, 5.0), (20, 9.0)], sd=0.1)]
    hits = [i for i, r in enumerate(raised) if r is not None]
    assert len(hits) == 1 and 60 <= hits[0] <= 63
    with pytest.raises(ValueError):
        OnlineDetector(confirm=0)


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
