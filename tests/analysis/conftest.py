"""Shared paths and helpers for the analysis tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _shared_data(repo: Path) -> Path:
    """``../shared/data`` beside the checkout, or beside an ancestor (a worktree nested deeper)."""
    for base in repo.parents:
        if (base / "shared" / "data").is_dir():
            return base / "shared" / "data"
    return repo.parent / "shared" / "data"


DATA = _shared_data(REPO)
NDT = DATA / "ndt"
STEP_FILE = NDT / "e45f01963c21_gig03_d_throughput.txt"

T0 = 1_700_000_000.0  # 2023-11-14, a Tuesday


def hourly(n: int, start: float = T0, step: float = 3600.0) -> np.ndarray:
    return start + step * np.arange(n, dtype=np.float64)


@pytest.fixture
def step_file() -> Path:
    if not STEP_FILE.exists():
        pytest.skip(f"real data not found: {STEP_FILE}")
    return STEP_FILE
