"""Step-change detection on ../shared/data/rtt-changes/ (RTT traces, hand-labelled change points).

Scoring: a detection matches a label within ±5 samples, each label and each detection at most
once, nearest pairs first; precision, recall and F1 per file, then averaged over files (a file
without labels scores 1 only when nothing is detected). The online detector is scored on the
change index it reports with each alert and, separately, on the alert index itself; its delay
is alert index − label index over matched labels.

Baselines run in the same benchmark, on the raw traces:
- ruptures PELT with the rbf cost, pen=10 (``KernelCPD(kernel="rbf")``: ruptures' C
  implementation of PELT with that cost; ``Pelt(model="rbf")`` builds an n×n Gram matrix and does
  not finish in reasonable time on 12,000-point traces);
- PELT with the l2 cost (``KernelCPD(kernel="linear")``) and penalty 3·ln(n)·var;
- a naive two-sided CUSUM (k = 0.5σ, h = 5σ, σ and the mean from the first 20 samples after
  each alarm).

``online`` is :func:`detect_online` (the kernel scan detector); ``online_band`` is the older
robust-band :class:`OnlineDetector` (threshold 4), kept for comparison.

Our detectors treat RTT ≤ 0 (RIPE Atlas's marks for failed measurements) as missing samples.
The rbf baseline is also run on the same cleaned traces, so the comparison is like for like.

Files are split by a fixed hash of their name into a tune half (where the defaults in
iepm/analysis/changes.py were chosen) and a test half (never used for choosing).

``--ceiling`` adds how far the detectors' own parameters could go, chosen WITH hindsight: for
each half, the best single setting of (bandwidth, penalty) over a grid, and the mean of each
file's own best setting (an oracle no method can use). When even these stay below a goal, no
choice of parameters reaches it: the labels, not the tuning, are the limit.

``--per-trace`` asks whether the setting can be chosen per trace from features of the trace
itself (its length, relative noise, heavy-tailedness, share of spikes, ...), the rule learned on
the tune half only: a rule is one setting for all, or a threshold on one feature with a setting
on each side (at least 3 files each side). Its complexity (which feature, or none) is chosen by
leave-one-file-out cross-validation within the tune half, and that whole choice is itself
cross-validated (nested) to give the tune half's honest figure; the rule fitted on the whole
tune half is then scored once on the test half. Per feature, the same figures for a rule on that
feature alone. Online, only settings with a median delay ≤ 3 samples on the training files
compete.

``--penalty-rules`` chooses each trace's penalty without its labels, by rules with a few
constants: every optimal segmentation for penalties 1–64 is found once per trace (CROPS, Haynes,
Eckley & Fearnhead 2017), then a rule picks one: ``fixed`` (one penalty), ``log_n`` (a·ln n, the
BIC/MBIC form), ``elbow`` (the point of cost against number of changes furthest below the chord
between the segmentations at two penalties), ``plateau`` (the number of changes optimal over the
longest range of log penalty between two penalties), ``effect`` (a fixed penalty, then adjacent
segments merged while their medians differ by under k robust noise scales of the pair). Each
rule's constants (and bandwidth 8 or 12) are chosen by leave-one-file-out CV on the tune half,
the rule among rules likewise, and each is scored once on the test half; the test half's own
best constants are printed beside them as hindsight, never as a result.

``--excursions`` asks how each half labels short excursions (a label within 25 samples of
another: an excursion's start and end) and how the defaults' true and false positives split
between such short detections and the others; and, with hindsight, the online detector waiting
for a 4th sample of the new level (bandwidth 8/12 × penalty 5/6/7) on each half.

``--online-window`` runs the online detector with a look-back of 100 (the default) to 400
samples: a longer one can find smaller lasting steps (see :func:`online_window`).

Usage: .venv/bin/python benchmarks/changes.py [--ceiling] [--per-trace] [--penalty-rules]
[--excursions] [--online-window]
→ one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from iepm.analysis.changes import (  # noqa: E402
    DEFAULT_MIN_CHANGE,
    OnlineDetector,
    crops,
    detect_online,
    finite_samples,
    merge_small,
    noise_scale,
    segment,
    unit_scaled,
)
from iepm.analysis.series import read_series  # noqa: E402


def _shared_data(repo: Path) -> Path:
    """``../shared/data`` beside the checkout, or beside an ancestor (a worktree nested deeper)."""
    for base in repo.parents:
        if (base / "shared" / "data").is_dir():
            return base / "shared" / "data"
    return repo.parent / "shared" / "data"


DATA = _shared_data(REPO) / "rtt-changes"
MARGIN = 5
T = TypeVar("T")
# --ceiling grids: bandwidth (noise scales) × penalty (samples), around the defaults.
OFFLINE_GRID = {
    "bandwidth": (6.0, 8.0, 12.0, 16.0, 24.0),
    "penalty": (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0),
}
ONLINE_GRID = {"bandwidth": (8.0, 12.0, 16.0), "penalty": (4.0, 5.0, 6.0)}
# --per-trace: the settings a per-trace rule may choose among (smaller: walked on every file).
PER_TRACE_OFFLINE = [(b, p) for b in (8.0, 12.0, 16.0) for p in (3.0, 4.0, 6.0, 8.0, 12.0)]
PER_TRACE_ONLINE = [(12.0, 4.0), (12.0, 5.0), (12.0, 6.0), (8.0, 5.0), (16.0, 5.0)]
MIN_SIDE = 3  # files on each side of a per-trace rule's threshold


def splits(names: Sequence[str]) -> dict[str, str]:
    """Fixed split: files sorted by the SHA-256 of their name, the first half (rounded up) tunes.

    It depends on nothing but the names, so it cannot follow the results.
    """
    ordered = sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    half = (len(ordered) + 1) // 2
    return {n: ("tune" if i < half else "test") for i, n in enumerate(ordered)}


def match(
    detected: Sequence[int], labels: Sequence[int], margin: int = MARGIN
) -> list[tuple[int, int]]:
    """(detection, label) pairs within ``margin``, nearest first, each used at most once."""
    pairs = sorted(
        (abs(d - lab), d, lab) for d in set(detected) for lab in labels if abs(d - lab) <= margin
    )
    used_d: set[int] = set()
    used_l: set[int] = set()
    out = []
    for _, d, lab in pairs:
        if d not in used_d and lab not in used_l:
            used_d.add(d)
            used_l.add(lab)
            out.append((d, lab))
    return out


def prf(detected: Sequence[int], labels: Sequence[int]) -> tuple[float, float, float]:
    det = set(detected)
    if not labels:
        ok = 1.0 if not det else 0.0
        return ok, ok, ok
    tp = len(match(sorted(det), labels))
    p = tp / len(det) if det else 0.0
    r = tp / len(labels)
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def cusum(y: np.ndarray, k: float = 0.5, h: float = 5.0, warmup: int = 20) -> list[int]:
    out: list[int] = []
    i, n = 0, y.size
    while i + warmup < n:
        ref = y[i : i + warmup]
        mu, sd = float(np.mean(ref)), float(np.std(ref)) or 1e-9
        hi = lo = 0.0
        j = i + warmup
        while j < n:
            z = (y[j] - mu) / sd
            hi, lo = max(0.0, hi + z - k), max(0.0, lo - z - k)
            if hi > h or lo > h:
                out.append(j)
                break
            j += 1
        i = j + 1 if j < n else n
    return out


@functools.cache  # --ceiling asks for each trace once per setting
def load(path: Path) -> tuple[np.ndarray, list[int]]:
    """The cleaned trace (RTT ≤ 0 → NaN) and its labelled change indices."""
    s = read_series(path, check_order=False)
    labels = [i for i, e in enumerate(s.extra) if e and e[0].strip() == "1"]
    return np.where(s.y > 0, s.y, np.nan), labels


def _online_f1(clean: np.ndarray, labels: list[int], **options: float) -> tuple[float, list[int]]:
    """F1 of :func:`detect_online` (``options``: its parameters) on the reported change indices,
    and the delays (alert index − label) of the matched labels."""
    alerts = detect_online(clean, **options)
    at = {a.index: (a.index if a.alert_index is None else a.alert_index) for a in alerts}
    delays = [at[d] - lab for d, lab in match(list(at), labels)]
    return prf(list(at), labels)[2], delays


def _setting_f1(
    job: tuple[str, str, float, float],
) -> tuple[str, str, float, float, float, list[int]]:
    """(kind, file, bandwidth, penalty, F1, online delays) for one file and one setting."""
    kind, name, bandwidth, penalty = job
    clean, labels = load(DATA / name)
    if kind == "offline":
        found = [cp.index for cp in segment(clean, penalty=penalty, bandwidth=bandwidth)]
        return kind, name, bandwidth, penalty, prf(found, labels)[2], []
    f1, delays = _online_f1(clean, labels, penalty=penalty, bandwidth=bandwidth)
    return kind, name, bandwidth, penalty, f1, delays


Row = tuple[str, str, float, float, float, list[int]]


def _grid_rows(
    names: Sequence[str], settings: dict[str, Sequence[tuple[float, float]]]
) -> list[Row]:
    """:func:`_setting_f1` for every file and every (bandwidth, penalty) of each kind."""
    jobs = [
        (kind, name, b, p) for kind, grid in settings.items() for b, p in grid for name in names
    ]
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        return list(pool.map(_setting_f1, jobs, chunksize=2))


def ceiling(split: dict[str, str]) -> dict[str, object]:
    """Best parameters with hindsight, per half: one setting for all files, and each file's own.

    Online, only settings whose median delay meets the goal (≤ 3 samples) compete.
    """
    rows = _grid_rows(
        list(split),
        {
            kind: [(b, p) for b in grid["bandwidth"] for p in grid["penalty"]]
            for kind, grid in (("offline", OFFLINE_GRID), ("online", ONLINE_GRID))
        },
    )
    out: dict[str, object] = {"offline_grid": OFFLINE_GRID, "online_grid": ONLINE_GRID}
    for kind in ("offline", "online"):
        per: dict[str, object] = {}
        for part in ("tune", "test"):
            f1: dict[tuple[float, float], list[float]] = {}
            delays: dict[tuple[float, float], list[int]] = {}
            for row_kind, name, b, p, f, d in rows:
                if row_kind == kind and split[name] == part:
                    f1.setdefault((b, p), []).append(f)
                    delays.setdefault((b, p), []).extend(d)
            allowed = [
                k for k in f1 if kind == "offline" or (delays[k] and np.median(delays[k]) <= 3)
            ]
            setting = max(allowed, key=lambda k: float(np.mean(f1[k])))
            per_file = [
                max(f for k, n, b, p, f, _ in rows if k == kind and n == name and (b, p) in allowed)
                for name in split
                if split[name] == part
            ]
            summary: dict[str, object] = {
                "best_single_setting": {"bandwidth": setting[0], "penalty": setting[1]},
                "best_single_setting_f1": float(np.mean(f1[setting])),
                "each_file_its_best_f1": float(np.mean(per_file)),
            }
            if kind == "online":
                summary["best_single_setting_median_delay"] = float(np.median(delays[setting]))
            per[part] = summary
        out[kind] = per
    return out


def trace_features(y: np.ndarray) -> dict[str, float]:
    """What a per-trace rule may look at: the trace alone (cleaned: NaN where missing)."""
    x = y[np.isfinite(y)]
    sigma = max(noise_scale(x), 1e-12)
    d = np.diff(x)
    # First differences in noise units: a share beyond 5 or 10 is how heavy the tails are.
    z = np.abs(d - np.median(d)) / (sigma * np.sqrt(2.0))
    # Spikes: samples more than 5 noise scales from the median of their 11 neighbours.
    near = np.median(np.lib.stride_tricks.sliding_window_view(np.pad(x, 5, mode="edge"), 11), 1)
    q75, q25 = np.percentile(x, [75, 25])
    return {
        "length": float(y.size),
        "relative_noise": sigma / float(np.median(x)),
        "tail_share_5": float(np.mean(z > 5)),
        "tail_share_10": float(np.mean(z > 10)),
        "spike_share": float(np.mean(np.abs(x - near) > 5 * sigma)),
        "iqr_in_noise_scales": float((q75 - q25) / sigma),
        "missing_share": float(np.mean(~np.isfinite(y))),
    }


# A per-trace rule: ("all", setting) or ("split", feature, threshold, setting ≤, setting >).
Rule = tuple[object, ...]


class _PerTrace:
    """Per-trace rules of one detector kind, fitted and cross-validated on lists of files."""

    def __init__(self, kind: str, rows: list[Row], features: dict[str, dict[str, float]]) -> None:
        self.kind = kind
        self.features = features
        self.f1: dict[tuple[float, float], dict[str, float]] = {}
        self.delays: dict[tuple[float, float], dict[str, list[int]]] = {}
        for k, name, b, p, f, d in rows:
            if k == kind:
                self.f1.setdefault((b, p), {})[name] = f
                self.delays.setdefault((b, p), {})[name] = d

    def best(self, files: list[str]) -> tuple[float, float]:
        def delay(s: tuple[float, float]) -> float:
            return float(np.median([d for f in files for d in self.delays[s][f]] or [np.inf]))

        allowed = [s for s in self.f1 if self.kind == "offline" or delay(s) <= 3]
        # No setting meets the delay goal on these files: the quickest ones compete.
        allowed = allowed or [s for s in self.f1 if delay(s) == min(map(delay, self.f1))]
        return max(allowed, key=lambda s: float(np.mean([self.f1[s][f] for f in files])))

    def apply(self, rule: Rule, name: str) -> tuple[float, float]:
        if rule[0] == "all":
            return rule[1]  # type: ignore[return-value]
        _, feature, threshold, low, high = rule
        return low if self.features[name][feature] <= threshold else high  # type: ignore[return-value,operator]

    def score(self, rule: Rule, files: list[str]) -> float:
        return float(np.mean([self.f1[self.apply(rule, f)][f] for f in files]))

    def fit(self, files: list[str], feature: str | None) -> Rule:
        """The best rule on ``files``: one setting (``feature`` None) or a split on ``feature``
        (kept only when it beats the one setting there)."""
        rule: Rule = ("all", self.best(files))
        top = self.score(rule, files)
        if feature is None:
            return rule
        values = sorted(self.features[f][feature] for f in files)
        for lo, hi in zip(
            values[MIN_SIDE - 1 : -MIN_SIDE],
            values[MIN_SIDE : len(values) - MIN_SIDE + 1],
            strict=True,
        ):
            t = (lo + hi) / 2
            low = [f for f in files if self.features[f][feature] <= t]
            high = [f for f in files if self.features[f][feature] > t]
            if min(len(low), len(high)) < MIN_SIDE:  # tied values
                continue
            candidate: Rule = ("split", feature, t, self.best(low), self.best(high))
            if (sc := self.score(candidate, files)) > top + 1e-12:
                rule, top = candidate, sc
        return rule

    def cv(self, files: list[str], feature: str | None) -> float:
        """Leave-one-file-out F1 of :meth:`fit` with ``feature``."""
        return float(
            np.mean(
                [
                    self.f1[self.apply(self.fit([f for f in files if f != h], feature), h)][h]
                    for h in files
                ]
            )
        )

    def choose(self, files: list[str]) -> tuple[str | None, Rule]:
        """Complexity by leave-one-file-out CV on ``files`` (ties: one setting), then refit."""
        options = [None, *sorted(next(iter(self.features.values())))]
        feature = max(options, key=lambda o: self.cv(files, o) + (1e-9 if o is None else 0.0))
        return feature, self.fit(files, feature)


def _rule_json(rule: Rule) -> dict[str, object]:
    if rule[0] == "all":
        return {"setting": rule[1]}
    return {"feature": rule[1], "threshold": rule[2], "at_or_below": rule[3], "above": rule[4]}


def per_trace(split: dict[str, str]) -> dict[str, object]:
    """Per-trace choice of the setting from the trace's own features (see the module doc)."""
    names = sorted(split)
    features = {n: trace_features(load(DATA / n)[0]) for n in names}
    rows = _grid_rows(names, {"offline": PER_TRACE_OFFLINE, "online": PER_TRACE_ONLINE})
    tune = [n for n in names if split[n] == "tune"]
    test = [n for n in names if split[n] == "test"]
    out: dict[str, object] = {"features": features}
    for kind in ("offline", "online"):
        pt = _PerTrace(kind, rows, features)
        nested = [pt.f1[pt.apply(pt.choose([f for f in tune if f != h])[1], h)][h] for h in tune]
        feature, rule = pt.choose(tune)
        chosen = [pt.apply(rule, f) for f in test]
        per_feature = {}
        for name in [None, *sorted(next(iter(features.values())))]:
            r = pt.fit(tune, name)
            per_feature[name or "none (one setting)"] = {
                "tune_cv_f1": pt.cv(tune, name),
                "tune_fit_f1": pt.score(r, tune),
                "test_f1": pt.score(r, test),
                "rule": _rule_json(r),
            }
        summary: dict[str, object] = {
            "settings": PER_TRACE_OFFLINE if kind == "offline" else PER_TRACE_ONLINE,
            "tune_nested_cv_f1": float(np.mean(nested)),
            "chosen_feature": feature,
            "rule": _rule_json(rule),
            "tune_f1": pt.score(rule, tune),
            "test_f1": pt.score(rule, test),
            "per_feature": per_feature,
        }
        if kind == "online":
            d = [x for f, s in zip(test, chosen, strict=True) for x in pt.delays[s][f]]
            summary["test_median_delay"] = float(np.median(d)) if d else None
        out[kind] = summary
    return out


