"""A route change is an alert of its own: raised at the first traceroute on another route,
with the hops that changed, never for a silent hop; stored, sent to the webhook, not repeated
by a restarted watcher and not missed by one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from iepm.analysis.alerts import load_alerts
from iepm.analysis.watch import AlertWatcher, hops_changed
from iepm.analysis.webhook import Notifier, WebhookSender
from iepm.results import Result
from iepm.store import Archive
from testkit.httpd import receiver

# A real HTTP receiver on loopback (testkit.httpd) for the webhook.
pytestmark = pytest.mark.servers

T0 = datetime(2026, 11, 25, 1, tzinfo=UTC)
A, B, C, X = "198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.9"


def trace(i: int, hops: list[str | None], target: str = "tgt") -> Result:
    return Result(
        probe="traceroute",
        tool="traceroute",
        monitor="mon",
        target=target,
        started_at=T0 + timedelta(seconds=30 * i),
        data={
            "reached": True,
            "hops": [{"ttl": n + 1, "address": a, "rtts_ms": []} for n, a in enumerate(hops)],
        },
    )


def feed(archive: Archive, watcher: AlertWatcher, results: list[Result]) -> None:
    for r in results:
        archive.add(r)
        watcher.observe(r)


def test_changed_hops_never_include_a_silent_hop() -> None:
    assert hops_changed([A, B, C], [A, None, C]) == []
    assert hops_changed([A, None, C], [A, X, C]) == []
    assert hops_changed([A, B, C], [A, X, C]) == [{"ttl": 2, "before": B, "after": X}]
    assert hops_changed([A, B], [A, B, C]) == [{"ttl": 3, "before": None, "after": C}]
    assert hops_changed([A, B, C, None], [A, B, C]) == []  # only a silent hop more


def test_a_silent_hop_is_no_change_and_a_new_address_after_it_is_one(tmp_path: Path) -> None:
    routes: list[list[str | None]] = [[A, B, C], [A, None, C], [A, B, C], [A, None, C], [A, X, C]]
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        watcher = AlertWatcher(archive, "mon")
        feed(archive, watcher, [trace(i, r) for i, r in enumerate(routes)])
        stored = load_alerts(archive)
    assert len(stored) == 1, [a.summary for a in stored]
    (alert,) = stored
    assert (alert.probe, alert.metric, alert.direction, alert.cause) == (
        "traceroute",
        "route",
        "changed",
        "route",
    )
    assert alert.change_at == T0 + timedelta(seconds=120)
    assert alert.details["before"] == [A, B, C] and alert.details["after"] == [A, X, C]
    assert alert.details["hops_changed"] == [{"ttl": 2, "before": B, "after": X}]
    assert alert.before is None and alert.after is None and alert.change_percent is None
    assert alert.summary == f"tgt route changed: hop 2 {B} → {X}"


def test_a_restarted_watcher_neither_repeats_nor_misses_a_route_change(tmp_path: Path) -> None:
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        feed(archive, AlertWatcher(archive, "mon"), [trace(0, [A, B, C]), trace(1, [A, X, C])])
        assert len(load_alerts(archive)) == 1
        # Restarted: the next traceroute is on the same (new) route; no alert about the past.
        feed(archive, AlertWatcher(archive, "mon"), [trace(2, [A, X, C])])
        assert len(load_alerts(archive)) == 1
        # Restarted again, and the route changed while it was down: compared with the archive's.
        feed(archive, AlertWatcher(archive, "mon"), [trace(3, [A, B, C])])
        stored = load_alerts(archive)
    assert len(stored) == 2
    assert stored[1].details["hops_changed"] == [{"ttl": 2, "before": X, "after": B}]


def test_a_route_alert_is_stored_and_sent_to_the_webhook(tmp_path: Path) -> None:
    with receiver([]) as (url, hook), Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        notifier = Notifier(archive, WebhookSender(url, timeout_s=2, attempts=2, backoff_s=0.1))
        watcher = AlertWatcher(archive, "mon", notifier=notifier)
        feed(
            archive,
            watcher,
            [
                trace(0, [A, B, C]),
                trace(
                    1,
                    [A, X, C],
                ),
            ],
        )
        assert notifier.drain(10)
        notifier.close(1)
        stored = load_alerts(archive)
    assert len(stored) == 1 and stored[0].delivered_at is not None
    (body,) = hook.bodies
    assert body["id"] == stored[0].id
    assert (body["probe"], body["metric"], body["direction"]) == ("traceroute", "route", "changed")
    assert body["details"]["hops_changed"] == [{"ttl": 2, "before": B, "after": X}]
