"""``iepm tune`` and ``iepm study …``: run the tuning studies and read them back.

TARGET is a target's name with ``--config`` (its address, port, monitor name, namespace and
archive come from the file) or an address with ``--db``. Errors print one line and exit with
the code of :class:`iepm.errors.ExitCode`; a study interrupted with Ctrl-C is kept, marked
partial, and the command exits 130.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from iepm import cliglue
from iepm.cliglue import GuardedTyper, archive_url, explain, fail, parse_moment
from iepm.errors import ExitCode
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.rawlog import RawLog

console = Console()
study_app = GuardedTyper(help="Tuning studies: duration, impact, early stop, Mathis, CPU cost.")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="targets.toml: TARGET is a target's name.")
]
if TYPE_CHECKING:
    from iepm.store import Archive


def open_archive(url: str) -> Archive:
    """The archive, imported on use: SQLAlchemy and Alembic are not needed to print --help."""
    from iepm.store import Archive

    return Archive.open(url)


DbOpt = Annotated[str | None, typer.Option("--db", help="Archive URL (default: the config's).")]
NetnsOpt = Annotated[str | None, typer.Option("--netns", help="Run the tools in this netns.")]
MonitorOpt = Annotated[str | None, typer.Option("--monitor", help="Monitor name to record.")]
PortOpt = Annotated[int | None, typer.Option("--port", help="iperf3 server port.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the study as JSON.")]
PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write the plot to this .svg file.")]
T = TypeVar("T")


@dataclass
class Where:
    ctx: ProbeContext
    archive_url: str
    base: iperf3.Spec
    own_iperf3: dict[str, Any]


def _where(
    target: str,
    config_path: Path | None,
    db: str | None,
    netns: str | None,
    monitor: str | None,
    port: int | None,
) -> Where:
    from iepm.config import load_config

    address, name, base, own = target, target, iperf3.Spec(), {}
    mon, ns, log = monitor or socket.gethostname(), netns, None
    url = archive_url(db, None) if db else None
    if config_path is not None:
        config = load_config(config_path)
        url = url or config.monitor.archive
        mon = monitor or config.monitor.name
        ns = netns or config.monitor.netns
        log = RawLog(config.monitor.log_dir)
        if target in config.target_names():
            entry = config.target(target)
            address, name = entry.address, entry.name
            spec = config.spec_for(entry, "iperf3")
            assert isinstance(spec, iperf3.Spec)
            base, own = spec, dict(entry.params("iperf3"))
    if url is None:
        raise fail("give --config FILE or --db URL: studies are stored in an archive")
    if port is not None:
        base = base.model_copy(update={"port": port})
    ctx = ProbeContext(target=name, address=address, monitor=mon, raw_log=log, netns=ns)
    return Where(ctx, url, base, own)


def _guard(work: Callable[[], T]) -> T:
    """Run ``work``; a ValueError from a study's arguments is bad input (exit code 2). Other
    errors reach the command's guard (iepm.cliglue) and exit with the table's code."""
    try:
        return work()
    except ValueError as exc:
        message, code = explain(exc) or (str(exc), ExitCode.USAGE)
        raise fail(message, code) from None


def _csv_list(text: str, convert: Callable[[str], T], what: str) -> list[T]:
    try:
        return [convert(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise fail(f"{what}: {exc}") from None


@contextmanager
def _progress(title: str, enabled: bool) -> Iterator[Callable[[dict[str, Any], int, int], None]]:
    if not enabled:
        yield lambda point, done, total: None
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[last]}"),
        console=Console(stderr=True),
        transient=False,
    ) as progress:
        task = progress.add_task(title, total=None, last="")

        def update(point: dict[str, Any], done: int, total: int) -> None:
            tp = point.get("throughput_bps")
            what = " ".join(
                f"{k}={point[k]}"
                for k in ("window_label", "streams", "duration_s", "level")
                if point.get(k) is not None
            )
            last = f"{what}: {tp / 1e6:.1f} Mbit/s" if tp else f"{what}: {point.get('error') or ''}"
            progress.update(task, completed=done, total=total, last=last[:70])

        yield update


def _run_async(coro: Any) -> Any:
    """Run a study; Ctrl-C ends it as partial (the study saved it) and exits 130."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: the points measured so far are stored, marked partial\n")
        raise typer.Exit(130) from None


