"""Decode an input file's bytes as UTF-8; a bad byte is named by line and column, in one line."""

from __future__ import annotations

from iepm.errors import IepmError


def decode(data: bytes, where: str, error: type[IepmError]) -> str:
    """``data`` as text (a leading BOM dropped), or ``error`` naming the line and column of the
    first byte that is not UTF-8: ``FILE:LINE: not UTF-8 (byte 0xe9 at column 12)``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            f"{where}:{line}: not UTF-8 (byte 0x{data[exc.start]:02x} at column {column})"
        ) from None
    return text.removeprefix("\ufeff")