RULE_BANDWIDTHS = (8.0, 12.0)
CROPS_PENALTIES = (1.0, 64.0)
Hull = dict[int, tuple[float, list[int]]]


def _crops_job(job: tuple[str, float]) -> tuple[str, float, Hull]:
    name, bandwidth = job
    x = unit_scaled(finite_samples(load(DATA / name)[0])[0])
    with np.errstate(over="ignore", under="ignore"):
        return name, bandwidth, crops(x, bandwidth, *CROPS_PENALTIES)


def _at_penalty(hull: Hull, penalty: float) -> list[int]:
    return hull[min(hull, key=lambda k: hull[k][0] + penalty * k)][1]


def _elbow(hull: Hull, low: float, high: float) -> list[int]:
    most, fewest = _at_penalty(hull, low), _at_penalty(hull, high)
    ks = [k for k in sorted(hull) if len(fewest) <= k <= len(most)]
    if len(ks) < 3:
        return fewest
    # Both axes scaled to [0, 1]; the chord runs from the most to the fewest changes.
    u = (np.array(ks, dtype=float) - ks[0]) / (ks[-1] - ks[0])
    q = np.array([hull[k][0] for k in ks])
    v = (q - q.min()) / max(float(q.max() - q.min()), 1e-12)
    return hull[ks[int(np.argmax(v[0] + (v[-1] - v[0]) * u - v))]][1]


