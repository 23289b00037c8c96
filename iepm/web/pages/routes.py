"""The route map of the overview: the hops seen by each path's latest traceroute, shared hops
and links merged (as the seeds' Figure 1), laid out in columns by TTL."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, NamedTuple

from iepm.analysis.cause import hop_addresses, route_text
from iepm.results import Result
from iepm.web.places import GROUP_TEXT, NOWHERE, SITE_TEXT, Places, sort_key
from iepm.web.tables import Table, col

MAP_COLUMN_PX = 150
MAP_ROW_PX = 34
MAP_MARGIN_PX = 24
GROUP_LABEL_PX = 140  # a group's name, right of its targets' labels


NodeKind = Literal["monitor", "hop", "silent", "target"]


@dataclass
class MapNode:
    id: str
    label: str
    kind: NodeKind
    column: int
    x: float = 0.0
    y: float = 0.0
    title: str = ""
    sublabel: str = ""


@dataclass
class MapEdge:
    a: str
    b: str
    paths: list[str] = field(default_factory=list)
    reached: bool = True


class GroupLabel(NamedTuple):
    """A group's name beside the first of its targets (targets are ordered by group)."""

    label: str
    x: float
    y: float


class LinkRow(NamedTuple):
    from_: str
    to: str
    paths: str
    path_count: int


class PathRow(NamedTuple):
    monitor: str
    target: str
    started_at: datetime
    outcome: str
    reached: int
    route: str
    capacity_mean: float | None
    group: str | None
    site: str | None


@dataclass
class RouteMap:
    nodes: list[MapNode]
    edges: list[tuple[MapNode, MapNode, MapEdge]]
    groups: list[GroupLabel]
    width: float
    height: float
    capacity: str  # the metric each target is labelled with
    links: Table
    paths: Table


