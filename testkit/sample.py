"""Results to store in the archive tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from iepm.results import Outcome, Result, new_result_id

T0 = datetime(2026, 11, 22, 11, 4, 21, 123456, tzinfo=UTC)


def ping(target: str = "cern-1", started_at: datetime = T0, **changes: Any) -> Result:
    """A successful ping result, with ``changes`` applied to the envelope fields."""
    fields: dict[str, Any] = {
        "probe": "ping",
        "tool": "ping",
        "tool_version": "iputils 20221126",
        "monitor": "slac-mon",
        "target": target,
        "target_address": "198.18.3.2",
        "started_at": started_at,
        "duration_s": 9.012,
        "diags": "ping -c 10 -i 1 198.18.3.2\n",
        "raw_token": new_result_id(),
        "params": {"count": 10, "interval_s": 1.0, "size_bytes": 56},
        "data": {
            "packets_sent": 10,
            "packets_received": 10,
            "loss_percent": 0.0,
            "rtt_min_ms": 40.1,
            "rtt_avg_ms": 40.512345678,
            "rtt_max_ms": 41.9,
            "rtts_ms": [40.1, 40.3, 41.9],
        },
    }
    fields.update(changes)
    return Result(**fields)


def failed_ping(target: str = "cern-1", started_at: datetime = T0, **changes: Any) -> Result:
    fields: dict[str, Any] = {
        "outcome": Outcome.TIMEOUT,
        "succeeded": False,
        "error": "ping to cern-1 did not finish within 15 s\tand was killed\nstderr: …",
        "data": {"packets_sent": 3},
    }
    fields.update(changes)
    return ping(target, started_at, **fields)


def iperf3(target: str = "cern-1", started_at: datetime = T0, **changes: Any) -> Result:
    fields: dict[str, Any] = {
        "probe": "iperf3",
        "tool": "iperf3",
        "tool_version": "iperf 3.12",
        "params": {"duration_s": 10, "streams": 4},
        "data": {
            "throughput_bps": 941234567.8912345,
            "sender_throughput_bps": 9.5e8,
            "retransmits": 12,
            "streams": [{"id": 1, "throughput_bps": 2.3e8}],
        },
    }
    fields.update(changes)
    return ping(target, started_at, **fields)


def series(count: int, step: timedelta = timedelta(minutes=10), **changes: Any) -> list[Result]:
    """``count`` pings of one target, ``step`` apart from T0."""
    return [ping(started_at=T0 + i * step, **changes) for i in range(count)]
