"""The archive: every Result ever measured, in SQLite (default) or PostgreSQL.

SQLite is one file in WAL mode: readers never block the writer, a second writing process waits
(``busy_timeout``) instead of failing, and every commit is fsynced (``synchronous=FULL``), so a
``kill -9`` or a power cut loses at most the result being written. PostgreSQL
(``postgresql+psycopg://…``) lets several monitoring hosts share one archive.

The schema only changes through the Alembic revisions in ``migrations/``; ``Archive.open``
upgrades the database to the newest one, serialised between processes that open it at once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import (
    URL,
    ColumnElement,
    Connection,
    Engine,
    RowMapping,
    Select,
    Text,
    cast,
    create_engine,
    event,
    func,
    insert,
    make_url,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from iepm.errors import StoreError
from iepm.results import Outcome, Purpose, Result, format_time, new_result_id
from iepm.store import partitions, rollup
from iepm.store.filters import result_conditions
from iepm.store.schema import cycles as CYCLES
from iepm.store.schema import results as RESULTS

Order = Literal["asc", "desc"]
T = TypeVar("T")

MIGRATIONS = Path(__file__).parent / "migrations"
# A writer waits this long for another process's transaction (e.g. an import) to finish.
BUSY_TIMEOUT_MS = 60_000
PG_CONNECT_TIMEOUT_S = 10
# Driver-side deadlines on PostgreSQL (each kept if the URL sets its own): a statement the server
# runs longer than this is cancelled by the server, and a server that stops answering on the
# network is given up by the kernel (keepalives, unacknowledged data) instead of waited for for
# ever. A server that is frozen but whose kernel still acknowledges data is caught by neither:
# the monitor also bounds every archive call by a wall-clock deadline (iepm.store.guard).
PG_DEADLINES: dict[str, Any] = {
    "connect_timeout": PG_CONNECT_TIMEOUT_S,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,  # ms
}
PG_STATEMENT_TIMEOUT_MS = 300_000
# pg_advisory_xact_lock key ("iepm"): hosts opening a fresh shared archive at once migrate in turn.
PG_MIGRATION_LOCK = 0x6965706D
# Rows fetched per round trip while streaming, and rows per executemany in add_many.
STREAM_BATCH = 1000
BULK_CHUNK = 5000
# Execution option marking a write transaction: on SQLite it starts with BEGIN IMMEDIATE, which
# takes the write lock up front, so a concurrent writer waits in busy_timeout instead of failing
# when it would have to upgrade a read lock.
WRITE = "iepm_write"
# Text columns that may carry tool output. PostgreSQL refuses NUL in text, so NUL becomes U+FFFD
# on both backends alike (the raw log keeps the verbatim bytes).
TOOL_TEXT = ("tool_version", "error", "diags")
# What re-extraction may change: the parser's reading of the same raw run.
REEXTRACTED = ("schema", "data", "outcome", "succeeded", "error")


@dataclass(frozen=True)
class Cycle:
    """One scheduler cycle: when it ran, whether it overran its interval, how it went."""

    monitor: str
    started_at: datetime
    finished_at: datetime
    interval_s: float
    overran: bool
    n_results: int
    n_failed: int
    id: str = field(default_factory=new_result_id)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _reason(exc: BaseException) -> str:
    """The driver's own message, without SQLAlchemy's echo of the statement and parameters."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        return str(exc.orig).strip()
    return str(exc).strip()


