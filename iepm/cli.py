"""The ``iepm`` command line. Its commands and options are a stable interface."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import sys
from enum import StrEnum
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import typer
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from rich.console import Console
from rich.live import Live
from typer.core import TyperGroup

from iepm import __version__
from iepm.cliglue import GuardedTyper, archive_url, fail, open_archive, parse_moment
from iepm.config import Config, load_config
from iepm.errors import IepmError, UsageError, exit_code
from iepm.probes import PROBES, get_probe
from iepm.probes.base import Probe, ProbeContext, ProbeSpec, result_from_raw
from iepm.rawlog import RawLog
from iepm.results import Result
from iepm.runner import RawRun

app = GuardedTyper(
    help="iepm: end-to-end network and application performance monitoring.",
    no_args_is_help=True,
    add_completion=False,
)


class _ProbeCommands(TyperGroup):
    """``iepm probe``: one command per registered probe, built when asked for (so a probe
    registered at run time has its command) from the probe's Spec (_probe_command)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(PROBES)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return _probe_command(PROBES[cmd_name]) if cmd_name in PROBES else None


probe_app = GuardedTyper(
    cls=_ProbeCommands, help="Run one measurement now and print the result.", no_args_is_help=True
)
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
TargetArg = Annotated[
    str, typer.Argument(help="Address, host name, or target name (--config).", show_default=False)
]
# Options every probe command has: no Spec field may take their names.
COMMON_OPTIONS = ("json", "netns", "config", "log-dir", "store", "help")


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
                from iepm.remote.lease import server_source

                ctx.servers = server_source(config.target(name).remote())
        result: Result = asyncio.run(module.run(spec, ctx))
        if store:
            from iepm.store import Archive

            with Archive.open(store) as archive:
                archive.add(result)
    except IepmError as exc:
        raise fail(str(exc), exit_code(exc)) from None
    except ValidationError as exc:
        raise fail(_option_problems(module, exc)) from None
    except ValueError as exc:
        raise fail(f"invalid {probe} option: {exc}") from None
    _print_result(result, as_json)
    raise typer.Exit(0 if result.succeeded else 1)


def _print_result(result: Result, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(result.envelope(), indent=2) + "\n")
    else:
        from iepm.console import describe

        console.print(describe(result), end="")


def _probe_command(probe: Probe) -> Any:
    """``iepm probe NAME``, generated from the probe's Spec: one option per field (its CLI
    name from ``json_schema_extra={"cli": ...}``, else the field's name), with the field's
    description, range and default in --help. Unset options leave the config's values."""
    params: list[inspect.Parameter] = []
    if not probe.META.local:
        params.append(_keyword("target", TargetArg, inspect.Parameter.empty))
    fields: dict[str, str] = {}  # parameter name → Spec field
    for name, info in probe.Spec.model_fields.items():
        cli = _cli_name(name, info)
        if cli in COMMON_OPTIONS:
            raise ValueError(f"probe {probe.NAME!r}: field {name!r} takes the CLI name --{cli}")
        fields[f"spec_{name}"] = name
        params.append(_keyword(f"spec_{name}", _option_type(info, cli), None))
    params += [
        _keyword("as_json", JsonOpt, False),
        _keyword("netns", NetnsOpt, None),
        *([] if probe.META.local else [_keyword("config", ConfigOpt, None)]),
        _keyword("log_dir", LogDirOpt, None),
        _keyword("store", StoreOpt, None),
    ]

    def command(**given: Any) -> None:
        target = given.get("target")
        if target is None:  # a probe of this host
            import socket

            target = socket.gethostname()
        _run_probe(
            probe.NAME,
            target,
            {field: given[param] for param, field in fields.items()},
            as_json=given["as_json"],
            netns=given["netns"],
            config_path=given.get("config"),
            log_dir=given["log_dir"],
            store=given["store"],
        )

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    # The first paragraph of the module's docstring says what the probe measures.
    doc = (getattr(probe, "__doc__", None) or probe.NAME).strip().split("\n\n")[0]
    one = typer.Typer(add_completion=False)
    one.command(probe.NAME, help=doc.replace("``", ""))(command)
    return typer.main.get_command(one)