def _plateau(hull: Hull, low: float, high: float) -> list[int]:
    ks = sorted(hull)
    longest, chosen = -1.0, ks[0]
    for k in ks:
        q = hull[k][0]
        # k changes are optimal for penalties between these (the hull's neighbouring slopes).
        lo = max([(q - hull[j][0]) / (j - k) for j in ks if j > k] + [low])
        hi = min([(hull[j][0] - q) / (k - j) for j in ks if j < k] + [high])
        if hi > lo and np.log(hi / lo) > longest:
            longest, chosen = float(np.log(hi / lo)), k
    return hull[chosen][1]


def _effect(x: np.ndarray, cps: list[int], k: float) -> list[int]:
    cps = list(cps)
    while cps:
        b = [0, *cps, x.size]
        size = [
            abs(float(np.median(x[m:c]) - np.median(x[a:m]))) / max(noise_scale(x[a:c]), 1e-12)
            for a, m, c in zip(b, b[1:], b[2:], strict=False)
        ]
        j = int(np.argmin(size))
        if size[j] >= k:
            break
        del cps[j]
    return cps


RULES: dict[str, list[tuple[float, ...]]] = {
    "fixed": [(b, p) for b in RULE_BANDWIDTHS for p in (2, 3, 4, 5, 6, 8, 10, 12, 16)],
    "log_n": [(b, a) for b in RULE_BANDWIDTHS for a in (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.3)],
    "elbow": [(b, lo, hi) for b in RULE_BANDWIDTHS for lo in (1, 2, 3) for hi in (8, 16, 32, 64)],
    "plateau": [
        (b, lo, hi) for b in RULE_BANDWIDTHS for lo in (1, 2, 3, 4) for hi in (8, 16, 32, 64)
    ],
    "effect": [(b, p, k) for b in RULE_BANDWIDTHS for p in (2, 3, 4, 6) for k in (0.5, 1, 2, 3, 4)],
}


