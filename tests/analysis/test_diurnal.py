"""Diurnal sine fit: known phase recovered and flagged; noise and degenerate input not flagged."""

from __future__ import annotations

import math

import numpy as np
import pytest

from iepm.analysis.diurnal import fit_diurnal, fit_sine, time_of_day
from tests.analysis.conftest import T0


def sine_series(b: float, weekend_b: float | None = None, noise: float = 3.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = T0 + np.sort(rng.uniform(0, 28 * 86400, 800))  # irregular, four weeks
    x = time_of_day(t)
    weekday = (np.floor(t / 86400).astype(int) + 3) % 7
    phase = np.where(weekday >= 5, b if weekend_b is None else weekend_b, b)
    return t, 200 + 40 * np.sin(x + phase) + rng.normal(0, noise, t.size)


def test_known_phase_recovered_and_flagged() -> None:
    t, y = sine_series(b=2.0)
    fits = fit_diurnal(t, y)
    for days in ("weekdays", "weekends"):
        f = fits[days]
        assert f.b == pytest.approx(2.0, abs=0.05), days
        assert f.a == pytest.approx(40, rel=0.05) and f.c == pytest.approx(200, rel=0.01)
        assert f.delta_b < 0.2 and f.diurnal
        # The maximum of sin(x + 2) is at x = π/2 − 2 (mod 2π): ±1 h.
        peak = ((math.pi / 2 - 2.0) % (2 * math.pi)) * 24 / (2 * math.pi)
        assert abs(f.peak_hour - peak) < 1.0
        assert f.rmse < f.simple_rmse  # the fit beats the seeds' simple estimate with b = π/2


def test_weekdays_and_weekends_apart() -> None:
    t, y = sine_series(b=1.0, weekend_b=3.0)
    fits = fit_diurnal(t, y)
    assert fits["weekdays"].b == pytest.approx(1.0, abs=0.1)
    assert fits["weekends"].b == pytest.approx(3.0, abs=0.1)


def test_simple_estimate_with_site_phase() -> None:
    t, y = sine_series(b=2.0, noise=0.5)
    f = fit_diurnal(t, y, site_b=2.0)["weekdays"]
    assert f.simple_b == 2.0 and f.simple_c == pytest.approx(200, rel=0.01)
    assert f.simple_a == pytest.approx(40, rel=0.1)
    assert f.simple_rmse < 6


def test_noise_is_not_diurnal() -> None:
    rng = np.random.default_rng(7)
    t = T0 + np.sort(rng.uniform(0, 14 * 86400, 60))
    f = fit_diurnal(t, 100 + rng.normal(0, 10, t.size))["weekdays"]
    assert not f.diurnal


@pytest.mark.parametrize("n", [0, 1, 3, 40])
def test_degenerate_input_gives_no_flag_and_no_error(n: int) -> None:
    x = np.linspace(0, 6, n)
    f = fit_sine(x, np.full(n, 5.0))
    assert not f.diurnal and f.delta_b == math.inf
    d = f.as_dict()
    assert d["delta_b"] is None  # JSON-safe


def test_a_few_hours_of_trend_are_not_diurnal() -> None:
    # Five hourly samples of a ramp fit a piece of sine with a tight phase; they do not span the
    # day, so the path is not called diurnal.
    f = fit_diurnal(T0 + 3600.0 * np.arange(5), np.arange(1.0, 6.0))["weekdays"]
    assert f.delta_b < 0.2 and f.day_coverage < 0.75 and not f.diurnal
