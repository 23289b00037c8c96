"""Live samples on SQLite and PostgreSQL: publish, follow by id, window reads, pruning, and the
tests running now."""

from __future__ import annotations

import time

import pytest

from iepm.store import Archive, live
from iepm.store.live import LiveSample


def test_published_samples_are_followed_by_id_in_order(archive: Archive) -> None:
    assert live.latest_id(archive) == 0
    now_s = time.time()
    first = live.publish(
        archive, "mon", [LiveSample("a", "ping", "rtt_ms", now_s, 12.5),
                         LiveSample("a", "ping", "rtt_ms", now_s + 1, None)]
    )  # fmt: skip
    assert first == live.latest_id(archive) > 0
    rows = live.read_since(archive, 0)
    assert [s for _, s in rows] == [
        LiveSample("a", "ping", "rtt_ms", now_s, 12.5),
        LiveSample("a", "ping", "rtt_ms", now_s + 1, None),
    ]
    second = live.publish(archive, "mon", [LiveSample("b", "ping", "rtt_ms", now_s + 2, 3.0)])
    assert second > first
    assert [s.target for _, s in live.read_since(archive, first)] == ["b"]
    assert live.publish(archive, "mon", []) == 0


def test_window_reads_filter_by_time_probe_and_target(archive: Archive) -> None:
    now_s = time.time()
    live.publish(
        archive, "mon",
        [LiveSample("a", "ping", "rtt_ms", now_s - 100, 1.0),
         LiveSample("a", "ping", "rtt_ms", now_s - 10, 2.0),
         LiveSample("b", "ping", "rtt_ms", now_s - 5, 3.0),
         LiveSample("eth0", "interface", "rx_mbps", now_s - 5, 4.0)],
    )  # fmt: skip
    recent = [s.value for _, s in live.read_window(archive, now_s - 50)]
    assert recent == [2.0, 3.0, 4.0]
    only_a = live.read_window(archive, now_s - 500, probe="ping", targets=["a"])
    assert [s.value for _, s in only_a] == [1.0, 2.0]


def test_old_samples_and_expired_running_tests_are_pruned(
    archive: Archive, monkeypatch: pytest.MonkeyPatch
) -> None:
    now_s = time.time()
    monkeypatch.setattr(live, "_last_prune_s", {})
    live.set_running(archive, "mon", "iperf3", "gone", {}, deadline_s=-1.0)
    live.publish(archive, "mon", [LiveSample("a", "ping", "rtt_ms", now_s - live.KEEP_S - 5, 1.0),
                                  LiveSample("a", "ping", "rtt_ms", now_s, 2.0)])  # fmt: skip
    assert [s.value for _, s in live.read_since(archive, 0)] == [2.0]
    assert live.running(archive) == []


def test_running_tests_are_listed_until_cleared(archive: Archive) -> None:
    live.set_running(archive, "mon", "iperf3", "cern", {"streams": 4}, deadline_s=60)
    live.set_running(archive, "mon", "iperf3", "cern", {"streams": 8}, deadline_s=60)
    [now] = live.running(archive)
    assert (now.probe, now.target, now.params) == ("iperf3", "cern", {"streams": 8})
    live.clear_running(archive, "mon", "iperf3", "cern")
    assert live.running(archive) == []