def connect_engine(url: str) -> Engine:
    """An engine for an archive URL (SQLite pragmas and transaction handling set up), without
    touching the schema. Creates the parent directory of a SQLite file."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(
            f"archive URL {url!r} is not a database URL "
            "(use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
        ) from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    if backend == "postgresql":
        connect_args = {k: v for k, v in PG_DEADLINES.items() if k not in parsed.query}
        if "options" not in parsed.query:
            connect_args["options"] = f"-c statement_timeout={PG_STATEMENT_TIMEOUT_MS}"
        return create_engine(
            parsed,
            pool_pre_ping=True,
            pool_timeout=PG_CONNECT_TIMEOUT_S,
            connect_args=connect_args,
            json_serializer=_dumps,
        )
    raise StoreError(
        f"archive URL {_shown(parsed)} names an unsupported database {backend!r} "
        "(use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
    )


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _sqlite_engine(url: URL) -> Engine:
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise StoreError(f"archive URL {_shown(url)} names no file; an archive is a file")
    try:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the directory for archive {_shown(url)}: {exc}") from exc
    # ``timeout``: the sqlite3 module's own wait for a lock, as long as busy_timeout below.
    engine = create_engine(
        url, json_serializer=_dumps, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000}
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # The sqlite3 module's own BEGIN handling skips reads and DDL; _on_begin does it instead.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # busy_timeout first, so that switching to WAL also waits for other processes.
            cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = FULL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        write = connection.get_execution_options().get(WRITE, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def alembic_config() -> Config:
    """Alembic configured for the migrations shipped in this package (no alembic.ini)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def _upgrade(engine: Engine) -> None:
    """Bring the schema to the newest revision; a no-op read when it is already there."""
    config = alembic_config()
    script = ScriptDirectory.from_config(config)
    head = script.get_current_head()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    if current == head:
        return
    if current is not None:
        try:
            script.get_revision(current)
        except CommandError:
            raise StoreError(
                f"archive {_shown(engine.url)} is at schema revision {current}, which this "
                f"version of iepm does not know (its newest is {head}); upgrade iepm"
            ) from None
    with engine.connect() as conn:
        conn.execution_options(**{WRITE: True})
        with conn.begin():
            if engine.dialect.name == "postgresql":
                # A migration may rebuild summaries of a large archive: no statement deadline.
                conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
                conn.execute(select(func.pg_advisory_xact_lock(PG_MIGRATION_LOCK)))
            config.attributes["connection"] = conn
            command.upgrade(config, "head")


def _partition(engine: Engine) -> None:
    """On PostgreSQL, the month partitions of ``results`` and ``flows`` ahead of now
    (iepm/store/partitions.py). Called before an archive's first write (and again once the
    month has changed), never by reading: a command that only reads creates nothing. A role
    that may not create tables skips it: its rows land in the default partition, and the next
    write, prune or maintenance by the archive's owner moves them into months of their own."""
    try:
        with engine.begin() as conn:
            partitions.ensure(conn)
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != "42501":  # insufficient_privilege
            raise


def _row(result: Result) -> dict[str, Any]:
    # The envelope's JSON form is what gets stored (NaN becomes null, as in every envelope)...
    row = result.envelope()
    # ...except the start time, kept at full precision (the envelope shows milliseconds).
    row["started_at"] = result.started_at
    for key in TOOL_TEXT:
        value = row[key]
        if value and "\x00" in value:
            row[key] = value.replace("\x00", "\ufffd")
    return row


def _cycle(row: RowMapping) -> Cycle:
    return Cycle(**row)


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


