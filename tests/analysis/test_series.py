"""Reading series files: good formats, and every kind of bad input as a clear AnalysisError."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iepm.analysis.series import AnalysisError, parse_series, read_series
from iepm.errors import IepmError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.csv"
    p.write_text(text)
    return p


def test_reads_header_and_formats(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "timestamp,value\n"
        "2023-08-21 10:00:00,515.5\n"
        "2023-08-21T11:00:00Z,500\n"
        "\n# a comment\n"
        "2023-08-21T13:00:00+01:00,-3.5e1\n",
    )
    s = read_series(p)
    assert len(s) == 3
    assert list(s.y) == [515.5, 500.0, -35.0]
    assert s.timestamp(0) == "2023-08-21T10:00:00Z"
    assert s.t[2] - s.t[1] == 3600.0  # 13:00+01:00 is 12:00Z
    assert s.lines == (2, 3, 6)


def test_reads_atlas_and_epoch_formats() -> None:
    s = parse_series("epoch;rtt;cp\r\n14/10/2016 21:17;178.9;0\r\n14/10/2016 21:21;178.7;1\r\n")
    assert s.timestamp(1) == "2016-10-14T21:21:00Z" and s.extra[1] == ("1",)
    s = parse_series("1692612000,1\n1692615600,2\n")
    assert s.timestamp(0) == "2023-08-21T10:00:00Z"


def test_real_file_reads(step_file: Path) -> None:
    s = read_series(step_file)
    assert len(s) > 900 and s.y.min() > 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no data rows"),
        ("timestamp,value\n", "no data rows"),
        ("2023-01-01 00:00:00,1\n", "only 1 data row"),
        ("2023-01-01 00:00:00,1\n2023-01-01 01:00:00,fast\n", ":2: value 'fast' is not a number"),
        ("2023-01-01 00:00:00,1\n2023-01-01 01:00:00\n", ":2: expected 'timestamp,value'"),
        ("2023-01-01 00:00:00,1\nyesterday,2\n", ":2: cannot read timestamp 'yesterday'"),
        ("2023-01-01 00:00:00,1\n2023-01-01 01:00:00,nan\n", ":2: value 'nan' is not finite"),
        ("2023-01-01 00:00:00,inf\n2023-01-01 01:00:00,1\n", ":1: value 'inf' is not finite"),
        (
            "2023-01-01 02:00:00,1\n2023-01-01 01:00:00,2\n",
            ":2: timestamp '2023-01-01 01:00:00' is earlier than line 1",
        ),
        (
            "2023-01-01 01:00:00,1\n\n2023-01-01 01:00:00,2\n",
            ":3: timestamp '2023-01-01 01:00:00' repeats the timestamp of line 1",
        ),
        ("2023-01-01 00:00:00,0\n2023-01-01 01:00:00,0.0\n", "every value is zero"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(AnalysisError) as err:
        read_series(p)
    assert str(p) in str(err.value)
    assert message in str(err.value)
    assert isinstance(err.value, IepmError)


def test_documented_options(tmp_path: Path) -> None:
    zeros = write(tmp_path, "2023-01-01 00:00:00,0\n2023-01-01 01:00:00,0\n")
    assert list(read_series(zeros, allow_all_zero=True).y) == [0.0, 0.0]
    text = "2023-01-01 01:00:00,1\n2023-01-01 01:00:00,2\n2023-01-01 00:59:59,3\n"
    assert len(parse_series(text, check_order=False)) == 3


def test_missing_file_and_binary(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="cannot read"):
        read_series(tmp_path / "absent.csv")
    p = tmp_path / "b.csv"
    p.write_bytes(b"\x00\xff\xfe,\x01\n\x89PNG\r\n")
    with pytest.raises(AnalysisError):
        read_series(p)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_reader_never_tracebacks_on_random_text(text: str) -> None:
    try:
        s = parse_series(text)
    except AnalysisError:
        return
    assert len(s) >= 2


LINE = st.tuples(
    st.sampled_from(
        ["2023-01-01 00:00:00", "2023-01-02T03:04:05Z", "x", "", "1e300", "0001-01-01"]
    ),
    st.sampled_from(["1", "-2.5", "nan", "inf", "", "abc", "1e400", "0"]),
).map(lambda p: ",".join(p))


@settings(max_examples=300, deadline=None)
@given(st.lists(LINE, max_size=8))
def test_reader_never_tracebacks_on_near_valid_rows(lines: list[str]) -> None:
    try:
        s = parse_series("\n".join(lines))
    except AnalysisError:
        return
    assert len(s) >= 2