def penalty_rules(split: dict[str, str]) -> dict[str, object]:
    """Per-trace penalties chosen without labels (see the module doc)."""
    names = sorted(split)
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        hulls = {
            (n, b): h
            for n, b, h in pool.map(_crops_job, [(n, b) for b in RULE_BANDWIDTHS for n in names])
        }

    def f1(rule: str, constants: tuple[float, ...], name: str) -> float:
        clean, labels = load(DATA / name)
        x, idx = finite_samples(clean)
        x = unit_scaled(x)
        hull = hulls[(name, constants[0])]
        if rule == "fixed":
            cps = _at_penalty(hull, constants[1])
        elif rule == "log_n":
            cps = _at_penalty(hull, constants[1] * np.log(x.size))
        elif rule == "elbow":
            cps = _elbow(hull, constants[1], constants[2])
        elif rule == "plateau":
            cps = _plateau(hull, constants[1], constants[2])
        else:
            cps = _effect(x, _at_penalty(hull, constants[1]), constants[2])
        found = merge_small(x, cps, DEFAULT_MIN_CHANGE)
        return prf([int(idx[c]) for c in found], labels)[2]

    score = {(r, c, n): f1(r, c, n) for r, grid in RULES.items() for c in grid for n in names}
    tune = [n for n in names if split[n] == "tune"]
    test = [n for n in names if split[n] == "test"]

    def mean(option: tuple[str, tuple[float, ...]], files: list[str]) -> float:
        return float(np.mean([score[(*option, f)] for f in files]))

    def fit(options: list[tuple[str, tuple[float, ...]]], files: list[str]) -> tuple:
        return max(options, key=lambda o: mean(o, files))

    def cv(options: list[tuple[str, tuple[float, ...]]]) -> float:
        held = [score[(*fit(options, [f for f in tune if f != h]), h)] for h in tune]
        return float(np.mean(held))

    out: dict[str, object] = {"crops_penalties": CROPS_PENALTIES, "rules": {}}
    for rule, grid in RULES.items():
        options = [(rule, c) for c in grid]
        chosen = fit(options, tune)
        hindsight = fit(options, test)
        out["rules"][rule] = {  # type: ignore[index]
            "tune_cv_f1": cv(options),
            "constants": chosen[1],
            "tune_f1": mean(chosen, tune),
            "test_f1": mean(chosen, test),
            "hindsight_on_test": {"constants": hindsight[1], "test_f1": mean(hindsight, test)},
        }
    every = [(r, c) for r, grid in RULES.items() for c in grid]
    chosen = fit(every, tune)
    out["chosen_among_rules"] = {
        "tune_cv_f1": cv(every),
        "rule": chosen[0],
        "constants": chosen[1],
        "tune_f1": mean(chosen, tune),
        "test_f1": mean(chosen, test),
    }
    return out


