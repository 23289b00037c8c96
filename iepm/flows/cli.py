"""``iepm flows``: collect, import, list instances, compare active with passive."""

from __future__ import annotations

import csv
import json
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from iepm.cliglue import GuardedTyper, archive_url, open_archive, parse_moment
from iepm.errors import UsageError

flows_app = GuardedTyper(
    help="Passive flows: NetFlow v5/v9 and IPFIX records against iepm's active tests.",
    no_args_is_help=True,
)

DbOpt = Annotated[str | None, typer.Option("--db", help="Archive URL (default: the config's).")]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="targets.toml naming the archive.")
]
SinceOpt = Annotated[str | None, typer.Option("--since", help="From this time (ISO, UTC).")]
UntilOpt = Annotated[str | None, typer.Option("--until", help="Until this time (ISO, UTC).")]
WindowOpt = Annotated[
    float,
    typer.Option("--window-s", min=0.0, max=3600.0, help="Flows starting this close join."),
]
FormatOpt = Annotated[str, typer.Option("--format", help="table, csv or json.")]


def register(app: typer.Typer) -> None:
    app.add_typer(flows_app, name="flows")


def _listen(text: str) -> tuple[str, int]:
    """ADDR:PORT as ``iepm serve`` takes it, and port 0 for any free port (printed once bound)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise UsageError(f"--listen: expected ADDR:PORT such as 0.0.0.0:2055, got {text[:80]!r}")
    return host.strip("[]") or "0.0.0.0", int(port_text)


def _ms(value: str | None, option: str) -> int | None:
    moment = parse_moment(value, option)
    return None if moment is None else int(moment.timestamp() * 1000)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _print(rows: list[dict[str, Any]], fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
    elif fmt in ("csv", "tsv"):
        if rows:
            writer = csv.DictWriter(
                sys.stdout, fieldnames=list(rows[0]), delimiter="," if fmt == "csv" else "\t"
            )
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "table":
        if not rows:
            return
        keys = list(rows[0])
        cells = [[_cell(r[k]) for k in keys] for r in rows]
        widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
        print("  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)))
        for c in cells:
            print("  ".join(v.rjust(w) for v, w in zip(c, widths, strict=True)))
    else:
        raise UsageError(f"--format: expected table, csv, tsv or json, got {fmt!r}")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@flows_app.command("collect")
def collect_command(
    listen: Annotated[str, typer.Option("--listen", help="ADDR:PORT to receive exports on.")],
    db: DbOpt = None,
    config: ConfigOpt = None,
    batch: Annotated[int, typer.Option(min=1, max=1_000_000, help="Records per write.")] = 5000,
    flush_s: Annotated[
        float, typer.Option(min=0.01, max=600, help="Write at least this often.")
    ] = 1.0,
    duration_s: Annotated[
        float | None, typer.Option(min=0.1, help="Stop after this long (default: until TERM).")
    ] = None,
    write_deadline_s: Annotated[
        float, typer.Option(min=0.1, max=3600, help="Give up a write after this long.")
    ] = 30.0,
    rcvbuf_bytes: Annotated[
        int, typer.Option(min=65536, max=1 << 30, help="Socket receive buffer (absorbs bursts).")
    ] = 64 << 20,
    spool_mb: Annotated[
        int,
        typer.Option(min=1, max=1 << 16, help="Datagrams held while the archive is behind."),
    ] = 512,
    progress_s: Annotated[
        float | None,
        typer.Option(
            min=0.1,
            max=3600,
            help="Print the records decoded and stored so far to stderr this often.",
        ),
    ] = None,
) -> None:
    """Receive NetFlow v5/v9 and IPFIX on ADDR:PORT and store the records; on TERM or Ctrl-C,
    store what is pending and print the counts (records, loss, bad packets) as JSON."""
    from iepm.flows.collector import Collector

    host, port = _listen(listen)
    url = archive_url(db, config)
    open_archive(db, config, reading=False).close()  # created and migrated here, once
    collector = Collector(
        url, host, port, batch_records=batch, flush_s=flush_s,
        write_deadline_s=write_deadline_s, rcvbuf_bytes=rcvbuf_bytes,
        spool_bytes=spool_mb << 20, progress_s=progress_s,
    )  # fmt: skip
    bound = collector.address
    sys.stderr.write(f"listening on {bound[0]}:{bound[1]}\n")
    sys.stderr.flush()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: collector.stop.set())
    # Records are queued from the start; this line says the archive is taking them too.
    threading.Thread(target=_say_ready, args=(collector.ready,), daemon=True).start()
    report = collector.run(duration_s)
    sys.stdout.write(json.dumps(report.as_dict()) + "\n")


def _say_ready(ready: threading.Event) -> None:
    if ready.wait(timeout=3600):
        sys.stderr.write("storing records\n")
        sys.stderr.flush()


@flows_app.command("import")
def import_command(
    files: Annotated[list[Path], typer.Argument(help="nfcapd files (read with nfdump).")],
    db: DbOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Store the flow records of nfcapd files; a record already stored is not stored again."""
    from iepm.flows.nfimport import read_nfcapd
    from iepm.flows.store import add_flows

    archive = open_archive(db, config, reading=False)
    try:
        for path in files:
            flows = list(read_nfcapd(path))
            new = add_flows(archive, flows, f"nfcapd:{path.name}")
            print(f"{path}: {len(flows)} records, {new} new")
    finally:
        archive.close()