class Archive:
    """Results and scheduler cycles in one database. Open it with ``Archive.open(url)``."""

    def __init__(self, engine: Engine, *, ready: bool = True) -> None:
        self._engine = engine
        #: The URL with any password hidden, as error messages show it.
        self.url = _shown(engine.url)
        # False until the schema is known to be at the newest revision (see ``connect``).
        self._ready = ready
        # The month whose partitions (and the next ones) this archive made sure of before a
        # write (``_partitioned``); None until its first write on PostgreSQL.
        self._partitioned_for: partitions.Month | None = None

    @classmethod
    def open(cls, url: str) -> Archive:
        """Open (creating or upgrading as needed) the archive at ``url``:
        ``sqlite:///path/to/archive.db`` or ``postgresql+psycopg://user:pass@host/db``. Month
        partitions are made by the first write, not here: reading creates none."""
        engine = connect_engine(url)
        try:
            _upgrade(engine)
        except StoreError:
            engine.dispose()
            raise
        except (SQLAlchemyError, CommandError, OSError) as exc:
            engine.dispose()
            raise StoreError(f"cannot open archive {_shown(engine.url)}: {_reason(exc)}") from exc
        return cls(engine)

    @classmethod
    def connect(cls, url: str) -> Archive:
        """The archive at ``url`` without touching the database yet: the schema is checked (and
        upgraded) by the first call that uses it, and a call made while the database is
        unreachable raises ``StoreError`` as any failed call does. For ``iepm run``, which must
        start — and spool — while the archive is down. Bad URLs still fail here."""
        return cls(connect_engine(url), ready=False)

    def prepare(self) -> None:
        """Check (and upgrade) the schema if not done yet; ``StoreError`` if it cannot."""
        if self._ready:
            return
        try:
            _upgrade(self._engine)
        except StoreError:
            raise
        except (SQLAlchemyError, CommandError, OSError) as exc:
            raise StoreError(f"cannot open archive {self.url}: {_reason(exc)}") from exc
        self._ready = True

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------

    def add(self, result: Result) -> None:
        """Store one result in its own transaction, committed (and on SQLite fsynced) on return."""
        with self._writing(f"cannot add result {result.id}") as conn:
            row = _row(result)
            conn.execute(insert(RESULTS), row)
            rollup.accumulate(conn, _summarised([row]))

    def add_many(self, results: Iterable[Result]) -> int:
        """Store many results in one transaction (all or none); returns how many."""
        count = 0
        with self._writing("cannot add results") as conn:
            for chunk in _chunks(results, BULK_CHUNK):
                rows = [_row(result) for result in chunk]
                conn.execute(insert(RESULTS), rows)
                rollup.accumulate(conn, _summarised(rows))
                count += len(rows)
        return count

    def upsert_by_token(self, result: Result) -> str:
        """Store a re-extracted result: if a row has the same ``raw_token``, replace its
        schema, data, outcome, succeeded and error (keeping its id); otherwise insert it.
        Returns the id of the stored row."""
        if result.raw_token is None:
            raise ValueError(f"result {result.id} has no raw_token to match a stored run by")
        if self._engine.dialect.name == "postgresql":
            return self._upsert_by_token_pg(result)
        statement = self._dialect().insert(RESULTS).values(_row(result))
        statement = statement.on_conflict_do_update(
            index_elements=[RESULTS.c.raw_token],
            set_={key: statement.excluded[key] for key in REEXTRACTED},
        ).returning(
            RESULTS.c.id, RESULTS.c.target, RESULTS.c.monitor, RESULTS.c.probe, RESULTS.c.started_at
        )
        with self._writing(f"cannot store re-extracted result {result.id}") as conn:
            stored_id, target, monitor, probe, started_at = conn.execute(statement).one()
            # The stored row keeps its own start: that day is the one to recompute.
            rollup.refresh(conn, [(target, monitor, probe, rollup.day_of(started_at))])
            return str(stored_id)

    def _upsert_by_token_pg(self, result: Result) -> str:
        """``upsert_by_token`` on PostgreSQL, where ``results`` is partitioned and so has no key
        on ``raw_token`` alone (iepm/store/partitions.py): the token is locked for the
        transaction, then the stored row updated, or the new one inserted."""
        row = _row(result)
        columns = RESULTS.c
        found = (
            update(RESULTS)
            .where(columns.raw_token == result.raw_token)
            .values({key: row[key] for key in REEXTRACTED})
            .returning(
                columns.id, columns.target, columns.monitor, columns.probe, columns.started_at
            )
        )
        with self._writing(f"cannot store re-extracted result {result.id}") as conn:
            conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(result.raw_token))))
            stored = conn.execute(found).first()
            if stored is None:
                conn.execute(insert(RESULTS), row)
                stored_id, target, monitor, probe, started_at = (
                    row["id"], row["target"], row["monitor"], row["probe"], row["started_at"]
                )  # fmt: skip
            else:
                stored_id, target, monitor, probe, started_at = stored
            rollup.refresh(conn, [(target, monitor, probe, rollup.day_of(started_at))])
            return str(stored_id)

    def add_new(self, results: Iterable[Result]) -> int:
        """Store the results not stored yet (by id or raw token), in one transaction; returns
        how many were new. For writing back a spool: a result already in the archive (e.g.
        written by a call that outlived its deadline) is no error and is not counted twice."""
        count = 0
        with self._writing("cannot add spooled results") as conn:
            insert_new = self._dialect().insert(RESULTS).on_conflict_do_nothing()
            partitioned = partitions.is_partitioned(conn)
            for result in results:
                row = _row(result)
                if partitioned and _stored_near(conn, result):
                    continue
                if conn.execute(insert_new.values(row).returning(RESULTS.c.id)).first():
                    rollup.accumulate(conn, _summarised([row]))
                    count += 1
        return count

    def add_cycle(self, cycle: Cycle) -> None:
        with self._writing(f"cannot add cycle {cycle.id}") as conn:
            conn.execute(insert(CYCLES), asdict(cycle))

    def add_cycles_new(self, cycles: Iterable[Cycle]) -> int:
        """Store the cycle records not stored yet (by id); returns how many were new."""
        count = 0
        with self._writing("cannot add spooled cycles") as conn:
            insert_new = self._dialect().insert(CYCLES).on_conflict_do_nothing()
            for cycle in cycles:
                row = asdict(cycle)
                if conn.execute(insert_new.values(row).returning(CYCLES.c.id)).first():
                    count += 1
        return count

    # -- reading ---------------------------------------------------------------------------

    def results(
        self,
        probe: str | None = None,
        target: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        monitor: str | None = None,
        outcome: Outcome | str | None = None,
        limit: int | None = None,
        offset: int = 0,
        order: Order = "asc",
        purpose: Purpose | str | None = Purpose.ROUTINE,
    ) -> Generator[Result, None, None]:
        """Results matching every given filter (``since`` inclusive, ``until`` exclusive; the
        routine series unless ``purpose`` says otherwise, ``None`` for every purpose), by
        start time then id, streamed from the database in batches. Closing the generator
        before the end releases its database connection at once."""
        query = _results_query(
            probe, target, since, until, monitor, outcome, purpose, limit, offset, order
        )
        return self._stream(query, Result.model_validate, "cannot read results")

    def envelope_page(
        self,
        probe: str | None = None,
        target: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        monitor: str | None = None,
        outcome: Outcome | str | None = None,
        limit: int | None = None,
        offset: int = 0,
        order: Order = "asc",
        purpose: Purpose | str | None = Purpose.ROUTINE,
    ) -> tuple[int, list[str]]:
        """How many results match (as ``count()``) and the page ``results()`` would yield, each
        as the JSON text of its envelope (the document ``Result.envelope()`` returns), from one
        snapshot on one connection. Built from the stored rows: the stored ``params`` and
        ``data`` texts are spliced in as they are. Every row was validated and serialised when
        it was written; decoding, validating and encoding it again was most of an API page's
        time. On PostgreSQL the count and the page are one statement outside any transaction
        (one round trip instead of BEGIN, count, page, ROLLBACK: on a busy server each round
        trip waits for the backend to be scheduled, and the web worker waits with it)."""
        counting = _count_query(probe, target, since, until, monitor, outcome, purpose)
        query = _results_query(
            probe, target, since, until, monitor, outcome, purpose, limit, offset, order
        )
        texts = query.with_only_columns(
            *(RESULTS.c[key] for key in _ENVELOPE_HEAD),
            cast(RESULTS.c.params, Text).label("params_text"),
            cast(RESULTS.c.data, Text).label("data_text"),
        )
        with self._errors("cannot read results"), self._engine.connect() as conn:
            if self._engine.dialect.name != "postgresql":
                total = int(conn.execute(counting).scalar_one())
                return total, [_envelope_text(row) for row in conn.execute(texts).mappings()]
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            counted = counting.with_only_columns(func.count().label("total")).subquery("counted")
            page = texts.subquery("page")
            keys = (page.c.started_at, page.c.id)
            both = (
                select(counted.c.total, page)
                .select_from(counted.outerjoin(page, true()))
                .order_by(*(key.asc() if order == "asc" else key.desc() for key in keys))
            )
            rows = conn.execute(both).mappings().all()
            total = int(rows[0]["total"])
            return total, [_envelope_text(row) for row in rows if row["id"] is not None]

    def count(
        self,
        probe: str | None = None,
        target: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        monitor: str | None = None,
        outcome: Outcome | str | None = None,
        purpose: Purpose | str | None = Purpose.ROUTINE,
    ) -> int:
        """How many results ``results()`` would yield with the same filters."""
        query = _count_query(probe, target, since, until, monitor, outcome, purpose)
        with self._errors("cannot count results"), self._engine.connect() as conn:
            return int(conn.execute(query).scalar_one())

    def latest(self, probe: str, target: str) -> Result | None:
        """The most recent result of ``probe`` against ``target``, if any."""
        return next(self.results(probe=probe, target=target, limit=1, order="desc"), None)

    def targets(self) -> list[str]:
        """Every target that has results, sorted."""
        query = select(RESULTS.c.target).distinct().order_by(RESULTS.c.target)
        with self._errors("cannot list targets"), self._engine.connect() as conn:
            return list(conn.execute(query).scalars())

    def cycles(
        self,
        monitor: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Generator[Cycle, None, None]:
        """Scheduler cycles, oldest first (``since`` inclusive, ``until`` exclusive)."""
        conditions: list[ColumnElement[bool]] = []
        if monitor is not None:
            conditions.append(CYCLES.c.monitor == monitor)
        if since is not None:
            conditions.append(CYCLES.c.started_at >= since)
        if until is not None:
            conditions.append(CYCLES.c.started_at < until)
        query = select(CYCLES).where(*conditions).order_by(CYCLES.c.started_at, CYCLES.c.id)
        return self._stream(query, _cycle, "cannot read cycles")

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` ("ok" when sound); PostgreSQL guards its own
        integrity, so there the answer is "ok" once the server answers."""
        with self._errors("cannot check integrity"), self._engine.connect() as conn:
            if self._engine.dialect.name != "sqlite":
                conn.exec_driver_sql("SELECT 1")
                return "ok"
            return "\n".join(conn.exec_driver_sql("PRAGMA integrity_check").scalars())

    # -- for modules that own other tables (alerts, studies, tuned parameters) ---------------

    @contextmanager
    def writing(self, doing: str) -> Iterator[Connection]:
        """One write transaction (serialised with every other writer on SQLite), committed when
        the block ends; database errors become a ``StoreError`` that starts with ``doing``."""
        with self._writing(doing) as conn:
            yield conn

    @contextmanager
    def reading(self, doing: str) -> Iterator[Connection]:
        """A connection for reads; database errors become a ``StoreError``."""
        with self._errors(doing), self._engine.connect() as conn:
            yield conn

    @contextmanager
    def autocommit(self, doing: str) -> Iterator[Connection]:
        """A connection outside any transaction, each statement committed on its own (VACUUM
        may run in no transaction, CLUSTER should not hold one open); its session settings are
        reset before it goes back to the pool. Database errors become a ``StoreError``."""
        with self._errors(doing), self._engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            try:
                yield conn
            finally:
                if self._engine.dialect.name == "postgresql":
                    conn.exec_driver_sql("RESET ALL")

    # -- plumbing --------------------------------------------------------------------------

    def _dialect(self) -> Any:
        return sqlite if self._engine.dialect.name == "sqlite" else postgresql

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            self.prepare()
            yield
        except (SQLAlchemyError, OSError) as exc:
            raise StoreError(f"{doing} (archive {self.url}): {_reason(exc)}") from exc

    def _partitioned(self) -> None:
        """Before a write on PostgreSQL: this month's partitions and the next ones exist (once
        per archive and month: a monitor running for months makes each new month's in time)."""
        if self._engine.dialect.name != "postgresql":
            return
        month = partitions.Month.of(datetime.now(UTC))
        if self._partitioned_for != month:
            _partition(self._engine)
            self._partitioned_for = month

    @contextmanager
    def _writing(self, doing: str) -> Iterator[Connection]:
        """One write transaction, committed when the block ends (on PostgreSQL after making
        sure the months ahead are partitioned)."""
        with self._errors(doing):
            self._partitioned()
        with self._errors(doing), self._engine.connect() as conn:
            conn.execution_options(**{WRITE: True})
            with conn.begin():
                yield conn

    def _stream(
        self, query: Select[Any], convert: Callable[[RowMapping], T], doing: str
    ) -> Generator[T, None, None]:
        # Rows come in batches (a server-side cursor on PostgreSQL); the connection is released
        # when the iterator is exhausted, closed or garbage-collected.
        with self._errors(doing), self._engine.connect() as conn:
            rows = conn.execute(query.execution_options(yield_per=STREAM_BATCH))
            for row in rows.mappings():
                yield convert(row)


# A spooled result's start is its envelope's, cut to the millisecond; the stored row has the
# full precision. Within this much of each other, the same id is the same result.
SPOOL_PRECISION = timedelta(seconds=1)


def _stored_near(conn: Connection, result: Result) -> bool:
    """Whether the result is stored already, on a partitioned ``results`` (PostgreSQL), whose
    key is ``(id, started_at)``: the spool's copy of a stored result has its id but a start cut
    to the millisecond, so the key alone would store it twice. The id is locked for the
    transaction (two flushes of one spool at once store it once), and the look-up reads only
    the partitions around its start."""
    conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(result.id))))
    near = (
        select(RESULTS.c.id)
        .where(
            RESULTS.c.id == result.id,
            RESULTS.c.started_at > result.started_at - SPOOL_PRECISION,
            RESULTS.c.started_at < result.started_at + SPOOL_PRECISION,
        )
        .limit(1)
    )
    return conn.execute(near).first() is not None


def _summarised(rows: Iterable[dict[str, Any]]) -> list[tuple[str, str, str, datetime, str, Any]]:
    """What the daily summaries read of stored rows (rollup.SOURCE's columns): routine results
    only, as rollup.refresh and rollup.rebuild select them."""
    return [
        tuple(row[column.name] for column in rollup.SOURCE)  # type: ignore[misc]
        for row in rows
        if row["purpose"] == rollup.ROLLED_UP_PURPOSE
    ]


def _count_query(
    probe: str | None,
    target: str | None,
    since: datetime | None,
    until: datetime | None,
    monitor: str | None,
    outcome: Outcome | str | None,
    purpose: Purpose | str | None,
) -> Select[Any]:
    conditions = _filters(probe, target, since, until, monitor, outcome, purpose)
    return select(func.count()).select_from(RESULTS).where(*conditions)


def _results_query(
    probe: str | None,
    target: str | None,
    since: datetime | None,
    until: datetime | None,
    monitor: str | None,
    outcome: Outcome | str | None,
    purpose: Purpose | str | None,
    limit: int | None,
    offset: int,
    order: Order,
) -> Select[Any]:
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
    keys = (RESULTS.c.started_at, RESULTS.c.id)
    return (
        select(RESULTS)
        .where(*_filters(probe, target, since, until, monitor, outcome, purpose))
        .order_by(*(key.asc() if order == "asc" else key.desc() for key in keys))
        .limit(limit)
        .offset(offset or None)
    )


# The envelope's keys in the order Result declares them (``schema`` spelled as documented);
# ``params`` and ``data`` come last, so their stored JSON texts can close each document.
_ENVELOPE_KEYS = [field.alias or name for name, field in Result.model_fields.items()]
_ENVELOPE_HEAD = _ENVELOPE_KEYS[:-2]
if _ENVELOPE_KEYS[-2:] != ["params", "data"]:
    raise RuntimeError("Result must declare params and data last (see _envelope_text)")


def _envelope_text(row: RowMapping) -> str:
    head = {key: row[key] for key in _ENVELOPE_HEAD}
    head["started_at"] = format_time(row["started_at"])
    if not math.isfinite(head["duration_s"]):
        head["duration_s"] = None  # as pydantic writes a NaN
    params, data = row["params_text"], row["data_text"]
    return f'{json.dumps(head, ensure_ascii=False)[:-1]}, "params": {params}, "data": {data}}}'


def _filters(
    probe: str | None,
    target: str | None,
    since: datetime | None,
    until: datetime | None,
    monitor: str | None,
    outcome: Outcome | str | None,
    purpose: Purpose | str | None,
) -> list[ColumnElement[bool]]:
    return result_conditions(
        RESULTS,
        probe=probe,
        target=target,
        monitor=monitor,
        since=since,
        until=until,
        outcome=outcome,
        purpose=purpose,
    )