SHORT_GAP = 25  # samples: a label or detection this close to another is part of an excursion
# --excursions: the online detector waiting for a 4th sample of the new level, hindsight only.
CONFIRM4_GRID = [(b, p) for b in (8.0, 12.0) for p in (5.0, 6.0, 7.0)]


def _short(points: Sequence[int]) -> set[int]:
    """The points within SHORT_GAP samples of another one (an excursion's start and end)."""
    pts = sorted(set(points))
    return {
        x
        for i, x in enumerate(pts)
        if (i > 0 and x - pts[i - 1] <= SHORT_GAP)
        or (i + 1 < len(pts) and pts[i + 1] - x <= SHORT_GAP)
    }


def _excursion_job(name: str) -> dict[str, object]:
    clean, labels = load(DATA / name)
    found = {
        "offline": [cp.index for cp in segment(clean)],
        "online": [a.index for a in detect_online(clean)],
    }
    out: dict[str, object] = {"labels": len(labels), "labels_short": len(_short(labels))}
    for kind, det in found.items():
        matched = {d for d, _ in match(det, labels)}
        short = _short(det)
        out[kind] = {
            "tp_short": len(matched & short),
            "fp_short": len(short - matched),
            "tp_other": len(matched - short),
            "fp_other": len(set(det) - matched - short),
        }
    return out


