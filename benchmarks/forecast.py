"""Forecast accuracy on every throughput series in ../shared/data/ndt/, all methods in one run.

Walk-forward one-step-ahead over each series; every method forecasts the same points. Figures
pooled over all points: relative error |f − o| / o (mean, mean without the worst 1%, median,
P90, share within 10%) and the 80% interval's coverage; ratios to MA(5). Observations ≤ 0 have
no relative error and are left out of the error figures (never out of coverage).

Files are split by a fixed hash of their name into a tune half (where parameters were chosen)
and a test half (never looked at while choosing); figures are given for all, tune and test.

For scale, ``reference_lookahead_median21`` is NOT a forecaster: a median of the neighbours on
both sides of each point (it sees the future); it shows the noise floor of this data.

Usage: .venv/bin/python benchmarks/forecast.py  → one JSON object.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from iepm.analysis.forecast import METHODS, START, walk_forward_all  # noqa: E402
from iepm.analysis.series import read_series  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "ndt"


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


def main() -> None:
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
        "data": str(DATA.relative_to(REPO.parent)),
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