@flows_app.command("instances")
def instances_command(
    db: DbOpt = None,
    config: ConfigOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    window_s: WindowOpt = 5.0,
    min_bytes: Annotated[int, typer.Option(min=0, help="Only instances this large.")] = 1_000_000,
    fmt: FormatOpt = "table",
) -> None:
    """Application instances (passive throughput of every host pair, tested or not) with the
    three formulas and long flows flagged."""
    from iepm.flows.instances import group
    from iepm.flows.store import read_flows

    archive = open_archive(db, config, reading=True)
    try:
        flows = list(
            read_flows(archive, since_ms=_ms(since, "--since"), until_ms=_ms(until, "--until"))
        )
    finally:
        archive.close()
    rows = []
    for inst in group(flows, window_s):
        if inst.bytes < min_bytes:
            continue
        rows.append(
            {
                "start": _iso(inst.start_ms), "src": inst.src, "dst": inst.dst,
                "dport": inst.dport, "streams": len(inst.flows), "bytes": inst.bytes,
                "f1_bps": inst.throughput_bps(1), "f2_bps": inst.throughput_bps(2),
                "f3_bps": inst.throughput_bps(3), "long_flows": len(inst.long_flows()),
            }
        )  # fmt: skip
    _print(rows, fmt)


@flows_app.command("compare")
def compare_command(
    db: DbOpt = None,
    config: ConfigOpt = None,
    probe: Annotated[str, typer.Option(help="Active probe whose results are compared.")] = "iperf3",
    since: SinceOpt = None,
    until: UntilOpt = None,
    min_tests: Annotated[int, typer.Option(min=2, help="Tests needed for R.")] = 50,
    ports: Annotated[
        bool, typer.Option("--ports/--no-ports", help="Only flows to the test's server port.")
    ] = True,
    fmt: FormatOpt = "table",
) -> None:
    """Active against passive per target × probe × formula: tests matched, err = (passive −
    active)/passive quartiles, correlation R, and instances with a long flow."""
    from iepm.flows.compare import match, over_hosts, table
    from iepm.flows.store import read_flows

    since_at, until_at = parse_moment(since, "--since"), parse_moment(until, "--until")
    archive = open_archive(db, config, reading=True)
    try:
        results = list(archive.results(probe=probe, since=since_at, until=until_at))
        if not results:
            raise UsageError(f"no {probe} results in the archive for that time range")
        lo = int(min(r.started_at for r in results).timestamp() * 1000) - 60_000
        hi = int(max(r.started_at for r in results).timestamp() * 1000) + 60_000
        flows = list(read_flows(archive, since_ms=lo, until_ms=hi))
    finally:
        archive.close()
    matches, unmatched = match(results, flows, by_port=ports)
    rows = table(matches, min_tests)
    out = [
        {
            "target": r.target, "probe": r.probe, "formula": r.formula, "n": r.n,
            "err_p25": r.err_p25, "err_median": r.err_median, "err_p75": r.err_p75,
            "R": r.r, "long_flows": r.long_flows,
        }
        for r in rows
    ]  # fmt: skip
    _print(out, fmt)
    if fmt == "table":
        print(f"{len(matches)} tests matched to flows, {unmatched} without flows")
        for formula, summary in over_hosts(rows).items():
            print(f"formula {formula}: " + ", ".join(f"{k}={_cell(v)}" for k, v in summary.items()))
