"""``iepm serve``: the dashboard, REST API and /metrics (run by iepm.web.server)."""

# parse_listen is imported from here by the demo and the tests.

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer

from iepm.cliglue import existing_archive_url, fail, guarded, parse_listen
from iepm.errors import ExitCode


def serve_command(
    db: Annotated[str, typer.Option("--db", help="Archive URL (sqlite:///… or postgresql+…).")],
    listen: Annotated[
        str, typer.Option("--listen", help="ADDR:PORT to listen on.")
    ] = "127.0.0.1:8080",
    workers: Annotated[
        int, typer.Option("--workers", min=1, max=64, help="Worker processes (one per core).")
    ] = 1,
    targets_toml: Annotated[
        str | None,
        typer.Option("--config", help="targets.toml: pages group targets by its site and group."),
    ] = None,
    thresholds_toml: Annotated[
        str | None,
        typer.Option(
            "--thresholds",
            help="thresholds.toml: health thresholds per metric, overridden per group or target "
            '([defaults."ping.loss_percent"] warn = 0.5, [targets.NAME."metric"] reference = …).',
        ),
    ] = None,
) -> None:
    """Serve the report pages, the REST API (/api/v1, docs at /docs) and /metrics."""
    from uvicorn.supervisors import Multiprocess

    from iepm.config import load_config
    from iepm.web.health import load_thresholds
    from iepm.web.places import places_of
    from iepm.web.server import (
        CONFIG_ENV,
        GRACEFUL_SHUTDOWN_S,
        THRESHOLDS_ENV,
        URL_ENV,
        Server,
        TcpConfig,
        uvicorn_config,
    )

    try:
        host, port = parse_listen(listen)
    except ValueError as exc:
        raise fail(str(exc)) from None
    places = places_of(load_config(targets_toml)) if targets_toml else None
    thresholds = load_thresholds(thresholds_toml)  # a bad file stops here, before serving
    # Serving only reads: a mistyped --db must not leave a new empty archive behind.
    config = uvicorn_config(existing_archive_url(db, None), host, port, None, places, thresholds)
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"iepm: serving {db} on http://{shown}:{port}/ (Ctrl-C stops)\n")
    if workers > 1:
        # The archive opened above proved the URL; each worker opens its own (pages are
        # CPU-bound Python: processes, not threads, use more than one core). uvicorn's
        # supervisor forwards SIGINT/SIGTERM to the workers, which shut down gracefully.
        os.environ[URL_ENV] = db
        if targets_toml:
            os.environ[CONFIG_ENV] = targets_toml
        if thresholds_toml:
            os.environ[THRESHOLDS_ENV] = thresholds_toml
        config = TcpConfig(
            "iepm.web.server:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level="warning",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            access_log=False,
        )
        try:
            sock = config.bind_socket()
        except OSError as exc:
            message = f"could not listen on {listen}: {exc.strerror or exc}"
            raise fail(message, ExitCode.FAILED) from None
        with contextlib.suppress(KeyboardInterrupt):
            Multiprocess(config, sockets=[sock]).run()
        return
    # uvicorn handles SIGINT/SIGTERM: stop accepting, let requests finish, then exit.
    server = Server(config)
    server.run()
    if not server.started:
        raise fail(f"could not listen on {listen}", ExitCode.FAILED)


def register(app: typer.Typer) -> None:
    """Add ``iepm serve`` to the ``iepm`` command."""
    app.command("serve")(guarded(serve_command))