def _mbps(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


# --------------------------------------------------------------------------------------------
# iepm tune


def tune_command(
    target: Annotated[str | None, typer.Argument(help="Target name (--config) or address.")] = None,
    config: ConfigOpt = None,
    db: DbOpt = None,
    netns: NetnsOpt = None,
    monitor: MonitorOpt = None,
    port: PortOpt = None,
    windows: Annotated[
        str, typer.Option(help="Comma-separated windows; 'default' = no -w.")
    ] = "8K,16K,32K,64K,128K,256K,512K,1M,2M,4M",
    streams: Annotated[str, typer.Option(help="Comma-separated stream counts.")] = (
        "1,2,4,8,12,16,24,32"
    ),
    duration: Annotated[int, typer.Option(help="Seconds per transfer.")] = 10,
    pings_during: Annotated[int, typer.Option(help="Pings during each transfer.")] = 10,
    pings_after: Annotated[int, typer.Option(help="Pings after each transfer.")] = 10,
    ping_interval: Annotated[float, typer.Option(help="Seconds between pings after.")] = 0.2,
    fraction: Annotated[float, typer.Option(help="Choose the fewest streams reaching this.")] = 0.8,
    max_total: Annotated[float, typer.Option(help="Refuse sweeps longer than this (s).")] = 3600,
    max_streams: Annotated[int, typer.Option(help="Refuse stream counts above this.")] = 128,
    max_window: Annotated[str, typer.Option(help="Refuse windows above this.")] = "512M",
    seed: Annotated[int, typer.Option(help="Seed of the visiting order.")] = 1,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Store the choice.")] = True,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    due: Annotated[
        bool, typer.Option("--due", help="Sweep every configured target that needs it now.")
    ] = False,
    period_days: Annotated[float, typer.Option(help="--due: re-tune after this many days.")] = 30,
) -> None:
    """Windows × streams sweep; stores the choice as the target's tuned iperf3 parameters."""
    from iepm.tuning.sweep import SweepLimits, SweepPlan, parse_window

    plan = SweepPlan(
        windows=_csv_list(windows, parse_window, "--windows"),
        streams=_csv_list(streams, int, "--streams"),
        duration_s=duration,
        pings_during=pings_during,
        pings_after=pings_after,
        after_interval_s=ping_interval,
        fraction=fraction,
        seed=seed,
    )
    limits = SweepLimits(
        max_total_s=max_total,
        max_streams=max_streams,
        max_window_bytes=_guard(lambda: iperf3.size_bytes(max_window, base=1024)),
    )
    if due:
        targets = _due_targets(config, period_days)
        if not targets:
            console.print("no target needs tuning now")
            return
    elif target is None:
        raise fail("give TARGET, or --due with --config")
    else:
        targets = [target]
    for name in targets:
        where = _guard(lambda name=name: _where(name, config, db, netns, monitor, port))
        study = _tune_one(where, plan, limits, save=save, quiet=as_json)
        _show_sweep(study, as_json, plot)


def _tune_one(where: Where, plan: Any, limits: Any, *, save: bool, quiet: bool) -> Any:
    from iepm.tuning.retune import latest_route
    from iepm.tuning.sweep import run_sweep

    for key in ("window", "streams"):
        if key in where.own_iperf3:
            console.print(
                f"[yellow]note: {where.ctx.target} sets iperf3 {key} in its own config; "
                "that setting wins over the tuned one[/]"
            )
    with open_archive(where.archive_url) as archive:
        extra = {"route": _guard(lambda: latest_route(archive, where.ctx.target))}
        with _progress(f"tune {where.ctx.target}", not quiet) as on_point:
            return _guard(
                lambda: _run_async(
                    run_sweep(
                        archive,
                        where.ctx,
                        plan,
                        base=where.base,
                        limits=limits,
                        save=save,
                        on_point=on_point,
                        extra_params=extra,
                    )
                )
            )


