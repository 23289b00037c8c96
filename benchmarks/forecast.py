"""Forecast accuracy on every throughput series in ../shared/data/ndt/, all methods in one run.

Walk-forward one-step-ahead over each series; every method forecasts the same points. Figures
pooled over all points: relative error |f − o| / o (mean, mean without the worst 1%, median,
P90, share within 10%) and the 80% interval's coverage; ratios to MA(5). Observations ≤ 0 have
no relative error and are left out of the error figures (never out of coverage).

Files are split by a fixed hash of their name into a tune half (where parameters were chosen)
and a test half (never looked at while choosing); figures are given for all, tune and test.

For scale, ``reference_lookahead_median21`` is NOT a forecaster: a median of the neighbours on
both sides of each point (it sees the future); it shows the noise floor of this data.

``--folds clients``: leave-clients-out cross-validation instead (files are
``<client>_<server>_<d|u>_throughput.txt``; four clients, so four folds). The tune/test halves
share clients and so flatter the ensemble; here each fold holds one whole client out. The
candidates (:data:`CANDIDATES`: member sets × selector error cap × decay × blend toward MA(5) ×
guard; ``--with-rescale``: × relative-error correction) are walked on every file (in one walk
per file, over the same predictors); each fold chooses the whole configuration on its training
clients only (nested; :func:`criterion`: the worst ratio to MA(5) over the training clients'
pooled summaries and each training path group's trimmed mean and P90, lowest wins) and reports
the held-out client's figures for MA(5), EWMA and that choice, all in the same run. ``pooled``
puts the four held-out clients' points together.
``hindsight_not_a_result`` is, for scale only, what the held-out client itself would have chosen.
``shipped`` is the same rule's choice on all clients, which must be the default
(``ENSEMBLE_CONFIG``), and its figures per client — those are NOT held out.
``rescale_effect_not_held_out`` (``--with-rescale``): the default with and without the
relative-error correction (rescale = 100), ratios to MA(5) per client and on all (not held out).

``--with-weak-rescale``: × weaker forms of it (:data:`WEAK_RESCALES`: shrunk toward 1, clipped
tighter, a longer window, only on a sign test's evidence, or only while its own record is no
worse on P90 and mean), on the cap-3, decay-0.97 candidates.

Usage: .venv/bin/python benchmarks/forecast.py [--folds halves|clients] [--with-rescale]
[--with-weak-rescale]
→ one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from iepm.analysis.forecast import (  # noqa: E402
    ENSEMBLE_CONFIG,
    LEVEL_MEMBERS,
    METHODS,
    START,
    EnsembleConfig,
    walk_forward_all,
)
from iepm.analysis.series import read_series  # noqa: E402


def _shared_data(repo: Path) -> Path:
    """``../shared/data`` beside the checkout, or beside an ancestor (a worktree nested deeper)."""
    for base in repo.parents:
        if (base / "shared" / "data").is_dir():
            return base / "shared" / "data"
    return repo.parent / "shared" / "data"


DATA = _shared_data(REPO) / "ndt"


def split_of(name: str) -> str:
    """Fixed split: the file name's SHA-256 decides, so it never depends on the results."""
    return "tune" if int(hashlib.sha256(name.encode()).hexdigest(), 16) % 2 == 0 else "test"


def figures(rel: np.ndarray, covered: np.ndarray) -> dict[str, float]:
    rel = np.sort(rel)
    keep = rel[: int(np.floor(rel.size * 0.99))]
    return {
        "mean_rel_error": float(np.mean(rel)),
        "trimmed_mean_rel_error": float(np.mean(keep)),
        "median_rel_error": float(np.median(rel)),
        "p90_rel_error": float(np.quantile(rel, 0.9)),
        "within_10_percent": float(np.mean(rel <= 0.1)),
        "coverage_80": float(np.mean(covered)),
        "points": int(rel.size),
    }


def lookahead_reference(y: np.ndarray, half: int = 10) -> np.ndarray:
    """Not a forecaster: the median of the 10 samples before *and after* each point (itself left
    out). It sees the future, so its errors show how much of the error is the measurement's
    own noise, which no one-step-ahead forecaster can remove."""
    pad = np.r_[np.full(half, np.nan), y, np.full(half, np.nan)]
    win = np.lib.stride_tricks.sliding_window_view(pad, 2 * half + 1).copy()
    win[:, half] = np.nan
    return np.nanmedian(win, axis=1)


