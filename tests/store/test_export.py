"""Exported tables parse back to what the archive holds."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import datetime, timedelta

import pytest

from iepm.export import COMMON_COLUMNS, export, format_number
from iepm.probes.base import Column
from iepm.results import Result
from iepm.store import Archive
from testkit import sample
from testkit.sample import T0

COLUMNS = [
    Column("packets_sent", "echo requests sent"),
    Column("loss_percent", "packets lost, percent"),
    Column("rtt_avg_ms", "mean round-trip time, milliseconds"),
    Column("reached", "whether the target answered"),
]
NAMES = [column.name for column in COMMON_COLUMNS + COLUMNS]
UNESCAPE = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


@pytest.fixture
def stored(archive: Archive) -> list[Result]:
    """Pings of cern-1 (one failed, with a tab and a newline in its error), a ping of another
    target and an iperf3 run; returns the cern-1 pings, oldest first."""
    pings = sample.series(6)
    pings[2] = sample.failed_ping(started_at=pings[2].started_at, target_address=None)
    pings[3] = sample.ping(started_at=pings[3].started_at, data={**pings[3].data, "reached": True})
    pings[4] = sample.ping(
        started_at=pings[4].started_at, data={"reached": False, "loss_percent": 1e-5}
    )
    archive.add_many([*pings, sample.ping(target="fnal"), sample.iperf3()])
    return pings


def parse_tsv(text: str) -> tuple[list[str], list[str], list[list[str]]]:
    lines = text.split("\n")
    assert lines[-1] == ""
    comments = [line for line in lines if line.startswith("#")]
    assert lines[: len(comments)] == comments  # comments first, then the table
    header, *rows = lines[len(comments) : -1]
    unescape = re.compile(r"\\(.)")
    table = [
        [unescape.sub(lambda m: UNESCAPE[m.group(1)], cell) for cell in row.split("\t")]
        for row in rows
    ]
    return comments, header.split("\t"), table


def assert_rows_match(rows: list[list[str]], results: list[Result]) -> None:
    assert len(rows) == len(results)
    for row, result in zip(rows, results, strict=True):
        assert len(row) == len(NAMES)
        cells = dict(zip(NAMES, row, strict=True))
        assert datetime.fromisoformat(cells["started_at"]) == result.started_at.replace(
            microsecond=result.started_at.microsecond // 1000 * 1000
        )
        assert cells["started_at"].endswith("Z")
        for name in ("monitor", "target", "target_address", "error"):
            assert cells[name] == (getattr(result, name) or "")
        assert cells["outcome"] == result.outcome.value
        assert float(cells["duration_s"]) == pytest.approx(result.duration_s, rel=1e-5)
        for column in COLUMNS:
            value = result.data.get(column.name)
            if value is None:
                assert cells[column.name] == ""
            elif isinstance(value, bool):
                assert cells[column.name] == str(int(value))
            else:
                assert float(cells[column.name]) == pytest.approx(value, rel=1e-5)


def test_tsv(archive: Archive, stored: list[Result]) -> None:
    out = io.StringIO()
    assert export(archive, "ping", COLUMNS, "tsv", out, target="cern-1") == len(stored)
    comments, header, rows = parse_tsv(out.getvalue())
    assert header == NAMES
    assert comments[0] == "# iepm results: probe=ping target=cern-1"
    for column in COMMON_COLUMNS + COLUMNS:
        assert f"# {column.name}: {column.description}" in comments
    assert_rows_match(rows, stored)
    assert rows[2][NAMES.index("error")] == stored[2].error  # tab and newline survived
    assert rows[4][NAMES.index("loss_percent")] == "0.00001"  # no exponent


def test_csv(archive: Archive, stored: list[Result]) -> None:
    out = io.StringIO(newline="")
    assert export(archive, "ping", COLUMNS, "csv", out, target="cern-1") == len(stored)
    text = out.getvalue()
    assert not text.startswith("#")
    assert text.split("\r\n")[0] == ",".join(NAMES)  # RFC 4180: CRLF line ends
    header, *rows = csv.reader(io.StringIO(text, newline=""))
    assert header == NAMES
    assert_rows_match(rows, stored)


def test_json_lines(archive: Archive, stored: list[Result]) -> None:
    out = io.StringIO()
    assert export(archive, "ping", COLUMNS, "json", out, target="cern-1") == len(stored)
    lines = out.getvalue().splitlines()
    assert [json.loads(line) for line in lines] == [result.envelope() for result in stored]


def test_selection(archive: Archive, stored: list[Result]) -> None:
    since, until = stored[1].started_at, stored[4].started_at
    out = io.StringIO()
    assert export(archive, "ping", COLUMNS, "tsv", out, since=since, until=until) == 3
    comments, _header, rows = parse_tsv(out.getvalue())
    assert comments[0] == (
        "# iepm results: probe=ping target=all "
        "since=2026-11-22T11:14:21.123Z until=2026-11-22T11:44:21.123Z"
    )
    assert_rows_match(rows, stored[1:4])
    everything = io.StringIO()
    assert export(archive, "ping", COLUMNS, "csv", everything) == len(stored) + 1
    assert export(archive, "traceroute", COLUMNS, "csv", io.StringIO()) == 0
    assert export(archive, "ping", [], "tsv", io.StringIO(), since=T0 + timedelta(days=1)) == 0


def test_bad_requests_write_nothing(archive: Archive) -> None:
    out = io.StringIO()
    with pytest.raises(ValueError, match="clash with the common columns: duration_s"):
        export(archive, "iperf3", [Column("duration_s", "test length")], "tsv", out)
    with pytest.raises(ValueError, match="unknown export format 'xlsx'"):
        export(archive, "ping", COLUMNS, "xlsx", out)  # type: ignore[arg-type]
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (40.512345678, "40.5123"),
        (9412345678.9, "9412345679"),
        (0.000123456789, "0.000123457"),
        (1e-12, "0.000000000001"),
        (100.0, "100"),
        (-2.5, "-2.5"),
        (0.0, "0"),
        (float("nan"), ""),
    ],
)
def test_number_format(value: float, text: str) -> None:
    assert format_number(value) == text
