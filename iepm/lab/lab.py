"""Build, inspect, change and tear down a WAN lab.

A lab is one network namespace per host (``<lab>-<host>``), one address per host on its ``lo``
(from 198.18.0.0/15), and per link a TUN device in each end's namespace joined by a delay-line
process (:mod:`iepm.lab.delayline`). Routes are /32 host routes ``dev <tun> src <own address>``;
routers forward, monitors and targets do not. Nothing is created in the root namespace.

Everything created is recorded in a state file (``/run/iepm-lab/<lab>.json``) *before* it is
created, so :func:`down` can remove it after any crash, ``kill -9`` included.

Typical use in a test or demo::

    with Lab.up("examples/lab/wan.toml") as lab:
        ns = lab.netns("mon")                    # run probes as: ip netns exec <ns> ping ...
        run = lab.exec("mon", ["ping", "-c", "5", lab.address("cern")])
        truth = lab.ground_truth("mon", "cern")  # rtt_ms, rate_mbit, loss_percent, hops, ...
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

from iepm.errors import ConfigError, LabError
from iepm.lab import netns as nx
from iepm.lab.delayline import Params, control, steady_state_loss_percent
from iepm.lab.topology import (
    EventSpec,
    LinkInfo,
    Plan,
    Topology,
    as_topology,
    event_problems,
    plan,
    validate,
)
from iepm.runner import GRACE_S, RawRun, run_command

DEFAULT_STATE_DIR = Path("/run/iepm-lab")
READY_TIMEOUT_S = 30.0  # many links start at once on a loaded 2-core box
LISTEN_TIMEOUT_S = 30.0  # a server starting in a namespace on a loaded 2-core box
IPERF3_PORT = 5201
TUN_QUEUE_LEN = 10_000  # packets the kernel may queue for a delay line that is momentarily busy
DIR_KEYS = {"both": "both", "a_to_b": "ab", "b_to_a": "ba"}


def state_dir_default() -> Path:
    return Path(os.environ.get("IEPM_LAB_STATE_DIR", str(DEFAULT_STATE_DIR)))


@contextlib.contextmanager
def _locked(state_dir: Path, name: str) -> Iterator[None]:
    """Serialise up/down/state updates of one lab across processes."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / f"{name}.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)  # atomic: a crash never leaves half a state file


def read_state(name: str, state_dir: Path | None = None) -> dict[str, Any] | None:
    path = (state_dir or state_dir_default()) / f"{name}.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise LabError(f"{path}: unreadable lab state ({exc}); remove it after `ip netns`") from exc
    return data


def running_labs(state_dir: Path | None = None) -> list[str]:
    """Names of labs that have a state file."""
    sd = state_dir or state_dir_default()
    if not sd.is_dir():
        return []
    return sorted(p.stem for p in sd.glob("*.json"))