SUMMARIES = (
    "mean_rel_error",
    "trimmed_mean_rel_error",
    "median_rel_error",
    "p90_rel_error",
    "within_10_percent",
)
MEMBER_SETS: dict[str, tuple[str, ...]] = {
    "level": LEVEL_MEMBERS,  # the ensemble before leave-clients-out
    "level+baselines": (*LEVEL_MEMBERS, "ma5", "ewma"),
    "level+baselines+mean10": (*LEVEL_MEMBERS, "ma5", "ewma", "mean10"),
}


# blend: the weight of MA(5) in the forecast; guard: the window of the fall-back to MA(5) (0 off);
# rescale: the window of the relative-error correction (0 off).
def candidates(rescales: tuple[int, ...] = (0,)) -> dict[str, EnsembleConfig]:
    return {
        f"{name} cap={cap} decay={decay} blend={blend} guard={guard}"
        + (f" rescale={rescale}" if rescale else ""): EnsembleConfig(
            members, cap=cap, decay=decay, blend=blend, guard=guard, rescale=rescale
        )
        for (name, members), cap, decay, blend, guard, rescale in itertools.product(
            MEMBER_SETS.items(), (0.5, 1.0, 3.0), (0.97, 0.99), (0.0, 0.25, 0.5), (0, 100), rescales
        )
    }


# --with-rescale adds each with the relative-error correction (before the walks' processes fork).
CANDIDATES: dict[str, EnsembleConfig] = candidates()

# Weaker forms of the correction (window 100 unless named): the factor shrunk toward 1
# (m**power), clipped tighter, over a longer window, used only on a sign test's evidence, or
# only while checked against the uncorrected forecasts.
WEAK_RESCALES: dict[str, dict[str, float | bool]] = {
    "power=0.25": {"rescale": 100, "rescale_power": 0.25},
    "power=0.5": {"rescale": 100, "rescale_power": 0.5},
    "power=0.75": {"rescale": 100, "rescale_power": 0.75},
    "limit=1.25": {"rescale": 100, "rescale_limit": 1.25},
    "window=300 power=0.5": {"rescale": 300, "rescale_power": 0.5},
    "evidence=2": {"rescale": 100, "rescale_evidence": 2.0},
    # Used only while the corrected forecasts' own record is no worse on P90 and mean.
    "checked": {"rescale": 100, "rescale_check": True},
    "power=0.5 checked": {"rescale": 100, "rescale_power": 0.5, "rescale_check": True},
    "limit=1.25 checked": {"rescale": 100, "rescale_limit": 1.25, "rescale_check": True},
}


def weak_rescale_candidates() -> dict[str, EnsembleConfig]:
    """Each weaker correction on the candidates with cap 3 and decay 0.97 (every fold's choice
    in the runs with and without the full correction): member sets × blend × guard."""
    out = {}
    for key, config in candidates().items():
        if config.cap != 3.0 or config.decay != 0.97:
            continue
        for name, weak in WEAK_RESCALES.items():
            out[f"{key} rescale {name}"] = replace(config, **weak)  # type: ignore[arg-type]
    return out


def client_of(name: str) -> str:
    return name.split("_")[0]


def group_of(name: str) -> str:
    """A client's paths in one direction (d/u): uploads from a home link behave alike."""
    return f"{client_of(name)}_{name.split('_')[-2]}"


def ratios_to_ma5(fig: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """Each summary as a ratio to MA(5)'s, oriented so that below 1 is better (within 10%: the
    share outside 10%)."""
    out = {}
    for k in SUMMARIES:
        a, b = (1 - fig[k], 1 - base[k]) if k == "within_10_percent" else (fig[k], base[k])
        out[k] = a / b if b else (1.0 if a == b else float("inf"))
    return out


Walk = dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]  # method → (o, f, covered)


def pooled(walks: dict[str, Walk], names: list[str], method: str) -> dict[str, float]:
    o = np.concatenate([walks[n][method][0] for n in names])
    f = np.concatenate([walks[n][method][1] for n in names])
    covered = np.concatenate([walks[n][method][2] for n in names])
    pos = o > 0
    return figures(np.abs(f[pos] - o[pos]) / o[pos], covered)