def _confirm4_job(job: tuple[str, float, float]) -> tuple[str, float, float, float, list[int]]:
    name, bandwidth, penalty = job
    clean, labels = load(DATA / name)
    f1, delays = _online_f1(clean, labels, penalty=penalty, bandwidth=bandwidth, confirm=4)
    return name, bandwidth, penalty, f1, delays


def excursions(split: dict[str, str]) -> dict[str, object]:
    """How each half's labels treat short excursions, and what that does to the detectors.

    A label (or detection) is "short" when another lies within SHORT_GAP samples: the start and
    end of an excursion. Per half: the share of labels that are short, and the detectors'
    (defaults) true and false positives among short and other detections. Then, with hindsight,
    the online detector confirming on the 4th sample instead of the 3rd, per half.
    """
    names = list(split)
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        per_file = dict(zip(names, pool.map(_excursion_job, names), strict=True))
        grid = list(pool.map(_confirm4_job, [(n, b, p) for b, p in CONFIRM4_GRID for n in names]))
    out: dict[str, object] = {"short_gap_samples": SHORT_GAP}
    for part in ("tune", "test"):
        files = [n for n in names if split[n] == part]
        labels = sum(int(per_file[n]["labels"]) for n in files)  # type: ignore[call-overload]
        short = sum(int(per_file[n]["labels_short"]) for n in files)  # type: ignore[call-overload]
        summary: dict[str, object] = {"labels": labels, "labels_short": short}
        for kind in ("offline", "online"):
            tally = {
                k: sum(int(per_file[n][kind][k]) for n in files)  # type: ignore[index]
                for k in ("tp_short", "fp_short", "tp_other", "fp_other")
            }
            for sort in ("short", "other"):
                tp, fp = tally[f"tp_{sort}"], tally[f"fp_{sort}"]
                tally[f"precision_{sort}"] = round(tp / (tp + fp), 3) if tp + fp else None  # type: ignore[assignment]
            summary[kind] = tally
        summary["online_confirm4_with_hindsight"] = [
            {
                "bandwidth": b,
                "penalty": p,
                "f1": round(
                    float(np.mean([r[3] for r in grid if r[0] in files and r[1:3] == (b, p)])), 3
                ),
                "median_delay": float(
                    np.median([d for r in grid if r[0] in files and r[1:3] == (b, p) for d in r[4]])
                ),
            }
            for b, p in CONFIRM4_GRID
        ]
        out[part] = summary
    return out


