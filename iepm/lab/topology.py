"""Lab topology: the TOML file format, its validation, addressing and routing.

Everything a topology can get wrong is caught here, before a single namespace exists. Errors name
the file, line and field (``lab.toml:23: links[1].delay_ms: ...``); tomllib keeps no positions, so
:mod:`iepm.tomlpos` maps table/key paths to lines by scanning the text.

See ``examples/lab/wan.toml`` for a commented example of every field.
"""

from __future__ import annotations

import hashlib
import heapq
import ipaddress
import itertools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import ErrorDetails

from iepm import tomlload
from iepm.errors import ConfigError
from iepm.lab.delayline import Params

LAB_POOL = ipaddress.ip_network("198.18.0.0/15")  # RFC 2544 benchmarking range, never routed
# Lab names may not contain '-': namespaces are "<lab>-<node>", which must be unambiguous.
LAB_NAME_RE = r"^[a-z][a-z0-9_]{0,23}$"
NODE_NAME_RE = r"^[a-z][a-z0-9_]{0,30}$"
Role = Literal["monitor", "target", "router"]
DirectionName = Literal["both", "a_to_b", "b_to_a"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Gilbert(_Model):
    """Gilbert-Elliott bursty loss: per-packet chance to enter (p) and leave (r) the bad state."""

    p_percent: float = Field(ge=0, le=100)
    r_percent: float = Field(ge=0, le=100)
    loss_bad_percent: float = Field(default=100.0, ge=0, le=100)
    loss_good_percent: float = Field(default=0.0, ge=0, le=100)


class DirectionOverride(_Model):
    """Parameters that differ in one direction of a link (asymmetric paths)."""

    rate_mbit: float | None = Field(default=None, gt=0, le=100_000)
    delay_ms: float | None = Field(default=None, ge=0, le=10_000)
    jitter_ms: float | None = Field(default=None, ge=0, le=10_000)
    loss_percent: float | None = Field(default=None, ge=0, le=100)
    queue_ms: float | None = Field(default=None, gt=0, le=60_000)
    queue_bytes: int | None = Field(default=None, gt=0)
    gilbert: Gilbert | None = None


class LinkSpec(_Model):
    """A point-to-point WAN link between hosts ``a`` and ``b``; ``delay_ms`` is one way."""

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,40}$")
    a: str
    b: str
    rate_mbit: float | None = Field(default=None, gt=0, le=100_000)
    delay_ms: float = Field(default=0.0, ge=0, le=10_000)
    jitter_ms: float = Field(default=0.0, ge=0, le=10_000)
    loss_percent: float = Field(default=0.0, ge=0, le=100)
    queue_ms: float | None = Field(default=None, gt=0, le=60_000)
    queue_bytes: int | None = Field(default=None, gt=0)
    reorder: bool = False
    gilbert: Gilbert | None = None
    cost: float | None = Field(default=None, gt=0)
    a_to_b: DirectionOverride | None = None
    b_to_a: DirectionOverride | None = None

    @property
    def link_name(self) -> str:
        return self.name or f"{self.a}-{self.b}"

    def params(self, direction: Literal["a_to_b", "b_to_a"]) -> Params:
        """Delay-line parameters of one direction: the link's values, then the override."""
        base: dict[str, Any] = {
            "rate_mbit": self.rate_mbit,
            "delay_ms": self.delay_ms,
            "jitter_ms": self.jitter_ms,
            "loss_percent": self.loss_percent,
            "queue_ms": self.queue_ms,
            "queue_bytes": self.queue_bytes,
        }
        gilbert = self.gilbert
        override = getattr(self, direction)
        if override is not None:
            base.update(override.model_dump(exclude_none=True, exclude={"gilbert"}))
            gilbert = override.gilbert or gilbert
        params = Params(reorder=self.reorder, **base)
        if gilbert is not None:
            params = params.updated(gilbert_params(gilbert))
        return params


def gilbert_params(g: Gilbert) -> dict[str, float]:
    return {
        "ge_p_percent": g.p_percent,
        "ge_r_percent": g.r_percent,
        "ge_loss_bad_percent": g.loss_bad_percent,
        "ge_loss_good_percent": g.loss_good_percent,
    }


