"""``iepm serve``: the dashboard, REST API and /metrics (run by iepm.web.server)."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer

from iepm.errors import IepmError


def parse_listen(text: str) -> tuple[str, int]:
    """``127.0.0.1:8080``, ``[::1]:8080`` or ``:8080`` (all addresses) → (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--listen: expected ADDR:PORT such as 127.0.0.1:8080, got {text!r}")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


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
) -> None:
    """Serve the report pages, the REST API (/api/v1, docs at /docs) and /metrics."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from iepm.config import load_config
    from iepm.web.places import places_of
    from iepm.web.server import (
        CONFIG_ENV,
        GRACEFUL_SHUTDOWN_S,
        URL_ENV,
        TcpConfig,
        uvicorn_config,
    )

    try:
        host, port = parse_listen(listen)
        places = places_of(load_config(targets_toml)) if targets_toml else None
        config = uvicorn_config(db, host, port, None, places)
    except (IepmError, ValueError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise typer.Exit(2) from None
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"iepm: serving {db} on http://{shown}:{port}/ (Ctrl-C stops)\n")
    if workers > 1:
        # The archive opened above proved the URL; each worker opens its own (pages are
        # CPU-bound Python: processes, not threads, use more than one core). uvicorn's
        # supervisor forwards SIGINT/SIGTERM to the workers, which shut down gracefully.
        os.environ[URL_ENV] = db
        if targets_toml:
            os.environ[CONFIG_ENV] = targets_toml
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
            sys.stderr.write(f"error: could not listen on {listen}: {exc.strerror or exc}\n")
            raise typer.Exit(1) from None
        with contextlib.suppress(KeyboardInterrupt):
            Multiprocess(config, sockets=[sock]).run()
        return
    # uvicorn handles SIGINT/SIGTERM: stop accepting, let requests finish, then exit.
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        sys.stderr.write(f"error: could not listen on {listen}\n")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``iepm serve`` to the ``iepm`` command."""
    app.command("serve")(serve_command)
