"""The ``iepm`` command line. Its commands and options are a stable interface."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live

from iepm import __version__
from iepm.cliglue import GuardedTyper, archive_url, fail, open_archive, parse_moment
from iepm.config import Config, load_config
from iepm.errors import IepmError, exit_code
from iepm.probes import PROBES, get_probe
from iepm.probes.base import ProbeContext, ProbeSpec, result_from_raw
from iepm.rawlog import RawLog
from iepm.results import Result
from iepm.runner import RawRun

app = GuardedTyper(
    help="iepm: end-to-end network and application performance monitoring.",
    no_args_is_help=True,
    add_completion=False,
)
probe_app = GuardedTyper(help="Run one measurement now and print the result.", no_args_is_help=True)
app.add_typer(probe_app, name="probe")

console = Console()

JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result envelope as JSON.")]
NetnsOpt = Annotated[
    str | None, typer.Option("--netns", help="Run the tool inside this network namespace.")
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="targets.toml: TARGET may then be a target's name."),
]
LogDirOpt = Annotated[
    Path | None, typer.Option("--log-dir", help="Append the raw tool output to this raw-log dir.")
]
StoreOpt = Annotated[
    str | None, typer.Option("--store", help="Also write the result to this archive URL.")
]


class OutputFormat(StrEnum):
    tsv = "tsv"
    csv = "csv"
    json = "json"


def _resolve_target(target: str, config_path: Path | None) -> tuple[str, str, Config | None]:
    """(name, address, config): TARGET is a target's name when a config is given."""
    if config_path is None:
        return target, target, None
    config = load_config(config_path)
    if target in config.target_names():
        entry = config.target(target)
        return entry.name, entry.address, config
    return target, target, config


def _run_probe(
    probe: str,
    target: str,
    options: dict[str, Any],
    *,
    as_json: bool,
    netns: str | None,
    config_path: Path | None,
    log_dir: Path | None,
    store: str | None,
) -> None:
    module = get_probe(probe)
    try:
        name, address, config = _resolve_target(target, config_path)
        given = {k: v for k, v in options.items() if v is not None}
        if config is not None and name in config.target_names():
            base = config.spec_for(config.target(name), probe).model_dump()
            spec: ProbeSpec = module.Spec.model_validate({**base, **given})
        else:
            spec = module.Spec.model_validate(given)
        if config is not None:
            netns = netns or config.monitor.netns
        ctx = ProbeContext(
            target=name,
            address=address,
            raw_log=RawLog(log_dir) if log_dir else None,
            netns=netns,
        )
        if config is not None:
            ctx.monitor = config.monitor.name
            if name in config.target_names():
                # An agent or SSH target: the probe obtains (and releases) its server there.
                ctx.remote = config.target(name).remote()
        result: Result = asyncio.run(module.run(spec, ctx))
        if store:
            from iepm.store import Archive

            with Archive.open(store) as archive:
                archive.add(result)
    except IepmError as exc:
        raise fail(str(exc), exit_code(exc)) from None
    except ValueError as exc:  # pydantic ValidationError is a ValueError
        raise fail(f"invalid {probe} option: {exc}") from None
    _print_result(result, as_json)
    raise typer.Exit(0 if result.succeeded else 1)


def _print_result(result: Result, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(result.envelope(), indent=2) + "\n")
    else:
        from iepm.console import describe

        console.print(describe(result), end="")


