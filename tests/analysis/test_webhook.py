"""Webhook delivery against real HTTP servers on loopback."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from iepm.analysis.alerts import Alert, load_alerts, store_alert
from iepm.analysis.webhook import Notifier, WebhookSender
from iepm.errors import IepmError
from iepm.results import utcnow
from iepm.store import Archive
from testkit.httpd import receiver
from testkit.net import free_port

# A real HTTP receiver on loopback (testkit.httpd).
pytestmark = pytest.mark.servers


def an_alert(**over: object) -> Alert:
    now = utcnow()
    fields: dict[str, object] = {
        "monitor": "mon",
        "target": "cern",
        "probe": "ping",
        "metric": "rtt_avg_ms",
        "detected_at": now,
        "change_at": now - timedelta(minutes=3),
        "direction": "up",
        "before": 40.0,
        "after": 92.0,
        "change_percent": 130.0,
        "cause": "route",
        "details": {"route": {"before": ["198.18.0.2"], "after": ["198.18.0.5"]}},
    }
    fields.update(over)
    return Alert(**fields)  # type: ignore[arg-type]


def test_a_failing_then_succeeding_receiver_gets_the_alert_once_with_backoff() -> None:
    with receiver([503, 500]) as (url, state):
        sender = WebhookSender(url, timeout_s=2, attempts=4, backoff_s=0.2)
        t0 = time.monotonic()
        outcome = sender.send(an_alert().payload())
        took = time.monotonic() - t0
    assert outcome.delivered and outcome.attempts == 3 and outcome.status == 200
    assert state.answers == [503, 500, 200]
    assert took >= 0.2 + 0.4  # two backoff waits, the second twice the first
    body = state.bodies[-1]
    assert body["kind"] == "iepm.alert" and body["cause"] == "route"
    assert body["before"] == 40.0 and body["after"] == 92.0 and body["direction"] == "up"
    assert str(body["detected_at"]).endswith("Z")


def test_a_refusing_receiver_is_not_retried() -> None:
    with receiver([400]) as (url, state):
        outcome = WebhookSender(url, attempts=4, backoff_s=0.1).send({"x": 1})
    assert not outcome.delivered and outcome.attempts == 1 and outcome.status == 400
    assert "HTTP 400" in (outcome.error or "")
    assert state.answers == [400]


def test_no_receiver_gives_up_within_its_time_bound() -> None:
    url = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    sender = WebhookSender(url, timeout_s=0.5, attempts=10, backoff_s=0.3, total_s=1.5)
    t0 = time.monotonic()
    outcome = sender.send({"x": 1})
    assert time.monotonic() - t0 < 30  # no hang, whatever else the machine is doing
    # The sender's own clock: its 1.5 s bound plus one attempt's 0.5 s timeout (and 1 s of slack
    # for a thread that is not scheduled at once).
    assert outcome.seconds < 1.5 + 0.5 + 1.0
    assert not outcome.delivered and 1 <= outcome.attempts < 10
    assert "ConnectError" in (outcome.error or "")


def test_a_slow_receiver_times_out_and_is_retried() -> None:
    with receiver([], delay_s=1.0) as (url, _state):
        outcome = WebhookSender(url, timeout_s=0.3, attempts=2, backoff_s=0.0).send({"x": 1})
    assert not outcome.delivered and outcome.attempts == 2
    assert "Timeout" in (outcome.error or "")


def test_bad_webhook_urls_are_refused() -> None:
    with pytest.raises(IepmError, match="http:// or https://"):
        WebhookSender("ftp://example.org/hook")


def test_notifier_records_delivery_state_and_redelivers_after_an_outage(tmp_path: Path) -> None:
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        alert = an_alert()
        store_alert(archive, alert)
        # First round: the receiver fails every attempt.
        with receiver([503, 503]) as (url, state):
            notifier = Notifier(archive, WebhookSender(url, attempts=2, backoff_s=0.05))
            assert notifier.submit(alert)
            assert notifier.drain(10)
        stored = load_alerts(archive)[0]
        assert stored.delivered_at is None and stored.delivery_attempts == 2
        assert state.answers == [503, 503]
        # The receiver is back: the next cycle's redelivery gets it there, and only once.
        with receiver([]) as (url2, state2):
            notifier.sender.url = url2
            assert notifier.redeliver("mon") == 1
            assert notifier.drain(10)
            assert notifier.redeliver("mon") == 0  # delivered: nothing left to send
        notifier.close(1)
        stored = load_alerts(archive)[0]
        assert stored.delivered_at is not None and stored.delivery_attempts == 3
        assert state2.bodies[0]["id"] == alert.id
        # A receiver that never recovers: rounds stop at max_rounds × attempts.
        other = an_alert()
        store_alert(archive, other)
        with receiver([503] * 20) as (url3, state3):
            notifier = Notifier(
                archive, WebhookSender(url3, attempts=2, backoff_s=0.0), max_rounds=2
            )
            for _ in range(4):
                notifier.redeliver("mon")
                assert notifier.drain(10)
            notifier.close(1)
        again = next(a for a in load_alerts(archive) if a.id == other.id)
        assert again.delivered_at is None and again.delivery_attempts == 4
        assert len(state3.answers) == 4


def test_alert_ids_are_unique_and_a_second_insert_fails(tmp_path: Path) -> None:
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        a, b = an_alert(), an_alert()
        assert a.id != b.id
        store_alert(archive, a)
        store_alert(archive, b)
        with pytest.raises(IepmError, match="cannot store alert"):
            store_alert(archive, a)
        assert len(load_alerts(archive)) == 2
