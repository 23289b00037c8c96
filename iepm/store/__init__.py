"""The archive of results (SQLite or PostgreSQL, schema managed by Alembic migrations)."""

from iepm.store.archive import Archive, Cycle

__all__ = ["Archive", "Cycle"]
