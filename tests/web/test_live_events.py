"""``/live/events`` on SQLite and PostgreSQL, served by uvicorn on a free port and read by a
real HTTP client: published samples arrive (filtered), a reconnect resumes from Last-Event-ID,
a stream far behind catches up in bounded batches, new light-probe results and running tests
arrive, a client that leaves is noticed, PostgreSQL's NOTIFY wakes the stream with no poll, and
the server's shutdown ends open streams without waiting for its graceful timeout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from iepm.probes import ping
from iepm.probes.base import ProbeContext
from iepm.store import Archive, live
from iepm.store.live import LiveSample
from iepm.web import live as web_live
from iepm.web.server import ServerHandle, serve_in_background
from testkit.net import free_port
from testkit.pg import PgServer

# uvicorn on a free loopback port, read by a real HTTP client.
pytestmark = pytest.mark.servers

DEADLINE_S = 20.0


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.pg)])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A new archive on either database (tests/web's own ``archive_url`` is one shared
    SQLite file)."""
    if request.param == "sqlite":
        with tempfile.TemporaryDirectory(prefix="iepm-live-test-") as path:
            yield f"sqlite:///{Path(path) / 'iepm.db'}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = f"iepm_live_{uuid.uuid4().hex[:12]}"
    try:
        yield server.create_database(name)
    finally:
        server.drop_database(name)


@pytest.fixture
def archive(url: str) -> Iterator[Archive]:
    with Archive.open(url) as opened:
        yield opened


@pytest.fixture
def served(url: str, archive: Archive) -> Iterator[ServerHandle]:
    handle = serve_in_background(url, port=free_port(), cache_ttl_s=0)
    try:
        yield handle
    finally:
        handle.stop()


