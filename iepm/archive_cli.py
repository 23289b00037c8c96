"""``iepm archive``: keep an archive for years (``prune``) and quick to read (``maintain``).
Outside iepm.store so that the command line starts without loading the archive's libraries."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from iepm.cliglue import GuardedTyper, open_archive
from iepm.errors import UsageError

archive_app = GuardedTyper(help="The archive: retention, maintenance.", no_args_is_help=True)


@archive_app.command("prune")
def prune_cmd(
    keep_days: Annotated[
        float | None,
        typer.Option(help="Keep results this many days (default: the config's keep_results_days)."),
    ] = None,
    log_dir: Annotated[
        Path | None, typer.Option(help="Raw-log directory (default: the config's log_dir).")
    ] = None,
    compress_after_days: Annotated[
        float | None, typer.Option(help="Gzip raw logs older than this many days.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only; remove nothing.")] = False,
    maintain: Annotated[
        bool, typer.Option(help="Then run `iepm archive maintain` (PostgreSQL).")
    ] = True,
    db: Annotated[str | None, typer.Option("--db", help="Archive URL.")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="targets.toml")] = None,
) -> None:
    """Remove results, cycles and flow records older than the retention (daily summaries,
    alerts and studies stay), and rotate raw logs; report what was removed. Then (unless
    --dry-run or --no-maintain) the maintenance of `iepm archive maintain`."""
    from iepm.store.maintenance import maintain as maintain_archive
    from iepm.store.retention import prune

    if log_dir is not None and not log_dir.is_dir():
        raise UsageError(f"--log-dir {log_dir}: no such directory")
    if config is not None:
        from iepm.config import load_config

        monitor = load_config(config).monitor
        keep_days = keep_days if keep_days is not None else monitor.keep_results_days
        if compress_after_days is None:
            compress_after_days = monitor.compress_logs_after_days
        if log_dir is None and Path(monitor.log_dir).is_dir():
            log_dir = Path(monitor.log_dir)
    if keep_days is None:
        raise UsageError("give --keep-days N, or --config with [monitor] keep_results_days")
    if keep_days <= 0:
        raise UsageError(f"--keep-days: must be positive (got {keep_days:g})")
    # An archive that does not exist has nothing to prune: never create one here.
    with open_archive(db, config, reading=True) as archive:
        report = prune(
            archive,
            keep_days=keep_days,
            dry_run=dry_run,
            log_dir=log_dir,
            compress_after_days=compress_after_days,
        )
        sys.stdout.write("\n".join(report.lines()) + "\n")
        if maintain and not dry_run:
            sys.stdout.write("\n".join(maintain_archive(archive).lines()) + "\n")


@archive_app.command("maintain")
def maintain_cmd(
    recluster: Annotated[
        bool, typer.Option("--recluster", help="Cluster closed months clustered before again.")
    ] = False,
    open_month: Annotated[
        bool,
        typer.Option(
            "--open-month",
            help="Cluster this month too: its writers wait while it is rewritten (a quiet hour).",
        ),
    ] = False,
    db: Annotated[str | None, typer.Option("--db", help="Archive URL.")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="targets.toml")] = None,
) -> None:
    """On PostgreSQL: cluster each closed month of results by path (once), vacuum and analyse
    every partition and the daily summaries, make the months ahead; report what was done.
    Nothing on SQLite. `iepm archive prune` runs it too."""
    from iepm.store.maintenance import maintain

    with open_archive(db, config, reading=True) as archive:
        report = maintain(archive, recluster=recluster, open_month=open_month)
    sys.stdout.write("\n".join(report.lines()) + "\n")


def register(app: typer.Typer) -> None:
    """Add ``iepm archive`` to the ``iepm`` command."""
    app.add_typer(archive_app, name="archive")