def criterion(walks: dict[str, Walk], names: list[str], method: str) -> float:
    """The worst ratio to MA(5): pooled over ``names`` on every summary, and per path group on
    the trimmed mean and P90 (so one kind of path cannot be sacrificed to the pool)."""
    worst = max(ratios_to_ma5(pooled(walks, names, method), pooled(walks, names, "ma5")).values())
    for g in sorted({group_of(n) for n in names}):
        part = [n for n in names if group_of(n) == g]
        r = ratios_to_ma5(pooled(walks, part, method), pooled(walks, part, "ma5"))
        worst = max(worst, r["trimmed_mean_rel_error"], r["p90_rel_error"])
    return worst


def walk_file(path: Path) -> Walk:
    series = read_series(path, allow_all_zero=True)
    out: Walk = {}

    def keep(method: str, fcs: list) -> None:  # type: ignore[type-arg]
        o = np.array([f.observed for f in fcs])
        out[method] = (
            o,
            np.array([f.forecast for f in fcs]),
            np.array([f.lower <= f.observed <= f.upper for f in fcs]),
        )

    # One walk: the predictors once, every candidate ensemble over them.
    walks = walk_forward_all(series.t, series.y, methods=("ma5", "ewma"), ensembles=CANDIDATES)
    for method, fcs in walks.items():
        keep(method, fcs)
    return out


def table(walks: dict[str, Walk], names: list[str], auto: str) -> dict[str, object]:
    per: dict[str, object] = {m: pooled(walks, names, m) for m in ("ma5", "ewma")}
    per["auto"] = pooled(walks, names, auto)
    base = per["ma5"]
    assert isinstance(base, dict)
    for m in ("ewma", "auto"):
        fig = per[m]
        assert isinstance(fig, dict)
        fig["ratio_to_ma5"] = {
            k: fig[k] / base[k] if base[k] else None for k in (*SUMMARIES, "coverage_80")
        }
    return per


def raw_mean_points(held: dict[str, Walk], top: int = 10) -> dict[str, object]:
    """Where the pooled raw means come from: the points with MA(5)'s largest relative errors
    (their share of its sum, with the held-out ensemble's forecast there) and the ratio with
    the single largest left out. A measurement of the held-out walks, used to choose nothing."""
    rows = []
    for name, walk in held.items():
        o, fm, fa = walk["ma5"][0], walk["ma5"][1], walk["auto"][1]
        for i in np.flatnonzero(o > 0):
            rows.append((abs(fm[i] - o[i]) / o[i], abs(fa[i] - o[i]) / o[i], name, int(i), i))
    em = np.array([r[0] for r in rows])
    ea = np.array([r[1] for r in rows])
    order = np.argsort(-em)
    worst = order[0]
    name, i = rows[worst][2], rows[worst][4]
    return {
        "ma5_sum": float(em.sum()),
        "auto_sum": float(ea.sum()),
        "ma5_top_share": float(em[order[:top]].sum() / em.sum()),
        "auto_minus_ma5_on_top": float((ea - em)[order[:top]].sum()),
        "auto_minus_ma5_on_the_rest": float((ea - em)[order[top:]].sum()),
        "largest": {
            "file": name,
            "forecast_number": rows[worst][3],
            "observed": float(held[name]["ma5"][0][i]),
            "ma5": float(held[name]["ma5"][1][i]),
            "auto": float(held[name]["auto"][1][i]),
            "ma5_share_of_its_sum": float(em[worst] / em.sum()),
        },
        "ratio_without_the_largest": float((ea.sum() - ea[worst]) / (em.sum() - em[worst])),
    }


