"""The plan of a windows × streams sweep and its limits, checked before anything is measured.

Light (no archive): the config validates ``[monitor] retune_*`` with it, the sweep
(:mod:`iepm.tuning.sweep`) runs it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from iepm.errors import ConfigError
from iepm.probes import iperf3
from iepm.tuning.measure import IPERF3_OVERHEAD_S

DEFAULT_WINDOWS: list[str | None] = [
    "8K",
    "16K",
    "32K",
    "64K",
    "128K",
    "256K",
    "512K",
    "1M",
    "2M",
    "4M",
]
DEFAULT_STREAMS = [1, 2, 4, 8, 12, 16, 24, 32]
# Consecutive failed transfers after which the target is taken for dead.
DEAD_AFTER_FAILURES = 2


class StudyRefused(ConfigError):
    """A study that would exceed its limits; raised before anything is measured."""


@dataclass(frozen=True)
class SweepLimits:
    max_total_s: float = 3600.0
    max_streams: int = 128
    max_window_bytes: int = iperf3.MAX_WINDOW_BYTES
    max_points: int = 500


@dataclass(frozen=True)
class SweepPlan:
    windows: list[str | None] = field(default_factory=lambda: list(DEFAULT_WINDOWS))
    streams: list[int] = field(default_factory=lambda: list(DEFAULT_STREAMS))
    duration_s: int = 10
    pings_during: int = 10
    pings_after: int = 10
    after_interval_s: float = 0.2
    fraction: float = 0.8
    seed: int = 1
    baseline: bool = True

    def grid(self) -> list[tuple[str | None, int]]:
        return [(w, n) for w in self.windows for n in self.streams]

    def n_points(self) -> int:
        return len(self.grid()) + (1 if self.baseline else 0)

    def point_s(self) -> float:
        return self.duration_s + IPERF3_OVERHEAD_S + self.pings_after * self.after_interval_s

    def estimate_s(self) -> float:
        return self.n_points() * self.point_s()


def window_label(window: str | None) -> str:
    return window if window is not None else "default"


def parse_window(text: str) -> str | None:
    """``default`` (the system's autotuned window, no ``-w``) or an iperf3 size like ``64K``."""
    text = text.strip()
    if text.lower() in ("default", "auto", "-"):
        return None
    iperf3.Spec(window=text)  # validates, with iperf3's own message
    return text


def check_plan(plan: SweepPlan, limits: SweepLimits, base: iperf3.Spec | None = None) -> None:
    """Raise StudyRefused, with the reason, when the sweep must not start (``base``: the
    target's other iperf3 settings)."""
    base = base or iperf3.Spec()
    problems = []
    if not plan.windows or not plan.streams:
        problems.append("the sweep needs at least one window and one stream count")
    if base.udp:
        problems.append("the sweep measures TCP; the target's iperf3 settings say udp = true")
    too_many = [n for n in plan.streams if n > limits.max_streams or n < 1]
    if too_many:
        problems.append(
            f"stream counts {too_many} are outside 1…{limits.max_streams} (the stream limit)"
        )
    for window in plan.windows:
        if window is None:
            continue
        try:
            nbytes = iperf3.Spec(window=window).window_bytes or 0
        except ValueError as exc:
            problems.append(f"window {window!r}: {exc}")
            continue
        if nbytes > limits.max_window_bytes:
            problems.append(
                f"window {window} ({nbytes} bytes) exceeds the window limit of "
                f"{limits.max_window_bytes} bytes"
            )
    if not 0 < plan.fraction <= 1:
        problems.append(f"fraction must be in (0, 1], not {plan.fraction}")
    if plan.n_points() > limits.max_points:
        problems.append(f"{plan.n_points()} points exceed the limit of {limits.max_points}")
    estimate = plan.estimate_s()
    if estimate > limits.max_total_s:
        problems.append(
            f"{len(plan.windows)} windows × {len(plan.streams)} stream counts"
            f"{' + 1 baseline' if plan.baseline else ''} × about {plan.point_s():.0f} s each "
            f"≈ {estimate:.0f} s exceeds the limit of {limits.max_total_s:.0f} s total "
            "(use fewer windows or stream counts, a shorter duration, or raise --max-total)"
        )
    if problems:
        raise StudyRefused("sweep refused before it started: " + "; ".join(problems))


def visit_order(plan: SweepPlan) -> list[tuple[str | None, int]]:
    """Every window × streams combination once, shuffled (reproducibly, by ``plan.seed``) and
    arranged so that consecutive points differ in stream count where possible."""
    points = plan.grid()
    rng = random.Random(plan.seed)
    rng.shuffle(points)
    ordered: list[tuple[str | None, int]] = []
    while points:
        pick = next(
            (i for i, p in enumerate(points) if not ordered or p[1] != ordered[-1][1]),
            0,
        )
        ordered.append(points.pop(pick))
    return ordered