class HostSpec(_Model):
    """A node: its own network namespace with one address (on ``lo``) from 198.18.0.0/15."""

    name: str = Field(pattern=NODE_NAME_RE)
    role: Role = "target"
    address: str | None = None
    sysctl: dict[str, str | int] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _in_pool(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            addr = ipaddress.IPv4Address(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IPv4 address") from exc
        if addr not in LAB_POOL:
            raise ValueError(f"{value} is outside the lab range {LAB_POOL}")
        return str(addr)

    @field_validator("sysctl")
    @classmethod
    def _sysctl_keys(cls, value: dict[str, str | int]) -> dict[str, str | int]:
        for key in value:
            if not re.fullmatch(r"net\.[a-z0-9_.]+", key):
                raise ValueError(f"sysctl {key!r}: only net.* keys (they are per namespace)")
        return value


class RouteSpec(_Model):
    """Pin the path between ``path[0]`` and ``path[-1]`` (both directions if symmetric)."""

    path: list[str] = Field(min_length=2)
    symmetric: bool = True


class EventSpec(_Model):
    """A change at lab time ``at_s``: ``route`` (switch a path) or ``link`` (set parameters)."""

    at_s: float = Field(default=0.0, ge=0)
    name: str | None = None
    action: Literal["route", "link"]
    path: list[str] | None = Field(default=None, min_length=2)
    symmetric: bool = True
    link: str | None = None
    direction: DirectionName = "both"
    rate_mbit: float | None = Field(default=None, gt=0, le=100_000)
    delay_ms: float | None = Field(default=None, ge=0, le=10_000)
    jitter_ms: float | None = Field(default=None, ge=0, le=10_000)
    loss_percent: float | None = Field(default=None, ge=0, le=100)
    queue_ms: float | None = Field(default=None, gt=0, le=60_000)
    up: bool | None = None

    @model_validator(mode="after")
    def _complete(self) -> EventSpec:
        if self.action == "route" and self.path is None:
            raise ValueError("a route event needs 'path' (list of node names)")
        if self.action == "link":
            if self.link is None:
                raise ValueError("a link event needs 'link' (the link's name)")
            if not self.link_changes():
                raise ValueError("a link event needs a parameter to change (delay_ms, up, …)")
        return self

    def link_changes(self) -> dict[str, Any]:
        keys = ("rate_mbit", "delay_ms", "jitter_ms", "loss_percent", "queue_ms", "up")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class TrafficSpec(_Model):
    """Background iperf3 load from ``src`` to ``dst`` with a constant, on/off or diurnal shape.

    Times are lab seconds (divided by ``lab.time_compression`` to get real seconds).
    """

    name: str | None = None
    src: str
    dst: str
    protocol: Literal["tcp", "udp"] = "tcp"
    rate_mbit: float | None = Field(default=None, gt=0, le=100_000)
    streams: int = Field(default=1, ge=1, le=32)
    profile: Literal["constant", "onoff", "diurnal"] = "constant"
    start_s: float = Field(default=0.0, ge=0)
    stop_s: float | None = Field(default=None, gt=0)
    on_s: float = Field(default=60.0, gt=0)
    off_s: float = Field(default=60.0, gt=0)
    period_s: float = Field(default=86_400.0, gt=0)
    peak_at_s: float = Field(default=50_400.0, ge=0)  # 14:00 of the lab day
    min_rate_mbit: float = Field(default=0.0, ge=0)
    step_s: float | None = Field(default=None, gt=0)
    port: int | None = Field(default=None, ge=1024, le=65535)

    @model_validator(mode="after")
    def _rates(self) -> TrafficSpec:
        if self.rate_mbit is None and (self.protocol == "udp" or self.profile == "diurnal"):
            raise ValueError("rate_mbit is required for UDP and for the diurnal profile")
        return self


class LabSection(_Model):
    name: str = Field(pattern=LAB_NAME_RE)
    seed: int = 0
    # Lab seconds per real second: 1440 makes a lab day pass in one real minute.
    time_compression: float = Field(default=1.0, gt=0, le=1_000_000)
    # Fixed forwarding latency of one delay-line pass (wake-up, two syscalls; 45-90 us measured
    # on a 2-core VM), subtracted from each configured delay so measured RTTs match the file.
    latency_compensation_us: float = Field(default=60.0, ge=0, le=5_000)
    # realtime (SCHED_FIFO) keeps delays exact while other work loads the CPUs; high = nice -20.
    delay_line_priority: Literal["realtime", "high", "normal"] = "realtime"


class Topology(_Model):
    lab: LabSection
    hosts: list[HostSpec] = Field(min_length=1)
    links: list[LinkSpec] = Field(default_factory=list)
    routes: list[RouteSpec] = Field(default_factory=list)
    events: list[EventSpec] = Field(default_factory=list)
    traffic: list[TrafficSpec] = Field(default_factory=list)

    def digest(self) -> str:
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- formatting errors -------------------------------------------------------------------------

Loc = tuple[str | int, ...]
HEADING = "invalid lab topology:"


# --- semantic checks ----------------------------------------------------------------------------


def _check_path(
    path: list[str], base: Loc, roles: Mapping[str, str], pairs: Mapping[frozenset[str], str]
) -> list[tuple[Loc, str]]:
    problems: list[tuple[Loc, str]] = []
    for i, node in enumerate(path):
        if node not in roles:
            problems.append(((*base, "path", i), f"unknown host {node!r}"))
    if problems:
        return problems
    for i in range(len(path) - 1):
        if frozenset((path[i], path[i + 1])) not in pairs:
            problems.append(
                ((*base, "path", i + 1), f"no link between {path[i]} and {path[i + 1]}")
            )
    for i, node in enumerate(path[1:-1], 1):
        if roles[node] != "router":
            problems.append(((*base, "path", i), f"{node} is a {roles[node]}, not a router"))
    if len(set(path)) != len(path):
        problems.append(((*base, "path"), "a path may not visit a node twice"))
    return problems


def semantic_problems(topo: Topology) -> list[tuple[Loc, str]]:
    """Cross-field checks pydantic cannot express: names, references, paths."""
    problems: list[tuple[Loc, str]] = []
    roles: dict[str, str] = {}
    addresses: dict[str, str] = {}
    for i, host in enumerate(topo.hosts):
        if host.name in roles:
            problems.append((("hosts", i, "name"), f"duplicate host name {host.name!r}"))
        roles.setdefault(host.name, host.role)
        if host.address is not None:
            if host.address in addresses:
                other = addresses[host.address]
                problems.append(
                    (("hosts", i, "address"), f"address {host.address} already used by {other}")
                )
            addresses.setdefault(host.address, host.name)
    link_names: set[str] = set()
    pairs: dict[frozenset[str], str] = {}
    for i, link in enumerate(topo.links):
        for end in ("a", "b"):
            if getattr(link, end) not in roles:
                problems.append(((("links", i, end)), f"unknown host {getattr(link, end)!r}"))
        if link.a == link.b:
            problems.append((("links", i, "b"), "a link needs two different hosts"))
        if link.link_name in link_names:
            problems.append((("links", i, "name"), f"duplicate link name {link.link_name!r}"))
        link_names.add(link.link_name)
        pair = frozenset((link.a, link.b))
        if pair in pairs:
            problems.append(
                (("links", i, "b"), f"{link.a} and {link.b} are already linked by {pairs[pair]}")
            )
        pairs.setdefault(pair, link.link_name)
    for i, route in enumerate(topo.routes):
        problems += _check_path(route.path, ("routes", i), roles, pairs)
    event_names: set[str] = set()
    for i, event in enumerate(topo.events):
        problems += event_problems(event, ("events", i), roles, pairs, link_names)
        if event.name is not None:
            if event.name in event_names:
                problems.append((("events", i, "name"), f"duplicate event name {event.name!r}"))
            event_names.add(event.name)
    flow_names: set[str] = set()
    for i, flow in enumerate(topo.traffic):
        for end in ("src", "dst"):
            if getattr(flow, end) not in roles:
                problems.append((("traffic", i, end), f"unknown host {getattr(flow, end)!r}"))
        name = flow.name or f"traffic{i}"
        if name in flow_names:
            problems.append((("traffic", i, "name"), f"duplicate traffic name {name!r}"))
        flow_names.add(name)
    return problems


def event_problems(
    event: EventSpec,
    base: Loc,
    roles: Mapping[str, str],
    pairs: Mapping[frozenset[str], str],
    link_names: Iterable[str],
) -> list[tuple[Loc, str]]:
    if event.action == "route" and event.path is not None:
        return _check_path(event.path, base, roles, pairs)
    if event.action == "link" and event.link not in set(link_names):
        return [((*base, "link"), f"unknown link {event.link!r}")]
    return []


def _describe(error: ErrorDetails) -> str:
    return str(error["msg"]).removeprefix("Value error, ")


def validate(
    data: Mapping[str, Any], source: str = "<topology>", text: str | None = None
) -> Topology:
    """Build a Topology from parsed TOML/dict data or raise ConfigError naming file:line: field."""
    doc = tomlload.TomlText(source, text or "", dict(data))
    topo = tomlload.validate(Topology, doc, describe=_describe, heading=HEADING)
    problems = semantic_problems(topo)
    if problems:
        raise tomlload.config_error(source, text, problems, HEADING)
    return topo


def load_topology(path: str | Path) -> Topology:
    """Read, decode, parse and validate a topology TOML file."""
    doc = tomlload.load(path)
    return validate(doc.data, doc.where, doc.text)


def as_topology(source: Topology | Mapping[str, Any] | str | Path) -> Topology:
    if isinstance(source, Topology):
        return source
    if isinstance(source, Mapping):
        return validate(source, "<dict>")
    return load_topology(source)


# --- resolution: addresses, devices, routes -----------------------------------------------------


@dataclass(frozen=True)
class LinkInfo:
    """A link as built: which TUN device it is in each end's namespace."""

    name: str
    index: int
    a: str
    b: str
    dev_a: str
    dev_b: str
    ab: Params
    ba: Params
    cost_ab: float
    cost_ba: float

    def dev(self, node: str) -> str:
        return self.dev_a if node == self.a else self.dev_b

    def peer(self, node: str) -> str:
        return self.b if node == self.a else self.a


@dataclass
class Plan:
    """Everything ``up`` needs, computed before touching the system."""

    topology: Topology
    name: str
    addresses: dict[str, str]
    roles: dict[str, str]
    links: dict[str, LinkInfo]
    # routes[node][dest_node] = link name leaving ``node``
    routes: dict[str, dict[str, str]] = field(default_factory=dict)

    def netns(self, node: str) -> str:
        return f"{self.name}-{node}"

    def link_between(self, x: str, y: str) -> LinkInfo:
        for link in self.links.values():
            if {link.a, link.b} == {x, y}:
                return link
        raise KeyError(f"no link between {x} and {y}")

    def path_routes(self, path: list[str], symmetric: bool) -> dict[str, dict[str, str]]:
        """Routes that make traffic to ``path[-1]`` follow ``path`` (and back, if symmetric)."""
        out: dict[str, dict[str, str]] = {}
        walks = [path, path[::-1]] if symmetric else [path]
        for walk in walks:
            dest = walk[-1]
            for here, there in itertools.pairwise(walk):
                out.setdefault(here, {})[dest] = self.link_between(here, there).name
        return out


def _device_name(index: int, peer: str) -> str:
    return f"l{index}-{peer}"[:15]  # IFNAMSIZ; the index keeps it unique in the namespace


def _allocate(hosts: list[HostSpec]) -> dict[str, str]:
    taken = {h.address for h in hosts if h.address is not None}
    pool = (a for a in LAB_POOL.hosts() if str(a) not in taken and a.packed[-1] not in (0, 255))
    return {h.name: h.address or str(next(pool)) for h in hosts}


def _shortest_routes(plan: Plan) -> dict[str, dict[str, str]]:
    """Destination-rooted Dijkstra; only routers carry transit traffic. Ties break by name."""
    adj: dict[str, list[tuple[str, LinkInfo]]] = {n: [] for n in plan.roles}
    for link in plan.links.values():
        adj[link.a].append((link.b, link))
        adj[link.b].append((link.a, link))
    routes: dict[str, dict[str, str]] = {n: {} for n in plan.roles}
    for dest in sorted(plan.roles):
        dist = {dest: 0.0}
        heap: list[tuple[float, str]] = [(0.0, dest)]
        done: set[str] = set()
        while heap:
            d, v = heapq.heappop(heap)
            if v in done:
                continue
            done.add(v)
            if v != dest and plan.roles[v] != "router":
                continue  # reachable, but not a transit node
            for u, link in sorted(adj[v], key=lambda item: item[0]):
                cost = link.cost_ab if u == link.a else link.cost_ba  # cost of u -> v
                nd = d + cost
                if u not in done and nd < dist.get(u, float("inf")):
                    dist[u] = nd
                    routes[u][dest] = link.name
                    heapq.heappush(heap, (nd, u))
    return routes


def plan(topo: Topology, name: str | None = None) -> Plan:
    """Addresses, device names and routes for ``topo`` (optionally under another lab name)."""
    lab_name = name or topo.lab.name
    if not re.fullmatch(LAB_NAME_RE, lab_name):
        raise ConfigError(f"lab name {lab_name!r}: use a-z, 0-9 and _, starting with a letter")
    links: dict[str, LinkInfo] = {}
    for i, spec in enumerate(topo.links):
        ab, ba = spec.params("a_to_b"), spec.params("b_to_a")
        hop = 0.001  # among equal delays prefer fewer hops
        links[spec.link_name] = LinkInfo(
            name=spec.link_name,
            index=i,
            a=spec.a,
            b=spec.b,
            dev_a=_device_name(i, spec.b),
            dev_b=_device_name(i, spec.a),
            ab=ab,
            ba=ba,
            cost_ab=spec.cost if spec.cost is not None else ab.delay_ms + hop,
            cost_ba=spec.cost if spec.cost is not None else ba.delay_ms + hop,
        )
    result = Plan(
        topology=topo,
        name=lab_name,
        addresses=_allocate(topo.hosts),
        roles={h.name: h.role for h in topo.hosts},
        links=links,
    )
    result.routes = _shortest_routes(result)
    for route in topo.routes:
        for node, table in result.path_routes(route.path, route.symmetric).items():
            result.routes[node].update(table)
    return result
