"""What every ``iepm`` command shares: one error path, one date parser, one way to name the
archive.

Every command runs inside :func:`guarded`: an :class:`~iepm.errors.IepmError`, an unreadable
or undecodable input file, an invalid option value or Ctrl-C becomes one line on stderr
(``error: …``) and an exit code from :class:`~iepm.errors.ExitCode`, never a traceback. Apps
made with :class:`GuardedTyper` guard each command they register; ``register()`` functions that
add commands to another app wrap them with :func:`guarded` themselves.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import typer
from pydantic import ValidationError

from iepm.errors import ExitCode, IepmError, UsageError, exit_code

if TYPE_CHECKING:
    from iepm.store import Archive

P = ParamSpec("P")
R = TypeVar("R")

DATE_EXAMPLE = "e.g. 2026-11-01 or 2026-11-01T12:00:00Z"


def fail(message: str, code: int = ExitCode.USAGE) -> typer.Exit:
    """Print ``error: message`` on stderr; return the Exit to raise (``raise fail(...)``)."""
    # Plain text, never wrapped: error lines are read by people and by grep alike.
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    return typer.Exit(int(code))


def explain(exc: BaseException) -> tuple[str, ExitCode] | None:
    """(message, exit code) for an error a command may meet on bad input or a failing
    dependency; None for anything else (a bug: let its traceback show)."""
    if isinstance(exc, IepmError):
        return str(exc), exit_code(exc)
    if isinstance(exc, ValidationError):
        from iepm.tomlload import one_line

        return f"invalid value: {one_line(exc)}", ExitCode.USAGE
    if isinstance(exc, UnicodeDecodeError):
        byte = exc.object[exc.start : exc.start + 1].hex()
        return f"input is not UTF-8 (byte 0x{byte} at offset {exc.start})", ExitCode.USAGE
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename is not None else ""
        return f"{where}{exc.strerror or exc}", ExitCode.USAGE
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", ExitCode.INTERRUPTED
    return None


def guarded(func: Callable[P, R]) -> Callable[P, R]:
    """Run a command so that the errors :func:`explain` knows end it with one line and their
    exit code. Idempotent: a guarded command is returned as it is."""
    if getattr(func, "__iepm_guarded__", False):
        return func

    @functools.wraps(func)
    def command(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (IepmError, ValidationError, UnicodeDecodeError, OSError, KeyboardInterrupt) as exc:
            explained = explain(exc)
            assert explained is not None
            raise fail(*explained) from None

    command.__iepm_guarded__ = True  # type: ignore[attr-defined]
    return command


class GuardedTyper(typer.Typer):
    """A Typer app whose commands and callbacks all run inside :func:`guarded`."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
        return _guarding(super().command(*args, **kwargs))

    def callback(self, *args: Any, **kwargs: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
        return _guarding(super().callback(*args, **kwargs))


def _guarding(register: Callable[[Any], Any]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    def decorator(func: Callable[P, R]) -> Callable[P, R]:
        register(guarded(func))
        return func

    return decorator


def parse_listen(text: str, example: str = "127.0.0.1:8080") -> tuple[str, int]:
    """``127.0.0.1:8080``, ``[::1]:8080`` or ``:8080`` (all addresses) → (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--listen: expected ADDR:PORT such as {example}, got {text[:80]!r}")
    return host.strip("[]") or "0.0.0.0", int(port_text)


def parse_moment(value: str | None, option: str) -> datetime | None:
    """``--since``/``--until``-style value: an ISO 8601 date or date-time (``Z`` or an offset;
    none means UTC), as an aware UTC datetime; None stays None."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise UsageError(
            f"{option}: not an ISO date or time: {value[:80]!r} ({DATE_EXAMPLE})"
        ) from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is in year 10000 in UTC
        raise UsageError(f"{option}: {value!r} is outside the years 1-9999 in UTC") from None


def archive_url(db: str | None, config: Path | None) -> str:
    """The archive a command works on: ``--db URL``, else the archive of ``--config FILE``.
    A URL that cannot work is a usage error, before anything connects."""
    from iepm.dburl import archive_url_problem

    if db:
        problem = archive_url_problem(db)
        if problem is not None:
            raise UsageError(f"--db {db[:200]!r}: {problem}")
        return db
    if config is not None:
        from iepm.config import load_config

        return load_config(config).monitor.archive
    raise UsageError("give --db URL or --config FILE to say which archive to use")


def existing_archive_url(db: str | None, config: Path | None) -> str:
    """:func:`archive_url` for a command that only reads: it never creates anything, so an
    SQLite file that does not exist is an error, not a new empty archive."""
    from iepm.dburl import sqlite_file

    url = archive_url(db, config)
    path = sqlite_file(url)
    if path is not None and not path.exists():
        raise UsageError(f"archive {url} does not exist (nothing to read)")
    return url


def open_archive(db: str | None, config: Path | None, *, reading: bool) -> Archive:
    """Open the archive named by ``--db``/``--config``; ``reading``: see
    :func:`existing_archive_url`."""
    from iepm.store import Archive

    return Archive.open(existing_archive_url(db, config) if reading else archive_url(db, config))
