"""Adaptive early stop vs the full 10 s iperf3 test, on several lab paths (needs root).

Paths (one lab, a monitor and one target per path): loss 0–1%, RTT 10–200 ms,
rate 10–500 Mbit/s. Each run is one early-stopped test (the real thing: iperf3 stopped by
SIGINT once the detector is satisfied) followed by one full 10 s test on the same path, during
which the detector runs in shadow mode (it records when it would have stopped, and its estimate,
on that very transfer).

Figures, over all runs:

* ``within_10pct_share_shadow``: the estimate is within 10% of the full test it watched (the
  detector's own accuracy, no run-to-run variation) — the goal is ≥ 0.9;
* ``traffic_share_shadow_mean``: bytes acknowledged when it would have stopped ÷ the full test's
  bytes — the goal is ≤ 0.5;
* ``within_10pct_share_live`` / ``traffic_share_live_mean``: the stopped test vs the full test
  run just after it (includes the paths' run-to-run variation);
* baseline: ``within_10pct_share_full_vs_full``: consecutive full tests of the same path within
  10% of each other — how often two full tests agree at all; ``ratio`` = live share ÷ baseline.

    .venv/bin/python benchmarks/early_stop.py [--runs-per-path 5] [--json-out FILE]
        [--path-set report|tune] [--samples-out FILE] [--mode study|routine]

``--mode routine`` measures the probe's routine mode, as the scheduler runs it: per run, one
``iperf3.run(Spec(early_stop=True))`` (a one-shot server leased from the target's agent, raw
log, stored as a successful early-stopped result) and one ordinary full ``iperf3.run(Spec())``,
on the same path. Figures per path and pooled: ``within_10pct_share`` (the early result's
``throughput_bps`` within 10% of the full run's), ``traffic_share_mean`` (early ``bytes_sent``
÷ full ``bytes_sent``, both bytes written by iperf3), ``early_stopped_share``, and
``reextracted_equal`` (the result parsed again from its raw-log record is the stored one, and
``iepm extract`` of the whole raw log into the archive updates every stored result to the same
throughput and early-stop flag); pooled also ``traffic_share_mean_over_paths`` (the mean of the
paths' means); baseline as above (full vs the previous full), ``ratio`` = within share ÷
baseline. This is the study tests/lab/test_lab_early_stop.py asserted over 3 paths × 4 pairs
(``--mode routine --path-set suite --runs-per-path 4``: goals within share ≥ 0.9, early-stopped
share ≥ 0.9, mean over paths of the bytes share ≤ 0.5); the test keeps one path.

``--path-set suite`` is the test's three paths (seed 23). ``--path-set tune`` uses other paths
and another lab seed: the detector's thresholds were chosen on that set (replaying its
``--samples-out`` series offline), and the figures are reported on the default ``report`` set,
which played no part in choosing them.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.extract import extract
from iepm.lab import Lab
from iepm.lab.testing import unique_lab_name
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext, result_from_raw
from iepm.rawlog import RawLog
from iepm.store import Archive
from iepm.tuning.early_stop import EarlyStopConfig, adaptive_run
from testkit.agent import running_agent
from testkit.copylab import agent_context

# (name, one-way delay ms, rate Mbit/s, loss % per direction)
REPORT_PATHS = [
    ("p10ms500m", 5, 500, 0.0),
    ("p40ms100m", 20, 100, 0.0),
    ("p200ms50m", 100, 50, 0.0),
    ("p20ms10m", 10, 10, 0.1),
    ("p100ms100m", 50, 100, 0.1),
    ("p40ms20m", 20, 20, 1.0),
]
# Thresholds are tuned on these, never on REPORT_PATHS.
TUNE_PATHS = [
    ("t16ms200m", 8, 200, 0.0),
    ("t60ms50m", 30, 50, 0.0),
    ("t150ms80m", 75, 80, 0.0),
    ("t250ms30m", 125, 30, 0.0),
    ("t120ms40m", 60, 40, 0.1),
    ("t30ms15m", 15, 15, 0.5),
]
# tests/lab/test_lab_early_stop.py's paths (it keeps "mid").
SUITE_PATHS = [("near", 5, 100, 0.0), ("mid", 20, 50, 0.0), ("far", 60, 30, 0.0)]
PATH_SETS = {"report": (REPORT_PATHS, 17), "tune": (TUNE_PATHS, 29), "suite": (SUITE_PATHS, 23)}
AGENT_PORT = 8720


def topology(paths: list[tuple[str, int, int, float]], seed: int) -> dict[str, Any]:
    return {
        "lab": {"name": "x", "seed": seed},
        "hosts": [{"name": "mon", "role": "monitor"}]
        + [{"name": name, "role": "target"} for name, *_ in paths],
        "links": [
            {
                "name": f"l_{name}",
                "a": "mon",
                "b": name,
                "delay_ms": delay,
                "rate_mbit": rate,
                "loss_percent": loss,
                "queue_ms": 50,
            }
            for name, delay, rate, loss in paths
        ],
    }


def within(a: float | None, b: float | None, tol: float = 0.1) -> bool:
    return bool(a and b and abs(a - b) <= tol * b)


def routine(
    lab: Lab, paths: list[tuple[str, int, int, float]], runs_per_path: int
) -> dict[str, Any]:
    """The probe's early_stop mode against ordinary full runs, path by path, through each
    target's agent; every result stored, then the raw log extracted into the same archive."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="iepm-bench-early-") as tmp:
        log = RawLog(Path(tmp) / "raw")
        url = f"sqlite:///{Path(tmp) / 'archive.db'}"
        early_results = []
        with Archive.open(url) as archive:
            for name, delay, rate, loss in paths:
                with running_agent(
                    Path(tmp) / f"agent-{name}",
                    address=lab.address(name),
                    port=AGENT_PORT,
                    netns=lab.netns(name),
                ) as agent:
                    ctx = agent_context(
                        agent, name, lab.address(name), lab.netns("mon"), raw_log=log
                    )
                    previous_full: float | None = None
                    for i in range(runs_per_path):
                        early = asyncio.run(iperf3.run(iperf3.Spec(early_stop=True), ctx))
                        full = asyncio.run(iperf3.run(iperf3.Spec(), ctx))
                        archive.add(early)
                        archive.add(full)
                        early_results.append(early)
                        logged = next(r for r in log.runs() if r.raw.token == early.raw_token)
                        again = result_from_raw(
                            iperf3, iperf3.Spec.model_validate(logged.params), ctx, logged.raw, None
                        )
                        d, f = early.data, full.data
                        row = {
                            "path": name,
                            "rtt_ms": 2 * delay,
                            "rate_mbit": rate,
                            "loss_percent": loss,
                            "run": i,
                            "early_ok": early.succeeded,
                            "early_stopped": bool(d.get("early_stopped")),
                            "early_bps": d.get("throughput_bps") if early.succeeded else None,
                            "early_measured_bps": d.get("measured_throughput_bps"),
                            "stopped_after_s": d.get("stopped_after_s"),
                            "early_bytes_sent": d.get("bytes_sent"),
                            "bytes_saved": d.get("bytes_saved"),
                            "full_bps": f.get("throughput_bps") if full.succeeded else None,
                            "full_bytes_sent": f.get("bytes_sent") if full.succeeded else None,
                            "previous_full_bps": previous_full,
                            "reextracted_equal": again.data == early.data
                            and again.outcome == early.outcome,
                            "early_error": early.error,
                        }
                        rows.append(row)
                        previous_full = row["full_bps"]
                        sys.stderr.write(json.dumps(row) + "\n")
        counts = extract(log, url, monitor="mon1")
        with Archive.open(url) as archive:
            stored = {r.id: r for r in archive.results(probe="iperf3")}
        for row, early in zip(rows, early_results, strict=True):
            again = stored.get(early.id)
            row["reextracted_equal"] = bool(
                row["reextracted_equal"]
                and again is not None
                and math.isclose(
                    again.data.get("throughput_bps") or 0.0,
                    early.data.get("throughput_bps") or 0.0,
                    rel_tol=1e-9,
                )
                and again.data.get("early_stopped") == early.data.get("early_stopped")
            )
    figures = summarise_routine(rows, [name for name, *_ in paths])
    figures["extract_counts"] = dict(counts)
    return figures


