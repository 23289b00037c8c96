"""``iepm forecast``, ``iepm changes``, ``iepm diurnal``: the analyses on any series file
(an ``iepm export`` table too) or on a path of an archive (``--db URL --target T --metric M``);
``iepm alerts``: the step-change alerts the monitor stored.

The main CLI mounts them with :func:`register`. Errors print one line to stderr and exit with
the code of :class:`iepm.errors.ExitCode` (2 for a bad file or option).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from iepm.analysis.methods import METHODS, START
from iepm.cliglue import guarded, open_archive, parse_moment
from iepm.errors import AnalysisError, UsageError

if TYPE_CHECKING:
    from iepm.analysis.series import Series

# The analyses (numpy, scipy) are imported inside the commands: every `iepm` command line
# imports this module, and most never analyse a series.

CsvOpt = Annotated[
    Path | None,
    typer.Option(
        "--csv",
        help="Series file: rows 'timestamp,value' (header optional), or an `iepm export "
        "--format csv|tsv` table. Or read the archive instead: --db/--config with --target.",
        show_default=False,
    ),
]
DbOpt = Annotated[str | None, typer.Option("--db", help="Archive URL to read the series from.")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="targets.toml (its archive).")
]
TargetOpt = Annotated[
    str | None, typer.Option("--target", help="The path's target (reading the archive).")
]
MetricOpt = Annotated[
    str | None,
    typer.Option(
        "--metric",
        help="Registered metric: key (throughput_bps, rtt_avg_ms) or name "
        "(iperf3.throughput_bps); default: the first the monitor watches that the target has. "
        "With --csv: the export table's column of that key.",
    ),
]
MonitorOpt = Annotated[
    str | None,
    typer.Option(
        "--monitor",
        help="The path's monitor (default: the one with most results; in a table, the only one).",
    ),
]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="Archive: from this UTC date/time (ISO).")
]
UntilOpt = Annotated[
    str | None, typer.Option("--until", help="Archive: before this UTC date/time (ISO).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ColumnOpt = Annotated[
    str | None,
    typer.Option(
        "--column",
        help="Value column of a file with a header, e.g. an `iepm export --format csv` table "
        "(default there: the metric the monitor watches, such as throughput_bps or rtt_avg_ms).",
    ),
]

T = TypeVar("T")


def _guard(work: Callable[[], T]) -> T:
    """Run ``work``; numbers the analyses cannot handle are the series' fault (exit code 2)."""
    try:
        return work()
    except (ValueError, OverflowError, MemoryError) as exc:
        raise AnalysisError(f"cannot analyse the series: {exc}") from None


