"""``iepm demo`` (``make demo``): a WAN lab of research sites, measured live, on a dashboard.

As root, brings up the lab in ``examples/lab/demo.toml`` (six sites 5–300 ms away, 10 Mbit/s to
1 Gbit/s bottlenecks, lossy paths, cross traffic and a scheduled route change, with time
compressed so a lab hour passes in a real minute), starts an ``iperf3 -s`` in every site, and
runs measurement cycles from the lab's monitor namespace with short probes so the pages fill
within minutes, while ``iepm serve``'s dashboard runs on 127.0.0.1:8080. Without root it
measures loopback targets (127.0.0.x) instead, and says so.

Ctrl-C (or SIGTERM) ends it: the web server stops, every iperf3 server is stopped by its PID and
the lab is torn down. The archive and raw logs stay in ``--workdir`` (``var/demo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from iepm import tomlload
from iepm.cliglue import fail, guarded
from iepm.config import Config, load_config_text
from iepm.console import summary
from iepm.errors import IepmError, LabError, StoreError
from iepm.results import Result
from iepm.runner import DEVNULL, start_process_sync

if TYPE_CHECKING:  # imported when the demo runs: the archive and scheduler pull in SQLAlchemy
    from iepm.scheduler import CycleReport, Scheduler
    from iepm.store import Archive
    from iepm.store.live import LiveSample

TOPOLOGY = Path(__file__).resolve().parents[1] / "examples" / "lab" / "demo.toml"
IPERF3_PORT = 5201
SERVER_START_S = 10.0
CYCLE_INTERVAL_S = 30.0
# Short probes: one cycle over six sites takes about 20 s.
PROBE_DEFAULTS = """
[defaults.ping]
count = 5
interval_s = 0.2

[defaults.traceroute]
max_hops = 12
wait_s = 1.0