@probe_app.command("ping")
def probe_ping(
    target: Annotated[str, typer.Argument(help="Address, host name, or target name (--config).")],
    count: Annotated[int | None, typer.Option(help="Echo requests to send [10].")] = None,
    interval: Annotated[float | None, typer.Option(help="Seconds between requests [1.0].")] = None,
    size: Annotated[int | None, typer.Option(help="Payload bytes [56].")] = None,
    deadline: Annotated[float | None, typer.Option(help="Stop after this many seconds.")] = None,
    discard_first: Annotated[
        int | None, typer.Option(help="Leave the first N replies out of the statistics.")
    ] = None,
    as_json: JsonOpt = False,
    netns: NetnsOpt = None,
    config: ConfigOpt = None,
    log_dir: LogDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """RTT and loss with iputils ping."""
    options = {
        "count": count,
        "interval_s": interval,
        "size_bytes": size,
        "deadline": deadline,
        "discard_first": discard_first,
    }
    _run_probe(
        "ping",
        target,
        options,
        as_json=as_json,
        netns=netns,
        config_path=config,
        log_dir=log_dir,
        store=store,
    )


class TracerouteMethod(StrEnum):
    icmp = "icmp"
    udp = "udp"
    tcp = "tcp"


@probe_app.command("traceroute")
def probe_traceroute(
    target: Annotated[str, typer.Argument(help="Address, host name, or target name (--config).")],
    max_hops: Annotated[int | None, typer.Option(help="Largest TTL [30].")] = None,
    queries: Annotated[int | None, typer.Option(help="Probes per hop [1].")] = None,
    method: Annotated[TracerouteMethod | None, typer.Option(help="Probe packets [udp].")] = None,
    wait: Annotated[float | None, typer.Option(help="Seconds to wait for each reply.")] = None,
    as_json: JsonOpt = False,
    netns: NetnsOpt = None,
    config: ConfigOpt = None,
    log_dir: LogDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """The route, hop by hop, with Linux traceroute (numeric: no DNS)."""
    options = {
        "max_hops": max_hops,
        "queries": queries,
        "method": method.value if method else None,
        "wait_s": wait,
    }
    _run_probe(
        "traceroute",
        target,
        options,
        as_json=as_json,
        netns=netns,
        config_path=config,
        log_dir=log_dir,
        store=store,
    )


@probe_app.command("iperf3")
def probe_iperf3(
    target: Annotated[str, typer.Argument(help="Address, host name, or target name (--config).")],
    port: Annotated[int | None, typer.Option(help="Server port [5201].")] = None,
    streams: Annotated[int | None, typer.Option(help="Parallel streams, 1-128 [1].")] = None,
    window: Annotated[str | None, typer.Option(help="Socket buffer, e.g. 256K, 4M.")] = None,
    duration: Annotated[float | None, typer.Option(help="Seconds to transmit [10].")] = None,
    omit: Annotated[int | None, typer.Option(help="Seconds of slow start to omit [0].")] = None,
    congestion: Annotated[str | None, typer.Option(help="TCP congestion control.")] = None,
    reverse: Annotated[bool | None, typer.Option("--reverse", help="Server sends.")] = None,
    udp: Annotated[bool | None, typer.Option("--udp", help="UDP: jitter and loss.")] = None,
    rate: Annotated[str | None, typer.Option(help="UDP target bitrate, e.g. 100M.")] = None,
    as_json: JsonOpt = False,
    netns: NetnsOpt = None,
    config: ConfigOpt = None,
    log_dir: LogDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """TCP throughput (or UDP jitter and loss) against any iperf3 server."""
    options = {
        "port": port,
        "streams": streams,
        "window": window,
        "duration_s": duration,
        "omit_s": omit,
        "congestion": congestion,
        "reverse": reverse,
        "udp": udp,
        "rate": rate,
    }
    _run_probe(
        "iperf3",
        target,
        options,
        as_json=as_json,
        netns=netns,
        config_path=config,
        log_dir=log_dir,
        store=store,
    )


@probe_app.command("load")
def probe_load(
    as_json: JsonOpt = False,
    netns: NetnsOpt = None,
    log_dir: LogDirOpt = None,
    store: StoreOpt = None,
) -> None:
    """Host facts that explain results: load, CPUs and MHz, NIC speed, TCP buffer limits."""
    import socket

    host = socket.gethostname()
    _run_probe(
        "load",
        host,
        {},
        as_json=as_json,
        netns=netns,
        config_path=None,
        log_dir=log_dir,
        store=store,
    )


@app.command("parse")
def parse_cmd(
    probe: Annotated[str, typer.Argument(help=f"One of: {', '.join(PROBES)}.")],
    file: Annotated[Path, typer.Argument(help="Saved output of the tool ('-' for stdin).")],
    as_json: JsonOpt = False,
) -> None:
    """Parse a saved tool output (the extraction step) and print what iepm reads from it."""
    try:
        module = get_probe(probe)
    except KeyError as exc:
        raise fail(str(exc.args[0])) from None
    try:
        data = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
    except OSError as exc:
        raise fail(f"{file}: cannot read: {exc.strerror}") from None
    # Decoded as the runner decodes a live run's output, so that parse and extract agree:
    # a byte that is not UTF-8 becomes U+FFFD and the parser decides what it can read.
    raw = RawRun(argv=(module.TOOL,), stdout=data.decode("utf-8", errors="replace"))
    spec = module.Spec()
    ctx = ProbeContext(target=str(file), address="")
    result = result_from_raw(module, spec, ctx, raw, None)
    result.diags = f"parsed from {file}"
    if not result.succeeded and result.error:
        result.error = f"{file}: {result.error}"
    _print_result(result, as_json)
    raise typer.Exit(0 if result.succeeded else 1)


@app.command("validate")
def validate_cmd(config: Annotated[Path, typer.Argument(help="targets.toml to check.")]) -> None:
    """Check a targets.toml; errors name the file, line and field."""
    loaded = load_config(config)
    console.print(
        f"{config}: ok — monitor {loaded.monitor.name}, {len(loaded.targets)} targets, "
        f"cycle every {loaded.monitor.cycle_interval_s:g} s"
    )


@app.command("run")
def run_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="targets.toml")],
    once: Annotated[bool, typer.Option("--once", help="Run one cycle and exit.")] = False,
    cycles: Annotated[int | None, typer.Option(help="Run this many cycles and exit.")] = None,
    live: Annotated[bool, typer.Option("--live/--no-live", help="Show a live table.")] = True,
) -> None:
    """Run measurement cycles as the config says (forever, unless --once or --cycles)."""
    from iepm.console import LiveTable
    from iepm.scheduler import Scheduler
    from iepm.store import Archive

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        loaded = load_config(config)
        archive = Archive.open(loaded.monitor.archive)
    except IepmError as exc:
        raise fail(str(exc), exit_code(exc)) from None
    count = 1 if once else cycles
    table = LiveTable(f"iepm {loaded.monitor.name}: latest results")
    show_live = live and console.is_terminal
    view = Live(table.render(), console=console) if show_live else None
    with archive, view or contextlib.nullcontext():

        def on_result(result: Result) -> None:
            table.update(result)
            if view is not None:
                view.update(table.render())
            else:
                # One unwrapped line per result, flushed: a log or a pipe sees it at once.
                sys.stdout.write(
                    f"{result.started_at:%Y-%m-%dT%H:%M:%SZ} {result.target} {result.probe} "
                    f"{result.outcome.value}: {_line(result)} [{result.id}]\n"
                )
                sys.stdout.flush()

        scheduler = Scheduler(loaded, archive, on_result=on_result)
        try:
            reports = asyncio.run(scheduler.run(cycles=count))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
    for report in reports:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items()))
        console.print(
            f"cycle {report.number}: {len(report.results)} results ({outcomes}) in "
            f"{report.duration_s:.1f} s" + (" — OVERRAN its interval" if report.overran else "")
        )


