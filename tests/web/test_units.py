"""Page tables write numbers for people by the unit in their column's name; the raw number
(the download's text) stays on the cell as ``data-value``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

import pytest

from iepm.web.tables import Table, col, human, shown_cells, significant


@pytest.mark.parametrize(
    ("value", "name", "text"),
    [
        (94.3e6, "throughput_bps", "94.3 Mbit/s"),
        (811486982.0, "iperf3.throughput_bps", "811 Mbit/s"),
        (1.25e9, "throughput_bps_max", "1.25 Gbit/s"),
        (950.0, "throughput_bps", "950 bit/s"),
        (12.4, "rtt_avg_ms", "12.4 ms"),
        (148.23, "ping.rtt_avg_ms", "148 ms"),
        (1234.4, "rtt_max_ms", "1234 ms"),  # never 1.23e+03
        (0.1, "loss_percent", "0.1 %"),
        (99.5, "loss_percent", "99.5 %"),  # never 1e+02
        (100.0, "loss_percent", "100 %"),
        (0.0, "loss_percent", "0 %"),
        (4194304, "window_bytes", "4 MiB"),
        (10.02, "duration_s", "10 s"),
        (7200, "age_s", "2 h"),
        (3 * 86400, "age_s", "3 d"),
        (3.14159, "exponent", "3.142"),
        (None, "rtt_avg_ms", "–"),
        (float("nan"), "rtt_avg_ms", "–"),
    ],
)
def test_human_units(value: float | None, name: str, text: str) -> None:
    assert human(value, name) == text


def test_significant_never_uses_exponents() -> None:
    assert significant(0.000123456) == "0.000123"
    assert significant(-0.04) == "-0.04"
    assert significant(99.96) == "100"
    assert significant(123456789.0) == "123456789"


class Row(NamedTuple):
    started_at: datetime
    metric: str
    value: float | None
    count: int
    success_rate: float
    cause: str


def test_cells_keep_their_raw_value_and_the_unit_of_their_metric() -> None:
    t = datetime(2026, 11, 22, 11, 4, 21, tzinfo=UTC)
    table = Table(
        "x",
        "x",
        [col(n, n) for n in Row._fields],
        [
            Row(t, "iperf3.throughput_bps", 811486982.0, 7, 0.875, "route"),
            Row(t, "ping.loss_percent", 0.1, 3, 1.0, "unknown"),
            Row(t, "ping.rtt_avg_ms", None, 0, 0.0, ""),
        ],
    )
    rows = [shown_cells(table, r) for r in table.rows]
    assert rows[0] == [
        ("2026-11-22T11:04:21.000Z", None),
        ("iperf3.throughput_bps", None),
        ("811 Mbit/s", "811486982"),  # in the row's metric's unit; the download's text kept
        ("7", None),
        ("0.875", None),  # no unit in the name: as the download writes it
        ("route", None),
    ]
    assert rows[1][2] == ("0.1 %", "0.1")
    assert rows[2][2] == ("", None)  # no value: an empty cell, as in the download
    # The download writes the raw numbers, the units in the column names.
    assert table.render("csv", "").splitlines()[1].split(",")[2] == "811486982"