class Source:
    """Where a command's series comes from: a file (``--csv``) or a path of an archive
    (``--db``/``--config`` with ``--target``, ``--metric``, ``--monitor``, ``--since/--until``)."""

    def __init__(
        self,
        csv: Path | None,
        column: str | None,
        *,
        db: str | None = None,
        config: Path | None = None,
        target: str | None = None,
        metric: str | None = None,
        monitor: str | None = None,
        since: str | None = None,
        until: str | None = None,
    ) -> None:
        archive = db is not None or config is not None
        if csv is not None and (archive or target is not None):
            raise UsageError("give --csv, or --db/--config with --target, not both")
        if csv is not None and metric is not None:
            if column is not None:
                raise UsageError("--metric and --column both name the value column: give one")
            column = metric.rpartition(".")[2]  # an export table's columns are the keys
        if csv is None and not archive:
            raise UsageError("give the series: --csv FILE, or --db URL (or --config) --target T")
        if archive and target is None:
            raise UsageError("--target: which path of the archive? (with --db/--config)")
        if csv is not None and (since or until):
            raise UsageError("--since/--until select from an archive; a file is read whole")
        if archive and column is not None:
            raise UsageError("--column names a file's column; in an archive use --metric")
        self.csv, self.column, self.db, self.config = csv, column, db, config
        self.target, self.metric, self.monitor = target, metric, monitor
        self.since = parse_moment(since, "--since")
        self.until = parse_moment(until, "--until")

    def read(self, min_rows: int = 2) -> Series:
        if self.csv is not None:
            return _read_file(self.csv, self.column, self.monitor, min_rows)
        return self._read_archive(min_rows)

    def _read_archive(self, min_rows: int) -> Series:
        """The routine series of the path, read without creating or changing anything."""
        from iepm.analysis import predict
        from iepm.analysis.series import Series
        from iepm.analysis.watch import alert_rules

        assert self.target is not None
        with open_archive(self.db, self.config, reading=True) as archive:
            measured = predict.measured_probes(archive, self.target)
            if not measured:
                known = ", ".join(archive.targets()[:20]) or "none"
                raise UsageError(
                    f"--target: no routine results for {self.target!r} in the archive "
                    f"(targets: {known})"
                )
            if self.metric is None:
                watched = [f"{r.probe}.{r.metric}" for r in alert_rules() if r.probe in measured]
                if not watched:
                    raise UsageError(f"--metric: which metric of {self.target!r}?")
                name = watched[0]
            else:
                name = self.metric
            try:
                metric = predict.find_metric(name, None, measured)
            except AnalysisError as exc:
                raise UsageError(f"--metric: {exc}") from None
            if self.monitor is not None:
                monitors = predict.path_monitors(archive, self.target, metric.probe)
                if self.monitor not in monitors:
                    raise UsageError(
                        f"--monitor: {self.monitor!r} has no {metric.probe} results for "
                        f"{self.target!r} (monitors: {', '.join(monitors) or 'none'})"
                    )
            s = predict.read_path(
                archive,
                target=self.target,
                metric=metric,
                monitor=self.monitor,
                since=self.since,
                until=self.until,
                limit=None,
            )
        t, y = predict.increasing(s.t, s.y)
        where = f"{archive.url} {s.monitor} → {s.target} {metric.name}"
        if t.size < min_rows:
            raise AnalysisError(f"{where}: only {t.size} sample(s); at least {min_rows} are needed")
        return Series(t, y, where)


def _read_file(csv: Path, column: str | None, monitor: str | None, min_rows: int = 2) -> Series:
    """The series in ``csv``; from an export table, ``column`` or the watched metric it has."""
    from iepm.analysis.series import read_series
    from iepm.analysis.watch import alert_rules

    prefer = [f"{rule.metric}" for rule in alert_rules()]
    return read_series(csv, min_rows=min_rows, column=column, prefer=prefer, monitor=monitor)


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _fmt(v: float) -> str:
    return f"{v:.6g}" if math.isfinite(v) else "nan"