def down(name: str, state_dir: Path | None = None) -> dict[str, Any]:
    """Remove every namespace and process of lab ``name``, with or without a state file.

    Processes are matched by PID *and* start time (a reused PID is never killed); anything
    still running inside the lab's namespaces is killed before they are deleted. Raises LabError
    naming the leftovers if something survives, and then keeps the state file for a retry.
    """
    nx.require_privileges()
    sd = state_dir or state_dir_default()
    with _locked(sd, name):
        state = read_state(name, sd) or {}
        records = [nx.ProcRecord.from_json(p) for p in state.get("processes", [])]
        survivors = nx.terminate(records)
        prefix = f"{name}-"
        namespaces = set(state.get("namespaces", []))
        namespaces |= {ns for ns in nx.list_netns() if ns.startswith(prefix)}
        stray: list[int] = []
        for ns in sorted(namespaces):
            stray += nx.kill_pids(nx.netns_pids(ns))
        existing = set(nx.list_netns())
        for ns in sorted(namespaces & existing):
            nx.run(["ip", "netns", "del", ns], check=False)
        left_ns = sorted(ns for ns in nx.list_netns() if ns.startswith(prefix))
        survivors = [r for r in survivors if r.alive()]
        if left_ns or survivors or stray:
            raise LabError(
                f"lab {name}: could not remove namespaces {left_ns} / processes "
                f"{[r.pid for r in survivors] + stray}; state kept in {sd / (name + '.json')}"
            )
        with contextlib.suppress(FileNotFoundError):
            (sd / f"{name}.json").unlink()
        shutil.rmtree(sd / name, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (sd / f"{name}.lock").unlink()
    return {
        "name": name,
        "namespaces_removed": sorted(namespaces),
        "processes_stopped": [r.pid for r in records],
    }


class Lab:
    """A running lab. Create with :meth:`up` (builds it) or :meth:`attach` (already running).

    Use as a context manager to tear it down on exit, even when the body raises.
    """

    def __init__(self, the_plan: Plan, state_dir: Path) -> None:
        self.plan = the_plan
        self.state_dir = state_dir
        self._owned = False  # True when this object built the lab (and should tear it down)

    # --- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def up(
        cls,
        topology: Topology | Mapping[str, Any] | str | Path,
        *,
        name: str | None = None,
        state_dir: Path | None = None,
    ) -> Lab:
        """Build a lab from a Topology, a dict in the TOML's shape, or a TOML file path.

        ``name`` overrides ``[lab] name`` (parallel tests use unique names). If a lab of that
        name is already up with the same topology this attaches to it (idempotent); with a
        different topology it raises LabError. Invalid topologies raise ConfigError before
        anything is created.
        """
        topo = as_topology(topology)
        the_plan = plan(topo, name)
        nx.require_privileges()
        sd = state_dir or state_dir_default()
        lab = cls(the_plan, sd)
        with _locked(sd, the_plan.name):
            state = read_state(the_plan.name, sd)
            if state is not None:
                return lab._reuse(state)
            clash = [ns for ns in nx.list_netns() if ns.startswith(the_plan.name + "-")]
            if clash:
                raise LabError(
                    f"namespaces {clash} exist but lab {the_plan.name} has no state file; "
                    f"remove them with `iepm lab down {the_plan.name}`"
                )
            try:
                lab._build()
            except BaseException:
                lab._owned = True
                with contextlib.suppress(Exception):
                    lab._down_unlocked()
                raise
        lab._owned = True
        return lab

    def _reuse(self, state: dict[str, Any]) -> Lab:
        if state.get("digest") != self.plan.topology.digest():
            raise LabError(
                f"lab {self.name} is already running with a different topology; "
                f"run `iepm lab down {self.name}` first"
            )
        dead = [r.pid for r in self._records() if r.role == "delayline" and not r.alive()]
        if state.get("phase") != "up" or dead:
            raise LabError(
                f"lab {self.name} exists but is broken (phase {state.get('phase')}, dead delay "
                f"lines {dead}); run `iepm lab down {self.name}` and bring it up again"
            )
        return self

    @classmethod
    def attach(cls, name: str, state_dir: Path | None = None) -> Lab:
        """Handle on a lab that is already up (for status, exec and events)."""
        sd = state_dir or state_dir_default()
        state = read_state(name, sd)
        if state is None:
            running = running_labs(sd)
            raise LabError(f"no lab named {name!r} is up (running: {', '.join(running) or 'none'})")
        topo = validate(state["topology"], f"{sd / name}.json")
        return cls(plan(topo, name), sd)

    @property
    def created(self) -> bool:
        """True if this handle built the lab; False if :meth:`up` found it already running
        (then leaving a ``with`` block does not tear it down)."""
        return self._owned

    def down(self) -> dict[str, Any]:
        """Tear the lab down (see :func:`down`)."""
        return down(self.name, self.state_dir)

    def _down_unlocked(self) -> None:
        # Undo a failed build while up() still holds the lock (down() would wait for it).
        state = self._state()
        nx.terminate(nx.ProcRecord.from_json(p) for p in state.get("processes", []))
        for ns in state.get("namespaces", []):
            nx.kill_pids(nx.netns_pids(ns))
            nx.run(["ip", "netns", "del", ns], check=False)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> Lab:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._owned:
            self.down()

    # --- names and paths ------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def topology(self) -> Topology:
        return self.plan.topology

    @property
    def state_file(self) -> Path:
        return self.state_dir / f"{self.name}.json"

    @property
    def run_dir(self) -> Path:
        return self.state_dir / self.name

    @property
    def nodes(self) -> list[str]:
        return list(self.plan.roles)

    def netns(self, node: str) -> str:
        """Namespace of ``node``: run any tool there with ``ip netns exec <ns> <tool> ...``."""
        self._node(node)
        return self.plan.netns(node)

    def address(self, node: str) -> str:
        """The node's address (IPv4, from 198.18.0.0/15): the target address for probes."""
        self._node(node)
        return self.plan.addresses[node]

    def _node(self, node: str) -> None:
        if node not in self.plan.roles:
            raise LabError(f"lab {self.name} has no node {node!r} (nodes: {', '.join(self.nodes)})")

    def _ctrl(self, link: str) -> Path:
        return self.run_dir / f"ctl-{self.plan.links[link].index}.sock"

    # --- state file -----------------------------------------------------------------------------

    def _state(self) -> dict[str, Any]:
        return read_state(self.name, self.state_dir) or {}

    def _save(self, state: Mapping[str, Any]) -> None:
        _write_json(self.state_file, state)

    def _records(self) -> list[nx.ProcRecord]:
        return [nx.ProcRecord.from_json(p) for p in self._state().get("processes", [])]

    def _record(self, rec: nx.ProcRecord) -> None:
        state = self._state()
        state.setdefault("processes", []).append(rec.to_json())
        self._save(state)

    @property
    def t0(self) -> float:
        """Wall-clock time (Unix s) at which lab time 0 began: the event schedule's origin."""
        return float(self._state().get("t0_unix", 0.0))

    def lab_time(self, unix_time: float | None = None) -> float:
        """Lab seconds elapsed at ``unix_time`` (default now), after time compression."""
        now = time.time() if unix_time is None else unix_time
        return (now - self.t0) * self.topology.lab.time_compression

    def real_time(self, lab_seconds: float) -> float:
        """Unix time at which lab time ``lab_seconds`` occurs."""
        return self.t0 + lab_seconds / self.topology.lab.time_compression

    # --- building -------------------------------------------------------------------------------

    def _build(self) -> None:
        p = self.plan
        self.run_dir.mkdir(parents=True, exist_ok=True)
        namespaces = [p.netns(n) for n in p.roles]
        state: dict[str, Any] = {
            "name": p.name,
            "digest": p.topology.digest(),
            "topology": p.topology.model_dump(mode="json"),
            "namespaces": namespaces,
            "processes": [],
            "phase": "building",
            "created_unix": time.time(),
        }
        self._save(state)  # intent first: down() can undo a crash at any later point
        nx.ip_batch(None, (f"netns add {ns}" for ns in namespaces))
        for node in p.roles:
            cmds = ["link set lo up", f"addr add {p.addresses[node]}/32 dev lo"]
            for link in p.links.values():
                if node in (link.a, link.b):
                    dev = link.dev(node)
                    cmds.append(f"tuntap add dev {dev} mode tun")
                    cmds.append(f"link set {dev} txqueuelen {TUN_QUEUE_LEN} mtu 1500 up")
            nx.ip_batch(p.netns(node), cmds)
            nx.run(
                ["ip", "netns", "exec", p.netns(node), "sysctl", "-q", "-w", *self._sysctls(node)]
            )
        procs = [self._start_delay_line(link) for link in p.links.values()]
        self._wait_ready(procs)
        for node, table in p.routes.items():
            self._set_routes(node, table)
        state = self._state()
        state["t0_unix"] = time.time()
        state["phase"] = "up"
        self._save(state)
        if p.topology.events or p.topology.traffic:
            _, rec = nx.spawn(
                [sys.executable, "-m", "iepm.lab.events", self.name, str(self.state_dir)],
                role="conductor",
                log=self.run_dir / "conductor.log",
            )
            self._record(rec)

    def _sysctls(self, node: str) -> list[str]:
        router = self.plan.roles[node] == "router"
        settings: dict[str, str | int] = {
            "net.ipv4.ip_forward": int(router),
            "net.ipv4.conf.all.rp_filter": 0,  # route switches make paths asymmetric
            "net.ipv4.conf.default.rp_filter": 0,
            "net.ipv4.icmp_ratelimit": 0,  # traceroute through a lab router must never see '*'
            "net.ipv6.conf.all.disable_ipv6": 1,  # keep the links quiet: IPv4 only
            "net.ipv6.conf.default.disable_ipv6": 1,
        }
        host = next(h for h in self.topology.hosts if h.name == node)
        settings.update(host.sysctl)
        return [f"{k}={v}" for k, v in settings.items()]

    def _start_delay_line(self, link: LinkInfo) -> tuple[subprocess.Popen[bytes], Path]:
        p = self.plan
        spec = {
            "link": link.name,
            "ns_a": p.netns(link.a),
            "dev_a": link.dev_a,
            "ns_b": p.netns(link.b),
            "dev_b": link.dev_b,
            "ctrl": str(self._ctrl(link.name)),
            "seed": f"{p.topology.lab.seed}:{link.index}",
            "priority": p.topology.lab.delay_line_priority,
            "compensation_us": p.topology.lab.latency_compensation_us,
            "ab": asdict(link.ab),
            "ba": asdict(link.ba),
        }
        spec_path = self.run_dir / f"dl-{link.index}.json"
        _write_json(spec_path, spec)
        proc, rec = nx.spawn(
            [sys.executable, "-m", "iepm.lab.delayline", str(spec_path)],
            role="delayline",
            log=self.run_dir / f"dl-{link.index}.log",
            link=link.name,
        )
        self._record(rec)
        return proc, self.run_dir / f"dl-{link.index}.log"

    def _wait_ready(self, procs: Sequence[tuple[subprocess.Popen[bytes], Path]]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(procs)
        while pending:
            proc, log = pending[0]
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise LabError(f"delay line exited with {proc.returncode}:\n{tail}")
            if b"ready" in (log.read_bytes() if log.exists() else b""):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise LabError(f"delay line (pid {proc.pid}) not ready in {READY_TIMEOUT_S} s")
            time.sleep(0.01)

    def _set_routes(self, node: str, table: Mapping[str, str]) -> None:
        p = self.plan
        src = p.addresses[node]
        nx.ip_batch(
            p.netns(node),
            (
                f"route replace {p.addresses[dest]}/32 dev {p.links[link].dev(node)} src {src}"
                for dest, link in sorted(table.items())
            ),
        )

    # --- running things inside nodes ------------------------------------------------------------

    def command(self, node: str, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` inside ``node``: ``ip netns exec <ns> ...``."""
        return ["ip", "netns", "exec", self.netns(node), *[str(a) for a in argv]]

    async def aexec(self, node: str, argv: Sequence[str], timeout_s: float = 60.0) -> RawRun:
        """Async :meth:`exec`."""
        return await run_command(self.command(node, argv), timeout_s)

    def exec(self, node: str, argv: Sequence[str], timeout_s: float = 60.0) -> RawRun:
        """Run ``argv`` inside ``node`` with a deadline; returns the RawRun (never raises for
        the tool's own failure). Not callable from a running event loop: use :meth:`aexec`."""
        return asyncio.run(self.aexec(node, argv, timeout_s))

    def popen(
        self, node: str, argv: Sequence[str], log: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a background process (e.g. ``iperf3 -s``) inside ``node``.

        It is recorded in the state file, so ``down`` stops it even if the caller crashes.
        Stop it earlier with :meth:`stop`.
        """
        # Unlike the lab's own helpers it also dies with this process (a test, the demo).
        proc, rec = nx.spawn(
            self.command(node, argv), role="user", log=log, node=node, die_with_monitor=True
        )
        with _locked(self.state_dir, self.name):
            self._record(rec)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = GRACE_S) -> int | None:
        """Stop a process started with :meth:`popen` (its whole group) and return its status."""
        rec = nx.ProcRecord("user", proc.pid, nx.start_time(proc.pid), [])
        nx.terminate([rec], grace_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
        return proc.returncode

    def listening(self, node: str, port: int) -> bool:
        """Whether a TCP socket listens on ``port`` inside ``node`` (``ss``, no connection made:
        a one-shot ``iperf3 -s -1`` would take a probe connection for its test)."""
        res = nx.run(self.command(node, ["ss", "-Hltn", f"sport = :{port}"]), check=False)
        return bool(res.stdout.strip())

    def wait_listening(
        self, node: str, port: int = IPERF3_PORT, timeout_s: float = LISTEN_TIMEOUT_S
    ) -> None:
        """Wait until a server in ``node`` listens on ``port``; LabError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.listening(node, port):
            if time.monotonic() > deadline:
                raise LabError(f"nothing listens on port {port} in {node} after {timeout_s:g} s")
            time.sleep(0.05)

    def wait_reachable(
        self, node: str, others: Sequence[str] | None = None, timeout_s: float = LISTEN_TIMEOUT_S
    ) -> None:
        """Wait until ``node`` has had a ping answered by each of ``others`` (default: every
        other node): neighbours resolved and delay lines passing packets, so the first
        measurement of a test does not pay for either. LabError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        for other in others if others is not None else [n for n in self.nodes if n != node]:
            argv = ["ping", "-n", "-c", "1", "-W", "1", self.address(other)]
            while self.exec(node, argv, timeout_s=5.0).returncode != 0:
                if time.monotonic() > deadline:
                    raise LabError(
                        f"{other} does not answer pings from {node} after {timeout_s:g} s"
                    )

    # --- links, routes, events ------------------------------------------------------------------

    def link_state(self, link: str) -> dict[str, Any]:
        """Live parameters and counters of a link, from its delay line."""
        if link not in self.plan.links:
            raise LabError(f"lab {self.name} has no link {link!r} ({', '.join(self.plan.links)})")
        try:
            return control(self._ctrl(link), {"cmd": "get"})
        except OSError as exc:
            raise LabError(f"delay line of link {link} is not answering: {exc}") from exc

    def link_trace(
        self, link: str, size: int = 0, count: int = 0
    ) -> list[tuple[float, float, int]]:
        """The delay line's (arrival s, queue wait s, bytes queued for the link before it) of the
        ``a→b`` packets of ``size`` IP bytes traced since the last call, and trace the next
        ``count`` of them (0: stop)."""
        if link not in self.plan.links:
            raise LabError(f"lab {self.name} has no link {link!r} ({', '.join(self.plan.links)})")
        try:
            reply = control(self._ctrl(link), {"cmd": "trace", "size": size, "count": count})
        except OSError as exc:
            raise LabError(f"delay line of link {link} is not answering: {exc}") from exc
        return [(float(t), float(w), int(b)) for t, w, b in reply.get("trace", [])]

    def link_params(self, link: str) -> dict[str, Params]:
        state = self.link_state(link)
        return {d: Params.from_dict(state[d]["params"]) for d in ("ab", "ba")}

    def set_link(self, link: str, direction: str = "both", **changes: Any) -> None:
        """Change a link now, e.g. ``set_link("wan", delay_ms=80)`` or ``up=False``."""
        if link not in self.plan.links:
            raise LabError(f"lab {self.name} has no link {link!r}")
        reply = control(
            self._ctrl(link),
            {"cmd": "set", "dir": DIR_KEYS.get(direction, direction), "params": changes},
        )
        if not reply.get("ok"):
            raise LabError(f"link {link}: {reply.get('error')}")

    def switch_route(self, path: Sequence[str], symmetric: bool = True) -> None:
        """Make traffic to ``path[-1]`` follow ``path`` (and the reverse, if symmetric)."""
        for node, table in self.plan.path_routes(list(path), symmetric).items():
            self._set_routes(node, table)

    def spread_route(self, node: str, dest: str, next_hops: Sequence[str]) -> None:
        """Equal-cost multipath at ``node``: traffic to ``dest`` is split per flow over the links
        to ``next_hops`` (the kernel hashes each packet's addresses and ports, as a router's
        ECMP does; set ``net.ipv4.fib_multipath_hash_policy = 1`` in the node's sysctl for the
        ports to count). ``switch_route`` or another call replaces it."""
        self._node(node)
        self._node(dest)
        if len(next_hops) < 2:
            raise LabError("spread_route needs at least two next hops")
        devs = [self.plan.link_between(node, hop).dev(node) for hop in next_hops]
        route = (
            f"route replace {self.plan.addresses[dest]}/32 src {self.plan.addresses[node]} "
            + " ".join(f"nexthop dev {dev} weight 1" for dev in devs)
        )
        nx.ip_batch(self.netns(node), [route])

    def apply(self, event: EventSpec | Mapping[str, Any]) -> None:
        """Apply one event now (its ``at_s`` is ignored)."""
        if not isinstance(event, EventSpec):
            try:
                event = EventSpec.model_validate(event)
            except Exception as exc:
                raise ConfigError(f"invalid event: {exc}") from None
        pairs = {frozenset((lk.a, lk.b)): lk.name for lk in self.plan.links.values()}
        problems = event_problems(event, ("event",), self.plan.roles, pairs, self.plan.links)
        if problems:
            raise ConfigError("; ".join(f"{'.'.join(map(str, loc))}: {m}" for loc, m in problems))
        if event.action == "route":
            assert event.path is not None
            self.switch_route(event.path, event.symmetric)
        else:
            assert event.link is not None
            self.set_link(event.link, event.direction, **event.link_changes())

    def events_log(self) -> list[dict[str, Any]]:
        """Events the conductor applied so far: ``{"at_s", "applied_unix", "event"}``."""
        path = self.run_dir / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # --- ground truth ---------------------------------------------------------------------------

    def path(self, src: str, dst: str) -> list[str]:
        """Nodes a packet from ``src`` to ``dst`` visits now, read from the kernels' routes."""
        self._node(src)
        self._node(dst)
        dev_to_link = {
            (node, link.dev(node)): link
            for link in self.plan.links.values()
            for node in (link.a, link.b)
        }
        nodes = [src]
        while nodes[-1] != dst:
            here = nodes[-1]
            dev = nx.route_dev(self.netns(here), self.address(dst))
            link = dev_to_link.get((here, dev or ""))
            if link is None:
                raise LabError(f"{here} has no route to {dst} ({self.address(dst)})")
            nodes.append(link.peer(here))
            if len(nodes) > len(self.plan.roles) + 1:
                raise LabError(f"routing loop from {src} to {dst}: {nodes}")
        return nodes

    def ground_truth(self, src: str, dst: str) -> dict[str, Any]:
        """What a perfect probe from ``src`` to ``dst`` would measure now (configured values).

        ``rtt_ms``: forward + reverse propagation delay (no queueing); ``rtt_stdev_ms``: RTT
        standard deviation from jitter; ``rate_mbit``: forward bottleneck (None = unlimited),
        counted in IP bytes; ``loss_percent``: round-trip loss (what ping sees), with
        ``loss_forward_percent`` / ``loss_reverse_percent`` one way (what iperf3 UDP sees);
        ``hops``: addresses of the routers in order (what traceroute shows before the target).
        """
        fwd, rev = self.path(src, dst), self.path(dst, src)
        fwd_params = [self._dir_params(a, b) for a, b in itertools.pairwise(fwd)]
        rev_params = [self._dir_params(a, b) for a, b in itertools.pairwise(rev)]

        def loss(ps: list[Params]) -> float:
            keep = math.prod(1 - steady_state_loss_percent(p) / 100 for p in ps)
            return 100 * (1 - keep)

        rates = [p.rate_mbit for p in fwd_params if p.rate_mbit is not None]
        fwd_ms = sum(p.delay_ms for p in fwd_params)
        rev_ms = sum(p.delay_ms for p in rev_params)
        keep_rt = (1 - loss(fwd_params) / 100) * (1 - loss(rev_params) / 100)
        return {
            "src": src,
            "dst": dst,
            "src_address": self.address(src),
            "dst_address": self.address(dst),
            "rtt_ms": fwd_ms + rev_ms,
            "delay_forward_ms": fwd_ms,
            "delay_reverse_ms": rev_ms,
            "rtt_stdev_ms": math.sqrt(sum(p.jitter_ms**2 for p in fwd_params + rev_params)),
            "rate_mbit": min(rates) if rates else None,
            "loss_percent": 100 * (1 - keep_rt),
            "loss_forward_percent": loss(fwd_params),
            "loss_reverse_percent": loss(rev_params),
            "hops": [self.address(n) for n in fwd[1:-1]],
            "path": fwd,
            "reverse_path": rev,
            "links_up": all(p.up for p in fwd_params + rev_params),
        }

    def _dir_params(self, a: str, b: str) -> Params:
        link = self.plan.link_between(a, b)
        params = self.link_params(link.name)
        return params["ab"] if a == link.a else params["ba"]

    # --- status ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Nodes, addresses, links (live parameters and counters) and processes alive."""
        state = self._state()
        links: dict[str, Any] = {}
        for name, link in self.plan.links.items():
            entry: dict[str, Any] = {
                "a": link.a,
                "b": link.b,
                "dev_a": link.dev_a,
                "dev_b": link.dev_b,
            }
            try:
                live = self.link_state(name)
                entry.update(a_to_b=live["ab"], b_to_a=live["ba"], delay_line_pid=live["pid"])
            except LabError as exc:
                entry.update(
                    a_to_b={"params": asdict(link.ab)},
                    b_to_a={"params": asdict(link.ba)},
                    error=str(exc),
                )
            links[name] = entry
        existing = set(nx.list_netns())
        return {
            "name": self.name,
            "phase": state.get("phase"),
            "t0_unix": state.get("t0_unix"),
            "lab_time_s": self.lab_time() if state.get("t0_unix") else None,
            "time_compression": self.topology.lab.time_compression,
            "nodes": {
                n: {
                    "role": role,
                    "address": self.plan.addresses[n],
                    "netns": self.plan.netns(n),
                    "netns_exists": self.plan.netns(n) in existing,
                }
                for n, role in self.plan.roles.items()
            },
            "links": links,
            "processes": [{**r.to_json(), "alive": r.alive()} for r in self._records()],
            "events_applied": self.events_log(),
        }
