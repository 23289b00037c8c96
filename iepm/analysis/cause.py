"""What else changed when a series stepped: the route, the host, or the tuning (the seeds'
"pin-point whether it is the host, the network or the application").

Around a change there are three moments: the last sample of the old level (``last_before``),
the first sample of the new one (``change_at``) and now. Results that started within half a
sampling interval of ``last_before`` are ambiguous: probes of one cycle run side by side, so a
traceroute of that cycle may have seen the new route although its ping still saw the old
level. So the *before* state is the latest result started at least half an interval before
``last_before``; the *after* states are the results started from half an interval before
``change_at`` until now. A cause is found when some after state differs from the before state:

- ``route``: a traceroute's hop list (silent hops match any address);
- ``host``: the host facts of either end: the monitor's (the ``load`` probe) and the target's
  (the ``facts`` probe, read through its agent or over SSH): kernel, CPU count, NIC speeds and
  MTUs, TCP buffer limits, congestion control. ``details["host"]["end"]`` says which end
  (``monitor``, ``target`` or ``both``), and each end's evidence lists the facts that changed
  as ``[before, after]``;
- ``tuning``: tuned parameters stored for the path in that time (table ``tuned_params``), or the
  parameters the changed probe actually ran with (``params`` of its results).

The first found in that order is the alert's ``cause`` (``unknown`` when none); ``details`` keeps
all the evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import select

from iepm.results import Result, format_time, utcnow
from iepm.store import Archive
from iepm.store.schema import tuned_params

Route = list[str | None]
# The probes whose results are a path's route and a host's facts (what a cause is looked for in).
ROUTE_PROBE = "traceroute"
HOST_PROBE = "load"
TARGET_PROBE = "facts"
# Each end of a path, and the probe whose results are its facts.
HOST_ENDS = (("monitor", HOST_PROBE), ("target", TARGET_PROBE))
HOST_FACTS = (
    "kernel_release",
    "cpu_count",
    "tcp_congestion_control",
    "tcp_rmem_bytes",
    "tcp_wmem_bytes",
    "rmem_max_bytes",
    "wmem_max_bytes",
)
# Parameters that change from run to run without tuning anything: the port an agent or SSH
# target leased for that run.
NOT_TUNING = frozenset({"port"})
# A handful of results per window is enough: the state just before, and the few after.
WINDOW_LIMIT = 20


class Traced(Protocol):
    """A traceroute run as pages and analyses read it: a Result, or a row with its data."""

    @property
    def succeeded(self) -> bool: ...

    @property
    def data(self) -> Mapping[str, Any]: ...


def hop_addresses(data: Mapping[str, Any]) -> Route:
    """The hop addresses of a traceroute's ``data`` in TTL order (None for a silent hop)."""
    hops = data.get("hops")
    if not isinstance(hops, list):
        return []
    return [h.get("address") if isinstance(h, dict) else None for h in hops]


def route_of(result: Traced) -> Route | None:
    """The route of a successful traceroute (None for a silent hop); the one reading of a
    route in the project: the watcher, the cause finder, retuning and the pages use it."""
    if not result.succeeded:
        return None
    return hop_addresses(result.data) or None


def aligned(a: Sequence[str | None], b: Sequence[str | None]) -> tuple[Route, Route]:
    """The two routes with a late answer of their common destination undone: traceroute's
    probes for every TTL past the path's length reach the destination at once and its ICMP
    rate limit (Linux's icmp_ratelimit) drops some replies, so it can answer a few TTLs late
    behind silent hops (a-b-*-d for a-b-d). Those silent hops are dropped from the longer
    route when both end at the same address; anything else is left as it is."""
    a, b = list(a), list(b)
    if len(a) == len(b) or not a or not b or a[-1] is None or a[-1] != b[-1]:
        return a, b
    longer, shorter = (a, b) if len(a) > len(b) else (b, a)
    extra = len(longer) - len(shorter)
    if any(hop is not None for hop in longer[-1 - extra : -1]):
        return a, b
    trimmed = [*longer[: len(longer) - 1 - extra], longer[-1]]
    return (trimmed, shorter) if longer is a else (shorter, trimmed)


def same_route(a: Sequence[str | None], b: Sequence[str | None]) -> bool:
    """Equal hop by hop; a silent hop (None) matches any address (and the destination may
    answer late behind silent hops: ``aligned``)."""
    a, b = aligned(a, b)
    if len(a) != len(b):
        return False
    return all(x is None or y is None or x == y for x, y in zip(a, b, strict=True))


def route_changes(routes: Iterable[Route]) -> list[bool]:
    """For each route in time order: whether it differs from the route before it. A silent
    hop matches any address, and the route compared against keeps the addresses seen at hops
    that later went silent (a-b-c, a-*-c, a-x-c is one change, at a-x-c)."""
    known: Route | None = None
    out = []
    for route in routes:
        changed = known is not None and not same_route(known, route)
        if known is not None and not changed:
            known, route = aligned(known, route)
            route = [new if new is not None else old for old, new in zip(known, route, strict=True)]
        out.append(changed)
        known = list(route)
    return out


def route_text(route: Sequence[str | None]) -> str:
    """A route as text: hop addresses in TTL order, ``*`` for a silent hop."""
    return " ".join(a or "*" for a in route)


