"""The ensemble's safeguards toward MA(5): the blend (shrinking toward it) and the guard (falling
back to it while the ensemble's own recent record is worse), the relative-error correction
(rescale), and several ensembles in one walk."""

from __future__ import annotations

import numpy as np
import pytest

from iepm.analysis.forecast import (
    ENSEMBLE_CONFIG,
    GUARD_CAP,
    LEVEL_MEMBERS,
    EnsembleConfig,
    Forecast,
    _RelativeScale,
    walk_forward_all,
)
from iepm.analysis.series import AnalysisError
from tests.analysis.conftest import hourly

GUARDED = EnsembleConfig(LEVEL_MEMBERS, cap=3.0, guard=100)
UNGUARDED = EnsembleConfig(LEVEL_MEMBERS, cap=3.0)


def random_walk(n: int, seed: int) -> np.ndarray:
    """Multiplicative random walk: the latest samples say most, so MA(5) beats the level-based
    members (medians of the current level lag behind) on both P90 and mean."""
    rng = np.random.default_rng(seed)
    return 100.0 * np.exp(np.cumsum(rng.normal(0, 0.05, n)))


def noisy_level(n: int, seed: int) -> np.ndarray:
    """A steady level with noise and dips: the level-based members beat MA(5)."""
    rng = np.random.default_rng(seed)
    y = 100.0 * rng.uniform(0.85, 1.05, n)
    dips = rng.random(n) < 0.05
    y[dips] *= rng.uniform(0.1, 0.4, int(dips.sum()))
    return y


def rel(fcs: list[Forecast]) -> np.ndarray:
    return np.array([abs(f.forecast - f.observed) / f.observed for f in fcs])


def test_the_guard_falls_back_to_ma5_where_ma5_is_the_better_forecast() -> None:
    n = 600
    y = random_walk(n, seed=3)
    walks = walk_forward_all(
        hourly(n), y, methods=("ma5",), ensembles={"g": GUARDED, "u": UNGUARDED}
    )
    guarded, unguarded, ma5 = walks["g"], walks["u"], walks["ma5"]
    late = guarded[200:]
    assert sum(f.method == "ma5" for f in late) > 0.6 * len(late)
    assert all(
        f.forecast == m.forecast for f, m in zip(guarded, ma5, strict=True) if f.method == "ma5"
    )
    assert not any(f.method == "ma5" for f in unguarded)  # not a member: only the guard uses it
    for stat in (np.mean, lambda e: np.quantile(e, 0.9)):
        assert stat(rel(guarded[200:])) < stat(rel(unguarded[200:]))
    # Until the guard has a record (20 forecasts), the ensemble is never overruled.
    assert [f.forecast for f in guarded[:20]] == [f.forecast for f in unguarded[:20]]


def test_the_guard_keeps_the_ensemble_where_it_is_the_better_forecast() -> None:
    n = 600
    y = noisy_level(n, seed=4)
    walks = walk_forward_all(
        hourly(n), y, methods=("ma5",), ensembles={"g": GUARDED, "u": UNGUARDED}
    )
    guarded, unguarded, ma5 = walks["g"], walks["u"], walks["ma5"]
    held = sum(f.method == "ma5" for f in guarded)
    assert held < 0.05 * len(guarded)
    same = [f.forecast == u.forecast for f, u in zip(guarded, unguarded, strict=True)]
    assert sum(same) == len(guarded) - held
    assert np.quantile(rel(guarded), 0.9) < np.quantile(rel(ma5), 0.9)


def test_the_guard_sees_only_the_past() -> None:
    n, cut = 400, 250
    y = random_walk(n, seed=5)
    z = y.copy()
    z[cut:] = z[cut:][::-1] * 3.0  # a different future
    a = walk_forward_all(hourly(n), y, methods=(), ensembles={"g": GUARDED})["g"]
    b = walk_forward_all(hourly(n), z, methods=(), ensembles={"g": GUARDED})["g"]
    before = [(f.forecast, f.method) for f in a if f.index <= cut]
    assert before == [(f.forecast, f.method) for f in b if f.index <= cut]
    assert [f.forecast for f in a] != [f.forecast for f in b]


@pytest.mark.parametrize("blend", [0.25, 0.5])
def test_the_blend_shrinks_the_chosen_members_forecast_toward_ma5(blend: float) -> None:
    n = 300
    y = noisy_level(n, seed=6)
    config = EnsembleConfig(LEVEL_MEMBERS, cap=3.0, blend=blend)
    walks = walk_forward_all(hourly(n), y, methods=("ma5", *LEVEL_MEMBERS), ensembles={"b": config})
    for k, f in enumerate(walks["b"]):
        member = walks[f.method][k].forecast
        expected = (1 - blend) * member + blend * walks["ma5"][k].forecast
        assert f.forecast == pytest.approx(expected, rel=1e-12)
        assert f.lower <= f.forecast <= f.upper