ONLINE_WINDOWS = (100, 200, 300, 400)  # --online-window: samples the online detector may look back


def _window_job(job: tuple[str, int]) -> tuple[str, int, float, list[int]]:
    name, window = job
    clean, labels = load(DATA / name)
    f1, delays = _online_f1(clean, labels, window=window)
    return name, window, f1, delays


def online_window(split: dict[str, str]) -> dict[str, object]:
    """The online detector's look-back (its other settings the defaults), per half.

    Within ``window`` samples the largest kernel gain a step of k noise scales can reach is
    2·(window/4)·(1 − exp(−k²/(2·bandwidth²))) (half the window each side), so with bandwidth 12
    and penalty 5 a window of 100 can never alert on a step under ~5.5 noise scales, 400 on one
    under ~2.7; the offline segmentation has no such bound.
    """
    names = list(split)
    with ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        rows = list(pool.map(_window_job, [(n, w) for w in ONLINE_WINDOWS for n in names]))
    out: dict[str, object] = {}
    for part in ("tune", "test"):
        per = []
        for w in ONLINE_WINDOWS:
            sel = [r for r in rows if r[1] == w and split[r[0]] == part]
            d = [x for r in sel for x in r[3]]
            per.append(
                {
                    "window": w,
                    "f1": round(float(np.mean([r[2] for r in sel])), 4),
                    "median_delay": float(np.median(d)) if d else None,
                    "p90_delay": float(np.percentile(d, 90)) if d else None,
                }
            )
        out[part] = per
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ceiling", action="store_true", help="add the hindsight ceilings")
    parser.add_argument(
        "--per-trace", action="store_true", help="add the per-trace choice of the setting"
    )
    parser.add_argument(
        "--penalty-rules", action="store_true", help="add per-trace penalties chosen without labels"
    )
    parser.add_argument(
        "--excursions",
        action="store_true",
        help="add how each half labels short excursions, and the online detector on a 4th sample",
    )
    parser.add_argument(
        "--online-window",
        action="store_true",
        help="add the online detector's look-back (100-400 samples) per half",
    )
    args = parser.parse_args()
    import ruptures as rpt

    def rbf(y: np.ndarray) -> list[int]:
        x = y[np.isfinite(y)]
        idx = np.flatnonzero(np.isfinite(y))
        cps = rpt.KernelCPD(kernel="rbf", min_size=2).fit(x).predict(pen=10)[:-1]
        return [int(idx[c]) for c in cps]

    def l2(y: np.ndarray) -> list[int]:
        pen = 3 * np.log(y.size) * float(np.var(y))
        return list(rpt.KernelCPD(kernel="linear", min_size=2).fit(y).predict(pen=pen)[:-1])

    started = time.monotonic()
    files = sorted(DATA.glob("*.csv"))
    split = splits([p.name for p in files])
    rows: list[dict[str, object]] = []
    delays: dict[str, list[int]] = {"tune": [], "test": []}
    timing: dict[str, float] = {}

    def timed(name: str, fn: Callable[[np.ndarray], T], y: np.ndarray) -> T:
        t0 = time.monotonic()
        out = fn(y)
        timing[name] = timing.get(name, 0.0) + time.monotonic() - t0
        return out

    for path in files:
        raw = read_series(path, check_order=False).y
        clean, labels = load(path)
        part = split[path.name]
        alerts = timed("online", detect_online, clean)

        def band(y: np.ndarray) -> list[int]:
            det = OnlineDetector()
            return [cp.index for v in y if (cp := det.update(float(v))) is not None]

        det = {
            "offline": [cp.index for cp in timed("offline", segment, clean)],
            "online": [a.index for a in alerts],
            "online_at_alert": [
                (a.index if a.alert_index is None else a.alert_index) for a in alerts
            ],
            "online_band": timed("online_band", band, clean),
            "pelt_rbf_pen10": timed("pelt_rbf_pen10", rbf, raw),
            "pelt_rbf_pen10_cleaned": timed("pelt_rbf_pen10_cleaned", rbf, clean),
            "pelt_l2_bic": timed("pelt_l2_bic", l2, raw),
            "naive_cusum": timed("naive_cusum", cusum, raw),
        }
        # Delay: from the label to the alert, over labels matched by the reported change index.
        alert_at = {a.index: (a.index if a.alert_index is None else a.alert_index) for a in alerts}
        delays[part] += [alert_at[d] - lab for d, lab in match(list(alert_at), labels)]
        row: dict[str, object] = {
            "file": path.name,
            "split": part,
            "n": int(raw.size),
            "labels": len(labels),
        }
        for name, cps in det.items():
            p, r, f = prf(cps, labels)
            row[name] = {"precision": p, "recall": r, "f1": f, "detections": len(set(cps))}
        rows.append(row)

    methods = [k for k in rows[0] if isinstance(rows[0][k], dict)]
    result: dict[str, object] = {"benchmark": "changes", "margin_samples": MARGIN}
    for part in ("all", "tune", "test"):
        sel = [r for r in rows if part == "all" or r["split"] == part]
        per: dict[str, object] = {"files": len(sel)}
        for m in methods:
            per[m] = {
                k: float(np.mean([r[m][k] for r in sel]))  # type: ignore[index]
                for k in ("precision", "recall", "f1")
            }
        d = delays["tune"] + delays["test"] if part == "all" else delays[part]
        per["online_median_delay_samples"] = float(np.median(d)) if d else None
        per["online_delays_matched"] = len(d)
        f1 = {m: per[m]["f1"] for m in methods}  # type: ignore[index]
        per["ratio_f1_to_pelt_rbf"] = {m: f1[m] / f1["pelt_rbf_pen10"] for m in methods}
        per["goals"] = {
            "offline_f1_ge_0.70": f1["offline"] >= 0.70,
            "online_f1_ge_0.65": f1["online"] >= 0.65,
            "online_median_delay_le_3": per["online_median_delay_samples"] is not None
            and per["online_median_delay_samples"] <= 3,
        }
        result[part] = per
    result["per_file"] = [
        {"file": r["file"], "split": r["split"], **{m: round(r[m]["f1"], 3) for m in methods}}  # type: ignore[index]
        for r in rows
    ]
    parts = {
        "ceiling_with_hindsight": (args.ceiling, ceiling),
        "per_trace": (args.per_trace, per_trace),
        "penalty_rules": (args.penalty_rules, penalty_rules),
        "excursions": (args.excursions, excursions),
        "online_window": (args.online_window, online_window),
    }
    for key, (wanted, part_fn) in parts.items():
        if wanted:
            t0 = time.monotonic()
            result[key] = part_fn(split)
            timing[key.removesuffix("_with_hindsight")] = time.monotonic() - t0
    result["seconds"] = {k: round(v, 1) for k, v in timing.items()}
    result["total_seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
