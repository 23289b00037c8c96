"""Start-up cost of the `iepm` command line, against the libraries it cannot do without.

Runs `iepm --help` (every command line pays this before doing anything) and, as the baseline
in the same run, a bare interpreter importing typer, rich and pydantic (the CLI framework and
the config models). Median wall time of ``--runs`` runs each, after one warm-up run.

Usage: .venv/bin/python benchmarks/cli_startup.py [--runs 15]  → one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def wall(argv: list[str], runs: int) -> float:
    def once() -> float:
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, check=True, timeout=120)
        return time.perf_counter() - t0

    once()  # warm the page cache and the bytecode
    return statistics.median(once() for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    help_s = wall([sys.executable, "-m", "iepm.cli", "--help"], args.runs)
    base_s = wall([sys.executable, "-c", "import typer, rich.console, pydantic"], args.runs)
    print(
        json.dumps(
            {
                "benchmark": "cli_startup",
                "runs": args.runs,
                "iepm_help_s": round(help_s, 3),
                "baseline_framework_import_s": round(base_s, 3),
                "ratio": round(help_s / base_s, 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
