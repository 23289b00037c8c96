"""Small self-contained SVG line charts (no plotting library): the sweep's throughput vs
streams per window (the seeds' Figure 4) and the impact study's RTT CDFs."""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

Series = dict[str, list[tuple[float, float]]]

COLOURS = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
]  # fmt: skip
WIDTH, HEIGHT = 760, 460
LEFT, RIGHT, TOP, BOTTOM = 70, 150, 40, 55


def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def line_chart(
    series: Series,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    step: bool = False,
    markers: bool = True,
) -> str:
    """An SVG document: one line per series, legend on the right."""
    points = [p for pts in series.values() for p in pts]
    xs = [p[0] for p in points] or [0.0, 1.0]
    ys = [p[1] for p in points] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x1 = x0 + 1
    y0, y1 = min(0.0, min(ys)), max(ys) * 1.05 or 1.0
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (y - y0) / (y1 - y0) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>',
    ]
    for t in _ticks(x0, x1):
        out.append(f'<line x1="{sx(t):.1f}" y1="{TOP}" x2="{sx(t):.1f}" y2="{TOP + ph}" '
                   'stroke="#ddd"/>')  # fmt: skip
        out.append(f'<text x="{sx(t):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{t:g}</text>')
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{LEFT}" y1="{sy(t):.1f}" x2="{LEFT + pw}" y2="{sy(t):.1f}" '
                   'stroke="#ddd"/>')  # fmt: skip
        out.append(f'<text x="{LEFT - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 12}" text-anchor="middle">{escape(xlabel)}</text>'
    )
    out.append(
        f'<text transform="translate(16 {TOP + ph / 2}) rotate(-90)" text-anchor="middle">'
        f"{escape(ylabel)}</text>"
    )
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        pts = sorted(pts)
        coords: list[tuple[float, float]] = []
        for j, (x, y) in enumerate(pts):
            if step and j:
                coords.append((sx(x), sy(pts[j - 1][1])))
            coords.append((sx(x), sy(y)))
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        if markers:
            out += [
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>' for x, y in pts
            ]
        ly = TOP + 14 + 18 * i
        out.append(f'<line x1="{LEFT + pw + 12}" y1="{ly - 4}" x2="{LEFT + pw + 32}" '
                   f'y2="{ly - 4}" stroke="{colour}" stroke-width="3"/>')  # fmt: skip
        out.append(f'<text x="{LEFT + pw + 38}" y="{ly}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write(path: Path, svg: str) -> Path:
    if path.suffix.lower() != ".svg":
        raise ValueError(f"{path}: plots are written as SVG; give a file name ending in .svg")
    path.write_text(svg, encoding="utf-8")
    return path


def sweep_chart(points: list[dict[str, object]], target: str) -> str:
    """Throughput vs streams, one line per window."""
    series: Series = {}
    for p in points:
        if p.get("baseline") or not p.get("throughput_bps"):
            continue
        label = f"window {p['window_label']}"
        tp = float(p["throughput_bps"])  # type: ignore[arg-type]
        series.setdefault(label, []).append((float(p["streams"]), tp / 1e6))  # type: ignore[arg-type]
    return line_chart(
        series,
        title=f"iepm tune {target}: throughput vs parallel streams",
        xlabel="parallel streams",
        ylabel="throughput, Mbit/s",
    )


def cdf_chart(distributions: dict[str, list[float]], target: str) -> str:
    """Empirical CDFs of ping RTT, one line per load level."""
    series: Series = {}
    for name, values in distributions.items():
        ordered = sorted(values)
        n = len(ordered)
        series[name] = [(v, (i + 1) / n) for i, v in enumerate(ordered)]
    return line_chart(
        series,
        title=f"iepm study impact {target}: ping RTT with and without load",
        xlabel="RTT, ms",
        ylabel="fraction of pings ≤ RTT",
        step=True,
        markers=False,
    )
