"""A private, throwaway PostgreSQL server for tests and benchmarks.

``pg_server`` (a session-scoped pytest fixture; import it into a ``conftest.py``) starts one with
``initdb`` + ``pg_ctl`` in a temporary directory, listening on 127.0.0.1 on a free port with a
random password, and at the end stops it (``-m immediate``) and removes the directory. As root
the server binaries run as the ``postgres`` system user, since PostgreSQL refuses to run as root.

Without the server binaries the fixture skips, except under ``CI=true`` where it fails: CI must
never pass by skipping the database tests.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from testkit.net import free_port

MISSING = "PostgreSQL server binaries (initdb, pg_ctl) not found; `make test` installs them"
# Settings for a server nobody needs to survive a crash: faster, same SQL behaviour.
FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
RUN_AS = "postgres"
SUPERUSER = "postgres"


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: from PATH, else Debian's newest
    ``/usr/lib/postgresql/<major>/bin``."""
    initdb = shutil.which("initdb")
    if initdb is not None and shutil.which("pg_ctl") is not None:
        return Path(initdb).parent
    versions = [
        path
        for path in Path("/usr/lib/postgresql").glob("*/bin")
        if re.fullmatch(r"\d+", path.parent.name) and (path / "initdb").exists()
    ]
    return max(versions, key=lambda path: int(path.parent.name), default=None)


@dataclass(frozen=True)
class PgServer:
    """A running server; ``url(db)`` is a SQLAlchemy URL for one of its databases."""

    directory: Path
    port: int
    password: str

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user=SUPERUSER,
            password=self.password,
            dbname="postgres",
            autocommit=True,
            connect_timeout=10,
        )

    def create_database(self, name: str) -> str:
        """Create an empty database and return its URL."""
        with self._admin() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting whoever still uses it (e.g. a killed test child)."""
        with self._admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _runner(bindir: Path) -> tuple[list[str], int | None, int | None]:
    """The command prefix to run server binaries, and the uid/gid to own their files."""
    if os.geteuid() != 0:
        return [], None, None
    try:
        account = pwd.getpwnam(RUN_AS)
    except KeyError:
        raise RuntimeError(
            f"running as root, and there is no '{RUN_AS}' user to run {bindir}/postgres as"
        ) from None
    return ["runuser", "-u", RUN_AS, "--"], account.pw_uid, account.pw_gid


def _run(argv: list[str], cwd: Path, timeout_s: float) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}".strip()
        )


@contextmanager
def running_server(
    bindir: Path, settings: Mapping[str, str] = FAST, timeout_s: float = 60.0
) -> Iterator[PgServer]:
    """Start a fresh cluster, yield it, then stop it and remove every file it had."""
    prefix, uid, gid = _runner(bindir)
    directory = Path(tempfile.mkdtemp(prefix="iepm-pg-"))
    data = directory / "data"
    try:
        password = secrets.token_hex(16)
        pwfile = directory / "pwfile"
        pwfile.write_text(password + "\n")
        if uid is not None and gid is not None:
            os.chown(directory, uid, gid)
            os.chown(pwfile, uid, gid)
        _run(
            [
                *prefix,
                str(bindir / "initdb"),
                f"--pgdata={data}",
                f"--username={SUPERUSER}",
                f"--pwfile={pwfile}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            directory,
            timeout_s,
        )
        port = free_port()
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(port),
            "unix_socket_directories": f"'{directory}'",
            **settings,
        }
        with (data / "postgresql.conf").open("a") as config:
            config.writelines(f"{key} = {value}\n" for key, value in conf.items())
        pg_ctl = [*prefix, str(bindir / "pg_ctl"), f"--pgdata={data}"]
        try:
            log = directory / "server.log"
            start = [*pg_ctl, f"--log={log}", "-w", f"--timeout={int(timeout_s)}", "start"]
            try:
                _run(start, directory, timeout_s + 10)
            except RuntimeError as exc:
                server_log = log.read_text(errors="replace")[-4000:] if log.exists() else ""
                raise RuntimeError(f"{exc}\nserver log:\n{server_log}") from None
            yield PgServer(directory, port, password)
        finally:
            _stop(pg_ctl, data, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _stop(pg_ctl: list[str], data: Path, directory: Path) -> None:
    try:
        _run([*pg_ctl, "-m", "immediate", "-w", "--timeout=30", "stop"], directory, 40)
    except (RuntimeError, subprocess.TimeoutExpired):
        # pg_ctl could not stop it: kill the postmaster we started, by the PID it recorded.
        with suppress(OSError, ValueError, IndexError):
            pid = int((data / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    bindir = find_bindir()
    if bindir is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{MISSING} (CI=true: the PostgreSQL tests must run)", pytrace=False)
        pytest.skip(MISSING)
    with running_server(bindir) as server:
        yield server
