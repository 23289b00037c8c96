"""A silent traceroute hop (``*``) is not a route change: on the target page, in retuning and
in the alerts' cause finder alike (one reading of a route: iepm.analysis.cause)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fastapi.testclient import TestClient

from iepm.analysis.cause import route_changes
from iepm.results import format_time
from iepm.store import Archive
from iepm.tuning.retune import retune_reasons
from iepm.tuning.store import Study, StudyRecorder
from iepm.web.app import create_app
from tests.web import data

T0 = datetime(2026, 11, 1, tzinfo=UTC)
A, B, C, X = "192.0.2.1", "198.51.100.7", "203.0.113.9", "198.51.100.99"
# b goes silent and answers again (no change), then x replaces b (one change).
ROUTES: list[list[str | None]] = [[A, B, C], [A, None, C], [A, B, C], [None, B, C], [A, X, C]]


def test_a_silent_hop_matches_any_address_and_keeps_the_one_seen_before() -> None:
    assert route_changes(ROUTES) == [False, False, False, False, True]
    # The hop that went silent is still compared by the address it had.
    assert route_changes([[A, B, C], [A, None, C], [A, X, C]]) == [False, False, True]
    # A longer path counts, unless the extra silent hops sit right before the same destination:
    # that is the destination answering late (its ICMP rate limit), test_route_alignment.py.
    assert route_changes([[A, B, C], [A, None, B, C]]) == [False, True]
    assert route_changes([[A, B, C], [A, B, None, C]]) == [False, False]


def test_target_page_counts_no_route_change_for_a_silent_hop(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with Archive.open(url) as archive:
        archive.add_many(
            [
                data.traceroute("slac-mon", "flaky", T0 + timedelta(hours=i), hops)
                for i, hops in enumerate(ROUTES)
            ]
        )
    until = format_time(T0 + timedelta(days=1))
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        text = client.get(f"/targets/flaky/tables/routes?until={until}").text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["changed"] for r in rows] == ["0", "0", "0", "0", "1"]
    assert rows[1]["route"] == f"{A} * {C}"


def test_retune_sees_no_route_change_for_a_silent_hop(tmp_path: Path) -> None:
    with Archive.open(f"sqlite:///{tmp_path / 'a.db'}") as archive:
        params = {"route": [A, B, C]}
        study = Study("sweep", "slac-mon", "flaky", params, started_at=T0)
        StudyRecorder(archive, study).finish({}, partial=False)
        later = T0 + timedelta(hours=1)
        archive.add(data.traceroute("slac-mon", "flaky", later, [A, None, C]))
        reasons = retune_reasons(
            archive, monitor="slac-mon", target="flaky", period_s=86400, now=later
        )
        assert reasons == []
        archive.add(data.traceroute("slac-mon", "flaky", later + timedelta(minutes=1), [A, X, C]))
        reasons = retune_reasons(
            archive, monitor="slac-mon", target="flaky", period_s=86400, now=later
        )
        assert reasons == ["route changed since the last sweep (3 → 3 hops)"]
