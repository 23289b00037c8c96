"""A probe is a plug-in: one defined only here (TCP connect time, measured by a Python one-liner
against a listener this test opens on 127.0.0.1) is registered at run time and then found, with
no other edit, by config validation, ``iepm probe``, a scheduled cycle, the archive, export, the
daily rollup, an alert, and the web layer's target page and ``/metrics``."""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from sqlalchemy import select
from typer.testing import CliRunner

from iepm.analysis.alerts import load_alerts
from iepm.analysis.watch import AlertWatcher
from iepm.cli import app
from iepm.config import load_config_text
from iepm.console import summary
from iepm.errors import ConfigError, ParseError, ToolFailed
from iepm.probes import PROBES, all_metrics, register, unregister
from iepm.probes.base import (
    Column,
    Metric,
    ProbeContext,
    ProbeMeta,
    ProbeSpec,
    execute,
    result_from_raw,
)
from iepm.results import Result
from iepm.runner import RawRun
from iepm.scheduler import Scheduler
from iepm.store import Archive
from iepm.store.schema import daily as DAILY

# The tool: connect once, print the time it took (or why it could not).
PROGRAM = """\
import socket, sys, time
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
t0 = time.perf_counter()
try:
    socket.create_connection((host, port), timeout=timeout).close()
except OSError as exc:
    print(f"error={exc.strerror or exc}")
    sys.exit(1)
print(f"connect_ms={(time.perf_counter() - t0) * 1000:.3f}")
"""
CONNECT_RE = re.compile(r"^connect_ms=(\d+(?:\.\d+)?)$", re.M)
ERROR_RE = re.compile(r"^error=(.*)$", re.M)