def _tsv(header: list[str], rows: list[list[Any]]) -> None:
    lines = ["\t".join(header)]
    lines += ["\t".join(_fmt(v) if isinstance(v, float) else str(v) for v in r) for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")


def forecast_command(
    csv: CsvOpt = None,
    method: Annotated[
        str, typer.Option("--method", help=f"One of: {', '.join(METHODS)} (auto: ensemble).")
    ] = "auto",
    as_json: JsonOpt = False,
    column: ColumnOpt = None,
    db: DbOpt = None,
    config: ConfigOpt = None,
    target: TargetOpt = None,
    metric: MetricOpt = None,
    monitor: MonitorOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
) -> None:
    """Walk-forward one-step-ahead forecasts with 80% prediction intervals, of a file's
    series or of a path's routine results in an archive."""
    from iepm.analysis.forecast import walk_forward
    from iepm.analysis.series import iso

    source = Source(
        csv,
        column,
        db=db,
        config=config,
        target=target,
        metric=metric,
        monitor=monitor,
        since=since,
        until=until,
    )

    def work() -> list[Any]:
        if method not in METHODS:
            raise AnalysisError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        s = source.read(min_rows=START + 1)
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
    csv: CsvOpt = None,
    as_json: JsonOpt = False,
    online: Annotated[
        bool, typer.Option("--online", help="The alerting detector's decisions, sample by sample.")
    ] = False,
    column: ColumnOpt = None,
    db: DbOpt = None,
    config: ConfigOpt = None,
    target: TargetOpt = None,
    metric: MetricOpt = None,
    monitor: MonitorOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
) -> None:
    """Step changes: offline segmentation, or (--online) the alerts as they would be raised;
    of a file's series or of a path's routine results in an archive."""
    from iepm.analysis.changes import detect_online, segment

    source = Source(
        csv,
        column,
        db=db,
        config=config,
        target=target,
        metric=metric,
        monitor=monitor,
        since=since,
        until=until,
    )

    def work() -> tuple[Series, list[Any]]:
        s = source.read()
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
    csv: CsvOpt = None,
    as_json: JsonOpt = False,
    utc_offset: Annotated[
        float, typer.Option("--utc-offset", help="Hours to add to UTC for the time of day.")
    ] = 0.0,
    site_b: Annotated[
        float, typer.Option("--site-b", help="Phase b kept for this site (simple estimate).")
    ] = math.pi / 2,
    column: ColumnOpt = None,
    db: DbOpt = None,
    config: ConfigOpt = None,
    target: TargetOpt = None,
    metric: MetricOpt = None,
    monitor: MonitorOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
) -> None:
    """Fit |a|·sin(x + b) + c over the time of day, weekdays and weekends apart; of a file's
    series or of a path's routine results in an archive."""
    from iepm.analysis.diurnal import fit_diurnal

    source = Source(
        csv,
        column,
        db=db,
        config=config,
        target=target,
        metric=metric,
        monitor=monitor,
        since=since,
        until=until,
    )

    def work() -> dict[str, Any]:
        s = source.read()
        return fit_diurnal(s.t, s.y, utc_offset_hours=utc_offset, site_b=site_b)

    fits = _guard(work)
    if as_json:
        typer.echo(json.dumps({k: v.as_dict() for k, v in fits.items()}, indent=1))
        return
    keys = ["n", "a", "b", "c", "delta_b", "diurnal", "peak_hour", "rmse", "simple_rmse"]
    _tsv(["days", *keys], [[k, *(getattr(v, key) for key in keys)] for k, v in fits.items()])


def alerts_command(
    db: Annotated[str | None, typer.Option("--db", help="Archive URL.")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="targets.toml (its archive).")
    ] = None,
    target: Annotated[str | None, typer.Option("--target", help="Only this target.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Detected from this UTC date/time (ISO).")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Step-change alerts stored by the monitor, oldest first, with their likely cause."""
    from iepm.analysis.alerts import load_alerts
    from iepm.analysis.series import iso

    start = parse_moment(since, "--since")
    with open_archive(db, config, reading=True) as archive:
        alerts = load_alerts(archive, target=target, since=start)
    if as_json:
        rows = [
            {
                **a.payload(),
                "delivered_at": iso(a.delivered_at.timestamp()) if a.delivered_at else None,
                "delivery_attempts": a.delivery_attempts,
            }
            for a in alerts
        ]
        typer.echo(json.dumps(rows, indent=1))
        return
    header = ["detected_at", "change_at", "target", "probe", "metric", "direction", "before"]
    header += ["after", "change_percent", "cause", "delivered"]
    _tsv(
        header,
        [
            [
                iso(a.detected_at.timestamp()),
                iso(a.change_at.timestamp()),
                a.target,
                a.probe,
                a.metric,
                a.direction,
                math.nan if a.before is None else a.before,
                math.nan if a.after is None else a.after,
                math.nan if a.change_percent is None else a.change_percent,
                a.cause,
                "yes" if a.delivered_at else f"no ({a.delivery_attempts} attempts)",
            ]
            for a in alerts
        ],
    )


def register(app: typer.Typer) -> None:
    """Add ``forecast``, ``changes``, ``diurnal`` and ``alerts`` to ``app``."""
    app.command("forecast")(guarded(forecast_command))
    app.command("changes")(guarded(changes_command))
    app.command("diurnal")(guarded(diurnal_command))
    app.command("alerts")(guarded(alerts_command))