def _line(result: Result) -> str:
    from iepm.console import summary

    return summary(result) if result.data else (result.error or "")


@app.command("export")
def export_cmd(
    probe: Annotated[str, typer.Option("--probe", help="Which probe's table.")],
    target: Annotated[str | None, typer.Option(help="Only this target.")] = None,
    since: Annotated[str | None, typer.Option(help="From this UTC date/time (ISO).")] = None,
    until: Annotated[str | None, typer.Option(help="Before this UTC date/time (ISO).")] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", help="tsv, csv or json.")] = (
        OutputFormat.tsv
    ),
    db: Annotated[str | None, typer.Option("--db", help="Archive URL.")] = None,
    config: ConfigOpt = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="File (default stdout).")
    ] = None,
) -> None:
    """Write a probe's results as a table: TSV with documented columns, CSV, or JSON lines."""
    from iepm.export import export

    try:
        module = get_probe(probe)
    except KeyError as exc:
        raise fail(str(exc.args[0])) from None
    selection: dict[str, Any] = {
        "target": target,
        "since": parse_moment(since, "--since"),
        "until": parse_moment(until, "--until"),
    }
    with open_archive(db, config, reading=True) as archive:
        if output is None:
            export(archive, probe, module.COLUMNS, fmt.value, sys.stdout, **selection)
        else:
            with output.open("w", encoding="utf-8", newline="") as out:
                export(archive, probe, module.COLUMNS, fmt.value, out, **selection)


@app.command("extract")
def extract_cmd(
    log_dir: Annotated[Path, typer.Option("--log-dir", help="Raw-log directory to re-read.")],
    db: Annotated[str, typer.Option("--db", help="Archive URL to update.")],
) -> None:
    """Re-parse every raw log with today's parsers and update the archive's results."""
    from iepm.extract import extract

    counts = extract(RawLog(log_dir), archive_url(db, None))
    console.print(
        f"re-extracted {counts['runs']} runs: {counts['updated']} updated, "
        f"{counts['added']} added, {counts['failed']} failed to parse"
    )


@app.command("version")
def version_cmd() -> None:
    """Print iepm's version."""
    console.print(f"iepm {__version__}")


def _mount_subcommands() -> None:
    # Each layer owns its commands; these imports are light (heavy ones happen inside commands).
    from iepm.analysis.cli import register as register_analysis
    from iepm.demo import register as register_demo
    from iepm.lab.cli import lab_app
    from iepm.remote.cli import register as register_remote
    from iepm.web.cli import register as register_web

    app.add_typer(lab_app, name="lab")
    register_analysis(app)
    register_web(app)
    register_remote(app)
    register_demo(app)
    __import__("iepm.tuning.cli", fromlist=["register"]).register(app)


_mount_subcommands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
