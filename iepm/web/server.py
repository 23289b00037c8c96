"""The web server's machinery: uvicorn configured for iepm, a server in a background thread
(the demo, the browser tests) and the multi-worker socket fix. ``iepm serve`` (iepm.web.cli)
imports it only when it serves, so other command lines do not load uvicorn."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import uvicorn

from iepm.errors import IepmError

if TYPE_CHECKING:
    from iepm.scheduler import SchedulerHealth
    from iepm.web.health import Thresholds
    from iepm.web.places import Places

# Worker processes read the archive URL from here (uvicorn starts them from an import string).
URL_ENV = "IEPM_SERVE_ARCHIVE"
CONFIG_ENV = "IEPM_SERVE_CONFIG"
THRESHOLDS_ENV = "IEPM_SERVE_THRESHOLDS"
# Requests in flight get this long to finish on SIGINT/SIGTERM before connections are closed.
GRACEFUL_SHUTDOWN_S = 10
START_TIMEOUT_S = 15.0
# While a thread computes a page (0.7–2.5 s for the overview's background refresh), the event
# loop waits up to the GIL's switch interval each time it wants the GIL back (every socket
# call): at Python's 5 ms, cached pages answered during a refresh took up to 0.7–1.3 s (p99).
# At 0.5 ms: p99 17–19 ms in every run (benchmarks/web.py, SQLite, 2 runs each). A setting of
# the whole interpreter: made by the process that serves (iepm serve, its workers, the demo),
# not by the app.
SWITCH_INTERVAL_S = 0.0005


def tune_interpreter() -> None:
    """Settings of this process for serving pages (see SWITCH_INTERVAL_S)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def uvicorn_config(
    archive_url: str,
    host: str,
    port: int,
    health: SchedulerHealth | None,
    places: Places | None = None,
    thresholds: Thresholds | None = None,
    cache_ttl_s: float = 30.0,
) -> uvicorn.Config:
    from iepm.web.app import create_app

    tune_interpreter()
    app = create_app(
        archive_url,
        health=health,
        places=places,
        thresholds=thresholds,
        cache_ttl_s=cache_ttl_s,
    )
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # The archive is the only state: no reload, no proxy headers, one process.
        access_log=False,
    )


class Server(uvicorn.Server):
    """uvicorn's server that first ends the live pages' event streams when it shuts down:
    they never end by themselves, and uvicorn would wait for them until its graceful timeout
    (GRACEFUL_SHUTDOWN_S) before cancelling them."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        from iepm.web.live import end_streams

        await end_streams(self.config.app)
        await super().shutdown(sockets)


@dataclass
class ServerHandle:
    """A server running in a thread of this process; ``stop()`` shuts it down gracefully."""

    server: uvicorn.Server
    thread: threading.Thread
    url: str

    def stop(self, timeout_s: float = GRACEFUL_SHUTDOWN_S + 5) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(5)


def serve_in_background(
    archive_url: str,
    host: str = "127.0.0.1",
    port: int = 8080,
    health: SchedulerHealth | None = None,
    places: Places | None = None,
    cache_ttl_s: float = 30.0,
) -> ServerHandle:
    """Serve the dashboard from a thread (the demo does this beside its scheduler, passing the
    scheduler's ``health`` so /metrics shows its archive write failures). Returns once the
    server accepts connections; raises IepmError if it could not start."""
    config = uvicorn_config(archive_url, host, port, health, places, cache_ttl_s=cache_ttl_s)
    server = Server(config)
    # Signals belong to the main program (the demo stops us with stop()).
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, name=f"iepm-web-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(5)
            raise IepmError(f"the web server could not start on {host}:{port}")
        time.sleep(0.02)
    shown = f"[{host}]" if ":" in host else host
    return ServerHandle(server, thread, f"http://{shown}:{port}/")


class TcpConfig(uvicorn.Config):
    """uvicorn's multi-worker supervisor binds the listening socket with ``proto`` 0; accepted
    connections inherit it, and asyncio turns TCP_NODELAY on only when ``proto`` is
    IPPROTO_TCP. With Nagle's algorithm on, every keep-alive response waited ~40 ms for the
    client's delayed ACK (uvicorn issue #3149): every request of ``--workers 2`` took 44 ms,
    even /api/v1/health. This one binds it as TCP."""

    def bind_socket(self) -> socket.socket:
        family = socket.AF_INET6 if self.host and ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(True)
        return sock


def app_from_env() -> object:
    """The app of one worker process (``--workers N``): its archive URL is in the environment,
    and the paths of targets.toml (``--config``) and thresholds.toml (``--thresholds``) when
    given."""
    from iepm.config import load_config
    from iepm.web.app import create_app
    from iepm.web.health import load_thresholds
    from iepm.web.places import places_of

    tune_interpreter()
    config = os.environ.get(CONFIG_ENV)
    places = places_of(load_config(config)) if config else None
    thresholds = load_thresholds(os.environ.get(THRESHOLDS_ENV))
    return create_app(os.environ[URL_ENV], places=places, thresholds=thresholds)