def route_map(
    traces: list[Result],
    capacity: Mapping[tuple[str, str], float],
    capacity_name: str,
    places: Places,
) -> RouteMap:
    """The map of ``traces`` (each path's latest traceroute): monitors on the left, one column
    per TTL, every target labelled with ``capacity`` (mean over 28 days of the metric
    ``capacity_name``, by (monitor, target)). Targets are ordered by group, then site. A silent
    hop (``*``) belongs to its path alone: nothing says two silent hops are one router."""
    nodes: dict[str, MapNode] = {}
    edges: dict[tuple[str, str], MapEdge] = {}
    order: list[str] = []
    path_rows: list[PathRow] = []

    def node(key: str, label: str, kind: NodeKind, column: int, title: str = "") -> str:
        if key not in nodes:
            nodes[key] = MapNode(key, label, kind, column, title=title)
            order.append(key)
        else:  # a router seen at several TTLs sits at the earliest
            nodes[key].column = min(nodes[key].column, column)
        return key

    for trace in sorted(traces, key=lambda r: (*sort_key(places, r.target), r.monitor)):
        path = f"{trace.monitor} → {trace.target}"
        place = places.get(trace.target, NOWHERE)
        previous = node(f"monitor:{trace.monitor}", trace.monitor, "monitor", 0, "monitor")
        hops = [h for h in (trace.data.get("hops") or []) if isinstance(h, dict)]
        reached = bool(trace.data.get("reached")) and trace.succeeded
        destination = trace.data.get("destination_address") or trace.target_address
        column = 0
        for hop in hops:
            address = hop.get("address")
            ttl = int(hop.get("ttl") or column + 1)
            column = ttl
            if reached and address == destination:
                break  # the destination is drawn as the target node
            if address:
                key = node(f"hop:{address}", str(address), "hop", ttl, str(address))
            else:
                key = node(
                    f"silent:{path}:{ttl}", "*", "silent", ttl, f"silent hop {ttl} of {path}"
                )
            edges.setdefault((previous, key), MapEdge(previous, key)).paths.append(path)
            previous = key
        mean = capacity.get((trace.monitor, trace.target))
        where = ", ".join(p for p in (place.site, place.group) if p)
        target_key = node(
            f"target:{trace.target}",
            trace.target,
            "target",
            max(column, 1),
            f"{trace.target} ({trace.target_address}{', ' + where if where else ''})",
        )
        nodes[target_key].sublabel = _capacity_text(mean, capacity_name)
        edge = edges.setdefault((previous, target_key), MapEdge(previous, target_key))
        edge.paths.append(path)
        edge.reached = edge.reached and reached
        path_rows.append(
            PathRow(
                trace.monitor,
                trace.target,
                trace.started_at,
                trace.outcome.value,
                1 if reached else 0,
                route_text(hop_addresses(trace.data)),
                mean,
                place.group,
                place.site,
            )
        )
    # Targets in the last column, so routes of different lengths end aligned.
    last = max((n.column for n in nodes.values()), default=0)
    for n in nodes.values():
        if n.kind == "target":
            n.column = max(last, 1)
    # Room on the left for the monitors' names (written left of their node).
    left = MAP_MARGIN_PX + 7 * max(
        (len(n.label) for n in nodes.values() if n.kind == "monitor"), default=0
    )
    rows_in: dict[int, int] = defaultdict(int)
    for key in order:  # first seen first: each path's hops stay near each other
        n = nodes[key]
        n.x = left + n.column * MAP_COLUMN_PX
        n.y = MAP_MARGIN_PX + rows_in[n.column] * MAP_ROW_PX
        rows_in[n.column] += 1
    groups: list[GroupLabel] = []
    for key in order:
        n = nodes[key]
        group = places.get(n.label, NOWHERE).group if n.kind == "target" else None
        if group and (not groups or groups[-1].label != group):
            groups.append(GroupLabel(group, n.x + GROUP_LABEL_PX, n.y))
    height = MAP_MARGIN_PX * 2 + max(rows_in.values(), default=0) * MAP_ROW_PX
    width = left + MAP_MARGIN_PX + last * MAP_COLUMN_PX + 160 + (120 if groups else 0)
    links = Table(
        "route_links",
        "links of the route map (hops merged across paths)",
        [
            col("from", "monitor or hop address (* silent)"),
            col("to", "hop address (* silent) or target name"),
            col("paths", "paths (monitor -> target) whose latest traceroute uses the link"),
            col("path_count", "number of such paths"),
        ],
        [
            LinkRow(nodes[e.a].label, nodes[e.b].label, "; ".join(e.paths), len(e.paths))
            for e in edges.values()
        ],
    )
    paths = Table(
        "route_paths",
        f"latest traceroute of each path with its mean {capacity_name}",
        [
            col("monitor", "monitoring host"),
            col("target", "target name"),
            col("started_at", "start of the latest traceroute, UTC"),
            col("outcome", "outcome of that traceroute"),
            col("reached", "1 when the traceroute reached the target"),
            col("route", "hop addresses in TTL order, * for a silent hop"),
            col(f"{capacity_name.split('.')[-1]}_mean", f"mean {capacity_name} over 28 days"),
            col("group", GROUP_TEXT),
            col("site", SITE_TEXT),
        ],
        [tuple(r) for r in path_rows],  # plain rows: the mean's column is named by the metric
    )
    return RouteMap(
        nodes=[nodes[k] for k in order],
        edges=[(nodes[e.a], nodes[e.b], e) for e in edges.values()],
        groups=groups,
        width=width,
        height=max(height, 60),
        capacity=capacity_name,
        links=links,
        paths=paths,
    )


def _capacity_text(value: float | None, name: str) -> str:
    if value is None or not math.isfinite(value):
        return f"no {name.split('.')[-1]}"
    if name.endswith("_bps"):
        for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
            if value >= scale:
                return f"{value / scale:.3g} {unit}"
        return f"{value:.3g} bit/s"
    return f"{value:.3g}"
