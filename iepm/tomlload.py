"""Load a TOML file and validate it with pydantic: every error one line naming file, line, field.

The one loader of ``targets.toml``, ``agent.toml`` and lab topologies::

    targets.toml:23: targets[1].iperf3.streams: Input should be less than or equal to 128 (got 500)
    targets.toml:7: not UTF-8 (byte 0xe9 at column 12)
    targets.toml:3: arrays or inline tables nested more than 32 deep

Bytes are decoded here, not by ``open``, so that a bad byte is reported by line and column;
nesting is measured before ``tomllib`` (which recurses once per level) reads the text.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from iepm import utf8
from iepm.errors import ConfigError
from iepm.tomlpos import deepest_nesting, format_loc, key_lines, line_in

# Configuration files nest two or three levels; 32 leaves room and stays far from recursion limits.
MAX_DEPTH = 32
# A configuration file is a few kilobytes; refusing anything this large keeps a wrong path
# (a log, /dev/zero) from filling memory.
MAX_BYTES = 16 * 1024 * 1024

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]
Describe = Callable[[ErrorDetails], str]
M = TypeVar("M", bound=BaseModel)

_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)")


@dataclass(frozen=True)
class TomlText:
    """A parsed TOML document with the text its error messages point into."""

    where: str  # the file name as error messages show it
    text: str
    data: dict[str, Any]


def read_text(path: str | Path) -> str:
    """A configuration file's text; every failure is a one-line ConfigError."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB; not a config")
    return utf8.decode(data, str(path), ConfigError)


def parse(text: str, where: str) -> TomlText:
    """Parse TOML text; syntax errors and excessive nesting are one-line ConfigErrors."""
    depth, line = deepest_nesting(text, MAX_DEPTH)
    if depth > MAX_DEPTH:
        raise ConfigError(
            f"{where}:{line}: arrays or inline tables nested more than {MAX_DEPTH} deep"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = _TOML_POSITION.search(str(exc))
        prefix = f"{where}:{match[1]}" if match else where
        raise ConfigError(f"{prefix}: not valid TOML: {exc}") from None
    except RecursionError:  # nesting the scanner did not see (it cannot, in valid TOML)
        raise ConfigError(f"{where}: nested too deeply to read") from None
    return TomlText(where, text, data)


def load(path: str | Path) -> TomlText:
    """Read, decode and parse a TOML file."""
    return parse(read_text(path), str(path))


def shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters: a 100,000-character value stays one line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(
    error: ErrorDetails,
    unknown: str = "see the README for the fields",
    shown: Callable[[Any], str] = shown,
) -> str:
    """A pydantic error as a person reads it: the message, then the value given; an unknown
    field says so with ``unknown`` as the hint. ``shown`` renders the value (to hide secrets)."""
    if error.get("type") == "extra_forbidden":
        return f"unknown field (check the spelling; {unknown})"
    # A validator's own message reads on its own: pydantic's "Value error, " (and "Assertion
    # failed, ") prefixes name how it was raised, which the person reading it cannot act on.
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if error.get("type") != "missing" and "input" in error:
        given = error["input"]
        if not isinstance(given, dict | list):
            message += f" (got {shown(given)})"
    return message


def problems(
    exc: ValidationError, prefix: Loc = (), describe: Describe = describe
) -> list[Problem]:
    """Each error of ``exc`` as (location below ``prefix``, message)."""
    return [((*prefix, *error["loc"]), describe(error)) for error in exc.errors()]


def config_error(
    where: str, text: str | None, found: Iterable[Problem], heading: str | None = None
) -> ConfigError:
    """One ``FILE:LINE: field: message`` line per problem (no line when ``text`` is None or
    the field is not in it), under ``heading`` when given."""
    positions = key_lines(text) if text else {}
    lines = [heading] if heading else []
    for loc, message in found:
        line = line_in(positions, loc)
        prefix = f"{where}:{line}" if line else where
        lines.append(f"{prefix}: {format_loc(loc) or '(top level)'}: {message}")
    return ConfigError("\n".join(lines))


def validate(
    model: type[M],
    doc: TomlText,
    describe: Describe = describe,
    heading: str | None = None,
) -> M:
    """``model`` from the document's data, or a ConfigError with one line per problem."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as exc:
        raise config_error(doc.where, doc.text, problems(exc, describe=describe), heading) from None


def one_line(exc: ValidationError, names: Sequence[str] = ()) -> str:
    """A ValidationError outside any file (an option, an API body) as one line:
    ``field: message; field: message``."""
    parts = []
    for error in exc.errors():
        loc = format_loc((*names, *error["loc"])) or "(value)"
        parts.append(f"{loc}: {describe(error)}")
    return "; ".join(parts)
