"""Find the line of a TOML key so that validation errors can name file, line and field.

``tomllib`` gives values without positions; this scanner maps key paths to line numbers for the
subset of TOML that configuration files use: ``[table]``, ``[[array.of.tables]]``, ``key = …``
and dotted keys. Paths use array indices, as pydantic's error locations do:
``("targets", 1, "iperf3", "streams")``.

Values are scanned too (strings, multi-line strings, arrays and inline tables spanning lines), so
that a continuation line of a value is never taken for a header or a key: ``[1, 2],`` inside a
multi-line array is not a table. The scanner never raises, whatever the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

_ARRAY_HEADER = re.compile(r"^\s*\[\[\s*([^\]]+?)\s*\]\]")
_TABLE_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]")
_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)

Path = tuple[str | int, ...]


def _split_key(text: str) -> list[str]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", text)
    return [p.strip("\"'") for p in parts]


def lines(text: str) -> Iterator[tuple[int, str]]:
    """TOML's lines, numbered from 1: only LF (or CRLF) ends a line, as for tomllib; Python's
    ``splitlines`` also splits at U+2028, form feeds and the like, which TOML allows in comments
    and strings, and would shift every line number after them."""
    for number, line in enumerate(text.split("\n"), start=1):
        yield number, line.removesuffix("\r")


class ValueScanner:
    """Follows a value across lines: open strings and the nesting of ``[]`` and ``{}``."""

    def __init__(self) -> None:
        self.quote: str | None = None  # '"""' or "'''" while inside a multi-line string
        self.depth = 0
        self.deepest = 0

    @property
    def open(self) -> bool:
        return self.quote is not None or self.depth > 0

    def feed(self, line: str) -> None:
        i, n = 0, len(line)
        while i < n:
            if self.quote is not None:
                i = self._close_multiline(line, i)
                continue
            c = line[i]
            if c == "#":
                return
            if line.startswith('"""', i) or line.startswith("'''", i):
                self.quote = line[i : i + 3]
                i += 3
            elif c == '"':
                i = _end_of_basic(line, i + 1)
            elif c == "'":
                end = line.find("'", i + 1)
                i = n if end < 0 else end + 1
            else:
                if c in "[{":
                    self.depth += 1
                    self.deepest = max(self.deepest, self.depth)
                elif c in "]}":
                    self.depth = max(0, self.depth - 1)
                i += 1

    def _close_multiline(self, line: str, i: int) -> int:
        assert self.quote is not None
        n = len(line)
        while i < n:
            if self.quote == '"""' and line[i] == "\\":
                i += 2
                continue
            if line.startswith(self.quote, i):
                run = len(line[i:]) - len(line[i:].lstrip(self.quote[0]))
                # Up to two quotes may stand just before the closing delimiter: """a"""""
                self.quote = None
                return i + min(run, 5)
            i += 1
        return n


def _end_of_basic(line: str, i: int) -> int:
    n = len(line)
    while i < n:
        if line[i] == "\\":
            i += 2
        elif line[i] == '"':
            return i + 1
        else:
            i += 1
    return n


def key_lines(text: str) -> dict[Path, int]:
    """Map every table and key path in ``text`` to its 1-based line number."""
    positions: dict[Path, int] = {}
    array_counts: dict[tuple[str, ...], int] = {}
    current: Path = ()
    value = ValueScanner()
    for number, line in lines(text):
        if value.open:  # a continuation line of a multi-line string, array or inline table
            value.feed(line)
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if match := _ARRAY_HEADER.match(line):
            names = tuple(_split_key(match[1]))
            array_counts[names] = array_counts.get(names, 0) + 1
            current = _resolve(names, array_counts)
            positions.setdefault(current, number)
            positions.setdefault(current[:-1], number)
            continue
        if match := _TABLE_HEADER.match(line):
            current = _resolve(tuple(_split_key(match[1])), array_counts)
            positions.setdefault(current, number)
            continue
        if match := _KEY.match(line):
            positions.setdefault((*current, *_split_key(match[1])), number)
            value.feed(line[match.end() :])
    return positions


def deepest_nesting(text: str, limit: int | None = None) -> tuple[int, int]:
    """(depth, line): the deepest nesting of arrays and inline tables in ``text`` and the first
    line that reaches it, (0, 0) when there is none; with ``limit``, the first line nested
    deeper than ``limit`` (the scan stops there). Cheap, so that a loader can refuse a file
    before ``tomllib`` recurses into it."""
    value = ValueScanner()
    deepest, where = 0, 0
    for number, line in lines(text):
        if not value.open:
            stripped = line.lstrip()
            if stripped.startswith("[") or stripped.startswith("#"):
                continue  # a header or a comment
            match = _KEY.match(line)
            if match is None:
                continue
            line = line[match.end() :]
        value.feed(line)
        if value.deepest > deepest:
            deepest, where = value.deepest, number
            if limit is not None and deepest > limit:
                break
    return deepest, where


def _resolve(names: tuple[str, ...], array_counts: dict[tuple[str, ...], int]) -> Path:
    """Turn ``targets.iperf3`` into ``("targets", <current index>, "iperf3")``."""
    path: list[str | int] = []
    for i, name in enumerate(names):
        path.append(name)
        count = array_counts.get(names[: i + 1])
        if count:
            path.append(count - 1)
    return tuple(path)


def line_in(positions: dict[Path, int], loc: Sequence[str | int]) -> int | None:
    """Line of the longest prefix of ``loc`` in ``positions`` (from :func:`key_lines`)."""
    path = tuple(loc)
    while path:
        if path in positions:
            return positions[path]
        path = path[:-1]
    return None


def line_of(text: str, loc: Sequence[str | int]) -> int | None:
    """Line of the longest prefix of ``loc`` present in ``text``; None if nothing matches."""
    return line_in(key_lines(text), loc)


def format_loc(loc: Sequence[str | int]) -> str:
    """``("targets", 1, "iperf3", "streams")`` → ``targets[1].iperf3.streams``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out
