"""Forecasts: baselines exactly as the seeds define them, calibration, no look-ahead, robustness."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iepm.analysis.forecast import (
    METHODS,
    START,
    Z80,
    forecast_next,
    quantile_sorted,
    relative_loss_point,
    walk_forward,
    walk_forward_all,
)
from iepm.analysis.series import AnalysisError, read_series
from tests.analysis.conftest import DATA, hourly


def test_constant_series_zero_error_narrow_interval() -> None:
    t = hourly(60)
    y = np.full(60, 42.0)
    for method, fcs in walk_forward_all(t, y).items():
        assert len(fcs) == 60 - START, method
        for f in fcs:
            assert f.forecast == pytest.approx(42.0, abs=1e-9), method
            assert f.upper - f.lower <= 1e-6, method


def test_all_zero_series_is_handled() -> None:
    fcs = walk_forward(hourly(30), np.zeros(30))
    assert all(f.forecast == 0.0 and f.lower == 0.0 == f.upper for f in fcs)


def test_ma5_and_ewma_as_the_seeds_define_them() -> None:
    rng = np.random.default_rng(3)
    y = 100 + rng.normal(0, 5, 40)
    t = hourly(40)
    all_fc = walk_forward_all(t, y)
    for f in all_fc["ma5"]:
        last5 = y[f.index - 5 : f.index]
        assert f.forecast == pytest.approx(last5.mean())
        sd = last5.std(ddof=1)
        assert f.lower == pytest.approx(last5.mean() - Z80 * sd)
        assert f.upper == pytest.approx(last5.mean() + Z80 * sd)
    level = y[0]
    expected = {}
    for i in range(1, 40):
        expected[i] = level
        level = 0.7 * level + 0.3 * y[i]
    for f in all_fc["ewma"]:
        assert f.forecast == pytest.approx(expected[f.index])


def test_no_look_ahead() -> None:
    rng = np.random.default_rng(4)
    y = 50 + rng.normal(0, 3, 120)
    t = hourly(120)
    changed = y.copy()
    changed[80:] *= 3.0  # the future changes; forecasts up to index 80 must not
    a = walk_forward_all(t, y)
    b = walk_forward_all(t, changed)
    for m in METHODS:
        for fa, fb in zip(a[m], b[m], strict=True):
            if fa.index <= 80:
                assert (fa.forecast, fa.lower, fa.upper) == (fb.forecast, fb.lower, fb.upper)


@pytest.mark.parametrize("method", ["auto", "median5", "levelshift", "levelmode"])
def test_coverage_on_iid_noise_is_near_80_percent(method: str) -> None:
    rng = np.random.default_rng(5)
    n = 1500
    # Irregular spacing: gaps from 10 minutes to 5 hours.
    t = 1.7e9 + np.cumsum(rng.uniform(600, 18000, n))
    y = 100 + rng.normal(0, 10, n)
    fcs = walk_forward(t, y, method)[50:]
    cover = np.mean([f.lower <= f.observed <= f.upper for f in fcs])
    assert 0.76 <= cover <= 0.84, cover


def test_level_shift_followed_quickly() -> None:
    y = np.r_[np.full(60, 500.0), np.full(40, 300.0)] + np.tile([1.0, -1.0], 50)
    fcs = {f.index: f for f in walk_forward(hourly(100), y, "levelshift")}
    assert abs(fcs[66].forecast - 300) < 5  # a few samples after the step at 60


def test_forecast_next_uses_history_only() -> None:
    t = hourly(30)
    y = np.full(30, 7.0)
    f = forecast_next(t, y, t[-1] + 5400.0)
    assert f.forecast == pytest.approx(7.0) and math.isnan(f.observed)
    with pytest.raises(AnalysisError):
        forecast_next(t, y, t[0])


def test_bad_arguments() -> None:
    with pytest.raises(AnalysisError, match="unknown method"):
        walk_forward([0.0, 1.0], [1.0, 2.0], "crystal-ball")
    with pytest.raises(AnalysisError, match="finite"):
        walk_forward([0.0, 1.0], [1.0, math.nan])
    with pytest.raises(AnalysisError, match="backwards"):
        walk_forward([1.0, 0.0], [1.0, 2.0])


def test_real_series_ensemble_beats_ma5(step_file: Path) -> None:
    s = read_series(step_file)
    res = walk_forward_all(s.t, s.y)

    def p90(method: str) -> float:
        return float(
            np.quantile([abs(f.forecast - f.observed) / f.observed for f in res[method]], 0.9)
        )

    assert p90("auto") < p90("ma5")
    cover = np.mean([f.lower <= f.observed <= f.upper for f in res["auto"]])
    assert 0.7 <= cover <= 0.9


NDT = DATA / "ndt"


def test_real_ndt_series_ensemble_beats_ma5_on_p90_and_trimmed_mean() -> None:
    path = NDT / "e45f01963c21_gru03_u_throughput.txt"  # a tune-half file of the benchmark
    if not path.exists():
        pytest.skip(f"real data not found: {path}")
    s = read_series(path)
    res = walk_forward_all(s.t, s.y)

    def rel(method: str) -> np.ndarray:
        return np.sort([abs(f.forecast - f.observed) / f.observed for f in res[method]])

    auto, ma5 = rel("auto"), rel("ma5")
    keep = int(auto.size * 0.99)
    assert np.quantile(auto, 0.9) < 0.75 * np.quantile(ma5, 0.9)
    assert auto[:keep].mean() < 0.8 * ma5[:keep].mean()


def _loss(f: float, v: np.ndarray, cap: float) -> float:
    v = v[v > 0]
    return float(np.minimum(np.abs(f - v) / v, cap).sum())


positive = st.floats(1e-3, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(positive, min_size=1, max_size=40), st.sampled_from([0.3, 1.0]))
def test_relative_loss_point_minimises_the_truncated_relative_error(
    values: list[float], cap: float
) -> None:
    v = np.array(values)
    f = relative_loss_point(v, cap)
    assert f in v  # the loss is concave between samples: its minimum is at a sample
    grid = np.geomspace(v.min() / 2, v.max() * 2, 400)
    best = _loss(f, v, cap)
    assert all(best <= _loss(g, v, cap) * (1 + 1e-9) + 1e-12 for g in grid)


def test_relative_loss_point_is_below_the_median_for_a_wide_distribution() -> None:
    # Over-forecasts cost more relative error than under-forecasts of the same size.
    v = np.array([10.0, 12.0, 20.0, 30.0, 100.0])
    assert relative_loss_point(v, 1.0) == 12.0 < float(np.median(v))
    assert relative_loss_point(np.array([0.0, -1.0]), 1.0) == -0.5  # no positive sample: median


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(1.0, 1e4), min_size=8, max_size=60),
    st.sampled_from([3.0, 0.1, 1000.0, 7.25]),
)
def test_level_loss_predictors_scale_with_the_series(values: list[float], c: float) -> None:
    y = np.array(values)
    t = hourly(y.size)
    a = walk_forward_all(t, y)
    b = walk_forward_all(t, y * c)
    for m in ("levelmode", "levelrel", "auto"):
        for fa, fb in zip(a[m], b[m], strict=True):
            assert (
                math.isfinite(fa.forecast) and math.isfinite(fa.lower) and math.isfinite(fa.upper)
            )
            assert fb.forecast == pytest.approx(fa.forecast * c, rel=1e-9), m
            assert fa.lower <= fa.forecast <= fa.upper, m


@settings(max_examples=10, deadline=None)
@given(st.floats(1e-6, 1e9), st.integers(6, 40))
def test_level_loss_predictors_exact_on_a_constant_series(level: float, n: int) -> None:
    for m in ("levelmode", "levelrel", "auto"):
        for f in walk_forward(hourly(n), np.full(n, level), m):
            assert f.forecast == level
            assert f.lower <= level <= f.upper


finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1e6), finite), min_size=0, max_size=25),
)
def test_any_finite_series_gives_finite_ordered_forecasts(rows: list[tuple[float, float]]) -> None:
    t = np.cumsum([dt for dt, _ in rows]) + 1.6e9
    y = np.array([v for _, v in rows])
    for method, fcs in walk_forward_all(t, y).items():
        for f in fcs:
            assert math.isfinite(f.forecast) and math.isfinite(f.lower), method
            assert math.isfinite(f.upper), method
            assert f.lower <= f.forecast <= f.upper, (method, f)


def test_every_method_named_for_the_cli_has_its_predictor() -> None:
    # iepm.analysis.methods lists them without numpy (for `iepm --help`); forecast.py builds them.
    from iepm.analysis.forecast import _make_predictors
    from iepm.analysis.methods import BASELINES, PREDICTORS

    assert sorted(p.name for p in _make_predictors()) == sorted([*BASELINES, *PREDICTORS])


@pytest.mark.parametrize("method", METHODS)
def test_one_method_alone_gives_exactly_what_the_full_walk_gives(method: str) -> None:
    """``walk_forward`` computes only what ``method`` reads; that must change nothing."""
    rng = np.random.default_rng(11)
    n = 400
    t = 1.7e9 + np.cumsum(rng.uniform(600, 7200, n))
    y = np.where(np.arange(n) < 250, 80.0, 30.0) * rng.lognormal(0, 0.15, n)
    assert walk_forward(t, y, method) == walk_forward_all(t, y)[method]


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=120),
    st.floats(0.0, 1.0),
)
def test_quantile_of_sorted_errors_is_numpys_to_the_bit(values: list[float], q: float) -> None:
    assert quantile_sorted(sorted(values), q) == float(np.quantile(values, q))
