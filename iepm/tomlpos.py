"""Find the line of a TOML key so that validation errors can name file, line and field.

``tomllib`` gives values without positions; this scanner maps key paths to line numbers for the
subset of TOML that configuration files use: ``[table]``, ``[[array.of.tables]]``, ``key = …``
and dotted keys. Paths use array indices, as pydantic's error locations do:
``("targets", 1, "iperf3", "streams")``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_ARRAY_HEADER = re.compile(r"^\s*\[\[\s*([^\]]+?)\s*\]\]")
_TABLE_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]")
_KEY = re.compile(
    r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*="""
)

Path = tuple[str | int, ...]


def _split_key(text: str) -> list[str]:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", text)
    return [p.strip("\"'") for p in parts]


def key_lines(text: str) -> dict[Path, int]:
    """Map every table and key path in ``text`` to its 1-based line number."""
    positions: dict[Path, int] = {}
    array_counts: dict[tuple[str, ...], int] = {}
    current: Path = ()
    in_multiline = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if in_multiline:
            if stripped.count('"""') % 2 == 1 or stripped.count("'''") % 2 == 1:
                in_multiline = False
            continue
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
            if stripped.count('"""') == 1 or stripped.count("'''") == 1:
                in_multiline = True
    return positions


def _resolve(names: tuple[str, ...], array_counts: dict[tuple[str, ...], int]) -> Path:
    """Turn ``targets.iperf3`` into ``("targets", <current index>, "iperf3")``."""
    path: list[str | int] = []
    for i, name in enumerate(names):
        path.append(name)
        count = array_counts.get(names[: i + 1])
        if count:
            path.append(count - 1)
    return tuple(path)


def line_of(text: str, loc: Sequence[str | int]) -> int | None:
    """Line of the longest prefix of ``loc`` present in ``text``; None if nothing matches."""
    positions = key_lines(text)
    path = tuple(loc)
    while path:
        if path in positions:
            return positions[path]
        path = path[:-1]
    return None


def format_loc(loc: Sequence[str | int]) -> str:
    """``("targets", 1, "iperf3", "streams")`` → ``targets[1].iperf3.streams``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out
