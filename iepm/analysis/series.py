"""Reading a measurement series from a text file.

Format: one row per measurement, ``timestamp,value``; a header line is optional. Timestamps are
ISO 8601 (``2023-08-21T10:00:00Z``, ``2023-08-21 10:00:00``, with or without an offset; naive
times are taken as UTC), ``dd/mm/YYYY HH:MM`` (RIPE Atlas exports) or Unix epoch seconds. The
separator is ``,``; ``;`` and tab are accepted too. Extra columns are kept as text
(:attr:`Series.extra`), e.g. the hand-labelled change points of ``rtt-changes/``.

Bad input raises :class:`AnalysisError` naming the file and the line:

- an empty file, or fewer than ``min_rows`` data rows;
- a value that is not a number, or is NaN/inf;
- a timestamp that cannot be read, that goes backwards (unsorted) or repeats an earlier one;
- an all-zero series (almost always a broken export; pass ``allow_all_zero=True`` to accept it).

``check_order=False`` keeps rows in file order even when a timestamp repeats or goes back a little:
labelled traces whose row indices matter (RIPE Atlas exports, rounded to the minute) need it.

Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from iepm.errors import AnalysisError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Series:
    """A time series: ``t`` Unix seconds (UTC), increasing unless read with ``check_order=False``;
    ``y`` finite values; ``lines`` the file line of each row."""

    t: FloatArray
    y: FloatArray
    source: str = "<memory>"
    lines: tuple[int, ...] = ()
    extra: tuple[tuple[str, ...], ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return int(self.y.size)

    def timestamp(self, i: int) -> str:
        """Row ``i``'s time as ISO 8601 UTC (``2023-08-21T10:00:00Z``)."""
        return iso(float(self.t[i]))


def iso(t: float) -> str:
    """ISO 8601 UTC for Unix seconds; the bare number when the year leaves 1–9999."""
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return repr(t)


def parse_time(text: str) -> float | None:
    """Unix seconds for one timestamp field, or None when it is not a timestamp."""
    s = text.strip()
    if not s:
        return None
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        # Bare numbers are epoch seconds; small ones (a row number, a year) are not timestamps.
        return value if 1e8 <= value < 1e11 else None
    for fmt in ("%d/%m/%Y %H:%M", "%d/%m/%Y %H:%M:%S"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _split(line: str) -> list[str]:
    for sep in (",", ";", "\t"):
        if sep in line:
            return [part.strip() for part in line.split(sep)]
    return [line.strip()]


def parse_series(
    text: str,
    source: str = "<text>",
    *,
    min_rows: int = 2,
    allow_all_zero: bool = False,
    check_order: bool = True,
) -> Series:
    """Parse the text of a series file; see the module docstring for the format and errors."""
    times: list[float] = []
    values: list[float] = []
    lines: list[int] = []
    extra: list[tuple[str, ...]] = []
    first_content = True
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip().lstrip("\ufeff")
        if not line or line.startswith("#"):
            continue
        fields = _split(line)
        is_first, first_content = first_content, False
        t = parse_time(fields[0])
        value_text = fields[1] if len(fields) > 1 else ""
        if t is None:
            if is_first and not _is_number(value_text):
                continue  # a header such as "timestamp,value"
            raise AnalysisError(f"{source}:{lineno}: cannot read timestamp {fields[0]!r}")
        if len(fields) < 2:
            raise AnalysisError(f"{source}:{lineno}: expected 'timestamp,value', got {line!r}")
        try:
            value = float(value_text)
        except ValueError:
            raise AnalysisError(
                f"{source}:{lineno}: value {value_text!r} is not a number"
            ) from None
        if not math.isfinite(value):
            raise AnalysisError(f"{source}:{lineno}: value {value_text!r} is not finite")
        if times and check_order and t <= times[-1]:
            what = "repeats the timestamp of" if t == times[-1] else "is earlier than"
            raise AnalysisError(
                f"{source}:{lineno}: timestamp {fields[0]!r} {what} line {lines[-1]}"
                " (rows must be sorted by time, without duplicates)"
            )
        times.append(t)
        values.append(value)
        lines.append(lineno)
        extra.append(tuple(fields[2:]))
    if not values:
        raise AnalysisError(f"{source}: no data rows (expected 'timestamp,value' lines)")
    y = np.asarray(values, dtype=np.float64)
    if not allow_all_zero and not np.any(y):
        raise AnalysisError(f"{source}: every value is zero; nothing to analyse")
    if len(values) < min_rows:
        raise AnalysisError(
            f"{source}: only {len(values)} data row(s); at least {min_rows} are needed"
        )
    return Series(np.asarray(times, dtype=np.float64), y, source, tuple(lines), tuple(extra))


def read_series(
    path: str | Path,
    *,
    min_rows: int = 2,
    allow_all_zero: bool = False,
    check_order: bool = True,
) -> Series:
    """Read a series file; raises :class:`AnalysisError` (never another exception) on bad input."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise AnalysisError(f"{p}: cannot read: {exc.strerror or exc}") from None
    text = data.decode("utf-8", errors="replace")
    return parse_series(
        text,
        str(p),
        min_rows=min_rows,
        allow_all_zero=allow_all_zero,
        check_order=check_order,
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
