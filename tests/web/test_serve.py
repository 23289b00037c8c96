"""`iepm serve` wiring: the background server starts and stops cleanly, the command refuses
bad options with a message, and an empty archive serves every page."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
import typer
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from iepm.web.app import create_app
from iepm.web.cli import parse_listen, register
from iepm.web.server import serve_in_background
from testkit.net import free_port

# uvicorn on loopback ports, in this process and as `iepm serve` subprocesses.
pytestmark = pytest.mark.servers


def test_background_server_starts_and_stops(archive_url: str) -> None:
    import sys

    from iepm.web.server import SWITCH_INTERVAL_S

    port = free_port()
    handle = serve_in_background(archive_url, "127.0.0.1", port)
    try:
        # The serving process gets the GIL back quickly from page threads (SWITCH_INTERVAL_S).
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        assert handle.url == f"http://127.0.0.1:{port}/"
        assert httpx.get(f"{handle.url}api/v1/health", timeout=5).json()["status"] == "ok"
        assert httpx.get(f"{handle.url}static/uPlot.iife.min.js", timeout=5).status_code == 200
    finally:
        handle.stop()
    assert not handle.thread.is_alive()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        ("[::1]:9000", ("::1", 9000)),
        (":8080", ("0.0.0.0", 8080)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


def test_serve_command_rejects_bad_options(tmp_path: Path) -> None:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """iepm"""

    register(app)
    runner = CliRunner()
    bad_listen = runner.invoke(
        app, ["serve", "--db", f"sqlite:///{tmp_path}/a.db", "--listen", "localhost"]
    )
    assert bad_listen.exit_code == 2
    assert "expected ADDR:PORT" in bad_listen.output
    bad_db = runner.invoke(app, ["serve", "--db", "mysql://x/y", "--listen", "127.0.0.1:1"])
    assert bad_db.exit_code == 2
    assert "unsupported database" in bad_db.output


def test_empty_archive_serves_every_page(tmp_path: Path) -> None:
    with TestClient(create_app(f"sqlite:///{tmp_path / 'empty.db'}")) as client:
        for url in [
            "/",
            "/compare",
            "/api/v1/targets",
            "/api/v1/latest",
            "/metrics",
            "/api/v1/results",
            "/tables/paths?format=tsv",
            "/api/v1/alerts",
            "/api/v1/studies",
            "/tables/alerts",
        ]:
            response = client.get(url)
            assert response.status_code == 200, (url, response.text)
        assert "No ping or iperf3 results" in client.get("/").text
        assert client.get("/api/v1/results").json() == {
            "total": 0,
            "limit": 100,
            "offset": 0,
            "results": [],
        }


def test_cache_computes_once_for_simultaneous_requests(archive_url: str) -> None:
    import threading
    import time

    from iepm.web.queries import Queries

    queries = Queries(archive_url, cache_ttl_s=60)
    calls: list[int] = []

    def slow() -> int:
        calls.append(1)
        time.sleep(0.2)
        return 42

    try:
        threads = [threading.Thread(target=queries.cached, args=(("k",), slow)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert calls == [1]
        assert queries.cached(("k",), slow) == 42 and calls == [1]
    finally:
        queries.close()


def test_an_expired_page_is_served_stale_while_refreshed_and_a_too_old_one_anew(
    archive_url: str,
) -> None:
    import threading
    import time

    from iepm.web import queries as queries_module
    from iepm.web.queries import Queries

    queries = Queries(archive_url, cache_ttl_s=0.2)
    version = [0]
    started, release = threading.Event(), threading.Event()

    def compute() -> int:
        version[0] += 1
        if version[0] == 2:  # the background refresh: held until the test lets it go
            started.set()
            release.wait(10)
        return version[0]

    try:
        assert queries.cached(("page",), compute) == 1
        time.sleep(0.25)  # expired, but younger than STALE_SERVED_FOR TTLs
        t0 = time.monotonic()
        assert queries.cached(("page",), compute) == 1  # the stale copy, at once
        assert time.monotonic() - t0 < 1.0
        assert started.wait(5)  # ...while the refresh runs in the background
        assert queries.cached(("page",), compute) == 1  # still the copy, no second refresh
        release.set()
        deadline = time.monotonic() + 5
        while queries.cached(("page",), compute) != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queries.cached(("page",), compute) == 2 and version[0] == 2
        # Far older than STALE_SERVED_FOR TTLs: computed for the request itself.
        time.sleep(0.2 * queries_module.STALE_SERVED_FOR + 0.1)
        assert queries.cached(("page",), compute) == 3
    finally:
        release.set()
        queries.close()


def test_ready_answers_only_what_is_cached_and_refreshes_a_stale_copy(archive_url: str) -> None:
    import time

    from iepm.web.queries import Queries

    queries = Queries(archive_url, cache_ttl_s=0.2)
    version = [0]

    def compute() -> int:
        version[0] += 1
        return version[0]

    try:
        assert queries.ready(("page",), compute) is None and version == [0]  # nothing computed
        assert queries.cached(("page",), compute) == 1
        assert queries.ready(("page",), compute) == 1  # fresh
        time.sleep(0.25)
        assert queries.ready(("page",), compute) == 1  # stale copy; refreshed in the background
        deadline = time.monotonic() + 5
        while queries.ready(("page",), compute) != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert queries.ready(("page",), compute) == 2
    finally:
        queries.close()


def test_multi_worker_connections_get_tcp_nodelay() -> None:
    """The socket ``--workers N`` listens on is TCP, so asyncio disables Nagle's algorithm on
    every connection it accepts (with the socket uvicorn binds it did not: each keep-alive
    response then waited for the client's delayed ACK)."""
    import asyncio
    import socket

    from iepm.web.server import TcpConfig

    config = TcpConfig("iepm.web.server:app_from_env", host="127.0.0.1", port=0, workers=2)
    listener = config.bind_socket()
    nodelay: list[int] = []

    class Report(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            sock = transport.get_extra_info("socket")
            nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Report, sock=listener)
        port = listener.getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await reader.read()  # closed by the server once it has looked at the socket
        writer.close()
        server.close()
        await server.wait_closed()

    try:
        asyncio.run(asyncio.wait_for(accept_one(), 10))
    finally:
        listener.close()
    assert listener.proto == socket.IPPROTO_TCP
    assert nodelay == [1]


SERVE = """
import sys, typer
from iepm.web.cli import register
app = typer.Typer()
app.callback()(lambda: None)
register(app)
app(sys.argv[1:])
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_command_serves_and_stops_on_sigterm(archive_url: str, workers: int) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    port = free_port()
    argv = [
        "serve",
        "--db",
        archive_url,
        "--listen",
        f"127.0.0.1:{port}",
        "--workers",
        str(workers),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/targets/cern-1", timeout=10).is_success
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught (one worker) or
        # exits 0 (the supervisor of several).
        assert proc.wait(timeout=20) in (0, -signal.SIGTERM)
        assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_pages_are_computed_by_a_few_threads_of_their_own(
    archive_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many concurrent page computations share PAGE_THREADS threads (not anyio's 40, which
    pass the GIL to each other in 5 ms turns), and every one of them is answered."""
    import asyncio
    import threading
    from datetime import timedelta

    from iepm.results import format_time
    from iepm.web import context
    from iepm.web.pages import target
    from tests.web import data

    computing: list[str] = []
    real = target.target_page

    def recorded(*args: object, **kwargs: object) -> object:
        computing.append(threading.current_thread().name)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(target, "target_page", recorded)
    app = create_app(archive_url, cache_ttl_s=0)

    async def visit_all() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://iepm") as client:
            # A distinct `until` per request: each page is computed for that very request.
            ends = [data.END - timedelta(hours=h) for h in range(12)]
            answers = await asyncio.gather(
                *(client.get(f"/targets/kek-3?until={format_time(end)}") for end in ends)
            )
        return [answer.status_code for answer in answers]

    assert asyncio.run(visit_all()) == [200] * 12
    assert len(computing) == 12
    assert all(name.startswith("iepm-page") for name in computing)
    assert len(set(computing)) <= context.PAGE_THREADS


def test_api_docs_load_nothing_from_outside(client: TestClient) -> None:
    import re

    html = client.get("/docs").text
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(a.startswith("/static/docs/") for a in assets), assets
    for asset in assets:
        assert client.get(asset).status_code == 200, asset
    assert "url: '/openapi.json'" in html
