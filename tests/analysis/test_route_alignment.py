"""A destination answering a few TTLs late behind silent hops is one route, not a change (the
lab's 200-cycle no-change test saw a-d, a-*-d, a-d under load: the target's ICMP rate limit)."""

from __future__ import annotations

from iepm.analysis.cause import aligned, route_changes, same_route
from iepm.analysis.watch import hops_changed

A, B, D, X = "198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.9.9"


def test_the_destination_answering_late_behind_silent_hops_is_the_same_route() -> None:
    assert same_route([A, D], [A, None, D])
    assert same_route([A, None, None, D], [A, D])
    assert same_route([A, B, D], [A, B, None, D])
    assert hops_changed([A, D], [A, None, D]) == []
    assert aligned([A, D], [A, None, None, D]) == ([A, D], [A, D])


def test_real_changes_still_count() -> None:
    assert not same_route([A, D], [A, X, D])  # a new router that answers
    assert not same_route([A, B, D], [A, X, None, D])  # another router, then the late answer
    assert not same_route([A, D], [A, None, X])  # another end
    assert hops_changed([A, D], [A, X, D]) == [
        {"ttl": 2, "before": D, "after": X},
        {"ttl": 3, "before": None, "after": D},
    ]
    # A silent run that is not right before the destination is not undone.
    assert aligned([A, B, D], [A, None, B, D]) == ([A, B, D], [A, None, B, D])


def test_a_late_answer_between_two_routes_makes_no_change_in_the_series() -> None:
    assert route_changes([[A, D], [A, None, D], [A, D], [A, None, None, D]]) == [
        False, False, False, False,
    ]  # fmt: skip
    assert route_changes([[A, D], [A, None, D], [A, X, D]]) == [False, False, True]
