"""``iepm demo`` (``make demo``): a WAN lab of research sites, measured live, on a dashboard.

As root, brings up the lab in ``examples/lab/demo.toml`` (six sites 5–300 ms away, 10 Mbit/s to
1 Gbit/s bottlenecks, lossy paths, cross traffic and a scheduled route change, with time
compressed so a lab hour passes in a real minute), starts an ``iepm agent`` in every site (it
leases iperf3 and the memory-to-memory copies' servers, xrootd and GridFTP, one test at a time)
and softflowd on the monitor's interface exporting NetFlow v9 to ``iepm flows collect`` into the
demo's archive, and runs short probes from the lab's monitor namespace so the pages fill within
minutes, while ``iepm serve``'s dashboard runs on 127.0.0.1:8080. A copy whose tools are missing
is left out with a line saying what to install; ``--no-copies`` gives plain ``iperf3 -s`` servers
instead of agents. Without root it measures loopback targets (127.0.0.x) instead, and says so.

Ctrl-C (or SIGTERM, or the end of ``--cycles``) ends it: the web server stops, every agent (with
its servers), softflowd, the collector (after storing what it holds) and iperf3 server is
stopped by its PID and process group, their scratch directories removed and the lab torn down.
The archive, raw logs and the processes' logs (``logs/``) stay in ``--workdir`` (``var/demo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, ModuleType
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
DEMO_PROBES = ("ping", "traceroute", "iperf3", "load")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _toml_str(value: str | Path) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_value(value: object) -> str:
    """A scalar or list of scalars as TOML (JSON's forms are TOML's for these)."""
    return _toml_str(value) if isinstance(value, str | Path) else json.dumps(value)


def demo_config(
    workdir: Path,
    targets: list[dict[str, Any]],
    *,
    monitor: str,
    netns: str | None,
    interval_s: float = CYCLE_INTERVAL_S,
    schedule: dict[str, float] | None = None,
) -> str:
    """targets.toml for the demo: ``targets`` are dicts with name, address, site and port (a
    plain iperf3 server's), ``agent`` (url and credential_file of the site's agent) or ``ssh``
    (its ``[targets.ssh]``), and optionally ``probes`` (default: ping, traceroute, iperf3,
    load), ``params`` (probe → that probe's parameters for the target) and ``schedule`` (the
    target's own intervals). ``schedule``: probe → seconds between its runs (the other probes
    run every cycle)."""
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
    if schedule:
        lines += ["[schedule]", *(f"{k} = {v:g}" for k, v in schedule.items()), ""]
    for t in targets:
        lines += [
            "[[targets]]",
            f"name = {_toml_str(t['name'])}",
            f"address = {_toml_str(t['address'])}",
            f"site = {_toml_str(t['site'])}",
            f"probes = {_toml_value(list(t.get('probes', DEMO_PROBES)))}",
        ]
        for mode in ("agent", "ssh"):
            if access := t.get(mode):
                lines += [f'mode = "{mode}"', f"[targets.{mode}]"]
                lines += [f"{k} = {_toml_value(v)}" for k, v in access.items()]
        params_of = dict(t.get("params", {}))
        if not t.get("agent") and not t.get("ssh"):
            params_of["iperf3"] = {"port": t["port"], **params_of.get("iperf3", {})}
        if t.get("schedule"):
            params_of["schedule"] = t["schedule"]
        for probe, params in params_of.items():
            lines += [f"[targets.{probe}]", *(f"{k} = {_toml_value(v)}" for k, v in params.items())]
        lines.append("")
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


# -- copies through agents, flow records through softflowd (lab mode) --------------------------

AGENT_PORT = 8700
SSHD_PORT = 22  # in the site's own namespace
SSH_STEP_S = 20.0  # an SSH login on the 290 ms, 1 % loss path under load takes seconds
AGENT_SERVER_PORTS = (5301, 5399)
AGENT_START_S = 60.0
COLLECTOR_PORT = 2055
SOFTFLOWD_BUFFER_BYTES = 32 * 1024 * 1024
# The collector stores what is still queued when it is stopped (a busy host may be behind).
COLLECTOR_STOP_S = 60.0
# Each copy moves about this many seconds of its path's narrowest link, in this many streams:
# enough that the copy is past slow start for most of it (2 s, 1M on the lossy paths, was
# mostly ramp-up); a test through an agent costs a lease on top of its run (a few seconds on a
# busy host), so with agents iperf3 runs every 2 cycles and the copies every 8, one at a time.
COPY_SECONDS = 3.0
COPY_STREAMS = 4
COPY_MAX_MB = 64
COPY_DEADLINE_S = 30.0
COPY_CONNECT_S = 15  # set-up on a 290 ms, 1 % loss path takes several seconds
COPY_EVERY_S = 240.0
# With agents iperf3 is the seed's tuned test, not the 30 s cycle's quick one: IPERF3_STREAMS
# streams for IPERF3_SECONDS (slow start is ~1 s of it on the 290 ms path), each with a window
# of its share of the path's bandwidth-delay product (iperf3_params), as often as the copies:
# with rsync's SSH targets (their own iperf3 too) 24 tests of 3-12 s plus leases and logins
# fill the 240 s, and every 120 s made all of them run late.
IPERF3_STREAMS = 4
IPERF3_SECONDS = 8
IPERF3_MIN_WINDOW_KB = 128
AGENT_IPERF3_EVERY_S = COPY_EVERY_S
AGENT_REQUEST_S = 30.0
AGENT_GRACE_S = 15  # a slot's server lives duration + this: a loaded host starts tests late
UNLIMITED_MBIT = 1000.0  # a lab link without a rate: about what one delay line carries here


def copy_probes(say: Callable[[str], None]) -> list[ModuleType]:
    """The memory-to-memory copies a site's agent can serve (from the registry: ``META.copy``
    is "memory" and ``META.server`` a kind the agent leases), each left out — with a line
    saying what to install — when its client or its server is not installed."""
    from iepm.probes import PROBES
    from iepm.remote.servers import KINDS

    found = []
    for name, module in sorted(PROBES.items()):
        kind = KINDS.get(module.META.server or "")
        if module.META.copy != "memory" or kind is None:
            continue
        missing = []
        if shutil.which(module.TOOL) is None:
            missing.append(f"its client {module.TOOL}")
        if shutil.which(kind.program) is None:
            missing.append(f"its server {kind.program} (Debian: apt-get install {kind.package})")
        if missing:
            say(f"iepm demo: no {name} copies: {' and '.join(missing)} not installed")
        else:
            found.append(module)
    return found


def ssh_copy_probes(say: Callable[[str], None]) -> list[ModuleType]:
    """The memory-to-memory copies over SSH (``META.server`` is an SSH login: rsync_mem), run
    against a private sshd in each site; left out with a line when the client or sshd is
    missing."""
    from iepm.lab.sshd import SSHD
    from iepm.probes import PROBES
    from iepm.probes.base import SSH_LOGIN

    found = []
    for name, module in sorted(PROBES.items()):
        if module.META.copy != "memory" or module.META.server != SSH_LOGIN:
            continue
        needed = {module.TOOL: module.TOOL, "ssh": "openssh-client", SSHD: "openssh-server"}
        missing = [f"{p} (Debian: {pkg})" for p, pkg in needed.items() if shutil.which(p) is None]
        if missing:
            say(f"iepm demo: no {name} copies: {', '.join(missing)} not installed")
        else:
            found.append(module)
    return found


def _walk_links(plan: Any, path: list[str]) -> list[tuple[Any, Any]]:
    """(forward params, backward params) of each link along ``path``."""
    out = []
    for here, there in itertools.pairwise(path):
        link = plan.link_between(here, there)
        out.append((link.ab, link.ba) if here == link.a else (link.ba, link.ab))
    return out


def _route(plan: Any, source: str, dest: str) -> list[str]:
    path, node = [source], source
    while node != dest and len(path) <= len(plan.roles):
        node = plan.links[plan.routes[node][dest]].peer(node)
        path.append(node)
    return path


def expected_mbit(plan: Any, monitor: str, site: str) -> float:
    """The narrowest link from the monitor to ``site``, the lowest over its route now and any
    route an event switches it to. Not the Mathis et al. limit of a lossy path: that is Reno's
    (loss-bound); TCP here may be BBR (this host's), and the tuned iperf3 reached 33 of desy's
    50 Mbit/s where that limit says ~5."""
    paths = [_route(plan, monitor, site)]
    for event in plan.topology.events:
        if event.action == "route" and event.path and event.path[-1] == site:
            paths.append(list(event.path))
    return min(
        min(
            (f.rate_mbit or UNLIMITED_MBIT for f, _ in _walk_links(plan, path)),
            default=UNLIMITED_MBIT,
        )
        for path in paths
    )


def bdp_bytes(plan: Any, monitor: str, site: str) -> int:
    """The largest bandwidth-delay product (narrowest link × round-trip delay) from the
    monitor to ``site`` over its route now and any route an event switches it to."""
    paths = [_route(plan, monitor, site)]
    paths += [
        list(e.path)
        for e in plan.topology.events
        if e.action == "route" and e.path and e.path[-1] == site
    ]
    out = 0.0
    for path in paths:
        links = _walk_links(plan, path)
        rate = min((f.rate_mbit or UNLIMITED_MBIT for f, _ in links), default=UNLIMITED_MBIT)
        rtt_s = sum(f.delay_ms + b.delay_ms for f, b in links) / 1000.0
        out = max(out, rate * 1e6 / 8 * rtt_s)
    return math.ceil(out)


def iperf3_params(bdp: int) -> dict[str, Any]:
    """The seed's tuned iperf3 for a path of ``bdp`` bytes in flight: IPERF3_STREAMS streams,
    each with a window (-w) of the power of two in KiB at or above its share of the product
    (at least IPERF3_MIN_WINDOW_KB), for IPERF3_SECONDS."""
    share_kb = math.ceil(bdp / IPERF3_STREAMS / 1024)
    window_kb = max(IPERF3_MIN_WINDOW_KB, 1 << max(0, share_kb - 1).bit_length())
    window = f"{window_kb // 1024}M" if window_kb % 1024 == 0 else f"{window_kb}K"
    return {"streams": IPERF3_STREAMS, "window": window, "duration_s": IPERF3_SECONDS}


def copy_params(module: ModuleType, rate_mbit: float) -> dict[str, Any]:
    """A copy of about COPY_SECONDS at ``rate_mbit`` (1M to COPY_MAX_MB), killed at
    COPY_DEADLINE_S: tuned like the demo's iperf3 — COPY_STREAMS streams where an agent's
    server takes them, and xrdcp without its per-page CRC32C (the CPU it costs is what xrdcp
    lost to the load in the lab's tests); a copy over SSH as sites run it (its default spec)."""
    from iepm.probes.base import SSH_LOGIN

    size_mb = max(1, min(COPY_MAX_MB, int(rate_mbit * COPY_SECONDS / 8)))
    wanted: dict[str, Any] = {
        "size": f"{size_mb}M",
        "duration_s": COPY_DEADLINE_S,
        "connect_timeout_s": COPY_CONNECT_S,
    }
    if module.META.server != SSH_LOGIN:
        wanted |= {"streams": COPY_STREAMS, "page_checksums": False}
    return {k: v for k, v in wanted.items() if k in module.Spec.model_fields}


def agent_toml(
    site: str, address: str, base: Path, memory: Path, monitor: str, token: str, kinds: list[str]
) -> str:
    """agent.toml of a site's agent: this demo's monitor may lease ``kinds`` within limits
    that fit the demo's tests."""
    from iepm.remote.trust import token_digest

    low, high = AGENT_SERVER_PORTS
    return "\n".join(
        [
            "[agent]",
            f"name = {_toml_str(site)}",
            f"state_dir = {_toml_str(base / 'state')}",
            f"memory_dir = {_toml_str(memory)}",
            f"server_ports = [{low}, {high}]",
            f"server_bind = {_toml_str(address)}",
            f"slot_grace_s = {AGENT_GRACE_S}",
            "",
            "[[monitors]]",
            f"name = {_toml_str(monitor)}",
            f"token_sha256 = {_toml_str(token_digest(token))}",
            f"probes = {_toml_value(kinds)}",
            "[monitors.limits]",
            f"max_duration_s = {int(COPY_DEADLINE_S) * 2}",
            "max_streams = 8",
            'max_window = "16M"',
            "tests_per_hour = 3600",
            f'max_size = "{COPY_MAX_MB}M"',
            "",
        ]
    )


def _wait(
    what: str, ready: Callable[[], bool], procs: list[subprocess.Popen[bytes]], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        dead = [p.pid for p in procs if p.poll() is not None]
        if dead:
            raise LabError(f"{what}: PID {', '.join(map(str, dead))} exited (see its log)")
        if time.monotonic() > deadline:
            raise LabError(f"{what}: not ready after {timeout_s:g} s")
        time.sleep(0.1)


def _start_in_sites(
    lab: Any,
    stack: contextlib.ExitStack,
    sites: list[str],
    what: str,
    port: int,
    start_s: float,
    start: Callable[[str], subprocess.Popen[bytes]],
) -> list[subprocess.Popen[bytes]]:
    """One server per site (``start(site)``), each stopped by PID when the stack unwinds, then
    wait until every site listens on ``port``."""
    procs = []
    for site in sites:
        proc = start(site)
        procs.append(proc)
        stack.callback(lab.stop, proc)
    _wait(what, lambda: all(lab.listening(s, port) for s in sites), procs, start_s)
    return procs


def softflowd_argv(dev: str, collector_port: int, pid_file: Path, control: Path) -> list[str]:
    """softflowd on ``dev`` exporting NetFlow v9 to the collector on the monitor's loopback."""
    argv = ["softflowd", "-d", "-i", dev, "-v", "9", "-n", f"127.0.0.1:{collector_port}"]
    # A stream is exported as soon as it ends, so each test's flows come within seconds.
    argv += ["-t", "expint=1", "-t", "tcp.fin=1", "-t", "tcp.rst=1", "-t", "tcp=30"]
    # libpcap's default 2 MiB ring overflows when a busy host schedules softflowd late: on
    # kek's path at load 10-12 it dropped 5.6 % of the packets (a test's flows then read 3-6 %
    # low); with 32 MiB none (tests/flows/test_lab_demo_path.py).
    argv += ["-B", str(SOFTFLOWD_BUFFER_BYTES)]
    return [*argv, "-p", str(pid_file), "-c", str(control)]


def _save_statistics(lab: Any, node: str, control: Path, out: Path) -> None:
    """softflowctl's statistics of a running softflowd (packets libpcap dropped) into ``out``."""
    run = lab.exec(node, ["softflowctl", "-c", str(control), "statistics"], SERVER_START_S)
    out.write_text(run.stdout or run.stderr or "softflowctl said nothing\n", encoding="utf-8")


def _udp_listening(lab: Any, node: str, port: int) -> bool:
    return bool(lab.exec(node, ["ss", "-Hlun", f"sport = :{port}"], 10).stdout.strip())


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
    # Lab mode: each site's agent; the flow collector and its exporters (softflowd).
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    exporters: list[subprocess.Popen[bytes]] = field(default_factory=list)
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
        copies: bool = False,
        flows: bool = False,
    ) -> Demo:
        """``copies``: an agent in each site and the memory-to-memory copies through it;
        ``flows``: softflowd on the monitor's interfaces exporting to iepm's collector (lab
        only; ``iepm demo`` asks for both)."""
        workdir.mkdir(parents=True, exist_ok=True)
        reason = "--loopback was given" if loopback else _lab_unavailable()
        if reason is None:
            return cls._start_lab(workdir, topology, lab_name, say, copies=copies, flows=flows)
        say(f"iepm demo: no WAN lab ({reason}); measuring loopback targets 127.0.0.x instead")
        return cls._start_loopback(workdir)

    @classmethod
    def _start_lab(
        cls,
        workdir: Path,
        topology: str | Path | dict[str, Any],
        lab_name: str | None,
        say: Callable[[str], None],
        *,
        copies: bool,
        flows: bool,
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
            monitor = f"{lab.name}-{monitors[0]}"
            logs = workdir / "logs"
            logs.mkdir(exist_ok=True)
            # Agents' state and tokens, softflowd's pid files: removed after all of them stop.
            scratch = Path(tempfile.mkdtemp(prefix=f"iepm-demo-{lab.name}-", dir="/var/tmp"))
            stack.callback(shutil.rmtree, scratch, True)
            modules = copy_probes(say) if copies else []
            ssh_modules = ssh_copy_probes(say) if modules else []
            targets: list[dict[str, Any]] = [
                {"name": s, "address": lab.address(s), "site": s, "port": IPERF3_PORT}
                for s in sites
            ]
            servers, agents = [], []
            if modules:
                agents = cls._start_agents(lab, sites, monitor, scratch, logs, modules, stack)
                for t in targets:
                    t["agent"] = {
                        "url": f"http://{t['address']}:{AGENT_PORT}",
                        "credential_file": str(scratch / f"{t['site']}.token"),
                        # A busy host's agent may take more than the default 10 s to start
                        # a server (the demo's run at load 20 saw 4 of 179 leases time out).
                        "request_timeout_s": AGENT_REQUEST_S,
                    }
                    t["probes"] = [*DEMO_PROBES, *(m.NAME for m in modules)]
                    t["rate_mbit"] = rate = expected_mbit(lab.plan, monitors[0], t["site"])
                    t["params"] = {m.NAME: copy_params(m, rate) for m in modules}
                    t["params"]["iperf3"] = iperf3_params(
                        bdp_bytes(lab.plan, monitors[0], t["site"])
                    )
                if ssh_modules:
                    sshds = cls._start_sshds(lab, sites, scratch, logs, stack)
                    servers += [proc for _, proc in sshds.values()]
                    memory = Path(tempfile.mkdtemp(prefix=f"iepm-demo-{lab.name}-", dir="/dev/shm"))
                    stack.callback(shutil.rmtree, memory, True)
                    targets += [
                        {
                            "name": f"{t['site']}-ssh",
                            "address": t["address"],
                            "site": t["site"],
                            # The copy writes into a private directory made (and removed) in
                            # memory_dir; the demo's own directories, removed at exit.
                            "ssh": {
                                **sshd.access(),
                                "step_timeout_s": SSH_STEP_S,
                                "memory_dir": str(memory),
                                "work_dir": str(scratch),
                            },
                            # The seed's comparison pairs a copy with the iperf3 of its own
                            # target: the same tuned iperf3, both every COPY_EVERY_S.
                            "probes": ["iperf3", *(m.NAME for m in ssh_modules)],
                            "params": {
                                "iperf3": t["params"]["iperf3"],
                                **{m.NAME: copy_params(m, t["rate_mbit"]) for m in ssh_modules},
                            },
                            "schedule": {
                                p: COPY_EVERY_S for p in ("iperf3", *(m.NAME for m in ssh_modules))
                            },
                        }
                        for t, (sshd, _) in zip(list(targets), sshds.values(), strict=True)
                    ]
            else:
                servers += _start_in_sites(
                    lab, stack, sites, "iperf3 servers", IPERF3_PORT, SERVER_START_S,
                    lambda site: lab.popen(
                        site, ["iperf3", "-s", "-B", lab.address(site), "-p", str(IPERF3_PORT)]
                    ),
                )  # fmt: skip
            url = "sqlite:///" + str((workdir / "archive.db").resolve())
            exporters = []
            if flows:
                exporters = cls._start_flows(lab, monitors[0], url, scratch, logs, stack, say)
            schedule = {m.NAME: COPY_EVERY_S for m in modules}
            if modules:
                schedule["iperf3"] = AGENT_IPERF3_EVERY_S
            text = demo_config(
                workdir, targets, monitor=monitor, netns=lab.netns(monitors[0]), schedule=schedule
            )
            (workdir / "targets.toml").write_text(text, encoding="utf-8")
            config = load_config_text(text, workdir / "targets.toml")
            started = (
                f"agents PIDs {', '.join(str(p.pid) for p in agents)} (iperf3 and "
                f"{', '.join(m.NAME for m in modules)}: iperf3 ({IPERF3_STREAMS} streams, "
                f"{IPERF3_SECONDS} s, windows from the paths) every {AGENT_IPERF3_EVERY_S:g} s, "
                f"copies every {COPY_EVERY_S:g} s)"
                + (
                    f"; sshd PIDs {', '.join(str(p.pid) for p in servers)} "
                    f"({', '.join(m.NAME for m in ssh_modules)} and its iperf3 every "
                    f"{COPY_EVERY_S:g} s, targets <site>-ssh)"
                    if ssh_modules
                    else ""
                )
                if agents
                else f"iperf3 servers PIDs {', '.join(str(p.pid) for p in servers)}"
            )
            say(f"iepm demo: lab {lab.name} is up: {len(sites)} sites ({', '.join(sites)})")
            say(f"iepm demo: {started}")
        except BaseException:
            stack.close()
            raise
        return cls(
            workdir,
            config,
            "lab",
            lab=lab,
            servers=servers,
            agents=agents,
            exporters=exporters,
            stack=stack,
        )

    @staticmethod
    def _start_agents(
        lab: Any,
        sites: list[str],
        monitor: str,
        scratch: Path,
        logs: Path,
        modules: list[ModuleType],
        stack: contextlib.ExitStack,
    ) -> list[subprocess.Popen[bytes]]:
        """An ``iepm agent`` in each site's namespace, leasing iperf3 and the copies' servers
        to this monitor; its state under ``scratch``, its memory slots on /dev/shm."""
        from iepm.remote.trust import new_token

        memory = Path(tempfile.mkdtemp(prefix=f"iepm-demo-{lab.name}-", dir="/dev/shm"))
        stack.callback(shutil.rmtree, memory, True)
        # The copy servers run as nobody, who must reach the slots all the way down.
        for path in (scratch, memory):
            path.chmod(0o755)
        kinds = ["iperf3", *sorted({m.META.server for m in modules if m.META.server})]

        def start_agent(site: str) -> subprocess.Popen[bytes]:
            token = new_token()
            token_file = scratch / f"{site}.token"
            token_file.write_text(token + "\n", encoding="utf-8")
            token_file.chmod(0o600)
            base = scratch / site
            (base / "state").mkdir(parents=True)
            for path in (base, base / "state"):
                path.chmod(0o755)
            config = base / "agent.toml"
            text = agent_toml(site, lab.address(site), base, memory / site, monitor, token, kinds)
            config.write_text(text, encoding="utf-8")
            argv = [sys.executable, "-m", "iepm.cli", "agent", "--config", str(config)]
            argv += ["--listen", f"{lab.address(site)}:{AGENT_PORT}"]
            return lab.popen(site, argv, log=logs / f"agent-{site}.log")

        return _start_in_sites(
            lab, stack, sites, "the sites' agents", AGENT_PORT, AGENT_START_S, start_agent
        )

    @staticmethod
    def _start_sshds(
        lab: Any, sites: list[str], scratch: Path, logs: Path, stack: contextlib.ExitStack
    ) -> dict[str, Any]:
        """A private sshd (key login only, its keys under ``scratch``) in each site's
        namespace, for the copies over SSH: site → (its PrivateSshd, its process)."""
        from iepm.lab.sshd import prepare_sshd, sshd_argv

        found = {}

        def start(site: str) -> subprocess.Popen[bytes]:
            found[site] = prepare_sshd(scratch / f"sshd-{site}", lab.address(site), SSHD_PORT)
            return lab.popen(site, sshd_argv(found[site]), log=logs / f"sshd-{site}.log")

        procs = _start_in_sites(
            lab, stack, sites, "the sites' sshd", SSHD_PORT, SERVER_START_S, start
        )
        return {site: (found[site], proc) for site, proc in zip(sites, procs, strict=True)}

    @staticmethod
    def _start_flows(
        lab: Any,
        monitor: str,
        url: str,
        scratch: Path,
        logs: Path,
        stack: contextlib.ExitStack,
        say: Callable[[str], None],
    ) -> list[subprocess.Popen[bytes]]:
        """``iepm flows collect`` into the demo's archive and a softflowd on each of the
        monitor's interfaces exporting NetFlow v9 to it, both in the monitor's namespace."""
        from iepm.store import Archive

        if shutil.which("softflowd") is None:
            say(
                "iepm demo: no flow records: softflowd is not installed "
                "(Debian: apt-get install softflowd)"
            )
            return []
        with Archive.open(url):
            pass  # its tables exist before two processes write to it
        argv = [sys.executable, "-m", "iepm.cli", "flows", "collect", "--db", url]
        argv += ["--listen", f"127.0.0.1:{COLLECTOR_PORT}", "--flush-s", "1"]
        collector = lab.popen(monitor, argv, log=logs / "collector.log")
        # Registered before the exporters: stopped after them, it stores what they flush.
        stack.callback(lab.stop, collector, COLLECTOR_STOP_S)
        _wait(
            "iepm flows collect",
            lambda: _udp_listening(lab, monitor, COLLECTOR_PORT),
            [collector],
            SERVER_START_S * 3,
        )
        devs = [
            link.dev(monitor) for link in lab.plan.links.values() if monitor in (link.a, link.b)
        ]
        exporters = [collector]
        for dev in devs:
            control = scratch / f"softflowd-{dev}.ctl"
            argv = softflowd_argv(dev, COLLECTOR_PORT, scratch / f"softflowd-{dev}.pid", control)
            proc = lab.popen(monitor, argv, log=logs / f"softflowd-{dev}.log")
            exporters.append(proc)
            stack.callback(lab.stop, proc)
            # Before it stops: its counters (libpcap's drops) beside its log.
            stack.callback(_save_statistics, lab, monitor, control, logs / f"softflowd-{dev}.stats")
        say(
            f"iepm demo: softflowd on {', '.join(devs)} exports NetFlow v9 to iepm flows collect "
            f"into the archive: PIDs {', '.join(str(p.pid) for p in exporters)}"
        )
        return exporters

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
        """Stop the agents, servers and flow processes (by PID) and tear the lab down; safe to
        call twice."""
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
    copies: bool = True,
    flows: bool = True,
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
            workdir,
            loopback=loopback,
            topology=topology,
            lab_name=lab_name,
            say=console.print,
            copies=copies,
            flows=flows,
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
        console.print("iepm demo: stopped; agents, servers, flow exporter and lab removed")
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
    copies: Annotated[
        bool,
        typer.Option(
            "--copies/--no-copies",
            help="Lab: an agent and an sshd in each site, memory-to-memory copies through them.",
        ),
    ] = True,
    flows: Annotated[
        bool,
        typer.Option(
            "--flows/--no-flows",
            help="Lab: softflowd on the monitor's interfaces exporting to iepm's collector.",
        ),
    ] = True,
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
            copies=copies,
            flows=flows,
        )
    except ValueError as exc:  # --listen; iepm's own errors take the table's code (guarded)
        raise fail(str(exc)) from None


def register(app: typer.Typer) -> None:
    """Add ``iepm demo`` to the ``iepm`` command."""
    app.command("demo")(guarded(demo_command))
