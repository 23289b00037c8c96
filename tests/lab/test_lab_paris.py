"""Paris traceroute against per-flow load balancing: the lab's router r1 splits traffic to tgt
over two equal-cost paths (via ra or rb) by a hash of each packet's addresses and ports. Plain
UDP traceroute changes its ports from run to run, so its route flaps between the two paths and
the route-change reading (``cause.route_changes``, what the watcher and attribution use) sees
changes that are not there; in Paris mode (the default) every run takes one flow, so the route
stays put.

Behaviour only (routes, alerts; no delay is held against the lab's): not tagged ``timing``, so it
runs beside other tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from iepm.analysis.cause import hop_addresses, route_changes
from iepm.analysis.watch import AlertWatcher
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import traceroute
from iepm.probes.base import ProbeContext, result_from_raw
from iepm.results import Result
from iepm.store import Archive

pytestmark = pytest.mark.lab

ECMP = {
    "lab": {"name": "pa", "seed": 4},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        # Hash ports too (policy 1, as routers' 5-tuple ECMP), not only addresses.
        {"name": "r1", "role": "router", "sysctl": {"net.ipv4.fib_multipath_hash_policy": 1}},
        {"name": "ra", "role": "router"},
        {"name": "rb", "role": "router"},
        {"name": "r2", "role": "router"},
        {"name": "tgt", "role": "target"},
    ],
    "links": [
        {"a": "mon", "b": "r1", "delay_ms": 1},
        {"a": "r1", "b": "ra", "delay_ms": 1},
        {"a": "r1", "b": "rb", "delay_ms": 1},
        {"a": "ra", "b": "r2", "delay_ms": 1},
        {"a": "rb", "b": "r2", "delay_ms": 1},
        {"a": "r2", "b": "tgt", "delay_ms": 1},
    ],
}
MAX_PLAIN_RUNS = 24  # two paths at even odds: all the same by chance is 2**-23
PARIS_RUNS = 10


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Lab:
    lab = module_lab_factory(ECMP, prefix="pa")
    lab.spread_route("r1", "tgt", ["ra", "rb"])
    lab.wait_reachable("mon", ["tgt"])
    return lab


def traced(lab: Lab, paris: bool) -> Result:
    """One traceroute run from mon to tgt, as the probe stores it."""
    # A reply is waited for 3 s (the probe's default 2 s): a hop that answers late on a busy host
    # is not a hop that went silent, which would read as another route. Each run reaches the
    # target, so a run waits only for hops that stay silent.
    spec = traceroute.Spec(paris=paris, wait_s=3.0, max_hops=8)
    raw = lab.exec("mon", traceroute.build_argv(spec, lab.address("tgt")), 60)
    ctx = ProbeContext(target="tgt", address=lab.address("tgt"), monitor="mon")
    result = result_from_raw(traceroute, spec, ctx, raw, None)
    assert result.succeeded and result.data["reached"], raw.stdout
    return result


def trace(lab: Lab, paris: bool) -> list[str | None]:
    return hop_addresses(traced(lab, paris).data)


def route_alerts(results: list[Result], tmp_path: Path) -> int:
    """Route-change alerts the watcher raises over these runs, stored as the scheduler does."""
    with Archive.open(f"sqlite:///{tmp_path}.db") as archive:
        watcher = AlertWatcher(archive, "mon")
        raised = 0
        for result in results:
            archive.add(result)
            raised += sum(a.metric == "route" for a in watcher.observe(result))
        return raised


def test_plain_udp_traceroute_flaps_over_equal_cost_paths(lab: Lab) -> None:
    middle = {lab.address("ra"), lab.address("rb")}
    routes = []
    for _ in range(MAX_PLAIN_RUNS):
        routes.append(trace(lab, paris=False))
        if len({tuple(r) for r in routes}) > 1:
            break
    assert {r[1] for r in routes} == middle, routes  # both paths were taken
    assert any(route_changes(routes)), routes


def test_route_alerts_flap_in_plain_mode_and_stay_quiet_in_paris_mode(
    lab: Lab, tmp_path: Path
) -> None:
    plain: list[Result] = []
    while len({tuple(hop_addresses(r.data)) for r in plain}) < 2:
        assert len(plain) < MAX_PLAIN_RUNS, "plain traceroute kept one path"
        plain.append(traced(lab, paris=False))
    assert route_alerts(plain, tmp_path / "plain") >= 1
    paris = [traced(lab, paris=True) for _ in range(PARIS_RUNS)]
    assert route_alerts(paris, tmp_path / "paris") == 0


def test_paris_traceroute_keeps_one_route_over_equal_cost_paths(lab: Lab) -> None:
    routes = [trace(lab, paris=True) for _ in range(PARIS_RUNS)]
    assert routes[0][1] in {lab.address("ra"), lab.address("rb")}
    assert routes[0][-1] == lab.address("tgt")
    assert all(r == routes[0] for r in routes), routes
    assert not any(route_changes(routes))
