"""The archive's tables, as SQLAlchemy Core metadata.

This module describes the schema at the *latest* migration; the database itself only changes
through the Alembic revisions in ``migrations/versions`` (a test checks that the two agree on
SQLite and PostgreSQL). Text columns are unbounded so that a value SQLite accepts is never
rejected by PostgreSQL, and constraint names follow a convention so that later batch-mode
migrations on SQLite can refer to them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Dialect,
    Float,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    TypeDecorator,
)


class UtcDateTime(TypeDecorator[datetime]):
    """A moment in time, always read back timezone-aware in UTC.

    PostgreSQL stores ``timestamptz``; SQLite has no time zone type, so the value is stored as
    naive UTC text, which also sorts correctly. A naive value is taken as local time, exactly as
    ``Result.envelope()`` does, so the stored moment is the one the envelope shows.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# One row per Result, one column per envelope field. ``params`` and ``data`` are JSON (``json``,
# not ``jsonb``, on PostgreSQL: the text is kept as written, so key order and number spelling
# round-trip exactly).
results = Table(
    "results",
    metadata,
    Column("id", Text, primary_key=True),
    Column("schema", Integer, nullable=False),
    Column("probe", Text, nullable=False),
    Column("tool", Text, nullable=False),
    Column("tool_version", Text),
    Column("monitor", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("target_address", Text),
    Column("started_at", UtcDateTime, nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("succeeded", Boolean, nullable=False),
    Column("error", Text),
    Column("diags", Text, nullable=False),
    Column("raw_token", Text),
    # routine or study (iepm.results.Purpose): routine views read routine results only.
    Column("purpose", Text, nullable=False, server_default="routine"),
    Column("params", JSON, nullable=False),
    Column("data", JSON, nullable=False),
    # purpose before started_at: routine views ask for one purpose and a time range, and the
    # per-path summaries (counts, latest) are then answered from the index alone.
    Index(None, "target", "probe", "purpose", "started_at"),
    # One path of a mesh (many monitors per target): its page without the other monitors' rows.
    Index(None, "target", "monitor", "probe", "purpose", "started_at"),
    Index(None, "probe", "started_at"),
    # One raw run yields one result: re-extraction finds (and replaces) it by its token.
    Index(None, "raw_token", unique=True),
)

# One row per scheduler cycle, to see overruns and failure counts over time.
cycles = Table(
    "cycles",
    metadata,
    Column("id", Text, primary_key=True),
    Column("monitor", Text, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=False),
    Column("interval_s", Float, nullable=False),
    Column("overran", Boolean, nullable=False),
    Column("n_results", Integer, nullable=False),
    Column("n_failed", Integer, nullable=False),
    Index(None, "monitor", "started_at"),
)

# A step change found in a path's series, with what else changed at that moment (``cause`` is
# route, host, tuning or unknown; ``details`` holds the evidence) and its webhook delivery state.
alerts = Table(
    "alerts",
    metadata,
    Column("id", Text, primary_key=True),
    Column("monitor", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("probe", Text, nullable=False),
    Column("metric", Text, nullable=False),
    Column("detected_at", UtcDateTime, nullable=False),
    Column("change_at", UtcDateTime, nullable=False),
    Column("direction", Text, nullable=False),
    Column("before", Float),
    Column("after", Float),
    Column("change_percent", Float),
    Column("cause", Text, nullable=False),
    Column("details", JSON, nullable=False),
    Column("delivered_at", UtcDateTime),
    Column("delivery_attempts", Integer, nullable=False),
    Index(None, "target", "detected_at"),
    Index(None, "detected_at"),
)

# A tuning, duration or impact study: every point measured (``data``), what it concluded
# (``summary``), and whether it was interrupted (``partial``).
studies = Table(
    "studies",
    metadata,
    Column("id", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("monitor", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime),
    Column("partial", Boolean, nullable=False),
    Column("params", JSON, nullable=False),
    Column("data", JSON, nullable=False),
    Column("summary", JSON, nullable=False),
    Index(None, "target", "kind", "started_at"),
)

# The parameters the scheduler uses for a probe on a path, and the study that chose them.
tuned_params = Table(
    "tuned_params",
    metadata,
    Column("monitor", Text, primary_key=True),
    Column("target", Text, primary_key=True),
    Column("probe", Text, primary_key=True),
    Column("params", JSON, nullable=False),
    Column("study_id", Text),
    Column("set_at", UtcDateTime, nullable=False),
)

# Per-day summaries of each path's results (iepm/store/rollup.py keeps them in step with
# ``results`` in the same transaction as every write): what year-long views read.
daily = Table(
    "daily",
    metadata,
    Column("target", Text, primary_key=True),
    Column("monitor", Text, primary_key=True),
    Column("probe", Text, primary_key=True),
    Column("day", Date, primary_key=True),
    Column("metric", Text, primary_key=True),
    Column("n", Integer, nullable=False),
    Column("total", Float, nullable=False),
    Column("total_sq", Float),
    Column("minimum", Float),
    Column("maximum", Float),
    # The mesh grid: one metric of every path over the last days (migration 0010).
    Index(None, "probe", "metric", "day"),
    # A mesh pair page: two monitors' rows over the last days (migration 0011).
    Index(None, "monitor", "day"),
    # Stored in key order on SQLite, so a path's year is a few contiguous pages.
    sqlite_with_rowid=False,
)

# Host leases of a mesh (iepm/mesh/leases.py): a bandwidth test holds a row per host it uses,
# so no two meet at one host. ``expires_s`` is the database's clock (epoch seconds): monitors'
# clocks may differ, and a crashed monitor's row simply expires.
host_leases = Table(
    "host_leases",
    metadata,
    Column("host", Text, primary_key=True),
    Column("token", Text, nullable=False),
    Column("holder", Text, nullable=False),
    Column("probe", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("expires_s", Float, nullable=False),
    Index(None, "token"),
)

# One row per flow record collected (``iepm flows collect``) or imported (``iepm flows import``):
# one direction of one connection as an exporter saw it. Times are Unix milliseconds, as the
# exports carry them. ``id`` is a digest of the record itself, so a record met twice (a
# duplicated datagram, a file imported again) is stored once.
flows = Table(
    "flows",
    metadata,
    Column("id", Text, primary_key=True),
    Column("exporter", Text, nullable=False),
    Column("domain", BigInteger, nullable=False),
    Column("version", Integer, nullable=False),
    Column("src", Text, nullable=False),
    Column("dst", Text, nullable=False),
    Column("sport", Integer, nullable=False),
    Column("dport", Integer, nullable=False),
    Column("proto", Integer, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("packets", BigInteger, nullable=False),
    Column("start_ms", BigInteger, nullable=False),
    Column("end_ms", BigInteger, nullable=False),
    # 1 in ``sampling`` packets was seen: bytes and packets are as exported (not scaled up).
    Column("sampling", BigInteger, nullable=False),
    Column("source", Text, nullable=False),
    # Instances are built per host pair and time range; active tests are matched the same way.
    Index(None, "src", "dst", "start_ms"),
    Index(None, "start_ms"),
)

# Live samples (iepm/store/live.py): each ping reply and the monitor's interface rates as they
# happen, for the live pages. A short ring: rows older than ``live.KEEP_S`` are pruned by the
# writer; what the archive keeps for years is the per-minute result. ``value`` NULL is a lost
# reply (a gap on the page). ``id`` only grows, so "anything new?" is ``max(id)`` on either
# database.
live_samples = Table(
    "live_samples",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
    Column("monitor", Text, nullable=False),
    Column("target", Text, nullable=False),
    Column("probe", Text, nullable=False),
    Column("metric", Text, nullable=False),
    Column("t_s", Float, nullable=False),
    Column("value", Float),
    Index(None, "t_s"),
)

# The tests running now, one row per (monitor, probe, target) while it runs; ``expires_s`` (the
# writer's epoch seconds) lets a killed monitor's rows fall out of view.
live_running = Table(
    "live_running",
    metadata,
    Column("monitor", Text, primary_key=True),
    Column("probe", Text, primary_key=True),
    Column("target", Text, primary_key=True),
    Column("params", JSON, nullable=False),
    Column("started_s", Float, nullable=False),
    Column("expires_s", Float, nullable=False),
)