def host_facts(result: Result) -> dict[str, Any] | None:
    """The facts of a load or facts result that explain throughput, without the ones that
    always move (load averages, free memory, clock)."""
    if not result.succeeded or not result.data:
        return None
    facts = {k: result.data.get(k) for k in HOST_FACTS}
    nics = result.data.get("nics")
    if isinstance(nics, dict):
        for name, nic in sorted(nics.items()):
            if isinstance(nic, dict):
                facts[f"nic.{name}.speed_mbps"] = nic.get("speed_mbps")
                facts[f"nic.{name}.mtu_bytes"] = nic.get("mtu_bytes")
    return facts


def _diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, list[Any]]:
    return {
        k: [before.get(k), after.get(k)]
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    }


class _Windows:
    def __init__(
        self,
        archive: Archive,
        monitor: str,
        target: str,
        last_before: datetime,
        change_at: datetime,
        now: datetime,
    ) -> None:
        self.archive = archive
        self.monitor = monitor
        self.target = target
        guard = (change_at - last_before) / 2
        self.before_end = last_before - guard
        self.after_start = change_at - guard
        self.now = now

    def before(self, probe: str) -> list[Result]:
        """The latest results before the change, newest first."""
        return list(
            self.archive.results(
                probe=probe,
                target=self.target,
                monitor=self.monitor,
                until=self.before_end + timedelta(microseconds=1),
                order="desc",
                limit=WINDOW_LIMIT,
            )
        )

    def after(self, probe: str) -> list[Result]:
        """Results from the change until now, oldest first."""
        return list(
            self.archive.results(
                probe=probe,
                target=self.target,
                monitor=self.monitor,
                since=self.after_start,
                until=self.now + timedelta(microseconds=1),
                limit=WINDOW_LIMIT,
            )
        )


def _route_evidence(w: _Windows) -> dict[str, Any] | None:
    before = next(
        ((r, route) for r in w.before(ROUTE_PROBE) if (route := route_of(r)) is not None), None
    )
    if before is None:
        return None
    old_result, old = before
    new = [(r, route) for r in w.after(ROUTE_PROBE) if (route := route_of(r)) is not None]
    changed = [(r, route) for r, route in new if not same_route(old, route)]
    if not changed:
        return None
    r, route = changed[-1]
    return {
        "before": old,
        "after": route,
        "before_at": format_time(old_result.started_at),
        "after_at": format_time(r.started_at),
        # The first traceroute on another route: where the watcher places a step it caused.
        "first_after_at": format_time(changed[0][0].started_at),
        "traceroutes_after": len(new),
        "differing_after": len(changed),
    }


def _end_evidence(w: _Windows, probe: str) -> dict[str, Any] | None:
    """The facts of one end that differ between the state before and the latest after."""
    before = next(((r, f) for r in w.before(probe) if (f := host_facts(r)) is not None), None)
    if before is None:
        return None
    old_result, old = before
    for r in reversed(w.after(probe)):
        facts = host_facts(r)
        if facts is None:
            continue
        changed = _diff(old, facts)
        if changed:
            return {
                "probe": probe,
                "changed": changed,
                "before_at": format_time(old_result.started_at),
                "after_at": format_time(r.started_at),
            }
        return None
    return None


def _host_evidence(w: _Windows) -> dict[str, Any] | None:
    """Which end's host changed, and how: the end's evidence at the top level when one end
    changed (``end`` names it); when both did, each end's under its name and ``changed``
    with the facts prefixed by their end (``target.rmem_max_bytes``)."""
    ends = {end: ev for end, probe in HOST_ENDS if (ev := _end_evidence(w, probe)) is not None}
    if not ends:
        return None
    if len(ends) == 1:
        ((end, evidence),) = ends.items()
        return {"end": end, **evidence}
    changed = {f"{end}.{k}": v for end, ev in ends.items() for k, v in ev["changed"].items()}
    return {"end": "both", "changed": changed, **ends}


def _tuning_evidence(w: _Windows, probe: str) -> dict[str, Any] | None:
    evidence: dict[str, Any] = {}
    query = select(tuned_params).where(
        (tuned_params.c.monitor == w.monitor)
        & (tuned_params.c.target == w.target)
        & (tuned_params.c.set_at > w.before_end)
        & (tuned_params.c.set_at <= w.now)
    )
    with w.archive.reading(f"cannot read tuned parameters of {w.target}") as conn:
        rows = [dict(r) for r in conn.execute(query).mappings()]
    if rows:
        evidence["tuned_params"] = [
            {
                "probe": r["probe"],
                "params": r["params"],
                "study_id": r["study_id"],
                "set_at": format_time(r["set_at"]),
            }
            for r in rows
        ]
    before = w.before(probe)
    after = w.after(probe)
    if before and after:
        changed = {
            k: v
            for k, v in _diff(before[0].params, after[-1].params).items()
            if k not in NOT_TUNING
        }
        if changed:
            evidence["params"] = changed
    return evidence or None


def attribute(
    archive: Archive,
    *,
    monitor: str,
    target: str,
    probe: str,
    last_before: datetime,
    change_at: datetime,
    now: datetime | None = None,
) -> tuple[str, dict[str, Any]]:
    """(cause, details) for a change on ``target`` between ``last_before`` and ``change_at``."""
    w = _Windows(archive, monitor, target, last_before, change_at, now or utcnow())
    details: dict[str, Any] = {
        "compared": {
            "before_until": format_time(w.before_end),
            "after_from": format_time(w.after_start),
            "after_until": format_time(w.now),
        }
    }
    causes = []
    for name, evidence in (
        ("route", _route_evidence(w)),
        ("host", _host_evidence(w)),
        ("tuning", _tuning_evidence(w, probe)),
    ):
        if evidence is not None:
            details[name] = evidence
            causes.append(name)
    details["causes"] = causes
    return (causes[0] if causes else "unknown"), details