def folds_by_client() -> dict[str, object]:
    files = sorted(DATA.glob("*_throughput.txt"))
    started = time.monotonic()
    workers = min(2, os.cpu_count() or 1)  # the machine is shared: two walks at a time at most
    with ProcessPoolExecutor(workers) as pool:
        walks: dict[str, Walk] = dict(
            zip((p.name for p in files), pool.map(walk_file, files), strict=True)
        )
    clients = sorted({client_of(n) for n in walks})
    result: dict[str, object] = {
        "benchmark": "forecast",
        "folds": "clients",
        "data": str(DATA.relative_to(DATA.parents[2])),
        "clients": {c: sum(client_of(n) == c for n in walks) for c in clients},
        "candidates": list(CANDIDATES),
        "selection": "lowest worst ratio to MA(5) on the training clients (criterion())",
    }
    folds: list[dict[str, object]] = []
    held: dict[str, Walk] = {}  # the held-out client's files, walked with its fold's choice
    for test in clients:
        train = [n for n in walks if client_of(n) != test]
        scores = {key: criterion(walks, train, key) for key in CANDIDATES}
        chosen = min(scores, key=lambda k: scores[k])
        test_names = [n for n in walks if client_of(n) == test]
        assert not set(train) & set(test_names)  # the choice never saw the held-out client
        per = table(walks, test_names, chosen)
        # For scale only (NOT a result): the candidate the held-out client itself would choose.
        hindsight = {key: criterion(walks, test_names, key) for key in CANDIDATES}
        best_in_hindsight = min(hindsight, key=lambda k: hindsight[k])
        auto, ewma = per["auto"], per["ewma"]
        assert isinstance(auto, dict) and isinstance(ewma, dict)
        ratio = auto["ratio_to_ma5"]
        folds.append(
            {
                "held_out_client": test,
                "files": len(test_names),
                "chosen_on_training": chosen,
                "training_criterion": scores[chosen],
                "held_out_criterion": hindsight[chosen],
                "hindsight_not_a_result": {
                    "candidate": best_in_hindsight,
                    "held_out_criterion": hindsight[best_in_hindsight],
                },
                **per,
                "goals": {
                    "trimmed_mean_no_worse_than_ma5": ratio["trimmed_mean_rel_error"] <= 1.0,
                    "p90_no_worse_than_ma5": ratio["p90_rel_error"] <= 1.0,
                },
            }
        )
        for n in test_names:
            held[n] = {"ma5": walks[n]["ma5"], "ewma": walks[n]["ewma"], "auto": walks[n][chosen]}
    result["per_fold"] = folds
    pool_tab = table(held, list(held), "auto")
    auto = pool_tab["auto"]
    assert isinstance(auto, dict)
    ratio = auto["ratio_to_ma5"]
    pool_tab["goals"] = {
        "no_worse_than_ma5_on_every_summary": all(
            ratios_to_ma5(auto, pool_tab["ma5"])[k] <= 1.0  # type: ignore[arg-type]
            for k in SUMMARIES
        ),
        "p90_le_0.85_ma5": ratio["p90_rel_error"] <= 0.85,
        "trimmed_mean_le_0.95_ma5": ratio["trimmed_mean_rel_error"] <= 0.95,
        "coverage_78_82": 0.78 <= auto["coverage_80"] <= 0.82,
        "every_fold_trimmed_mean_and_p90_no_worse": all(
            all(f["goals"].values())  # type: ignore[attr-defined]
            for f in folds
        ),
    }
    result["pooled"] = pool_tab
    result["raw_mean_points"] = raw_mean_points(held)
    every = list(walks)
    shipped_scores = {key: criterion(walks, every, key) for key in CANDIDATES}
    shipped = min(shipped_scores, key=lambda k: shipped_scores[k])
    result["shipped"] = {
        "chosen_on_all_clients": shipped,
        "is_the_default": CANDIDATES[shipped] == ENSEMBLE_CONFIG,
        "note": "chosen with every client in view: these per-client figures are not held out",
        "per_client": {
            c: table(walks, [n for n in every if client_of(n) == c], shipped) for c in clients
        },
        "all": table(walks, every, shipped),
    }
    # What the relative-error correction alone does to the default (every client: not held out).
    default = next(k for k, c in CANDIDATES.items() if c == ENSEMBLE_CONFIG)
    scaled = next(
        (k for k, c in CANDIDATES.items() if c == replace(ENSEMBLE_CONFIG, rescale=100)), ""
    )
    result["rescale_effect_not_held_out"] = scaled and {
        name: {
            group: ratios_to_ma5(pooled(walks, part, key), pooled(walks, part, "ma5"))
            for group, part in (
                *((c, [n for n in every if client_of(n) == c]) for c in clients),
                ("all", every),
            )
        }
        for name, key in (("default", default), ("default_rescale_100", scaled))
    }
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", choices=("halves", "clients"), default="halves")
    parser.add_argument(
        "--with-rescale",
        action="store_true",
        help="--folds clients: every candidate also with the relative-error correction",
    )
    parser.add_argument(
        "--with-weak-rescale",
        action="store_true",
        help="--folds clients: candidates with weaker forms of the correction (WEAK_RESCALES)",
    )
    args = parser.parse_args()
    if args.with_rescale:
        CANDIDATES.update(candidates((100,)))
    if args.with_weak_rescale:
        CANDIDATES.update(weak_rescale_candidates())
    if args.folds == "clients":
        print(json.dumps(folds_by_client(), indent=2))
        return
    halves()