def _keyword(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


def _option_problems(module: Probe, exc: ValidationError) -> str:
    """``--count: Input should be greater than or equal to 1 (got 0)``: each error named by the
    option a person typed (a target's configured value is named by its field), one line each."""
    from iepm.tomlload import describe

    fields = module.Spec.model_fields
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        name = f"--{_cli_name(field, fields[field])}" if field in fields else field or module.NAME
        lines.append(f"{name}: {describe(error)}")
    return "; ".join(lines)


def _cli_name(field: str, info: FieldInfo) -> str:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return str(extra.get("cli") or field).replace("_", "-")


def _option_type(info: FieldInfo, cli: str) -> Any:
    """``Annotated[<type> | None, typer.Option(...)]`` for one Spec field."""
    kind = info.annotation
    if get_origin(kind) in (Union, UnionType):  # X | None: the option is X
        kinds = [a for a in get_args(kind) if a is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else str
    decl = f"--{cli}/--no-{cli}" if kind is bool else f"--{cli}"
    return Annotated[kind | None, typer.Option(decl, help=_field_help(info))]


def _field_help(info: FieldInfo) -> str:
    bounds = {type(m).__name__: m for m in info.metadata}
    low = bounds.get("Ge") or bounds.get("Gt")
    high = bounds.get("Le") or bounds.get("Lt")
    parts = []
    if low is not None or high is not None:
        lo = "" if low is None else f"{'>' if 'Gt' in bounds else ''}{_plain(low)}"
        hi = "" if high is None else f"{'<' if 'Lt' in bounds else ''}{_plain(high)}"
        parts.append(f"{lo}–{hi}")
    if info.default is not None and info.default is not PydanticUndefined:
        parts.append(f"default {info.default}")
    text = info.description or ""
    return f"{text} [{'; '.join(parts)}]" if parts else text


def _plain(bound: Any) -> str:
    value = next(getattr(bound, k) for k in ("ge", "gt", "le", "lt") if hasattr(bound, k))
    return f"{value:g}" if isinstance(value, float) else str(value)


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
def validate_cmd(
    config: Annotated[Path, typer.Argument(help="targets.toml or a mesh file to check.")],
) -> None:
    """Check a targets.toml or a mesh file; errors name the file, line and field."""
    from iepm.mesh.cli import describe_mesh, mesh_or_none

    mesh = mesh_or_none(config)
    if mesh is not None:
        console.print(describe_mesh(config, mesh), soft_wrap=True)
        return
    loaded = load_config(config)
    console.print(
        f"{config}: ok — monitor {loaded.monitor.name}, {len(loaded.targets)} targets, "
        f"cycle every {loaded.monitor.cycle_interval_s:g} s"
    )


@app.command("run")
def run_cmd(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="targets.toml")] = None,
    mesh: Annotated[
        Path | None, typer.Option("--mesh", help="A mesh file (re-read every cycle); needs --as.")
    ] = None,
    host: Annotated[
        str | None, typer.Option("--as", help="This host's name in the --mesh file.")
    ] = None,
    control: Annotated[
        bool,
        typer.Option(
            "--control",
            help="Be the --mesh file's control host: run every host's tests through its agent.",
        ),
    ] = False,
    once: Annotated[bool, typer.Option("--once", help="Run one cycle and exit.")] = False,
    cycles: Annotated[int | None, typer.Option(help="Run this many cycles and exit.")] = None,
    live: Annotated[bool, typer.Option("--live/--no-live", help="Show a live table.")] = True,
) -> None:
    """Run measurement cycles as the config says (forever, unless --once or --cycles)."""
    from iepm.console import LiveTable
    from iepm.scheduler import CycleReport, Scheduler
    from iepm.store import Archive

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    configure = None
    host_lease = None
    count = 1 if once else cycles
    if control:
        if mesh is None or config is not None or host is not None:
            raise fail("--control goes with --mesh FILE alone (no --config, no --as)", 2)
        _run_control(mesh, count)
        return
    try:
        if (config is None) == (mesh is None) or (mesh is None) != (host is None):
            raise UsageError(
                "give either --config FILE or --mesh FILE --as HOST (or --mesh FILE --control)"
            )
        if mesh is not None and host is not None:
            from iepm.mesh import MeshSource

            configure = MeshSource(mesh, host)
            loaded = configure(1)
            host_lease = configure.leases()
        else:
            assert config is not None
            loaded = load_config(config)
        # Not opened yet: a monitor restarted while its archive is down (full disk, database
        # stopped) measures and spools, and the schema is checked once the archive answers.
        archive = Archive.connect(loaded.monitor.archive)
    except IepmError as exc:
        raise fail(str(exc), exit_code(exc)) from None
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

        scheduler = Scheduler(
            loaded, archive, on_result=on_result, configure=configure, host_lease=host_lease
        )

        def on_cycle(report: CycleReport) -> None:
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items()))
            state = scheduler.health.degraded()
            console.print(
                f"cycle {report.number}: {report.n_results} results ({outcomes}) in "
                f"{report.duration_s:.1f} s"
                + (" — OVERRAN its interval" if report.overran else "")
                + (f" — {state}" if state else "")
                + (_lease_line(scheduler.health) if host_lease is not None else "")
            )

        try:
            asyncio.run(scheduler.run(cycles=count, on_cycle=on_cycle))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        finally:
            if host_lease is not None:
                host_lease.close()