def test_several_ensembles_in_one_walk_are_the_same_as_separate_walks() -> None:
    n = 300
    y = random_walk(n, seed=8)
    configs = {
        "g": GUARDED,
        "b": EnsembleConfig(LEVEL_MEMBERS, blend=0.25),
        "d": ENSEMBLE_CONFIG,
        "gb": EnsembleConfig(LEVEL_MEMBERS, cap=3.0, guard=100, blend=0.5),  # shares g's choice
    }
    together = walk_forward_all(hourly(n), y, methods=("auto",), ensembles=configs)
    assert together["d"] == together["auto"]
    for name, config in configs.items():
        alone = walk_forward_all(hourly(n), y, methods=("auto",), ensemble=config)["auto"]
        assert together[name] == alone


def test_the_shipped_ensemble_is_guarded_and_has_the_baselines_as_members() -> None:
    assert ENSEMBLE_CONFIG.guard >= 20 and {"ma5", "ewma"} <= set(ENSEMBLE_CONFIG.members)


def test_blend_guard_and_names_are_checked() -> None:
    with pytest.raises(AnalysisError, match="blend"):
        EnsembleConfig(LEVEL_MEMBERS, blend=1.0)
    with pytest.raises(AnalysisError, match="guard"):
        EnsembleConfig(LEVEL_MEMBERS, guard=5)
    with pytest.raises(AnalysisError, match="rescale"):
        EnsembleConfig(LEVEL_MEMBERS, rescale=5)
    with pytest.raises(AnalysisError, match="method's name"):
        walk_forward_all(hourly(10), np.ones(10), ensembles={"ma5": GUARDED})


def test_the_rescale_factor_minimises_the_summed_relative_error_of_the_window() -> None:
    rng = np.random.default_rng(11)
    observed = 100.0 * rng.uniform(0.7, 1.2, 150)
    observed[rng.random(150) < 0.1] = 0.5  # near-zero observations: clipped, not deciding
    scale = _RelativeScale(100)
    for o in observed:
        scale.update(100.0, 100.0, float(o), floor=1.0)
    r = np.clip(observed[-100:] / 100.0, 1 / (1 + GUARD_CAP), 1 + GUARD_CAP)
    m = scale.factor()
    loss = lambda k: float(np.sum(np.abs(k - r) / r))  # noqa: E731
    grid = np.linspace(0.2, 1.5, 2601)
    assert loss(m) <= min(loss(k) for k in grid) + 1e-9
    assert m < float(np.median(r))  # below the median: over-forecasts cost more
    assert m > 0.5  # ten near-zero observations in a hundred do not drag it to them


def test_rescale_lowers_the_relative_error_on_a_path_that_dips_and_sees_only_the_past() -> None:
    n = 800
    y = noisy_level(n, seed=12)
    plain = EnsembleConfig(LEVEL_MEMBERS, cap=3.0)
    scaled = EnsembleConfig(LEVEL_MEMBERS, cap=3.0, rescale=100)
    walks = walk_forward_all(hourly(n), y, methods=(), ensembles={"p": plain, "s": scaled})
    p, s = walks["p"], walks["s"]
    assert [f.forecast for f in s[:20]] == [f.forecast for f in p[:20]]  # no record yet
    assert np.mean(rel(s[100:])) < np.mean(rel(p[100:]))
    assert all(f.lower <= f.forecast <= f.upper for f in s)
    z = y.copy()
    z[500:] = z[500:][::-1] * 0.5  # a different future changes nothing before it
    other = walk_forward_all(hourly(n), z, methods=(), ensembles={"s": scaled})["s"]
    assert [f.forecast for f in other if f.index <= 500] == [
        f.forecast for f in s if f.index <= 500
    ]


def dipping_scale(power: float = 1.0, limit: float = 1 + GUARD_CAP) -> _RelativeScale:
    """A window whose ratios o/f favour a factor below 1 (the observations dip)."""
    rng = np.random.default_rng(13)
    scale = _RelativeScale(100, power=power, limit=limit)
    for o in 100.0 * rng.uniform(0.5, 1.1, 100):
        scale.update(100.0, 100.0, float(o), floor=1.0)
    return scale


@pytest.mark.parametrize("power", [0.25, 0.5, 0.75])
def test_a_weaker_rescale_shrinks_the_factor_toward_1(power: float) -> None:
    full = dipping_scale().factor()
    weak = dipping_scale(power=power).factor()
    assert full < weak < 1.0
    assert weak == pytest.approx(full**power)
    tight = dipping_scale(limit=1.25).factor()
    assert full < 0.8 and tight == pytest.approx(0.8)  # the tighter clip bounds it