def halves() -> None:
    files = sorted(DATA.glob("*_throughput.txt"))
    rel: dict[str, dict[str, list[np.ndarray]]] = {
        s: {m: [] for m in METHODS} for s in ("tune", "test")
    }
    cov: dict[str, dict[str, list[np.ndarray]]] = {
        s: {m: [] for m in METHODS} for s in ("tune", "test")
    }
    chosen: dict[str, int] = {}
    ref: dict[str, list[np.ndarray]] = {"tune": [], "test": []}
    started = time.monotonic()
    for path in files:
        series = read_series(path, allow_all_zero=True)
        part = split_of(path.name)
        o_all = series.y[START:]
        f_ref = lookahead_reference(series.y)[START:]
        ref[part].append(np.abs(f_ref - o_all)[o_all > 0] / o_all[o_all > 0])
        for method, fcs in walk_forward_all(series.t, series.y).items():
            o = np.array([f.observed for f in fcs])
            f = np.array([f.forecast for f in fcs])
            lo = np.array([f.lower for f in fcs])
            hi = np.array([f.upper for f in fcs])
            pos = o > 0
            rel[part][method].append(np.abs(f[pos] - o[pos]) / o[pos])
            cov[part][method].append((lo <= o) & (o <= hi))
            if method == "auto":
                for fc in fcs:
                    chosen[fc.method] = chosen.get(fc.method, 0) + 1
    result: dict[str, object] = {
        "benchmark": "forecast",
        "data": str(DATA.relative_to(DATA.parents[2])),
        "files": {"all": len(files), "tune": 0, "test": 0},
        "seconds": 0.0,
    }
    counts = result["files"]
    assert isinstance(counts, dict)
    for path in files:
        counts[split_of(path.name)] += 1
    for part in ("all", "tune", "test"):
        parts = ("tune", "test") if part == "all" else (part,)
        per: dict[str, dict[str, float]] = {}
        for m in METHODS:
            r = np.concatenate([a for p in parts for a in rel[p][m]])
            c = np.concatenate([a for p in parts for a in cov[p][m]])
            per[m] = figures(r, c)
        base = per["ma5"]
        for m in METHODS:
            per[m]["ratio_to_ma5"] = {  # type: ignore[assignment]
                k: (per[m][k] / base[k] if base[k] else None)
                for k in (
                    "mean_rel_error",
                    "trimmed_mean_rel_error",
                    "median_rel_error",
                    "p90_rel_error",
                    "within_10_percent",
                    "coverage_80",
                )
            }
        r = np.sort(np.concatenate([a for p in parts for a in ref[p]]))
        per["reference_lookahead_median21"] = {  # type: ignore[assignment]
            "p90_rel_error": float(np.quantile(r, 0.9)),
            "trimmed_mean_rel_error": float(np.mean(r[: int(np.floor(r.size * 0.99))])),
            "p90_ratio_to_ma5": float(np.quantile(r, 0.9)) / base["p90_rel_error"],
            "trimmed_mean_ratio_to_ma5": float(np.mean(r[: int(np.floor(r.size * 0.99))]))
            / base["trimmed_mean_rel_error"],
        }
        ens = per["auto"]
        per["goals"] = {  # type: ignore[assignment]
            "ensemble_p90_25pct_below_ma5": ens["p90_rel_error"] <= 0.75 * base["p90_rel_error"],
            "ensemble_trimmed_mean_20pct_below_ma5": ens["trimmed_mean_rel_error"]
            <= 0.8 * base["trimmed_mean_rel_error"],
            "ensemble_coverage_78_82": 0.78 <= ens["coverage_80"] <= 0.82,
        }
        result[part] = per
    result["ensemble_choices"] = chosen
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