def _due_targets(config: Path | None, period_days: float) -> list[str]:
    from iepm.config import load_config
    from iepm.tuning.retune import retune_reasons

    if config is None:
        raise fail("--due needs --config")
    loaded = _guard(lambda: load_config(config))
    due = []
    with open_archive(loaded.monitor.archive) as archive:
        for entry in loaded.targets:
            if "iperf3" not in entry.probes:
                continue
            reasons = _guard(
                lambda entry=entry: retune_reasons(  # type: ignore[misc]
                    archive,
                    monitor=loaded.monitor.name,
                    target=entry.name,
                    period_s=period_days * 86400,
                )
            )
            if reasons:  # on stderr: --json keeps stdout for the studies
                Console(stderr=True).print(f"{entry.name}: " + "; ".join(reasons))
                due.append(entry.name)
    return due


def _show_sweep(study: Any, as_json: bool, plot: Path | None) -> None:
    from iepm.tuning.plot import sweep_chart, write
    from iepm.tuning.sweep import table_rows

    if plot is not None:
        _guard(lambda: write(plot, sweep_chart(study.points, study.target)))
    if as_json:
        sys.stdout.write(json.dumps(study.as_json(), indent=1) + "\n")
        return
    s = study.summary
    windows, streams, cells = table_rows(study.points)
    chosen, best = s.get("chosen") or {}, s.get("best") or {}
    table = Table(title=f"{study.target}: throughput, Mbit/s (rows: window; columns: streams)")
    table.add_column("window")
    for n in streams:
        table.add_column(str(n), justify="right")
    for w in windows:
        row = []
        for n in streams:
            p = cells.get((w, n))
            text = "·" if p is None else (_mbps(p.get("throughput_bps")) if p["succeeded"] else "×")
            if p is not None and p.get("order") == chosen.get("order"):
                text = f"[bold green]{text}*[/]"
            elif p is not None and p.get("order") == best.get("order"):
                text = f"[bold]{text}+[/]"
            row.append(text)
        table.add_row(w, *row)
    console.print(table)
    base = s.get("baseline") or {}
    console.print(f"study {study.id}  * chosen  + best  × failed  · not measured")
    console.print(
        f"1 stream × default window: {_mbps(base.get('throughput_bps'))} Mbit/s; best "
        f"{_mbps(best.get('throughput_bps'))} Mbit/s ({best.get('window') or 'default'} × "
        f"{best.get('streams')}); chosen {_mbps(chosen.get('throughput_bps'))} Mbit/s "
        f"({chosen.get('window') or 'default'} × {chosen.get('streams')} streams, "
        f"{100 * (s.get('chosen_fraction_of_best') or 0):.0f}% of best)"
    )
    if s.get("improvement"):
        console.print(f"improvement over 1 stream × default window: {s['improvement']:.1f}×")
    console.print(
        f"RTT median without load {s.get('rtt_unloaded_median_ms')} ms, during transfers "
        f"{s.get('rtt_loaded_median_ms')} ms"
    )
    if study.partial:
        console.print(f"[yellow]PARTIAL: {s.get('partial_reason')}; nothing was chosen[/]")
    elif s.get("tuned_saved"):
        console.print(f"stored as tuned iperf3 parameters: {s.get('tuned')}")


# --------------------------------------------------------------------------------------------
# iepm study …