class TcpConnect:
    """TCP connect time to a port of the target (a Python one-liner)."""

    NAME = "tcpconnect"
    TOOL = "python3"
    META = ProbeMeta(scheduling="background", version_argv=(sys.executable, "--version"))
    METRICS = (
        Metric(
            "tcpconnect",
            "connect_ms",
            "TCP connect (ms)",
            "lower",
            1e-3,
            "seconds",
            rollup=True,
            alert={"min_relative": 0.2, "min_absolute": 1.0},
        ),
    )
    COLUMNS = (Column("connect_ms", "time for connect() to return, ms"),)

    class Spec(ProbeSpec):
        port: int = Field(ge=1, le=65535, description="TCP port to connect to")
        timeout_s: float = Field(
            2.0, gt=0, le=30, description="longest wait", json_schema_extra={"cli": "timeout"}
        )

        def deadline_s(self) -> float:
            return self.timeout_s + 5.0

    @staticmethod
    def build_argv(spec: TcpConnect.Spec, address: str) -> list[str]:
        return [sys.executable, "-c", PROGRAM, address, str(spec.port), f"{spec.timeout_s:g}"]

    @staticmethod
    def parse(raw: RawRun, spec: Any = None) -> dict[str, Any]:
        found = CONNECT_RE.search(raw.stdout)
        if found:
            return {"connect_ms": float(found.group(1))}
        error = ERROR_RE.search(raw.stdout)
        if error:
            raise ToolFailed(f"connect failed: {error.group(1)}")
        raise ParseError(f"no connect_ms in the output: {raw.stdout[:80]!r}")

    @staticmethod
    def check(data: dict[str, Any], spec: Any) -> str | None:
        return None

    @staticmethod
    def summary(data: dict[str, Any]) -> str:
        return f"connected in {data.get('connect_ms')} ms"

    @staticmethod
    async def run(spec: Any, ctx: ProbeContext) -> Result:
        return await execute(TcpConnect, spec, ctx)  # type: ignore[arg-type]


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that completes handshakes (the kernel does: no accept needed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield sock.getsockname()[1]


@pytest.fixture
def tcpconnect() -> Iterator[type[TcpConnect]]:
    register(TcpConnect)
    try:
        yield TcpConnect
    finally:
        unregister(TcpConnect.NAME)


def targets_toml(tmp_path: Path, port: int | str) -> str:
    return f"""\
[monitor]
name = "test-mon"
cycle_interval_s = 300
archive = "sqlite:///{tmp_path}/archive.db"
log_dir = "{tmp_path}/raw"

[[targets]]
name = "local"
address = "127.0.0.1"
probes = ["tcpconnect"]
[targets.tcpconnect]
port = {port}
"""


def test_before_registration_the_table_is_unknown(tmp_path: Path) -> None:
    assert "tcpconnect" not in PROBES
    with pytest.raises(ConfigError) as caught:
        load_config_text(targets_toml(tmp_path, 80), Path("targets.toml"))
    known = ", ".join(sorted(PROBES))
    assert set(str(caught.value).splitlines()) == {
        f"targets.toml:10: targets[0].probes: unknown probe 'tcpconnect' (known: {known})",
        "targets.toml:11: targets[0].tcpconnect: [targets.tcpconnect] is neither a target "
        f"setting nor a probe's table (probes: {known})",
    }
    result = CliRunner().invoke(app, ["probe", "tcpconnect", "127.0.0.1"])
    assert result.exit_code == 2 and "No such command 'tcpconnect'" in result.output


def step_results(spec: TcpConnect.Spec, start: datetime) -> list[Result]:
    """40 runs an hour apart whose connect time steps from ~2 ms to ~9 ms at run 30, read by
    the probe's own parser from its tool's output format (seeded noise)."""
    rng = random.Random(19)
    ctx = ProbeContext(target="local", address="127.0.0.1", monitor="test-mon")
    out = []
    for i in range(40):
        level = 2.0 if i < 30 else 9.0
        stdout = f"connect_ms={level + rng.uniform(-0.2, 0.2):.3f}\n"
        raw = RawRun(
            argv=tuple(TcpConnect.build_argv(spec, "127.0.0.1")),
            stdout=stdout,
            started_at=start + timedelta(hours=i),
            duration_s=0.05,
        )
        out.append(result_from_raw(TcpConnect, spec, ctx, raw, "Python 3"))  # type: ignore[arg-type]
    return out


def test_a_registered_probe_is_found_everywhere_without_another_edit(
    tmp_path: Path, listener: int, tcpconnect: type[TcpConnect]
) -> None:
    # Config: its table is accepted and validated against its Spec, errors at file:line.
    with pytest.raises(ConfigError) as caught:
        load_config_text(targets_toml(tmp_path, 70000), Path("targets.toml"))
    assert str(caught.value) == (
        "targets.toml:12: targets[0].tcpconnect.port: Input should be less than or equal to "
        "65535 (got 70000)"
    )
    text = targets_toml(tmp_path, listener)
    (tmp_path / "targets.toml").write_text(text)
    config = load_config_text(text, tmp_path / "targets.toml")
    assert config.spec_for(config.targets[0], "tcpconnect") == TcpConnect.Spec(port=listener)

    # iepm probe tcpconnect: generated from the Spec, with descriptions and ranges.
    cli = CliRunner()
    helped = cli.invoke(app, ["probe", "tcpconnect", "--help"], env={"COLUMNS": "200"})
    assert helped.exit_code == 0, helped.output
    assert "TCP connect time to a port of the target" in helped.output
    assert re.search(r"--port\s.*TCP port to connect to \[1–65535\]", helped.output)
    assert re.search(r"--timeout\s.*longest wait \[>0–30; default 2\.0\]", helped.output)
    ran = cli.invoke(
        app, ["probe", "tcpconnect", "local", "--config", str(tmp_path / "targets.toml"), "--json"]
    )
    assert ran.exit_code == 0, ran.output
    envelope = json.loads(ran.stdout)
    assert envelope["probe"] == "tcpconnect" and envelope["succeeded"] is True
    assert envelope["params"] == {"port": listener, "timeout_s": 2.0}
    assert 0 < envelope["data"]["connect_ms"] < 2000
    refused = cli.invoke(app, ["probe", "tcpconnect", "127.0.0.1", "--port", "0"])
    assert refused.exit_code == 2
    assert refused.stderr == "error: --port: Input should be greater than or equal to 1 (got 0)\n"

    # A scheduled cycle runs it, stores it and shows its summary.
    with Archive.open(config.monitor.archive) as archive:
        scheduler = Scheduler(config, archive, rng=random.Random(1))
        report = asyncio.run(scheduler.run_cycle())
        (measured,) = report.results
        assert measured.probe == "tcpconnect" and measured.succeeded, measured.error
        assert summary(measured) == f"connected in {measured.data['connect_ms']} ms"
        # The archive holds it as reported.
        (stored,) = archive.results(probe="tcpconnect")
        assert stored.envelope() == measured.envelope()

        # An alert: a step in its metric, seen by a watcher as the scheduler's sees results.
        watched = scheduler.alert_watcher.rules  # type: ignore[union-attr]
        # The probes registered before it (whatever they are) come first, then it.
        assert [r.probe for r in watched if r.probe in ("iperf3", "ping", "tcpconnect")] == [
            "iperf3",
            "ping",
            "ping",
            "tcpconnect",
        ]
        watcher = AlertWatcher(archive, "test-mon")
        start = measured.started_at + timedelta(hours=1)
        for result in step_results(TcpConnect.Spec(port=listener), start):
            archive.add(result)
            watcher.observe(result)
        (alert,) = load_alerts(archive, target="local")
        assert (alert.probe, alert.metric, alert.direction) == ("tcpconnect", "connect_ms", "up")
        assert alert.before == pytest.approx(2.0, abs=0.3)
        assert alert.after == pytest.approx(9.0, abs=0.3)

        # The daily rollup summarises its rollup metric, day by day.
        with archive.reading("test") as conn:
            rows = conn.execute(
                select(DAILY.c.day, DAILY.c.n, DAILY.c.total).where(
                    DAILY.c.probe == "tcpconnect", DAILY.c.metric == "connect_ms"
                )
            ).all()
        assert sum(n for _, n, _ in rows) == 41
        everything = [measured.data["connect_ms"]] + [
            r.data["connect_ms"] for r in archive.results(probe="tcpconnect") if r.id != stored.id
        ]
        assert sum(total for _, _, total in rows) == pytest.approx(sum(everything))

    # Export: its COLUMNS documented and filled.
    exported = cli.invoke(
        app, ["export", "--probe", "tcpconnect", "--db", config.monitor.archive, "--format", "tsv"]
    )
    assert exported.exit_code == 0, exported.output
    lines = exported.stdout.splitlines()
    assert "# connect_ms: time for connect() to return, ms" in lines
    header = next(line for line in lines if not line.startswith("#")).split("\t")
    assert header[-1] == "connect_ms"
    assert len([line for line in lines if not line.startswith("#")]) == 1 + 41


# The web layer derives its probes and metrics from the registry (issue 19): the API's probe
# enum, the target page's charts and /metrics show a probe registered at run time.
def test_the_web_layer_charts_and_exports_a_registered_probe(
    tmp_path: Path, listener: int, tcpconnect: type[TcpConnect]
) -> None:
    from fastapi.testclient import TestClient

    from iepm.web.app import create_app

    url = f"sqlite:///{tmp_path}/archive.db"
    ctx = ProbeContext(target="local", address="127.0.0.1", monitor="test-mon")
    with Archive.open(url) as archive:
        results = [asyncio.run(TcpConnect.run(TcpConnect.Spec(port=listener), ctx))]
        assert results[0].succeeded, results[0].error
        results += step_results(TcpConnect.Spec(port=listener), datetime.now(UTC) - timedelta(2))
        archive.add_many(results)
    assert "tcpconnect.connect_ms" in all_metrics()
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        listed = client.get("/api/v1/results", params={"probe": "tcpconnect"})
        assert listed.status_code == 200 and listed.json()["total"] == 41
        page = client.get("/targets/local")
        assert page.status_code == 200
        # The target page charts the metric (its label and its key as a series).
        assert "TCP connect (ms)" in page.text and "connect_ms" in page.text
        specs = re.findall(r'class="chart-spec"[^>]*>(.*?)</script>', page.text)
        charts = {spec["id"]: spec for spec in map(json.loads, specs)}
        assert [s["label"] for s in charts["tcpconnect"]["series"]] == ["connect_ms"]
        scraped = client.get("/metrics").text
        newest = max(results, key=lambda r: r.started_at)
        line = 'iepm_tcpconnect_connect_seconds{monitor="test-mon",target="local"} '
        (value,) = [float(s[len(line) :]) for s in scraped.splitlines() if s.startswith(line)]
        assert value == pytest.approx(newest.data["connect_ms"] * 1e-3)


class Gate(TcpConnect):
    """TCP connect as a reachability gate (as ping is): its failure skips the heavy probes."""

    NAME = "tcpgate"
    META = ProbeMeta(scheduling="background", gates=True)
    METRICS = ()

    @staticmethod
    async def run(spec: Any, ctx: ProbeContext) -> Result:
        return await execute(Gate, spec, ctx)  # type: ignore[arg-type]


class Heavy(TcpConnect):
    """TCP connect scheduled as an exclusive (bandwidth-class) probe."""

    NAME = "tcpheavy"
    META = ProbeMeta(scheduling="exclusive")
    METRICS = ()

    @staticmethod
    async def run(spec: Any, ctx: ProbeContext) -> Result:
        return await execute(Heavy, spec, ctx)  # type: ignore[arg-type]


@pytest.fixture
def gate_and_heavy() -> Iterator[None]:
    register(Gate)
    register(Heavy)
    try:
        yield
    finally:
        unregister(Gate.NAME)
        unregister(Heavy.NAME)


@pytest.mark.parametrize("gate_up", [True, False])
def test_a_registered_gating_probe_guards_the_exclusive_ones(
    tmp_path: Path, listener: int, gate_and_heavy: None, gate_up: bool
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connect is refused
        gate_port = listener if gate_up else closed.getsockname()[1]
        text = targets_toml(tmp_path, listener).replace(
            'probes = ["tcpconnect"]\n[targets.tcpconnect]',
            f'probes = ["tcpgate", "tcpheavy"]\n[targets.tcpgate]\nport = {gate_port}\n'
            "[targets.tcpheavy]",
        )
        config = load_config_text(text)
        with Archive.open(config.monitor.archive) as archive:
            report = asyncio.run(Scheduler(config, archive, watchers=[]).run_cycle())
    by = {r.probe: r for r in report.results}
    assert by["tcpgate"].succeeded is gate_up, by["tcpgate"].error
    if gate_up:
        assert by["tcpheavy"].succeeded, by["tcpheavy"].error
    else:
        assert by["tcpheavy"].outcome.value == "skipped"
        assert by["tcpheavy"].error == (
            "skipped because tcpgate to local (127.0.0.1) failed and ping_expected=true: "
            f"{by['tcpgate'].error}"
        )
        assert "connect failed: Connection refused" in (by["tcpgate"].error or "")
