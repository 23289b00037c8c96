"""Archive URLs, checked before anything connects: by config validation and by ``--db`` alike.

A URL that cannot work (unknown scheme or driver, a driver that is not installed or is async,
an SQLite URL naming no file, control characters) is bad input, reported at once with the
reason; whether the database then answers is the archive's business.
"""

from __future__ import annotations

from pathlib import Path

SUPPORTED = "use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"


def archive_url_problem(url: str) -> str | None:
    """Why ``url`` cannot name an archive, or None when it can."""
    # SQLAlchemy is imported here: most commands that load a config never open the archive.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        return "the archive URL contains a control character"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return f"not a database URL ({SUPPORTED})"
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        return f"names an unsupported database {backend!r} ({SUPPORTED})"
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file:"):
            return "an SQLite archive URL must name a file: sqlite:///PATH"
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        return f"names an unknown database driver {parsed.drivername!r} ({SUPPORTED})"
    if getattr(dialect, "is_async", False):
        return f"driver {parsed.get_driver_name()!r} is asynchronous; {SUPPORTED}"
    try:
        dialect.import_dbapi()
    except ImportError:
        return f"needs the {parsed.get_driver_name()!r} driver, which is not installed"
    return None


def sqlite_file(url: str) -> Path | None:
    """The file an SQLite archive URL names (None for other databases)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database)
