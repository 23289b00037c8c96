"""Host leases in the archive: no two bandwidth tests of a mesh ever meet at one host.

Before an exclusive probe, the monitor takes a lease on both ends — itself and the target's
host — in one transaction: a row per host in ``host_leases`` (the host is the primary key), so
of two monitors asking for a common host at once exactly one gets it, whatever the target's
access mode (plain, SSH or agent). The row carries an expiry on the *database's* clock: the
probe's whole deadline plus a margin. A monitor that crashes (``kill -9``) mid-test leaves its
rows behind only until then — the next taker deletes expired rows in the same transaction.
A test that cannot get its hosts within ``lease_wait_s`` is not run; the scheduler stores it as
a skipped result with the reason, and counts the refusal and the time spent waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Engine, Float, cast, delete, func, insert, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from iepm.config import TargetConfig
from iepm.errors import IepmError, StoreError
from iepm.store.archive import connect_engine
from iepm.store.schema import host_leases

log = logging.getLogger(__name__)
T = TypeVar("T")

# Deadline of one lease call (take or release); PostgreSQL's statement timeout bounds it too.
CALL_S = 10.0
# A lease outlives its probe's deadline by this much: a slow release is never a second test.
MARGIN_S = 5.0
# Polling for busy hosts: from FIRST_POLL_S, doubling up to LAST_POLL_S (with jitter, so
# monitors that lost one race do not ask again in step).
FIRST_POLL_S = 0.2
LAST_POLL_S = 5.0


class LeaseRefused(IepmError):
    """The hosts stayed busy for the whole wait, or the archive could not be asked."""


def db_now_s(engine: Engine) -> ColumnElement[Any]:
    """The database's clock in epoch seconds (monitors' clocks may disagree)."""
    if engine.dialect.name == "postgresql":
        return cast(func.extract("epoch", func.clock_timestamp()), Float)
    return (func.julianday("now") - 2440587.5) * 86400.0


class HostLeases:
    """Leases for the monitor ``holder``; ``host_of`` names the host a target belongs to."""

    def __init__(
        self,
        url: str,
        holder: str,
        host_of: Callable[[str], str],
        *,
        wait_s: float,
        rng: random.Random | None = None,
    ) -> None:
        self.url = url
        self.holder = holder
        self.host_of = host_of
        self.wait_s = wait_s
        self.rng = rng or random.Random()
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self.taken = 0
        self.refused = 0
        self.busy = 0  # takes that found a host leased (each poll while waiting)
        self.waited_s = 0.0

    def _connect(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = connect_engine(self.url)
            return self._engine

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None

    # -- one transaction each ------------------------------------------------------------------

    def take(self, hosts: list[str], target: str, probe: str, hold_s: float) -> str | None:
        """A token if every host was free (or its lease expired), else None; all or nothing."""
        engine = self._connect()
        token = uuid.uuid4().hex
        try:
            with engine.begin() as conn:
                now = float(conn.execute(select(db_now_s(engine))).scalar_one())
                conn.execute(
                    delete(host_leases).where(
                        host_leases.c.host.in_(hosts), host_leases.c.expires_s < now
                    )
                )
                rows = [
                    {
                        "host": host,
                        "token": token,
                        "holder": self.holder,
                        "probe": probe,
                        "target": target,
                        "expires_s": now + hold_s,
                    }
                    for host in sorted(hosts)  # one order everywhere: no deadlock between takers
                ]
                conn.execute(insert(host_leases), rows)
        except IntegrityError:
            return None  # a host is leased: the whole transaction was rolled back
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot take a host lease in {engine.url!r}: {exc}") from None
        return token

    def release(self, token: str) -> None:
        engine = self._connect()
        try:
            with engine.begin() as conn:
                conn.execute(delete(host_leases).where(host_leases.c.token == token))
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot release a host lease: {exc}") from None

    def holders(self, hosts: list[str]) -> list[tuple[str, str, str]]:
        """(host, holder, target) of the leases on ``hosts`` now (for messages and tests)."""
        engine = self._connect()
        query = select(host_leases.c.host, host_leases.c.holder, host_leases.c.target).where(
            host_leases.c.host.in_(hosts), host_leases.c.expires_s >= db_now_s(engine)
        )
        try:
            with engine.connect() as conn:
                return [(r.host, r.holder, r.target) for r in conn.execute(query)]
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot read host leases: {exc}") from None

    def current(self) -> list[tuple[str, str, str, str, float]]:
        """Every live lease: (host, holder, target, probe, seconds left), by host."""
        engine = self._connect()
        now = db_now_s(engine)
        query = (
            select(
                host_leases.c.host,
                host_leases.c.holder,
                host_leases.c.target,
                host_leases.c.probe,
                host_leases.c.expires_s - now,
            )
            .where(host_leases.c.expires_s >= now)
            .order_by(host_leases.c.host)
        )
        try:
            with engine.connect() as conn:
                return [(r[0], r[1], r[2], r[3], float(r[4])) for r in conn.execute(query)]
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot read host leases: {exc}") from None

    # -- the scheduler's hook ------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args), CALL_S)
        except TimeoutError:
            raise StoreError(f"no answer to a lease call within {CALL_S:g} s") from None

    @contextlib.asynccontextmanager
    async def __call__(self, target: TargetConfig, probe: str, hold_s: float) -> AsyncIterator[str]:
        """Hold this monitor's and the target's hosts for ``hold_s`` (+ margin); yields a line
        for the result's diagnostics. Raises LeaseRefused when they cannot be had in time."""
        hosts = sorted({self.holder, self.host_of(target.name)})
        t0 = time.monotonic()
        deadline = t0 + self.wait_s
        pause = FIRST_POLL_S
        while True:
            try:
                token = await self._call(self.take, hosts, target.name, probe, hold_s + MARGIN_S)
            except StoreError as exc:
                self.refused += 1
                raise LeaseRefused(f"no host lease (archive): {exc}") from None
            if token is not None:
                break
            self.busy += 1
            left = deadline - time.monotonic()
            if left <= 0:
                self.refused += 1
                busy = await self._busy(hosts)
                raise LeaseRefused(
                    f"hosts {', '.join(hosts)} stayed busy for {self.wait_s:g} s{busy}"
                )
            await asyncio.sleep(min(left, pause * self.rng.uniform(0.5, 1.5)))
            pause = min(pause * 2, LAST_POLL_S)
        waited = time.monotonic() - t0
        self.taken += 1
        self.waited_s += waited
        try:
            yield f"[host lease on {', '.join(hosts)}: waited {waited:.1f} s]"
        finally:
            try:
                await self._call(self.release, token)
            except StoreError as exc:  # it expires on its own; the next taker removes it
                log.error("host lease %s not released (expires by itself): %s", token, exc)

    async def _busy(self, hosts: list[str]) -> str:
        try:
            held = await self._call(self.holders, hosts)
        except StoreError:
            return ""
        return "".join(f"; {h} held by {who} (testing {t})" for h, who, t in held)