def summarise_routine(rows: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    def figures(sel: list[dict[str, Any]]) -> dict[str, Any]:
        valid = [r for r in sel if r["full_bps"] and r["full_bytes_sent"]]
        pairs = [r for r in valid if r["previous_full_bps"]]
        within_share = (
            sum(within(r["early_bps"], r["full_bps"]) for r in valid) / len(valid)
            if valid
            else None
        )
        baseline = (
            sum(within(r["full_bps"], r["previous_full_bps"]) for r in pairs) / len(pairs)
            if pairs
            else None
        )
        shares = [
            min(1.0, r["early_bytes_sent"] / r["full_bytes_sent"])
            for r in valid
            if r["early_bytes_sent"]
        ]
        errors = [abs(r["early_bps"] / r["full_bps"] - 1) for r in valid if r["early_bps"]]
        return {
            "runs": len(sel),
            "valid_runs": len(valid),
            "within_10pct_share": within_share,
            "traffic_share_mean": statistics.fmean(shares) if shares else None,
            "traffic_share_max": max(shares) if shares else None,
            "median_abs_error": statistics.median(errors) if errors else None,
            "early_stopped_share": sum(r["early_stopped"] for r in sel) / len(sel) if sel else None,
            "median_stop_s": statistics.median(
                [r["stopped_after_s"] for r in sel if r["stopped_after_s"]] or [0]
            ),
            "median_full_mbps": statistics.median([r["full_bps"] / 1e6 for r in valid] or [0]),
            "reextracted_equal": all(r["reextracted_equal"] for r in sel),
            "baseline_within_10pct_share_full_vs_full": baseline,
            "ratio_within_share_to_baseline": within_share / baseline
            if within_share and baseline
            else None,
        }

    per_path = {name: figures([r for r in rows if r["path"] == name]) for name in names}
    means = [p["traffic_share_mean"] for p in per_path.values() if p["traffic_share_mean"]]
    pooled = figures(rows) | {
        "traffic_share_mean_over_paths": statistics.fmean(means) if means else None
    }
    return {
        "pooled": pooled,
        "per_path": per_path,
        "runs_detail": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-per-path", type=int, default=5)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--path-set", choices=sorted(PATH_SETS), default="report")
    parser.add_argument("--samples-out", type=Path, help="JSON lines: each run's TCP_INFO series")
    parser.add_argument("--mode", choices=["study", "routine"], default="study")
    args = parser.parse_args()
    paths, seed = PATH_SETS[args.path_set]
    cfg = EarlyStopConfig(full_duration_s=10)
    if args.mode == "routine":
        t_start = time.monotonic()
        with Lab.up(topology(paths, seed), name=unique_lab_name("bench")) as lab:
            figures = routine(lab, paths, args.runs_per_path)
        report_routine = {
            "benchmark": "early_stop",
            "mode": "routine",
            "path_set": args.path_set,
            "goals": {
                "within_10pct_share": 0.9,
                "early_stopped_share": 0.9,
                "traffic_share_mean_over_paths": 0.5,
            },
            **figures,
            "wall_s": round(time.monotonic() - t_start, 1),
        }
        text = json.dumps(report_routine, indent=1)
        if args.json_out:
            args.json_out.write_text(text + "\n")
        print(text)
        return
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with Lab.up(topology(paths, seed), name=unique_lab_name("bench")) as lab:
        for name, delay, rate, loss in paths:
            server = lab.popen(name, ["iperf3", "-s", "-B", lab.address(name)])
            time.sleep(0.5)
            ctx = ProbeContext(target=name, address=lab.address(name), netns=lab.netns("mon"))
            previous_full: float | None = None
            for i in range(args.runs_per_path):
                live = asyncio.run(adaptive_run(iperf3.Spec(), ctx, cfg))
                time.sleep(0.5)  # let the server reset after the interrupted test
                full = asyncio.run(adaptive_run(iperf3.Spec(), ctx, cfg, shadow=True))
                time.sleep(0.5)
                full_bps = full.result.data.get("throughput_bps") if full.result.succeeded else None
                full_bytes = full.final_acked_bytes
                shadow = full.decision
                row = {
                    "path": name,
                    "rtt_ms": 2 * delay,
                    "rate_mbit": rate,
                    "loss_percent": loss,
                    "run": i,
                    "full_bps": full_bps,
                    "live_stopped": live.stopped_early,
                    "live_stop_s": live.decision.t_stop_s if live.decision else None,
                    "live_bps": live.reported_bps,
                    "live_bytes": live.final_acked_bytes,
                    "shadow_stop_s": shadow.t_stop_s if shadow else None,
                    "shadow_bps": shadow.estimate_bps if shadow else full_bps,
                    "shadow_bytes": shadow.acked_bytes if shadow else full_bytes,
                    "full_bytes": full_bytes,
                    "previous_full_bps": previous_full,
                }
                runs.append(row)
                if args.samples_out:
                    with args.samples_out.open("a") as out:
                        series = {
                            kind: [asdict(s) for s in run.samples]
                            for kind, run in (("live", live), ("full", full))
                        }
                        out.write(json.dumps({**row, "samples": series}) + "\n")
                previous_full = full_bps
                sys.stderr.write(json.dumps(row) + "\n")
            lab.stop(server)
    valid = [r for r in runs if r["full_bps"] and r["full_bytes"]]

    def share(key: str) -> float | None:
        return sum(within(r[key], r["full_bps"]) for r in valid) / len(valid) if valid else None

    def traffic(key: str) -> float | None:
        vals = [min(1.0, r[key] / r["full_bytes"]) for r in valid if r[key]]
        return statistics.fmean(vals) if vals else None

    pairs = [r for r in valid if r["previous_full_bps"]]
    baseline = (
        sum(within(r["full_bps"], r["previous_full_bps"]) for r in pairs) / len(pairs)
        if pairs
        else None
    )
    live_share = share("live_bps")
    per_path = {
        name: {
            "within_10pct_shadow": sum(
                within(r["shadow_bps"], r["full_bps"]) for r in valid if r["path"] == name
            ),
            "within_10pct_live": sum(
                within(r["live_bps"], r["full_bps"]) for r in valid if r["path"] == name
            ),
            "runs": sum(1 for r in valid if r["path"] == name),
            "median_full_mbps": statistics.median(
                [r["full_bps"] / 1e6 for r in valid if r["path"] == name] or [0]
            ),
            "median_shadow_stop_s": statistics.median(
                [r["shadow_stop_s"] or 10 for r in valid if r["path"] == name] or [0]
            ),
        }
        for name, *_ in paths
    }
    report = {
        "benchmark": "early_stop",
        "path_set": args.path_set,
        "config": asdict(cfg),
        "runs": len(runs),
        "valid_runs": len(valid),
        "within_10pct_share_shadow": share("shadow_bps"),
        "traffic_share_shadow_mean": traffic("shadow_bytes"),
        "within_10pct_share_live": live_share,
        "traffic_share_live_mean": traffic("live_bytes"),
        "baseline_within_10pct_share_full_vs_full": baseline,
        "ratio_live_share_to_baseline": (live_share / baseline)
        if live_share and baseline
        else None,
        "goals": {"within_10pct_share": 0.9, "traffic_share_mean": 0.5},
        "per_path": per_path,
        "wall_s": round(time.monotonic() - t0, 1),
        "runs_detail": runs,
    }
    text = json.dumps(report, indent=1)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
