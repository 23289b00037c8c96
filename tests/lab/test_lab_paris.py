"""Paris traceroute against per-flow load balancing: the lab's router r1 splits traffic to tgt
over two equal-cost paths (via ra or rb) by a hash of each packet's addresses and ports. Plain
UDP traceroute changes its ports from run to run, so its route flaps between the two paths and
the route-change reading (``cause.route_changes``, what the watcher and attribution use) sees
changes that are not there; in Paris mode (the default) every run takes one flow, so the route
stays put."""

from __future__ import annotations

import pytest

from iepm.analysis.cause import hop_addresses, route_changes
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import traceroute

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


def trace(lab: Lab, paris: bool) -> list[str | None]:
    spec = traceroute.Spec(paris=paris, wait_s=1.0, max_hops=8)
    raw = lab.exec("mon", traceroute.build_argv(spec, lab.address("tgt")), 60)
    data = traceroute.parse(raw, spec)
    assert data["reached"], raw.stdout
    return hop_addresses(data)


def test_plain_udp_traceroute_flaps_over_equal_cost_paths(lab: Lab) -> None:
    middle = {lab.address("ra"), lab.address("rb")}
    routes = []
    for _ in range(MAX_PLAIN_RUNS):
        routes.append(trace(lab, paris=False))
        if len({tuple(r) for r in routes}) > 1:
            break
    assert {r[1] for r in routes} == middle, routes  # both paths were taken
    assert any(route_changes(routes)), routes


def test_paris_traceroute_keeps_one_route_over_equal_cost_paths(lab: Lab) -> None:
    routes = [trace(lab, paris=True) for _ in range(PARIS_RUNS)]
    assert routes[0][1] in {lab.address("ra"), lab.address("rb")}
    assert routes[0][-1] == lab.address("tgt")
    assert all(r == routes[0] for r in routes), routes
    assert not any(route_changes(routes))