def _run_control(mesh: Path, count: int | None) -> None:
    """``iepm run --mesh FILE --control``: every source host's cycles, through its agent."""
    from iepm.mesh.control import Control
    from iepm.scheduler import CycleReport
    from iepm.store import Archive

    try:
        control = Control(mesh)
        archives = []

        def archive_for(config: Config) -> Archive:
            archives.append(Archive.connect(config.monitor.archive))
            return archives[-1]

        def on_result(result: Result) -> None:
            sys.stdout.write(
                f"{result.started_at:%Y-%m-%dT%H:%M:%SZ} {result.monitor} -> {result.target} "
                f"{result.probe} {result.outcome.value}: {_line(result)} [{result.id}]\n"
            )
            sys.stdout.flush()

        sources = control.build(archive_for, on_result)
    except IepmError as exc:
        raise fail(str(exc), exit_code(exc)) from None
    by_host = {s.host: s for s in sources}

    def on_cycle(host: str, report: CycleReport) -> None:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items()))
        console.print(
            f"{host} cycle {report.number}: {report.n_results} results ({outcomes}) in "
            f"{report.duration_s:.1f} s"
            + (" — OVERRAN its interval" if report.overran else "")
            + (_lease_line(by_host[host].scheduler.health) if by_host[host].leases else "")
        )

    try:
        asyncio.run(control.run(count, on_cycle))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        control.close()
        for archive in archives:
            archive.close()


def _lease_line(health: Any) -> str:
    return (
        f" — host leases: waited {health.lease_wait_s:.1f} s in all, "
        f"{health.lease_refusals} tests refused"
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
        # An unknown target is a mistake to say, as the API's 404 does, not an empty table.
        if target is not None and archive.count(target=target, purpose=None) == 0:
            known = ", ".join(archive.targets()[:20]) or "none yet"
            raise fail(f"--target {target!r}: no results in the archive (targets: {known})")
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
    from iepm.archive_cli import register as register_archive
    from iepm.demo import register as register_demo
    from iepm.flows.cli import register as register_flows
    from iepm.lab.cli import lab_app
    from iepm.mesh.cli import register as register_mesh
    from iepm.remote.cli import register as register_remote
    from iepm.web.cli import register as register_web

    app.add_typer(lab_app, name="lab")
    register_analysis(app)
    register_web(app)
    register_remote(app)
    register_demo(app)
    register_mesh(app)
    register_archive(app)
    register_flows(app)
    __import__("iepm.tuning.cli", fromlist=["register"]).register(app)


_mount_subcommands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
