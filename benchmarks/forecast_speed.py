"""Speed of `iepm forecast` on a long series: the `auto` walk against every method's walk.

A seeded synthetic throughput series (lognormal noise on levels that shift every 20,000 rows,
one row a minute) of ``--rows`` rows. The figure is the wall time of ``walk_forward(…, "auto")``,
what `iepm forecast --csv` runs; the baseline, in the same run, is ``walk_forward_all`` on the
same series: every predictor and band (with today's faster quantiles), which is what any one
method cost before a walk computed only what its method reads. Both give the same `auto`
forecasts (checked here).

Usage: .venv/bin/python benchmarks/forecast_speed.py [--rows 300000]  → one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.analysis.forecast import walk_forward, walk_forward_all


def series(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    t = 1.577e9 + 60.0 * np.arange(rows)
    levels = rng.uniform(50, 150, rows // 20_000 + 1)
    y = levels[np.arange(rows) // 20_000] * rng.lognormal(0, 0.1, rows)
    return t, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    rows = parser.parse_args().rows
    t, y = series(rows)
    t0 = time.perf_counter()
    auto = walk_forward(t, y, "auto")
    auto_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    every = walk_forward_all(t, y)
    every_s = time.perf_counter() - t0
    assert every["auto"] == auto, "the auto walk alone must equal the full walk's"
    print(
        json.dumps(
            {
                "benchmark": "forecast_speed",
                "rows": rows,
                "auto_walk_s": round(auto_s, 2),
                "baseline_every_method_walk_s": round(every_s, 2),
                "ratio": round(auto_s / every_s, 3),
                "rows_per_s": round(rows / auto_s),
            }
        )
    )


if __name__ == "__main__":
    main()