def test_the_evidence_gate_uses_the_factor_only_when_most_forecasts_gain() -> None:
    # Mostly at the forecast, a few deep dips: the factor is below 1 for the dips' sake, but
    # most forecasts would lose by it, so a sign test does not let it through.
    few = _RelativeScale(100, evidence=2.0)
    plain = _RelativeScale(100)
    rng = np.random.default_rng(14)
    for o in np.where(rng.random(100) < 0.15, 30.0, 100.0 * rng.uniform(0.98, 1.02, 100)):
        few.update(100.0, 100.0, float(o), floor=1.0)
        plain.update(100.0, 100.0, float(o), floor=1.0)
    assert plain.factor() < 1.0 and few.factor() == 1.0
    # Every forecast 20% too high: the evidence is overwhelming, the factor is used.
    biased = _RelativeScale(100, evidence=2.0)
    for o in 80.0 * rng.uniform(0.97, 1.03, 100):
        biased.update(100.0, 100.0, float(o), floor=1.0)
    assert biased.factor() == pytest.approx(0.8, abs=0.03)


WEAK = {
    "power": EnsembleConfig(LEVEL_MEMBERS, cap=3.0, rescale=100, rescale_power=0.5),
    "limit": EnsembleConfig(LEVEL_MEMBERS, cap=3.0, rescale=100, rescale_limit=1.25),
    "evidence": EnsembleConfig(LEVEL_MEMBERS, cap=3.0, rescale=100, rescale_evidence=2.0),
    "window": EnsembleConfig(LEVEL_MEMBERS, cap=3.0, rescale=300, rescale_power=0.5),
    "checked": EnsembleConfig(LEVEL_MEMBERS, cap=3.0, rescale=100, rescale_check=True),
}


def test_weaker_rescales_leave_a_constant_series_unchanged() -> None:
    y = np.full(300, 42.5)
    walks = walk_forward_all(hourly(300), y, methods=(), ensembles={"p": UNGUARDED, **WEAK})
    for name in WEAK:
        assert [f.forecast for f in walks[name]] == [f.forecast for f in walks["p"]]
        assert all(f.forecast == 42.5 for f in walks[name])


def test_weaker_rescales_sit_between_none_and_the_full_one_and_see_only_the_past() -> None:
    n = 800
    y = noisy_level(n, seed=12)
    full = EnsembleConfig(LEVEL_MEMBERS, cap=3.0, rescale=100)
    walks = walk_forward_all(
        hourly(n), y, methods=(), ensembles={"p": UNGUARDED, "s": full, **WEAK}
    )
    p, s, half = (np.array([f.forecast for f in walks[k]]) for k in ("p", "s", "power"))
    # factor**0.5 lies between 1 and the factor: so does the forecast, point by point.
    assert np.all(np.minimum(p, s) <= half * (1 + 1e-12))
    assert np.all(half <= np.maximum(p, s) * (1 + 1e-12))
    assert np.any(half != p) and np.any(half != s)
    z = y.copy()
    z[500:] = z[500:][::-1] * 0.5  # a different future changes nothing before it
    other = walk_forward_all(hourly(n), z, methods=(), ensembles=WEAK)
    for name in WEAK:
        assert [f.forecast for f in other[name] if f.index <= 500] == [
            f.forecast for f in walks[name] if f.index <= 500
        ]


def test_weaker_rescale_options_are_checked() -> None:
    for bad in ({"rescale_power": 0.0}, {"rescale_power": 1.5}, {"rescale_limit": 1.0}):
        with pytest.raises(AnalysisError, match="rescale_power"):
            EnsembleConfig(LEVEL_MEMBERS, rescale=100, **bad)  # type: ignore[arg-type]
    with pytest.raises(AnalysisError, match="rescale_power"):
        EnsembleConfig(LEVEL_MEMBERS, rescale=100, rescale_evidence=-1.0)


def test_the_checked_rescale_is_used_only_while_its_record_is_no_worse() -> None:
    rng = np.random.default_rng(15)
    observed = 100.0 * rng.uniform(0.8, 1.2, 20)
    better, worse = _RelativeScale(100, check=True), _RelativeScale(100, check=True)
    for o in observed:
        assert not better.trusted() and not worse.trusted()  # no record yet: uncorrected
        better.update(110.0, float(o), float(o), floor=1.0)  # corrected: exact
        worse.update(float(o), 110.0, float(o), floor=1.0)  # uncorrected: exact
    assert better.trusted() and not worse.trusted()
    assert _RelativeScale(100).trusted()  # unchecked: always


def test_the_checked_rescale_follows_the_full_one_or_none_point_by_point() -> None:
    n = 800
    y = noisy_level(n, seed=12)
    full = EnsembleConfig(LEVEL_MEMBERS, cap=3.0, rescale=100)
    walks = walk_forward_all(
        hourly(n), y, methods=(), ensembles={"p": UNGUARDED, "s": full, "c": WEAK["checked"]}
    )
    p, s, c = (np.array([f.forecast for f in walks[k]]) for k in ("p", "s", "c"))
    assert np.all((c == p) | (c == s))
    assert np.any((c == s) & (c != p))  # on this path the correction earned its use