[defaults.iperf3]
duration_s = 2
"""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _toml_str(value: str | Path) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def demo_config(
    workdir: Path,
    targets: list[dict[str, Any]],
    *,
    monitor: str,
    netns: str | None,
    interval_s: float = CYCLE_INTERVAL_S,
) -> str:
    """targets.toml for the demo: ``targets`` are dicts with name, address, site, port."""
    lines = [
        "[monitor]",
        f"name = {_toml_str(monitor)}",
        f"cycle_interval_s = {interval_s}",
        f"archive = {_toml_str('sqlite:///' + str((workdir / 'archive.db').resolve()))}",
        f"log_dir = {_toml_str((workdir / 'raw').resolve())}",
    ]
    if netns:
        lines.append(f"netns = {_toml_str(netns)}")
    lines.append(PROBE_DEFAULTS)
    for t in targets:
        lines += [
            "[[targets]]",
            f"name = {_toml_str(t['name'])}",
            f"address = {_toml_str(t['address'])}",
            f"site = {_toml_str(t['site'])}",
            'probes = ["ping", "traceroute", "iperf3", "load"]',
            "[targets.iperf3]",
            f"port = {t['port']}",
            "",
        ]
    return "\n".join(lines)


# -- iperf3 servers ----------------------------------------------------------------------------


@contextlib.contextmanager
def loopback_server(host: str, port: int) -> Iterator[subprocess.Popen[bytes]]:
    """An ``iperf3 -s`` bound to host:port, stopped (with its group) on exit."""
    server = start_process_sync(
        ["iperf3", "-s", "-B", host, "-p", str(port)], stdout=DEVNULL, stderr=DEVNULL
    )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if server.popen.poll() is not None:
                raise IepmError(f"iperf3 server on {host}:{port} exited ({server.returncode})")
            with socket.socket() as sock:
                sock.settimeout(0.2)
                if sock.connect_ex((host, port)) == 0:
                    break
            time.sleep(0.05)
        else:
            raise IepmError(f"iperf3 server on {host}:{port} did not start in {SERVER_START_S} s")
        yield server.popen
    finally:
        server.stop()


# -- the demo ---------------------------------------------------------------------------------


@dataclass
class Demo:
    """The demo's moving parts; :meth:`close` (or leaving ``with``) stops all of them.

    ``Demo.start(workdir)`` brings up the lab (or loopback targets) and the iperf3 servers and
    writes ``workdir/targets.toml``; :meth:`run_cycles` runs the real scheduler against them.
    """

    workdir: Path
    config: Config
    mode: str  # "lab" or "loopback"
    lab: Any = None
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    archive: Archive | None = None
    scheduler: Scheduler | None = None

    @classmethod
    def start(
        cls,
        workdir: Path,
        *,
        loopback: bool = False,
        topology: str | Path | dict[str, Any] = TOPOLOGY,
        lab_name: str | None = None,
        say: Callable[[str], None] = print,
    ) -> Demo:
        workdir.mkdir(parents=True, exist_ok=True)
        reason = "--loopback was given" if loopback else _lab_unavailable()
        if reason is None:
            return cls._start_lab(workdir, topology, lab_name, say)
        say(f"iepm demo: no WAN lab ({reason}); measuring loopback targets 127.0.0.x instead")
        return cls._start_loopback(workdir)

    @classmethod
    def _start_lab(
        cls,
        workdir: Path,
        topology: str | Path | dict[str, Any],
        lab_name: str | None,
        say: Callable[[str], None],
    ) -> Demo:
        from iepm.lab import Lab

        # A file: bad bytes or nesting become a one-line ConfigError, as for `iepm lab up`.
        raw = tomlload.load(topology).data if isinstance(topology, str | Path) else topology
        stack = contextlib.ExitStack()
        try:
            say(f"iepm demo: bringing up lab {lab_name or raw['lab']['name']} ...")
            lab = Lab.up(topology, name=lab_name)
            if not lab.created:
                # Left by a demo that was killed: its servers may still hold the ports.
                say(f"iepm demo: replacing lab {lab.name} left by an earlier demo")
                lab.down()
                lab = Lab.up(topology, name=lab_name)
            stack.enter_context(lab)
            monitors = [h["name"] for h in raw["hosts"] if h.get("role") == "monitor"]
            sites = [h["name"] for h in raw["hosts"] if h.get("role") == "target"]
            servers = []
            for site in sites:
                proc = lab.popen(site, ["iperf3", "-s", "-B", lab.address(site), "-p", "5201"])
                servers.append(proc)
                stack.callback(lab.stop, proc)
            deadline = time.monotonic() + SERVER_START_S
            waiting = list(sites)
            while waiting and time.monotonic() < deadline:
                waiting = [s for s in waiting if not lab.listening(s, IPERF3_PORT)]
                if waiting:
                    time.sleep(0.1)
            if waiting:
                raise LabError(f"iperf3 servers in {', '.join(waiting)} did not start")
            targets = [
                {"name": s, "address": lab.address(s), "site": s, "port": IPERF3_PORT}
                for s in sites
            ]
            text = demo_config(
                workdir, targets, monitor=f"{lab.name}-{monitors[0]}", netns=lab.netns(monitors[0])
            )
            (workdir / "targets.toml").write_text(text, encoding="utf-8")
            config = load_config_text(text, workdir / "targets.toml")
            say(
                f"iepm demo: lab {lab.name} is up: {len(sites)} sites "
                f"({', '.join(sites)}), iperf3 servers PIDs "
                f"{', '.join(str(p.pid) for p in servers)}"
            )
        except BaseException:
            stack.close()
            raise
        return cls(workdir, config, "lab", lab=lab, servers=servers, stack=stack)

    @classmethod
    def _start_loopback(cls, workdir: Path) -> Demo:
        stack = contextlib.ExitStack()
        try:
            targets = [
                {"name": "loop-a", "address": "127.0.0.1", "site": "loopback"},
                {"name": "loop-b", "address": "127.0.0.2", "site": "loopback"},
                # No server: shows a failed bandwidth test beside the good ones.
                {"name": "loop-c-no-server", "address": "127.0.0.3", "site": "loopback"},
            ]
            servers = []
            for t in targets:
                t["port"] = free_port(t["address"])
                if "no-server" not in t["name"]:
                    servers.append(stack.enter_context(loopback_server(t["address"], t["port"])))
            text = demo_config(workdir, targets, monitor="demo-loopback", netns=None)
            (workdir / "targets.toml").write_text(text, encoding="utf-8")
            config = load_config_text(text, workdir / "targets.toml")
        except BaseException:
            stack.close()
            raise
        return cls(workdir, config, "loopback", servers=servers, stack=stack)

    def open(self, on_result: Callable[[Result], None] | None = None) -> Scheduler:
        from iepm.scheduler import Scheduler
        from iepm.store import Archive

        if self.scheduler is None:
            self.archive = self.stack.enter_context(Archive.open(self.config.monitor.archive))
            self.scheduler = Scheduler(self.config, self.archive, on_result=on_result)
        return self.scheduler

    def run_cycles(
        self, cycles: int | None, on_cycle: Callable[[CycleReport], object] | None = None
    ) -> CycleReport | None:
        """Run ``cycles`` cycles (forever when None) at the configured interval; each report
        goes to ``on_cycle``, the last is returned."""
        return asyncio.run(self.open().run(cycles=cycles, on_cycle=on_cycle))

    def close(self) -> None:
        """Stop the servers (by PID) and tear the lab down; safe to call twice."""
        self.stack.close()

    def __enter__(self) -> Demo:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _lab_unavailable() -> str | None:
    from iepm.lab.testing import lab_unavailable

    return lab_unavailable()


def _raise_interrupt(_signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_demo(
    console: Console,
    *,
    workdir: Path,
    cycles: int | None = None,
    serve: bool = True,
    listen: str = "127.0.0.1:8080",
    loopback: bool = False,
    lab_name: str | None = None,
    topology: str | Path = TOPOLOGY,
) -> None:
    """The ``iepm demo`` command: start, serve, measure until Ctrl-C (or ``cycles`` cycles),
    then tear everything down."""
    from iepm.store import live
    from iepm.web.cli import parse_listen
    from iepm.web.places import places_of
    from iepm.web.server import serve_in_background

    host, port = parse_listen(listen)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        with Demo.start(
            workdir, loopback=loopback, topology=topology, lab_name=lab_name, say=console.print
        ) as demo:

            def on_result(result: Result) -> None:
                value = _headline(result)
                console.print(
                    f"{result.started_at:%H:%M:%S} {result.target:<18} {result.probe:<10} "
                    f"{result.outcome.value:<8} {value}",
                    highlight=False,
                )
                # The live pages (/live/ping) draw these replies as they arrive.
                if demo.archive is not None and (replies := ping_replies(result)):
                    with contextlib.suppress(StoreError):  # the result itself is spooled
                        live.publish(demo.archive, result.monitor, replies)

            scheduler = demo.open(on_result)
            assert demo.archive is not None  # opened by demo.open
            # The monitor's interface rates reach /live/interface from the scheduler itself.
            if serve:
                server = serve_in_background(
                    demo.config.monitor.archive,
                    host,
                    port,
                    health=scheduler.health,
                    places=places_of(demo.config),
                )
                demo.stack.callback(server.stop)
                console.print(f"iepm demo: dashboard at {server.url}  (Ctrl-C stops the demo)")
            sys.stdout.flush()

            def on_cycle(report: CycleReport) -> None:
                outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items()))
                console.print(f"cycle {report.number}: {outcomes} in {report.duration_s:.1f} s")

            demo.run_cycles(cycles, on_cycle)
            console.print(
                f"archive: {demo.config.monitor.archive}\n"
                f"try: iepm serve --db {demo.config.monitor.archive}"
            )
    except KeyboardInterrupt:
        console.print("iepm demo: stopped; servers and lab removed")
    finally:
        signal.signal(signal.SIGTERM, previous)


def ping_replies(result: Result) -> list[LiveSample]:
    """A ping run's replies as live samples (a lost one as a gap), oldest first. The demo runs
    ping in cycles, not continuously, so it publishes each run's replies when the run ends; each
    is timed when its request was sent: start + (icmp_seq − 1) × interval."""
    from iepm.store.live import LiveSample

    if result.probe != "ping":
        return []
    data, start_s = result.data, result.started_at.timestamp()
    interval_s = float(result.params.get("interval_s", 1.0))

    def sample(seq: int, rtt_ms: float | None) -> LiveSample:
        return LiveSample(result.target, "ping", "rtt_ms", start_s + (seq - 1) * interval_s, rtt_ms)

    out = [
        sample(s, r) for s, r in zip(data.get("seqs") or [], data.get("rtts_ms") or [], strict=True)
    ]
    out += [sample(s, None) for a, b in data.get("lost_seq_ranges") or [] for s in range(a, b + 1)]
    return sorted(out, key=lambda s: s.t_s)


def _headline(result: Result) -> str:
    """The run's line in the demo: why it failed, or its probe's own summary."""
    if not result.succeeded:
        return (result.error or "")[:70]
    return summary(result)


def demo_command(
    cycles: Annotated[
        int | None, typer.Option("--cycles", min=1, help="Stop after N cycles (default: never).")
    ] = None,
    serve: Annotated[
        bool, typer.Option("--serve/--no-serve", help="Serve the dashboard while measuring.")
    ] = True,
    listen: Annotated[str, typer.Option("--listen", help="ADDR:PORT of the dashboard.")] = (
        "127.0.0.1:8080"
    ),
    workdir: Annotated[Path, typer.Option(help="Where the demo keeps its archive and logs.")] = (
        Path("var/demo")
    ),
    loopback: Annotated[
        bool, typer.Option("--loopback", help="Measure loopback targets even as root.")
    ] = False,
    lab_name: Annotated[
        str | None, typer.Option("--lab-name", help="Name of the lab (default: iepmdemo).")
    ] = None,
    topology: Annotated[Path, typer.Option(help="Lab topology file.")] = TOPOLOGY,
) -> None:
    """Bring up a WAN lab of six sites (root) or loopback targets, measure them in cycles and
    serve the dashboard on 127.0.0.1:8080; Ctrl-C tears everything down."""
    console = Console()
    try:
        run_demo(
            console,
            workdir=workdir,
            cycles=cycles,
            serve=serve,
            listen=listen,
            loopback=loopback,
            lab_name=lab_name,
            topology=topology,
        )
    except ValueError as exc:  # --listen; iepm's own errors take the table's code (guarded)
        raise fail(str(exc)) from None


def register(app: typer.Typer) -> None:
    """Add ``iepm demo`` to the ``iepm`` command."""
    app.command("demo")(guarded(demo_command))