@study_app.command("duration")
def duration_command(
    target: Annotated[str, typer.Argument(help="Target name (--config) or address.")],
    config: ConfigOpt = None,
    db: DbOpt = None,
    netns: NetnsOpt = None,
    monitor: MonitorOpt = None,
    port: PortOpt = None,
    durations: Annotated[str, typer.Option(help="Comma-separated seconds.")] = (
        "2,5,10,20,40,80,160,320"
    ),
    windows: Annotated[str, typer.Option(help="Comma-separated windows.")] = "default",
    repeats: Annotated[int, typer.Option(help="Tests per duration and window.")] = 3,
    tolerance: Annotated[float, typer.Option(help="Within this of the longest.")] = 0.10,
    max_total: Annotated[float, typer.Option(help="Refuse studies longer than this (s).")] = 14400,
    as_json: JsonOpt = False,
) -> None:
    """Single-stream tests of several durations: the shortest representative duration."""
    from iepm.tuning.duration import DurationPlan, run_duration_study
    from iepm.tuning.sweep import parse_window

    plan = DurationPlan(
        durations=_csv_list(durations, int, "--durations"),
        windows=_csv_list(windows, parse_window, "--windows"),
        repeats=repeats,
        tolerance=tolerance,
        max_total_s=max_total,
    )
    where = _guard(lambda: _where(target, config, db, netns, monitor, port))
    with open_archive(where.archive_url) as archive, _progress("duration", not as_json) as cb:
        study = _guard(
            lambda: _run_async(
                run_duration_study(archive, where.ctx, plan, base=where.base, on_point=cb)
            )
        )
    if as_json:
        sys.stdout.write(json.dumps(study.as_json(), indent=1) + "\n")
        return
    for label, w in study.summary["windows"].items():
        table = Table(title=f"{study.target}: window {label}")
        for col in ("duration s", "median Mbit/s", "IQR Mbit/s", "runs"):
            table.add_column(col, justify="right")
        for d, s in w["by_duration"].items():
            table.add_row(d, _mbps(s["median_bps"]), _mbps(s["iqr_bps"]), str(s["n"]))
        console.print(table)
        console.print(f"window {label}: recommended duration {w['recommended_duration_s']} s")
    console.print(
        f"study {study.id}: recommended duration {study.summary['recommended_duration_s']} s "
        f"(shortest whose median is within {100 * plan.tolerance:g}% of the longest's)"
    )


