"""The live ping page over the WAN lab, in Debian's chromium: real pings from the lab's monitor
namespace to three targets (5 and 40 ms away, one path losing 30 % of packets one way) are
published reply by reply through ``live.publish`` while the page is open; with no reload the
page draws them by group, near the lab's configured RTT, with the lost replies as gaps."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iepm.demo import ping_replies
from iepm.lab import Lab
from iepm.lab.testing import LabFactory, lab_unavailable
from iepm.probes import ping
from iepm.probes.base import ProbeContext
from iepm.results import Result
from iepm.store import Archive, live
from iepm.web.places import Place
from iepm.web.server import serve_in_background
from testkit.browser import shoot
from testkit.net import free_port

pytestmark = [pytest.mark.lab, pytest.mark.browser]

TOPOLOGY = {
    "lab": {"name": "live", "seed": 13},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "r", "role": "router"},
        {"name": "near", "role": "target"},
        {"name": "far", "role": "target"},
        {"name": "lossy", "role": "target"},
    ],
    "links": [
        {"name": "mon_r", "a": "mon", "b": "r", "delay_ms": 1},
        {"name": "r_near", "a": "r", "b": "near", "delay_ms": 1.5},
        {"name": "r_far", "a": "r", "b": "far", "delay_ms": 19},
        # Loss one way only: each lost request is one gap, as the page should draw it.
        {"name": "r_lossy", "a": "r", "b": "lossy", "delay_ms": 4,
         "a_to_b": {"loss_percent": 30}},
    ],
}  # fmt: skip
PLACES = {"near": Place("slac", "americas"), "far": Place("cern", "europe"),
          "lossy": Place("ihep", "europe")}  # fmt: skip
ROUNDS = 2
COUNT = 10


@pytest.fixture
def lab(lab_factory: LabFactory) -> Lab:
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    return lab_factory(TOPOLOGY, prefix="live")


@pytest.fixture
def served(lab: Lab) -> Iterator[tuple[Archive, str]]:
    with tempfile.TemporaryDirectory(prefix="iepm-live-lab-") as path:
        url = f"sqlite:///{Path(path) / 'iepm.db'}"
        with Archive.open(url) as archive:
            handle = serve_in_background(url, port=free_port(), places=PLACES, cache_ttl_s=0)
            try:
                yield archive, handle.url.rstrip("/")
            finally:
                handle.stop()


def ping_round(lab: Lab, archive: Archive) -> list[Result]:
    """One real ping run per target from the monitor's namespace, all at once; each run's
    replies are published as it ends."""

    async def one(target: str) -> Result:
        ctx = ProbeContext(target=target, address=lab.address(target), monitor="mon",
                           netns=lab.netns("mon"))  # fmt: skip
        result = await ping.run(ping.Spec(count=COUNT, interval_s=0.2), ctx)
        live.publish(archive, "mon", ping_replies(result))
        return result

    async def all_targets() -> list[Result]:
        return list(await asyncio.gather(*(one(t) for t in PLACES)))

    return asyncio.run(all_targets())


def test_live_ping_page_follows_real_lab_pings(
    page: Any, lab: Lab, served: tuple[Archive, str]
) -> None:
    archive, server = served
    page.goto(f"{server}/live/ping")
    page.wait_for_function("window.iepmLive && window.iepmLive.connected")
    page.evaluate("window.__sameDocument = true")
    results: list[Result] = []
    failure: list[BaseException] = []

    def measure() -> None:
        # Playwright's sync API holds an event loop in the test's thread: ping runs here.
        try:
            for _ in range(ROUNDS):
                results.extend(ping_round(lab, archive))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=measure, name="live-lab-pings")
    thread.start()
    thread.join(120)
    assert not thread.is_alive() and not failure, failure
    total = ROUNDS * COUNT * len(PLACES)
    page.wait_for_function(f"window.iepmLive.samples >= {total}", timeout=30_000)
    assert page.evaluate("window.__sameDocument === true")  # no reload

    groups = page.evaluate(
        "Object.fromEntries(Object.values(window.iepmLive.charts).map(c => "
        "[c.u.root.closest('figure').querySelector('figcaption').textContent, "
        "c.u.series.slice(1).map(s => s.label)]))"
    )
    assert groups == {"americas": ["near"], "europe": ["far", "lossy"]}
    drawn = page.evaluate(
        "(() => { const out = {}; for (const c of Object.values(window.iepmLive.charts)) "
        "c.u.series.slice(1).forEach((s, i) => { out[s.label] = "
        "c.u.data[i + 1].filter(v => v !== undefined); }); return out; })()"
    )
    for target in PLACES:
        truth_ms = lab.ground_truth("mon", target)["rtt_ms"]
        measured = [r for r in results if r.target == target]
        replies = [v for v in drawn[target] if v is not None]
        lost = [v for v in drawn[target] if v is None]
        # Every reply drawn, each lost request a gap (null), as ping counted them.
        assert len(replies) == sum(r.data["packets_received"] for r in measured)
        assert len(lost) == sum(r.data["packets_sent"] - r.data["packets_received"]
                                for r in measured)  # fmt: skip
        # Near the lab's configured RTT (its delay line adds a little, never removes).
        assert truth_ms - 0.5 <= statistics.median(replies) <= truth_ms * 1.2 + 2, (
            target, truth_ms, replies)  # fmt: skip
    assert drawn["lossy"].count(None) > 0
    assert drawn["near"].count(None) == 0 and drawn["far"].count(None) == 0
    row = page.locator("#latest tr[data-target='far'] td").all_inner_texts()
    assert row[:2] == ["europe", "far"]
    assert page.locator("#latest tr[data-target='far'] td.rtt-fair, "
                        "#latest tr[data-target='far'] td.rtt-good").count() == 1  # fmt: skip
    shoot(page, "live-ping-lab")
