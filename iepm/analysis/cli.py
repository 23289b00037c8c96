"""``iepm forecast``, ``iepm changes``, ``iepm diurnal``: the analyses on any series file.

The main CLI mounts them with :func:`register`. Errors print one line to stderr and exit 2.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from iepm.analysis.changes import detect_online, segment
from iepm.analysis.diurnal import fit_diurnal
from iepm.analysis.forecast import METHODS, walk_forward
from iepm.analysis.series import AnalysisError, Series, iso, read_series
from iepm.errors import IepmError

CsvOpt = Annotated[
    Path,
    typer.Option(
        "--csv", help="Series file: rows 'timestamp,value' (header optional).", show_default=False
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

T = TypeVar("T")


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _guard(work: Callable[[], T]) -> T:
    """Run ``work``; a bad file or option becomes a one-line message and exit code 2."""
    try:
        return work()
    except IepmError as exc:
        raise _fail(str(exc)) from None
    except (ValueError, OverflowError, MemoryError) as exc:
        raise _fail(f"cannot analyse the series: {exc}") from None


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _fmt(v: float) -> str:
    return f"{v:.6g}" if math.isfinite(v) else "nan"


def _tsv(header: list[str], rows: list[list[Any]]) -> None:
    lines = ["\t".join(header)]
    lines += ["\t".join(_fmt(v) if isinstance(v, float) else str(v) for v in r) for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")


def forecast_command(
    csv: CsvOpt,
    method: Annotated[
        str, typer.Option("--method", help=f"One of: {', '.join(METHODS)} (auto: ensemble).")
    ] = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Walk-forward one-step-ahead forecasts with 80% prediction intervals."""

    def work() -> list[Any]:
        if method not in METHODS:
            raise AnalysisError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        s = read_series(csv)
        return walk_forward(s.t, s.y, method)

    fcs = _guard(work)
    if as_json:
        rows = [
            {
                "timestamp": iso(f.t),
                "index": f.index,
                "observed": f.observed,
                "forecast": _num(f.forecast),
                "lower": _num(f.lower),
                "upper": _num(f.upper),
                "method": f.method,
            }
            for f in fcs
        ]
        typer.echo(json.dumps(rows, indent=1))
        return
    _tsv(
        ["timestamp", "observed", "forecast", "lower", "upper", "method"],
        [[iso(f.t), f.observed, f.forecast, f.lower, f.upper, f.method] for f in fcs],
    )


def changes_command(
    csv: CsvOpt,
    as_json: JsonOpt = False,
    online: Annotated[
        bool, typer.Option("--online", help="The alerting detector's decisions, sample by sample.")
    ] = False,
) -> None:
    """Step changes: offline segmentation, or (--online) the alerts as they would be raised."""

    def work() -> tuple[Series, list[Any]]:
        s = read_series(csv)
        return s, (detect_online(s.y) if online else segment(s.y))

    s, cps = _guard(work)
    rows = []
    for cp in cps:
        row: dict[str, Any] = {
            "timestamp": s.timestamp(cp.index),
            "index": cp.index,
            "before": cp.before,
            "after": cp.after,
            "change_percent": _num(cp.change_percent),
            "direction": cp.direction,
        }
        if online:
            assert cp.alert_index is not None
            row["alert_index"] = cp.alert_index
            row["alert_timestamp"] = s.timestamp(cp.alert_index)
        rows.append(row)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    header = ["timestamp", "index", "before", "after", "change_percent", "direction"]
    if online:
        header += ["alert_index", "alert_timestamp"]
    _tsv(header, [[r[h] if r[h] is not None else math.nan for h in header] for r in rows])


def diurnal_command(
    csv: CsvOpt,
    as_json: JsonOpt = False,
    utc_offset: Annotated[
        float, typer.Option("--utc-offset", help="Hours to add to UTC for the time of day.")
    ] = 0.0,
    site_b: Annotated[
        float, typer.Option("--site-b", help="Phase b kept for this site (simple estimate).")
    ] = math.pi / 2,
) -> None:
    """Fit |a|·sin(x + b) + c over the time of day, weekdays and weekends apart."""

    def work() -> dict[str, Any]:
        s = read_series(csv)
        return fit_diurnal(s.t, s.y, utc_offset_hours=utc_offset, site_b=site_b)

    fits = _guard(work)
    if as_json:
        typer.echo(json.dumps({k: v.as_dict() for k, v in fits.items()}, indent=1))
        return
    keys = ["n", "a", "b", "c", "delta_b", "diurnal", "peak_hour", "rmse", "simple_rmse"]
    _tsv(["days", *keys], [[k, *(getattr(v, key) for key in keys)] for k, v in fits.items()])


def register(app: typer.Typer) -> None:
    """Add ``forecast``, ``changes`` and ``diurnal`` to ``app``."""
    app.command("forecast")(forecast_command)
    app.command("changes")(changes_command)
    app.command("diurnal")(diurnal_command)