@study_app.command("impact")
def impact_command(
    target: Annotated[str, typer.Argument(help="Target name (--config) or address.")],
    config: ConfigOpt = None,
    db: DbOpt = None,
    netns: NetnsOpt = None,
    monitor: MonitorOpt = None,
    port: PortOpt = None,
    rates: Annotated[
        str, typer.Option(help="Load levels: iperf3 -b rates; 'max' = unpaced.")
    ] = "10M,50M,100M,max",
    streams: Annotated[int, typer.Option(help="Streams of the load transfer.")] = 4,
    window: Annotated[str, typer.Option(help="Window of the load transfer.")] = "default",
    duration: Annotated[int, typer.Option(help="Seconds per load level.")] = 10,
    pings: Annotated[int, typer.Option(help="Pings per level (and without load).")] = 40,
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Ping RTT without and during heavy transfers: percentiles, CDF, the knee."""
    from iepm.tuning.impact import ImpactPlan, run_impact_study
    from iepm.tuning.plot import cdf_chart, write
    from iepm.tuning.sweep import parse_window

    def rate(v: str) -> str | None:
        if v.strip().lower() in ("max", "unpaced", "0"):
            return None
        iperf3.Spec(rate=v)
        return v.strip()

    plan = ImpactPlan(
        rates=_csv_list(rates, rate, "--rates"),
        streams=streams,
        window=_guard(lambda: parse_window(window)),
        duration_s=duration,
        pings=pings,
    )
    where = _guard(lambda: _where(target, config, db, netns, monitor, port))
    with open_archive(where.archive_url) as archive, _progress("impact", not as_json) as cb:
        study = _guard(
            lambda: _run_async(
                run_impact_study(archive, where.ctx, plan, base=where.base, on_point=cb)
            )
        )
    if plot is not None:
        dists = {p["level"]: p["rtt_ms"] for p in study.points if p["rtt_ms"]}
        _guard(lambda: write(plot, cdf_chart(dists, study.target)))
    if as_json:
        sys.stdout.write(json.dumps(study.as_json(), indent=1) + "\n")
        return
    s = study.summary
    table = Table(title=f"{study.target}: ping RTT, ms")
    for col in ("load", "Mbit/s", "p10", "p50", "p90", "p99", "median +ms"):
        table.add_column(col, justify="right")
    u = s["unloaded_rtt_percentiles_ms"]
    table.add_row("none", "-", *(str(u[k]) for k in ("p10", "p50", "p90", "p99")), "-")
    for lv in s["levels"]:
        q = lv["rtt_percentiles_ms"]
        inc = lv["median_increase_ms"]
        table.add_row(
            lv["level"],
            _mbps(lv["throughput_bps"]),
            *(str(q[k]) for k in ("p10", "p50", "p90", "p99")),
            "-" if inc is None else f"{inc:+.1f}",
        )
    console.print(table)
    knee = s.get("knee_throughput_bps")
    console.print(
        f"study {study.id}: RTT median rises by more than {s['knee_ms']:.1f} ms "
        + (
            "at no load level measured"
            if s.get("sharp_rise_at_bps") is None
            else f"above {_mbps(knee)} Mbit/s (at {_mbps(s['sharp_rise_at_bps'])} Mbit/s)"
        )
    )


@study_app.command("early-stop")
def early_stop_command(
    target: Annotated[str, typer.Argument(help="Target name (--config) or address.")],
    config: ConfigOpt = None,
    db: DbOpt = None,
    netns: NetnsOpt = None,
    monitor: MonitorOpt = None,
    port: PortOpt = None,
    full: Annotated[int, typer.Option(help="Duration of the full test it replaces (s).")] = 10,
    tolerance: Annotated[float, typer.Option(help="Stability: spread of the last rates.")] = 0.1,
    compare: Annotated[
        bool, typer.Option("--compare/--no-compare", help="Also run the full test to compare.")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """One iperf3 test stopped once slow start is over and the rate is stable."""
    from iepm.tuning.early_stop import EarlyStopConfig, run_early_stop_study

    cfg = EarlyStopConfig(full_duration_s=full, tolerance=tolerance)
    where = _guard(lambda: _where(target, config, db, netns, monitor, port))
    with open_archive(where.archive_url) as archive:
        study = _guard(
            lambda: _run_async(
                run_early_stop_study(archive, where.ctx, where.base, cfg, compare=compare)
            )
        )
    if as_json:
        sys.stdout.write(json.dumps(study.as_json(), indent=1) + "\n")
        return
    s = study.summary
    console.print(
        f"study {study.id}: early stop after {s['stopped_after_s']} s "
        f"(slow start ended at {s['slow_start_end_s']} s: {s['slow_start_by']}); "
        f"result {_mbps(s['early_bps'])} Mbit/s, traffic {s['early_bytes']} bytes"
    )
    if s.get("full_bps"):
        console.print(
            f"full {full} s test: {_mbps(s['full_bps'])} Mbit/s, {s['full_bytes']} bytes — "
            f"difference {100 * s['difference']:+.1f}%, traffic used "
            f"{100 * s['traffic_share']:.0f}%"
        )


@study_app.command("mathis")
def mathis_command(
    config: ConfigOpt = None,
    db: DbOpt = None,
    target: Annotated[str | None, typer.Option(help="Only this target.")] = None,
    since: Annotated[str | None, typer.Option(help="From this UTC date/time (ISO).")] = None,
    c: Annotated[float, typer.Option("--c", help="Mathis constant C.")] = 1.2247,
    mss: Annotated[int, typer.Option(help="TCP MSS, bytes.")] = 1448,
    fmt: Annotated[str, typer.Option("--format", help="table, tsv, csv or json.")] = "table",
) -> None:
    """Throughput predicted from ping RTT and loss (Mathis et al.) next to the measured one."""
    from iepm.tuning.mathis import path_table

    start = _since(since)
    with _archive(config, db) as archive:
        rows = _guard(lambda: path_table(archive, since=start, target=target, c=c, mss=mss))
    cols = [
        "monitor", "target", "pings", "rtt_ms", "loss_percent", "congestion", "iperf3_runs",
        "streams_median",
        "measured_per_stream_bps", "predicted_per_stream_bps", "ratio", "verdict",
    ]  # fmt: skip
    _emit(rows, cols, fmt, f"Mathis model, C = {c:g}, MSS = {mss} bytes (per stream)")


@study_app.command("cpu")
def cpu_command(
    config: ConfigOpt = None,
    db: DbOpt = None,
    since: Annotated[str | None, typer.Option(help="From this UTC date/time (ISO).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, tsv, csv or json.")] = "table",
) -> None:
    """CPU cost of throughput (MHz per Mbit/s) per host and per kernel, from iperf3 results."""
    from iepm.tuning.cpu import summary

    start = _since(since)
    with _archive(config, db) as archive:
        s = _guard(lambda: summary(archive, since=start))
    if fmt == "json":
        sys.stdout.write(json.dumps(s, indent=1) + "\n")
        return
    stat_cols = ["n", "median", "q1", "q3", "mean"]
    _emit(
        s["mhz_per_mbps"], ["host", "role", "kernel", *stat_cols], fmt, "MHz per Mbit/s, per host"
    )
    _emit(
        s["mhz_per_mbps_by_kernel"],
        ["kernel", "role", *stat_cols],
        fmt,
        "MHz per Mbit/s, per kernel",
    )
    _emit(
        s["remote_cpu_percent_per_gbps"],
        ["host", "role", *stat_cols],
        fmt,
        "remote iperf3: percent of one CPU per Gbit/s",
    )


@study_app.command("list")
def list_command(
    config: ConfigOpt = None,
    db: DbOpt = None,
    kind: Annotated[str | None, typer.Option(help="sweep, duration, impact, early_stop.")] = None,
    target: Annotated[str | None, typer.Option(help="Only this target.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table, tsv, csv or json.")] = "table",
) -> None:
    """Stored studies, newest first."""
    from iepm.tuning.store import list_studies

    with _archive(config, db) as archive:
        studies = _guard(lambda: list_studies(archive, kind=kind, target=target))
    rows = [
        {
            "id": s.id,
            "kind": s.kind,
            "monitor": s.monitor,
            "target": s.target,
            "started_at": s.started_at.isoformat(),
            "partial": s.partial,
            "points": len(s.points),
        }
        for s in studies
    ]
    _emit(
        rows, ["id", "kind", "monitor", "target", "started_at", "partial", "points"], fmt, "studies"
    )


@study_app.command("show")
def show_command(
    study_id: Annotated[str, typer.Argument(help="Study id (or a unique prefix).")],
    config: ConfigOpt = None,
    db: DbOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="table, tsv, csv or json.")] = "table",
    plot: PlotOpt = None,
) -> None:
    """A study's points as a table (tsv/csv for spreadsheets), or the whole study as JSON."""
    from iepm.tuning.store import load_study

    with _archive(config, db) as archive:
        study = _guard(lambda: load_study(archive, study_id))
    if study is None:
        raise fail(f"no study (or more than one) with id {study_id!r}; see `iepm study list`")
    if study.kind == "sweep" and fmt == "table":
        _show_sweep(study, False, plot)
        return
    if plot is not None and study.kind == "impact":
        from iepm.tuning.plot import cdf_chart, write

        write(plot, cdf_chart({p["level"]: p["rtt_ms"] for p in study.points}, study.target))
    if fmt == "json":
        sys.stdout.write(json.dumps(study.as_json(), indent=1) + "\n")
        return
    points = study.points
    cols = [k for k in (points[0] if points else {}) if not isinstance(points[0][k], list | dict)]
    _emit(points, cols, fmt, f"{study.kind} study {study.id} of {study.target}")


@contextmanager
def _archive(config: Path | None, db: str | None) -> Iterator[Archive]:
    """The archive a reading command (list, show, mathis, cpu) reads; never created."""
    with _guard(lambda: cliglue.open_archive(db, config, reading=True)) as archive:
        yield archive


def _since(value: str | None) -> Any:
    return parse_moment(value, "--since")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _emit(rows: list[dict[str, Any]], cols: list[str], fmt: str, title: str) -> None:
    if fmt == "json":
        for row in rows:
            sys.stdout.write(json.dumps({k: row.get(k) for k in cols}) + "\n")
    elif fmt in ("tsv", "csv"):
        buf = io.StringIO()
        if fmt == "tsv":
            buf.write(f"# {title}\n")
        writer = csv.writer(buf, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\n")
        writer.writerow(cols)
        for row in rows:
            writer.writerow([_cell(row.get(k)) for k in cols])
        sys.stdout.write(buf.getvalue())
    elif fmt == "table":
        table = Table(title=title)
        for col in cols:
            table.add_column(col)
        for row in rows:
            table.add_row(*(_cell(row.get(k)) for k in cols))
        console.print(table)
    else:
        raise fail(f"--format must be table, tsv, csv or json, not {fmt!r}")


def register(app: typer.Typer) -> None:
    app.command("tune")(cliglue.guarded(tune_command))
    app.add_typer(study_app, name="study")