def until(condition: Callable[[], Any], seconds: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    return condition()


class Events:
    """A server-sent-event client in a thread: every event as a dict (event, id, data)."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.comments = 0
        self.ended = False
        self.failure: BaseException | None = None
        self._client = httpx.Client(timeout=httpx.Timeout(5.0, read=60.0))
        self._response: httpx.Response | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._read, args=(url, headers or {}))
        self._thread.start()

    def _read(self, url: str, headers: dict[str, str]) -> None:
        try:
            with self._client.stream("GET", url, headers=headers) as response:
                self._response = response
                assert response.status_code == 200, response.read()
                assert response.headers["content-type"].startswith("text/event-stream")
                event: dict[str, Any] = {}
                for line in response.iter_lines():
                    if line.startswith(":"):
                        self.comments += 1
                    elif line == "":
                        if "event" in event:
                            self.events.append(event)
                        event = {}
                    else:
                        field, _, value = line.partition(": ")
                        event[field] = json.loads(value) if field == "data" else value
            self.ended = True
        except (httpx.HTTPError, AssertionError) as exc:
            if not self._closing:
                self.failure = exc

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def samples(self) -> list[list[Any]]:
        return [row for e in self.of("samples") for row in e["data"]["samples"]]

    def close(self) -> None:
        self._closing = True
        if self._response is not None and not self.ended:
            # Another thread is blocked reading: shutting the socket down wakes it (closing
            # the response from here would wait for the next keep-alive).
            stream = self._response.extensions["network_stream"]
            with contextlib.suppress(OSError):
                stream.get_extra_info("socket").shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self._client.close()
        self._thread.join(10)
        assert not self._thread.is_alive()


@pytest.fixture
def events() -> Iterator[Callable[..., Events]]:
    opened: list[Events] = []

    def open_(url: str, headers: dict[str, str] | None = None) -> Events:
        opened.append(Events(url, headers))
        return opened[-1]

    yield open_
    for e in opened:
        e.close()


def hub(handle: ServerHandle) -> web_live.Hub:
    found: web_live.Hub = until(lambda: getattr(handle.server.config.app.state, "live_hub", None))
    return found


def test_published_samples_reach_an_open_stream_filtered(
    archive: Archive, served: ServerHandle, events: Callable[..., Events]
) -> None:
    stream = events(served.url + "live/events?probe=ping")
    assert until(lambda: stream.of("running")), stream.failure  # connected: first event
    now_s = time.time()
    live.publish(archive, "mon", [LiveSample("eth0", "interface", "rx_mbps", now_s, 9.0)])
    newest = live.publish(
        archive, "mon", [LiveSample("a", "ping", "rtt_ms", now_s, 12.5),
                         LiveSample("a", "ping", "rtt_ms", now_s + 1, None)]
    )  # fmt: skip
    assert until(lambda: len(stream.samples()) >= 2), (stream.events, stream.failure)
    assert [row[1:] for row in stream.samples()] == [
        ["a", "ping", "rtt_ms", now_s, 12.5],
        ["a", "ping", "rtt_ms", now_s + 1, None],  # a lost reply stays a gap
    ]
    # The id carries the newest sample sent, which a reconnect resumes from.
    assert stream.of("samples")[-1]["id"].split(".")[0] == str(newest)


def test_a_stream_sends_only_the_targets_asked_for(
    archive: Archive, served: ServerHandle, events: Callable[..., Events]
) -> None:
    stream = events(served.url + "live/events?probe=ping&targets=b,c")
    assert until(lambda: stream.of("running")), stream.failure
    now_s = time.time()
    live.publish(
        archive, "mon", [LiveSample("a", "ping", "rtt_ms", now_s, 1.0),
                         LiveSample("b", "interface", "rx_mbps", now_s, 2.0),
                         LiveSample("b", "ping", "rtt_ms", now_s, 3.0),
                         LiveSample("c", "ping", "rtt_ms", now_s, 4.0)]
    )  # fmt: skip
    assert until(lambda: len(stream.samples()) >= 2), stream.failure
    assert [(row[1], row[5]) for row in stream.samples()] == [("b", 3.0), ("c", 4.0)]


def test_a_reconnect_resumes_after_the_last_event_id(
    archive: Archive, served: ServerHandle, events: Callable[..., Events]
) -> None:
    now_s = time.time()
    first = events(served.url + "live/events?probe=ping&after=0")
    live.publish(archive, "mon", [LiveSample("a", "ping", "rtt_ms", now_s, 1.0)])
    assert until(lambda: first.of("samples")), first.failure
    last_id = first.of("samples")[-1]["id"]
    first.close()
    # Published while the browser was away: the reconnect sends these and no earlier one.
    live.publish(archive, "mon", [LiveSample("a", "ping", "rtt_ms", now_s + 1, 2.0),
                                  LiveSample("b", "ping", "rtt_ms", now_s + 1, 3.0)])  # fmt: skip
    again = events(served.url + "live/events?probe=ping&after=0", {"Last-Event-ID": last_id})
    assert until(lambda: len(again.samples()) >= 2), again.failure
    assert [row[5] for row in again.samples()] == [2.0, 3.0]


def test_a_stream_far_behind_catches_up_in_bounded_batches(
    archive: Archive, url: str, events: Callable[..., Events], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_live, "BATCH", 10)
    monkeypatch.setattr(web_live, "RING_SAMPLES", 20)
    now_s = time.time()
    live.publish(archive, "mon", [LiveSample("a", "ping", "rtt_ms", now_s, 0.0)])
    handle = serve_in_background(url, port=free_port(), cache_ttl_s=0)
    try:
        # Published after the hub started: 50 samples, more than its ring of 20 holds.
        stream = events(handle.url + "live/events?probe=ping")
        assert until(lambda: stream.of("running")), stream.failure
        live.publish(
            archive, "mon", [LiveSample("a", "ping", "rtt_ms", now_s + i, float(i)) for i in
                             range(1, 51)]
        )  # fmt: skip
        assert until(lambda: len(stream.samples()) >= 50), stream.failure
        behind = events(handle.url + "live/events?probe=ping&after=0")
        assert until(lambda: len(behind.samples()) >= 51), behind.failure
    finally:
        handle.stop()
    assert [row[5] for row in stream.samples()] == [float(i) for i in range(1, 51)]
    assert [row[5] for row in behind.samples()] == [float(i) for i in range(51)]
    assert max(len(e["data"]["samples"]) for e in behind.of("samples")) <= 10
    assert max(len(e["data"]["samples"]) for e in stream.of("samples")) <= 10


@pytest.mark.skipif(shutil.which("ping") is None, reason="iputils ping is not installed")
def test_new_light_probe_results_and_running_tests_reach_the_stream(
    archive: Archive, served: ServerHandle, events: Callable[..., Events]
) -> None:
    stream = events(served.url + "live/events?probe=ping")
    assert until(lambda: stream.of("running")), stream.failure
    ctx = ProbeContext(target="loopback", address="127.0.0.1", monitor="mon")
    # Two at once: the hub sees both in one poll, and the stream must send both.
    results = [asyncio.run(ping.run(ping.Spec(count=2, interval_s=0.2), ctx)) for _ in range(2)]
    archive.add_many(results)
    sent_ids = lambda: [r["id"] for e in stream.of("results") for r in e["data"]["results"]]  # noqa: E731
    assert until(lambda: len(sent_ids()) >= 2, 30.0), stream.failure
    assert sorted(sent_ids()) == sorted(r.id for r in results)
    result = results[0]
    [sent] = [r for e in stream.of("results") for r in e["data"]["results"] if r["id"] == result.id]
    assert sent["target"] == "loopback"
    assert sent["figures"]["rtt_avg_ms"] == pytest.approx(result.data["rtt_avg_ms"])
    assert "rtts_ms" not in sent["figures"]  # numbers only, no per-packet arrays
    live.set_running(archive, "mon", "iperf3", "cern", {"streams": 4}, deadline_s=60)
    assert until(lambda: stream.of("running")[-1]["data"]["running"], 30.0), stream.failure
    [now] = stream.of("running")[-1]["data"]["running"]
    assert (now["target"], now["probe"], now["params"]) == ("cern", "iperf3", {"streams": 4})


def test_a_client_that_leaves_is_noticed(
    served: ServerHandle, events: Callable[..., Events], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_live, "KEEPALIVE_S", 0.3)
    stream = events(served.url + "live/events")
    assert until(lambda: stream.comments >= 1), stream.failure  # keep-alives while idle
    watcher = hub(served)
    assert watcher.open_streams == 1
    stream.close()
    assert until(lambda: watcher.open_streams == 0)


def test_shutdown_ends_open_streams_without_the_graceful_wait(
    url: str, archive: Archive, events: Callable[..., Events], caplog: pytest.LogCaptureFixture
) -> None:
    handle = serve_in_background(url, port=free_port(), cache_ttl_s=0)
    streams = [events(handle.url + "live/events") for _ in range(3)]
    assert until(lambda: all(s.of("running") for s in streams))
    with caplog.at_level(logging.INFO, logger="uvicorn.error"):
        handle.stop()
    assert not handle.thread.is_alive()
    assert all(until(lambda s=s: s.ended) for s in streams)  # closed by the server, cleanly
    # uvicorn logs this when it had to cancel responses at its graceful timeout.
    assert not [r for r in caplog.records if "graceful shutdown exceeded" in r.getMessage()]


@pytest.mark.pg
def test_postgresql_notify_wakes_the_stream_without_polling(
    pg_server: PgServer, events: Callable[..., Events], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub's own check comes every hour here: only the NOTIFY can bring the sample.
    monkeypatch.setattr(web_live, "PG_CHECK_S", 3600.0)
    monkeypatch.setattr(web_live, "RESULTS_POLL_S", 3600.0)
    monkeypatch.setattr(web_live, "PG_RETRY_S", 0.2)
    name = f"iepm_live_{uuid.uuid4().hex[:12]}"
    url = pg_server.create_database(name)
    try:
        with Archive.open(url) as archive:
            handle = serve_in_background(url, port=free_port(), cache_ttl_s=0)
            try:
                stream = events(handle.url + "live/events")
                assert until(lambda: stream.of("running")), stream.failure
                assert until(lambda: hub(handle).listening)
                live.publish(archive, "mon", [LiveSample("a", "ping", "rtt_ms", time.time(), 7.0)])
                assert until(lambda: stream.samples()), stream.failure
                assert stream.samples()[0][5] == 7.0
                # The listening connection dies (a server restart, a killed backend): the hub
                # reconnects, and a sample published meanwhile still arrives.
                with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as admin:
                    killed = admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE query = %s", (f"LISTEN {live.CHANNEL}",)
                    ).fetchall()  # fmt: skip
                assert killed == [(True,)]
                live.publish(archive, "mon", [LiveSample("a", "ping", "rtt_ms", time.time(), 8.0)])
                assert until(lambda: len(stream.samples()) >= 2), stream.failure
                assert stream.samples()[1][5] == 8.0
            finally:
                handle.stop()
    finally:
        pg_server.drop_database(name)


def test_a_malformed_last_event_id_is_ignored() -> None:
    assert web_live.parse_last_event_id("12.345") == (12, 345)
    assert web_live.parse_last_event_id("x.1") is None
    assert web_live.parse_last_event_id("") is None
    assert web_live.parse_last_event_id("12") is None
