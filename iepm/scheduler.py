"""Measurement cycles that never hang and never lose a finished result.

A cycle visits every target once, in a new random order each cycle (so that no target always
meets the same time of day or the same neighbour). For each target the background probes
(ping, traceroute, load) run side by side, then the exclusive probes (bandwidth tests) run one
at a time — never two bandwidth tests from this monitor at once. If ping is expected to work and
fails, the heavy probes are skipped and recorded as skipped, with the reason (the seeds' sanity
rule: a dead path would otherwise cost a full iperf3 timeout per probe).

Each result is written to the archive in its own transaction as soon as its probe finishes.
No archive call runs on the event loop: each runs on one worker thread with a deadline
(:mod:`iepm.store.guard`), so a hung or frozen database can never stretch a probe past its own
deadline. If the archive cannot take a result (down, hung, full), the result is appended to the
spool beside the raw logs (:mod:`iepm.store.spool`); if the spool's disk is full too, it is held
in memory. Cycle records take the same path. Everything waiting is written back — idempotently —
at the start of the next cycle, and as soon as the archive takes a write again. ``iepm run``
starts with the archive unreachable and spools until it is back. :class:`SchedulerHealth` says
where results went and what is waiting. A cycle that overruns its interval is recorded and the
next one starts late rather than overlapping.

After each result is stored it goes to the *watchers* (by default the alert watcher of
:mod:`iepm.analysis.watch`, as ``[monitor] alerts`` asks): a watcher that fails is logged and
counted, never allowed to stop the cycle. With ``[monitor] adaptive`` the exclusive probes of a
predictable path are not scheduled in every cycle (:mod:`iepm.analysis.adaptive`); each such
deferral is counted and listed in the cycle's report, and no result is stored for it. With
``[monitor] retune`` a path that needs tuning is swept (:mod:`iepm.tuning.routine`) in its tuned
probe's exclusive slot, just before that probe's run, within a budget; see ``_retune``.

With a ``[schedule]`` table (schedule mode) there is no cycle: each target × probe runs at its
own interval. Light (background) probes run on their own clocks, at most ``light_limit`` at
once; heavy (exclusive) ones run one at a time, earliest due first, under the same sanity rule,
cadence and host leases; a run that outlasts its interval makes the next start late (recorded as
an overrun), never overlap. A continuous probe (ping's :class:`~iepm.probes.ping.Stream`) runs
for as long as the scheduler does and stores one result per window. Every ``cycle_interval_s``
a cycle record counts the period's results. While :meth:`Scheduler.run` runs, what it sees now
(each streamed reply, the monitor's interface rates, the tests running) goes to the archive's
live tables (:mod:`iepm.store.live`) through the same worker thread, dropped — never spooled —
when the archive is slow.

Two hooks serve meshes (:mod:`iepm.mesh`) without the scheduler knowing them: ``configure``
gives the config of each cycle (a mesh file re-read, so an edit needs no restart), and
``host_lease`` is held around each exclusive probe (the archive's host leases, so no two
monitors' bandwidth tests meet at one host); a lease not had in time is a skipped result.
A third, ``execute``, runs each probe elsewhere (a mesh's control host: on the source's agent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Protocol, TypeVar

from pydantic import ValidationError

from iepm import ifrates
from iepm.analysis.adaptive import cadence_for
from iepm.analysis.watch import AlertWatcher, watcher_for
from iepm.config import Config, TargetConfig
from iepm.errors import IepmError, StoreError
from iepm.probes import PROBES, gating_probes
from iepm.probes.base import ProbeContext, ProbeSpec, failed_result, skipped_result
from iepm.rawlog import RawLog
from iepm.remote.lease import server_source
from iepm.results import Outcome, Result, utcnow
from iepm.store import Archive, Cycle, live
from iepm.store.guard import ArchiveDeadline, Guard
from iepm.store.live import LiveSample
from iepm.store.spool import Spool
from iepm.tuned import load_tuned
from iepm.tuning import routine

log = logging.getLogger(__name__)
T = TypeVar("T")

# Extra time past a probe's own deadline before the scheduler gives up on it (the runner's kill
# has its own deadline; this guards against a bug anywhere else in the probe).
PROBE_GUARD_S = 15.0


@dataclass
class CycleReport:
    number: int
    started_at: datetime
    finished_at: datetime | None = None
    duration_s: float = 0.0
    interval_s: float = 0.0
    overran: bool = False
    results: list[Result] = field(default_factory=list)
    probe_time_s: float = 0.0
    # (target, probe, reason) of each exclusive probe the adaptive cadence did not schedule.
    deferred: list[tuple[str, str, str]] = field(default_factory=list)
    # Schedule mode: outcomes counted, not kept (a period holds thousands of light results).
    counted: Counter[str] = field(default_factory=Counter)
    # (target, study id, reasons) of each re-tuning sweep run in this cycle ([monitor] retune);
    # the id is "" when the archive could not even record the sweep's failure.
    retuned: list[tuple[str, str, list[str]]] = field(default_factory=list)

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome.value for r in self.results) + self.counted

    @property
    def n_results(self) -> int:
        return len(self.results) + sum(self.counted.values())


@dataclass
class SchedulerHealth:
    """Counters that /metrics and the CLI expose: failures must be visible."""

    runs_by_outcome: Counter[str] = field(default_factory=Counter)
    cycles: int = 0
    cycle_overruns: int = 0
    # Results (and cycle records) the archive did not take when they were made.
    archive_write_failures: int = 0
    spooled_results: int = 0
    watcher_errors: int = 0
    deferred_runs: int = 0
    # Where each result went first: "archive", "spool" or "memory" (spool unwritable too).
    stored_in: Counter[str] = field(default_factory=Counter)
    spooled_cycles: int = 0
    # Waiting now to be written to the archive.
    spool_pending_results: int = 0
    spool_pending_cycles: int = 0
    held_results: int = 0  # in memory: the spool's disk refused them too
    held_cycles: int = 0
    dropped_results: int = 0  # over the memory bound (never expected; logged)
    spool_write_failures: int = 0
    spool_rejected_lines: int = 0
    caught_up_results: int = 0  # written back from spool or memory
    # "unknown" (not reached yet), "up" or "down"; the last archive error and when it was up.
    archive_state: str = "unknown"
    archive_last_error: str | None = None
    archive_last_ok_at: datetime | None = None
    raw_log_write_failures: int = 0
    raw_log_held: int = 0
    raw_log_last_error: str | None = None
    watcher_skipped: int = 0  # results not shown to watchers (their archive was down)
    # Host leases (a mesh's archive): exclusive probes not run for want of one, time waited.
    lease_refusals: int = 0
    lease_wait_s: float = 0.0
    # Schedule mode: runs that started an interval or more late (the probe, or the light slots
    # or the exclusive lock it waited for, took longer than its interval).
    schedule_overruns: int = 0
    light_running_max: int = 0  # most light probes seen running at once
    # Live samples (replies, interface rates) and running-test marks not written (archive busy
    # or down: they are a view of now, never spooled).
    live_dropped: int = 0
    # Re-tuning sweeps run ([monitor] retune), those that failed, and those a budget or back-off
    # put off.
    retune_sweeps: int = 0
    retune_failures: int = 0
    retune_put_off: int = 0

    def gauges(self) -> list[tuple[str, str, float]]:
        """(name, help, value) of what is waiting and where the archive stands, for /metrics."""
        return [
            ("iepm_archive_up", "1 when the last archive call succeeded, else 0",
             float(self.archive_state == "up")),
            ("iepm_spool_pending_results", "Results in the spool, not yet in the archive",
             self.spool_pending_results),
            ("iepm_spool_pending_cycles", "Cycle records in the spool, not yet in the archive",
             self.spool_pending_cycles),
            ("iepm_held_results", "Results held in memory (spool and archive unwritable)",
             self.held_results),
            ("iepm_raw_log_held_records", "Raw-log records held in memory (disk full)",
             self.raw_log_held),
        ]  # fmt: skip

    def degraded(self) -> str | None:
        """One line on what is not in the archive yet, or None when nothing is waiting."""
        waiting = []
        if self.spool_pending_results or self.spool_pending_cycles:
            waiting.append(
                f"{self.spool_pending_results} results, {self.spool_pending_cycles} cycles spooled"
            )
        if self.held_results or self.held_cycles:
            waiting.append(f"{self.held_results} results, {self.held_cycles} cycles in memory")
        if self.raw_log_held:
            waiting.append(f"{self.raw_log_held} raw-log records in memory")
        if not waiting and self.archive_state != "down":
            return None
        errors = [e for e in (self.archive_last_error, self.raw_log_last_error) if e]
        return (
            f"archive {self.archive_state}; "
            + ("; ".join(waiting) or "nothing waiting")
            + (f"; last error: {errors[0]}" if errors else "")
        )


ResultCallback = Callable[[Result], None]
# (target, probe, seconds to hold) → a context that holds the hosts and yields a diags line;
# raises an IepmError when the hosts cannot be had.
HostLease = Callable[[TargetConfig, str, float], AbstractAsyncContextManager[str]]


class Execute(Protocol):
    """Runs one probe somewhere else than here (a mesh's control host: on the source's agent);
    ``overhead_s``: the time that takes besides the probe's own deadline (starting it there,
    the answer), added to the probe's deadline and to its host lease."""

    overhead_s: float

    def __call__(
        self, module: ModuleType, spec: ProbeSpec, ctx: ProbeContext, target: TargetConfig
    ) -> Awaitable[Result]: ...


# Deadline of one archive call (a result, a cycle record, a watcher's look at the history).
ARCHIVE_CALL_S = 10.0
# After a call outlived its deadline (a hung database), results go straight to the spool for this
# long before the archive is tried again (a quick refusal is retried with the next result).
ARCHIVE_RETRY_S = 30.0
# Extra deadline per record written back from the spool.
CATCH_UP_PER_RECORD_S = 0.05
# Results and cycle records held in memory when the spool's disk is full as well.
MAX_HELD = 100_000
# Live samples are written in one transaction this often; at most this many wait (oldest go).
LIVE_FLUSH_S = 1.0
MAX_LIVE_WAITING = 20_000
# Live writes queued on the archive's thread at once; more are dropped (a slow archive must not
# build a queue in front of the results).
MAX_LIVE_CALLS = 4
# The monitor's interface rates are published this often.
INTERFACE_EVERY_S = 2.0
# Schedule mode: a light probe's first run is spread over this much (or its interval, if less).
START_SPREAD_S = 10.0
# A gating result (ping) younger than this decides the sanity rule; older, the gate runs again.
GATE_FRESH_S = 120.0
# How long stopping waits for the probe tasks of a schedule-mode run.
STOP_WAIT_S = 30.0
# How long close() lets the watchers finish pending work (webhook deliveries run in a thread of
# their own; after this they are stopped and the alerts stay recorded as undelivered).
WATCHER_CLOSE_S = 10.0


class ResultWatcher(Protocol):
    """Sees every stored result (e.g. the alert watcher). May also define ``cycle_started()``
    and ``close(timeout_s)``."""

    def observe(self, result: Result) -> object: ...


def _setup_budget_s(target: TargetConfig) -> float:
    # Agent and SSH targets spend time obtaining a server before the tool's own deadline starts.
    remote = target.remote()
    return remote.setup_budget_s() if remote is not None else 0.0


class _Count:
    """An integer changed from the loop and from the archive's worker thread."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class Scheduler:
    def __init__(
        self,
        config: Config,
        archive: Archive,
        *,
        on_result: ResultCallback | None = None,
        rng: random.Random | None = None,
        watchers: Sequence[ResultWatcher] | None = None,
        configure: Callable[[int], Config] | None = None,
        host_lease: HostLease | None = None,
        execute: Execute | None = None,
    ) -> None:
        """``watchers``: None for those the config asks for (``[monitor] alerts``/``adaptive``),
        or an explicit list (``[]`` for none). ``configure``: the config for cycle N, asked
        before each cycle (a mesh file re-read); the monitor's archive, log_dir and watchers
        stay those of ``config``. ``host_lease``: held around each exclusive probe (a mesh's
        archive leases); one it cannot give is a skipped result with its reason. ``execute``:
        runs each probe instead of running it here (a mesh's control host: through the source
        host's agent)."""
        self.config = config
        self.execute = execute
        self.configure = configure
        self.host_lease = host_lease
        self.archive = archive
        self.raw_log = RawLog(config.monitor.log_dir)
        self.spool_path = Path(config.monitor.log_dir) / "spool.jsonl"
        self.spool = Spool(self.spool_path)
        self.guard = Guard()
        self._stuck = _Count()
        self._blocked_until = 0.0
        self._held_results: list[Result] = []
        self._held_cycles: list[Cycle] = []
        self.on_result = on_result
        self.rng = rng or random.Random()
        self.exclusive = asyncio.Lock()
        self.health = SchedulerHealth()
        try:  # a spool left by an earlier run (e.g. restarted during an outage) shows at once
            self.health.spool_pending_results, self.health.spool_pending_cycles = self.spool.count()
        except OSError as exc:
            log.error("cannot read the spool %s: %s", self.spool.path, exc)
        self.cycle_number = 0
        self.alert_watcher: AlertWatcher | None
        if watchers is None:
            self.alert_watcher = watcher_for(config, archive)
            self.watchers: list[ResultWatcher] = [self.alert_watcher] if self.alert_watcher else []
        else:
            self.watchers = list(watchers)
            self.alert_watcher = next(
                (w for w in self.watchers if isinstance(w, AlertWatcher)), None
            )
        self.cadence = cadence_for(config, self.alert_watcher)
        self._deferred: list[tuple[str, str, str]] = []
        self.live = config.monitor.live
        self._live_waiting: list[LiveSample] = []
        self._live_calls = _Count()
        self._period: CycleReport | None = None  # schedule mode: the period being counted
        self._gates: dict[str, tuple[float, Result]] = {}  # target → (monotonic, gate result)
        self._light: asyncio.Semaphore | None = None
        self._light_running = 0
        self._stopping: asyncio.Event | None = None
        self._report: CycleReport | None = None  # the cycle (or period) running now

    # -- storing -------------------------------------------------------------------------------

    def _archive_usable(self) -> bool:
        """Whether to try the archive now: not while a call that outlived its deadline is still
        stuck in it, nor for a while after one did (every try would cost a full deadline)."""
        return self._stuck.value == 0 and time.monotonic() >= self._blocked_until

    async def _archive_call(self, deadline_s: float, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` on the archive's worker thread within ``deadline_s``; marks the
        archive up or down. Raises StoreError or ArchiveDeadline."""
        future = self.guard.submit(self._prepared, fn, *args)
        try:
            value = await asyncio.wait_for(asyncio.wrap_future(future), deadline_s)
        except TimeoutError:
            if not future.cancel():  # running: stuck in the database until it answers
                self._stuck.add(1)
                future.add_done_callback(lambda _done: self._stuck.add(-1))
            self._archive_down(f"no answer within {deadline_s:g} s (hung?)", hung=True)
            raise ArchiveDeadline(f"archive call took longer than {deadline_s:g} s") from None
        except StoreError as exc:
            self._archive_down(str(exc), hung=False)
            raise
        self.health.archive_state = "up"
        self.health.archive_last_ok_at = utcnow()
        return value

    def _prepared(self, fn: Callable[..., T], *args: object) -> T:
        prepare = getattr(self.archive, "prepare", None)
        if prepare is not None:
            prepare()  # the schema check of an archive opened while it was unreachable
        return fn(*args)

    def _archive_down(self, error: str, *, hung: bool) -> None:
        if self.health.archive_state != "down":
            log.error("archive %s unavailable, spooling: %s", self.archive.url, error)
        self.health.archive_state = "down"
        self.health.archive_last_error = error
        if hung:
            self._blocked_until = time.monotonic() + ARCHIVE_RETRY_S

    async def _store(self, result: Result) -> None:
        self.health.runs_by_outcome[result.outcome.value] += 1
        if self._period is not None:
            self._period.counted[result.outcome.value] += 1
            self._period.probe_time_s += result.duration_s
        if result.probe in gating_probes():
            self._gates[result.target] = (time.monotonic(), result)
        where = await self._persist(result)
        self.health.stored_in[where] += 1
        self._sync_raw_log_health()
        if self.on_result is not None:
            self.on_result(result)
        if where != "archive":
            self.health.watcher_skipped += bool(self.watchers)
        else:
            for watcher in self.watchers:
                try:
                    await self._archive_call(ARCHIVE_CALL_S, watcher.observe, result)
                except (StoreError, ArchiveDeadline) as exc:
                    self.health.watcher_errors += 1
                    log.error("watcher %s: %s", type(watcher).__name__, exc)
                except Exception:  # a watcher's bug must never stop measurements
                    self.health.watcher_errors += 1
                    log.exception(
                        "watcher %s failed on result %s", type(watcher).__name__, result.id
                    )
            if self._waiting():
                await self.catch_up()  # the archive is back: write back what waited

    async def _persist(self, result: Result) -> str:
        """Write ``result`` to the archive, else the spool, else memory; says which."""
        if self._archive_usable():
            try:
                await self._archive_call(ARCHIVE_CALL_S, self.archive.add, result)
                return "archive"
            except (StoreError, ArchiveDeadline):
                pass
            except Exception:  # a bug in writing must not cost the result: it is spooled
                log.exception("archive write of result %s failed", result.id)
        self.health.archive_write_failures += 1
        return self._spool_result(result)

    def _spool_result(self, result: Result) -> str:
        try:
            self.spool.append_result(result)
        except OSError as exc:
            self._spool_failed(exc)
            self._held_results.append(result)
            self._bound_held()
            self.health.held_results = len(self._held_results)
            log.error("result %s held in memory (spool and archive unwritable)", result.id)
            return "memory"
        self.health.spooled_results += 1
        self.health.spool_pending_results += 1
        log.warning("result %s spooled to %s", result.id, self.spool.path)
        return "spool"

    async def _persist_cycle(self, cycle: Cycle) -> str:
        if self._archive_usable():
            try:
                await self._archive_call(ARCHIVE_CALL_S, self.archive.add_cycle, cycle)
                return "archive"
            except (StoreError, ArchiveDeadline):
                pass
            except Exception:
                log.exception("archive write of cycle %s failed", cycle.id)
        self.health.archive_write_failures += 1
        try:
            self.spool.append_cycle(cycle)
        except OSError as exc:
            self._spool_failed(exc)
            self._held_cycles.append(cycle)
            self.health.held_cycles = len(self._held_cycles)
            return "memory"
        self.health.spooled_cycles += 1
        self.health.spool_pending_cycles += 1
        return "spool"

    def _spool_failed(self, exc: OSError) -> None:
        self.health.spool_write_failures += 1
        self.health.archive_last_error = (
            f"{self.health.archive_last_error}; spool {self.spool.path}: {exc.strerror or exc}"
        )

    def _bound_held(self) -> None:
        excess = len(self._held_results) - MAX_HELD
        if excess > 0:
            del self._held_results[:excess]
            self.health.dropped_results += excess
            log.error("%d results held in memory given up (bound %d)", excess, MAX_HELD)

    def _waiting(self) -> bool:
        return bool(self._held_results or self._held_cycles or self.spool.pending())

    def _sync_raw_log_health(self) -> None:
        raw = self.raw_log
        self.health.raw_log_write_failures = raw.write_failures
        self.health.raw_log_held = raw.held
        self.health.raw_log_last_error = raw.last_error

    async def catch_up(self) -> int:
        """Write back everything waiting (memory, then the spool), within deadlines; returns
        how many results reached the archive. Whatever cannot be written stays where it is."""
        if self.raw_log.held:
            self.raw_log.catch_up()
            self._sync_raw_log_health()
        # Memory first to the spool (its disk may have space again): one place to write back.
        moved = 0
        for result in self._held_results:
            try:
                self.spool.append_result(result)
            except OSError:
                break
            moved += 1
        del self._held_results[:moved]
        self.health.spool_pending_results += moved
        moved = 0
        for cycle in self._held_cycles:
            try:
                self.spool.append_cycle(cycle)
            except OSError:
                break
            moved += 1
        del self._held_cycles[:moved]
        self.health.spool_pending_cycles += moved
        written = 0
        if not self._archive_usable():
            self._update_held_health()
            return 0
        try:
            if self._held_results or self._held_cycles:  # the spool's disk is still full
                results, cycles = list(self._held_results), list(self._held_cycles)
                deadline = ARCHIVE_CALL_S + CATCH_UP_PER_RECORD_S * (len(results) + len(cycles))
                await self._archive_call(deadline, self._write_back, results, cycles)
                del self._held_results[: len(results)]
                del self._held_cycles[: len(cycles)]
                written += len(results)
            if self.spool.pending():
                pending = self.health.spool_pending_results + self.health.spool_pending_cycles
                deadline = ARCHIVE_CALL_S + CATCH_UP_PER_RECORD_S * max(pending, 1000)
                n_results, n_cycles, rejected = await self._archive_call(
                    deadline, self.spool.flush, self.archive.add_new, self.archive.add_cycles_new
                )
                written += n_results
                self.health.spool_rejected_lines += len(rejected)
                self.health.spool_pending_results = 0
                self.health.spool_pending_cycles = 0
                log.info(
                    "archive caught up: %d results and %d cycles written back from %s",
                    n_results,
                    n_cycles,
                    self.spool.path,
                )
        except (StoreError, ArchiveDeadline) as exc:
            log.error("archive not writable yet, records stay spooled: %s", exc)
        except OSError as exc:
            log.error("cannot read the spool %s: %s", self.spool.path, exc)
        except Exception:  # a bug must not stop measuring; the records stay where they are
            log.exception("writing back %s failed", self.spool.path)
        self.health.caught_up_results += written
        self._update_held_health()
        return written

    def _write_back(self, results: list[Result], cycles: list[Cycle]) -> int:
        count = self.archive.add_new(results)
        self.archive.add_cycles_new(cycles)
        return count

    def _update_held_health(self) -> None:
        self.health.held_results = len(self._held_results)
        self.health.held_cycles = len(self._held_cycles)

    def flush_spool(self) -> int:
        """Write everything waiting back into the archive now (blocking, for tools and tests
        outside a running loop); returns how many results reached the archive."""
        return asyncio.run(self.catch_up())

    async def _notify_watchers(self, hook: str, *args: object) -> None:
        if not self._archive_usable():
            return
        for watcher in self.watchers:
            method = getattr(watcher, hook, None)
            if method is None:
                continue
            try:
                await self._archive_call(ARCHIVE_CALL_S, method, *args)
            except (StoreError, ArchiveDeadline) as exc:
                self.health.watcher_errors += 1
                log.error("watcher %s in %s: %s", type(watcher).__name__, hook, exc)
            except Exception:
                self.health.watcher_errors += 1
                log.exception("watcher %s failed in %s", type(watcher).__name__, hook)

    def close(self) -> None:
        """Let the watchers finish (e.g. webhook deliveries in flight), for a bounded time."""
        for watcher in self.watchers:
            method = getattr(watcher, "close", None)
            if method is None:
                continue
            try:
                method(WATCHER_CLOSE_S)
            except Exception:
                self.health.watcher_errors += 1
                log.exception("watcher %s failed in close", type(watcher).__name__)

    # -- live ----------------------------------------------------------------------------------

    def _live_call(self, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
        """Queue a live write on the archive's thread without waiting for it: a view of now is
        dropped (counted) rather than delay a probe, or queue up while the archive is slow."""
        if not self.live:
            return
        if not self._archive_usable() or self._live_calls.value >= MAX_LIVE_CALLS:
            self.health.live_dropped += 1
            return
        self._live_calls.add(1)

        def call() -> None:
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # a view of now: never retried, never fatal
                self.health.live_dropped += 1
                log.debug("live write %s failed: %s", getattr(fn, "__name__", fn), exc)
            finally:
                self._live_calls.add(-1)

        try:
            self.guard.submit(call)
        except RuntimeError:  # the guard is closed (shutting down)
            self._live_calls.add(-1)
            self.health.live_dropped += 1

    def add_live(self, samples: Sequence[LiveSample]) -> None:
        """Queue samples for the next live flush (the oldest go past MAX_LIVE_WAITING)."""
        if not self.live:
            return
        self._live_waiting.extend(samples)
        excess = len(self._live_waiting) - MAX_LIVE_WAITING
        if excess > 0:
            del self._live_waiting[:excess]
            self.health.live_dropped += excess

    def _flush_live(self) -> None:
        if self._live_waiting:
            batch, self._live_waiting = self._live_waiting, []
            self._live_call(live.publish, self.archive, self.config.monitor.name, batch)

    async def _live_loop(self) -> None:
        """Flush live samples every LIVE_FLUSH_S and publish the interface rates every
        INTERFACE_EVERY_S, until cancelled."""
        netns = self.config.monitor.netns
        before: dict[str, tuple[int, int]] | None = None
        t_before = 0.0
        next_rates = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= next_rates:
                next_rates = now + INTERFACE_EVERY_S
                try:
                    counters = await ifrates.read_counters(netns)
                except IepmError as exc:
                    log.warning("interface rates: %s", exc)
                    counters = None
                t_now, wall_s = time.monotonic(), time.time()
                if counters is not None and before is not None:
                    rates = ifrates.rates_mbps(before, counters, t_now - t_before)
                    self.add_live(
                        [LiveSample(name, "interface", metric, wall_s, round(value, 6))
                         for name, pair in sorted(rates.items())
                         for metric, value in zip(("rx_mbps", "tx_mbps"), pair, strict=True)]
                    )  # fmt: skip
                if counters is not None:
                    before, t_before = counters, t_now
            self._flush_live()
            await asyncio.sleep(min(LIVE_FLUSH_S, max(0.0, next_rates - time.monotonic())))

    # -- schedule mode: each probe at its own interval ------------------------------------------

    def stop(self) -> None:
        """End a schedule-mode run at once (its period is reported, streams store their open
        window); a cycle-mode run ends after its current cycle as before."""
        if self._stopping is not None:
            self._stopping.set()

    async def _wait_stop(self, delay_s: float) -> bool:
        """Sleep ``delay_s`` unless stopped first; True when stopped."""
        assert self._stopping is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(0.0, delay_s))
        return self._stopping.is_set()

    async def _light_run(self, module: ModuleType, target: TargetConfig) -> Result:
        assert self._light is not None
        async with self._light:
            self._light_running += 1
            self.health.light_running_max = max(self.health.light_running_max, self._light_running)
            try:
                return await self._run_probe(module, target)
            finally:
                self._light_running -= 1

    def _next_due(self, due_s: float, every_s: float, what: str) -> float:
        """The next start after one due at ``due_s``: an interval later, or now (late, never
        queued up) when that has passed already — an overrun, recorded."""
        due_s += every_s
        now = time.monotonic()
        if due_s < now:
            self.health.schedule_overruns += 1
            if self._period is not None:
                self._period.overran = True
            log.warning("%s ran %.1f s past its %g s interval; next run now", what,
                        now - due_s, every_s)  # fmt: skip
            due_s = now
        return due_s

    async def _light_loop(self, module: ModuleType, target: TargetConfig, every_s: float) -> None:
        due_s = time.monotonic() + self.rng.uniform(0.0, min(every_s, START_SPREAD_S))
        while not await self._wait_stop(due_s - time.monotonic()):
            await self._light_run(module, target)
            due_s = self._next_due(due_s, every_s, f"{module.NAME} to {target.name}")

    async def _stream_loop(self, module: ModuleType, target: TargetConfig) -> None:
        assert self.config.schedule is not None and self._stopping is not None
        spec = await self._spec(target, module.NAME)
        monitor, probe = self.config.monitor.name, module.NAME

        def on_sample(t_s: float, rtt_ms: float | None) -> None:
            self.add_live([LiveSample(target.name, probe, "rtt_ms", t_s, rtt_ms)])

        stream = module.Stream(
            spec, self._context(target), window_s=self.config.schedule.window_s,
            on_sample=on_sample, on_result=self._store,
        )  # fmt: skip
        task = asyncio.create_task(stream.run())
        await self._stopping.wait()
        stream.stop()
        try:
            await asyncio.wait_for(task, STOP_WAIT_S)
        except TimeoutError:
            log.error("continuous %s to %s (%s) did not stop in time", probe, target.name, monitor)

    async def _gate_failure(self, target: TargetConfig) -> str | None:
        """The sanity rule in schedule mode: why the target's heavy probes are skipped now
        (its latest gating result, run afresh when older than GATE_FRESH_S), or None."""
        gates = [name for name in gating_probes() if name in target.probes]
        if not target.ping_expected or not gates:
            return None
        seen = self._gates.get(target.name)
        if seen is None or time.monotonic() - seen[0] > GATE_FRESH_S:
            for name in gates:
                await self._light_run(PROBES[name], target)
            seen = self._gates.get(target.name)
        if seen is None or seen[1].succeeded:
            return None
        gate = seen[1]
        return (
            f"skipped because {gate.probe} to {target.name} ({target.address}) failed and "
            f"ping_expected=true: {gate.error}"
        )

    async def _heavy_loop(self, jobs: list[tuple[ModuleType, TargetConfig, float]]) -> None:
        """The exclusive probes, one at a time on this monitor, each at its own interval (the
        earliest due first), with the sanity rule, the adaptive cadence and host leases."""
        if not jobs:
            return
        start = time.monotonic()
        due = [start + self.rng.uniform(0.0, min(every, START_SPREAD_S)) for _, _, every in jobs]
        while True:
            i = min(range(len(jobs)), key=due.__getitem__)
            if await self._wait_stop(due[i] - time.monotonic()):
                return
            module, target, every_s = jobs[i]
            reason = await self._gate_failure(target)
            if reason is not None:
                spec = await self._spec(target, module.NAME)
                await self._store(skipped_result(module, spec, self._context(target), reason))
            elif not self._deferred_by_cadence(target, module.NAME):
                async with self.exclusive:
                    await self._retune(module, target)
                    await self._run_exclusive(module, target)
            due[i] = self._next_due(due[i], every_s, f"{module.NAME} to {target.name}")

    async def _run_schedule(
        self, periods: int | None, on_cycle: Callable[[CycleReport], object] | None
    ) -> CycleReport | None:
        """Schedule mode: every (target, probe) at its own interval until ``periods`` periods
        of ``cycle_interval_s`` have passed (or stop()); each period is reported as a cycle."""
        schedule = self.config.schedule
        assert schedule is not None
        self._light = asyncio.Semaphore(schedule.light_limit)
        tasks: list[asyncio.Task[None]] = []
        heavy: list[tuple[ModuleType, TargetConfig, float]] = []
        targets = list(self.config.targets)
        self.rng.shuffle(targets)
        for target in targets:
            for name in target.probes:
                module = PROBES[name]
                every = self.config.every(target, name)
                if every == "continuous":
                    tasks.append(asyncio.create_task(self._stream_loop(module, target)))
                elif module.META.scheduling == "exclusive":
                    heavy.append((module, target, float(every)))
                else:
                    tasks.append(
                        asyncio.create_task(self._light_loop(module, target, float(every)))
                    )
        tasks.append(asyncio.create_task(self._heavy_loop(heavy)))
        done = 0
        report: CycleReport | None = None
        try:
            while periods is None or done < periods:
                report = await self._schedule_period()
                done += 1
                if on_cycle is not None:
                    on_cycle(report)
                if self._stopping is not None and self._stopping.is_set():
                    break
        finally:
            assert self._stopping is not None
            self._stopping.set()  # loops end at their next wait; streams store their window
            finished, running = await asyncio.wait(tasks, timeout=STOP_WAIT_S)
            for task in running:
                task.cancel()  # a probe still running is killed by the runner
            if running:
                await asyncio.wait(running, timeout=STOP_WAIT_S)
            for task in finished:
                if not task.cancelled() and task.exception() is not None:
                    exc = task.exception()
                    log.error("a schedule task failed: %s", exc, exc_info=exc)
            self._period = None
        return report

    async def _schedule_period(self) -> CycleReport:
        self.cycle_number += 1
        report = CycleReport(
            number=self.cycle_number, started_at=utcnow(),
            interval_s=self.config.monitor.cycle_interval_s,
        )  # fmt: skip
        self._period = self._report = report
        await self.catch_up()
        await self._notify_watchers("cycle_started")
        self._deferred = report.deferred
        t0 = time.monotonic()
        await self._wait_stop(report.interval_s)
        report.duration_s = time.monotonic() - t0
        report.finished_at = utcnow()
        self.health.cycles += 1
        if report.overran:
            self.health.cycle_overruns += 1
        await self._record_cycle(report, report.n_results, report.counted["ok"])
        return report

    # -- running -------------------------------------------------------------------------------

    def _context(self, target: TargetConfig) -> ProbeContext:
        return ProbeContext(
            target=target.name,
            address=target.address,
            monitor=self.config.monitor.name,
            raw_log=self.raw_log,
            netns=self.config.monitor.netns,
            servers=server_source(target.remote()),
        )

    async def _spec(self, target: TargetConfig, probe: str) -> ProbeSpec:
        tuned: dict[str, object] = {}
        if target.use_tuned and self._archive_usable():
            try:
                tuned = await self._archive_call(ARCHIVE_CALL_S, self._tuned, target.name, probe)
            except (StoreError, ArchiveDeadline) as exc:
                log.warning("using untuned %s parameters for %s: %s", probe, target.name, exc)
        elif target.use_tuned:
            log.info("using untuned %s parameters for %s: archive down", probe, target.name)
        try:
            return self.config.spec_for(target, probe, tuned)
        except ValidationError as exc:
            # A stored choice that no longer validates (e.g. after an upgrade) must not stop
            # the path being measured.
            log.warning("ignoring tuned %s parameters for %s: %s", probe, target.name, exc)
            return self.config.spec_for(target, probe)

    def _tuned(self, target: str, probe: str) -> dict[str, object]:
        return load_tuned(
            self.archive, monitor=self.config.monitor.name, target=target, probe=probe
        )

    async def _run_probe(
        self,
        module: ModuleType,
        target: TargetConfig,
        spec: ProbeSpec | None = None,
        note: str | None = None,
    ) -> Result:
        spec = spec or await self._spec(target, module.NAME)
        ctx = self._context(target)
        started_at, t0 = utcnow(), time.monotonic()
        deadline_s = spec.deadline_s() + _setup_budget_s(target) + PROBE_GUARD_S
        deadline_s += self.execute.overhead_s if self.execute is not None else 0.0
        key = (self.config.monitor.name, module.NAME, target.name)
        self._live_call(
            live.set_running, self.archive, *key, spec.model_dump(mode="json"),
            deadline_s=deadline_s,
        )  # fmt: skip
        try:
            running = (
                module.run(spec, ctx)
                if self.execute is None
                else self.execute(module, spec, ctx, target)
            )
            result: Result = await asyncio.wait_for(running, deadline_s)
        except TimeoutError:
            result = failed_result(
                module,
                spec,
                ctx,
                f"{module.NAME} to {target.name} overran its deadline and was abandoned",
                outcome=Outcome.TIMEOUT,
            ).model_copy(
                # The time it really took, from when it really started.
                update={"started_at": started_at, "duration_s": time.monotonic() - t0}
            )
        finally:
            self._live_call(live.clear_running, self.archive, *key)
        if note:
            result.diags = f"{result.diags or ''}\n{note}".lstrip("\n")
        await self._store(result)
        return result

    async def _run_exclusive(self, module: ModuleType, target: TargetConfig) -> Result:
        if self.host_lease is None:
            return await self._run_probe(module, target)
        spec = await self._spec(target, module.NAME)
        hold_s = spec.deadline_s() + _setup_budget_s(target) + PROBE_GUARD_S
        hold_s += self.execute.overhead_s if self.execute is not None else 0.0
        t0 = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            try:
                note = await stack.enter_async_context(self.host_lease(target, module.NAME, hold_s))
            except IepmError as exc:
                self.health.lease_refusals += 1
                result = skipped_result(module, spec, self._context(target), f"skipped: {exc}")
                await self._store(result)
                return result
            self.health.lease_wait_s += time.monotonic() - t0
            return await self._run_probe(module, target, spec, note)
        raise AssertionError("unreachable")  # the stack never swallows an exception

    async def _retune(self, module: ModuleType, target: TargetConfig) -> None:
        """Re-tuning as a routine mode (:mod:`iepm.tuning.routine`): before the tuned probe's
        run, in its exclusive slot and under its host lease, sweep the path when it needs it
        and the budget allows; the run that follows uses what the sweep chose. A failed sweep
        is stored with its reason (back-off); nothing here stops the monitor."""
        monitor = self.config.monitor
        if not (monitor.retune and module.NAME == routine.PROBE and target.use_tuned):
            return
        if self.execute is not None:  # a sweep would run here, not from the source host
            return
        if not self._archive_usable():
            return
        report = self._report
        done = len(report.retuned) if report is not None else 0
        policy = routine.Policy.of(monitor)
        try:
            decision = await self._archive_call(
                ARCHIVE_CALL_S, lambda: routine.decide(
                    self.archive, policy, monitor=monitor.name, target=target.name,
                    swept_this_cycle=done,
                ),
            )  # fmt: skip
        except (StoreError, ArchiveDeadline) as exc:
            log.warning("re-tuning %s not decided: %s", target.name, exc)
            return
        if decision.reasons and decision.wait:
            self.health.retune_put_off += 1
            log.info("re-tuning %s put off (%s): %s", target.name, "; ".join(decision.reasons),
                     decision.wait)  # fmt: skip
        if not decision.run:
            return
        base = self.config.spec_for(target, module.NAME)  # untuned: the sweep sets both
        hold_s = policy.deadline_s() + _setup_budget_s(target) + PROBE_GUARD_S
        log.info("re-tuning %s: %s", target.name, "; ".join(decision.reasons))
        async with contextlib.AsyncExitStack() as stack:
            if self.host_lease is not None:
                try:
                    await stack.enter_async_context(self.host_lease(target, module.NAME, hold_s))
                except IepmError as exc:
                    self.health.lease_refusals += 1
                    log.warning("re-tuning %s put off: %s", target.name, exc)
                    return
            try:
                ctx, reasons = self._context(target), decision.reasons
                study = await routine.off_loop(
                    lambda: routine.run(self.archive, ctx, policy, reasons, base=base)
                )
            except IepmError as exc:  # the archive failed even to record the failure
                self.health.retune_failures += 1
                log.error("re-tuning %s failed and was not recorded: %s", target.name, exc)
                if report is not None:  # it spent the cycle's budget all the same
                    report.retuned.append((target.name, "", decision.reasons))
                return
        self.health.retune_sweeps += 1
        if report is not None:
            report.retuned.append((target.name, study.id, decision.reasons))
        failure = routine.failure_reason(study)
        if failure is not None:
            self.health.retune_failures += 1
            log.warning("re-tuning %s failed (study %s): %s", target.name, study.id, failure)
        else:
            log.info("re-tuned %s (study %s): %s", target.name, study.id, study.summary["tuned"])

    async def run_target(self, target: TargetConfig) -> list[Result]:
        modules = [PROBES[name] for name in target.probes]
        background = [m for m in modules if m.META.scheduling == "background"]
        exclusive = [m for m in modules if m.META.scheduling == "exclusive"]
        results = list(await asyncio.gather(*(self._run_probe(m, target) for m in background)))
        skip_reason = None
        gates = gating_probes()
        gate = next((r for r in results if r.probe in gates and not r.succeeded), None)
        if target.ping_expected and gate is not None:
            skip_reason = (
                f"skipped because {gate.probe} to {target.name} ({target.address}) failed and "
                f"ping_expected=true: {gate.error}"
            )
        for module in exclusive:
            if skip_reason:
                spec = await self._spec(target, module.NAME)
                result = skipped_result(module, spec, self._context(target), skip_reason)
                await self._store(result)
                results.append(result)
                continue
            if self._deferred_by_cadence(target, module.NAME):
                continue
            async with self.exclusive:
                await self._retune(module, target)
                results.append(await self._run_exclusive(module, target))
        return results

    def _deferred_by_cadence(self, target: TargetConfig, probe: str) -> bool:
        if self.cadence is None:
            return False
        try:
            reason = self.cadence.decide(target.name, probe)
            if reason is None:
                self.cadence.ran(target.name, probe)
                return False
        except Exception:  # adaptive scheduling is an optimisation: on a bug, just measure
            self.health.watcher_errors += 1
            log.exception("adaptive cadence failed for %s %s", target.name, probe)
            return False
        self.health.deferred_runs += 1
        self._deferred.append((target.name, probe, reason))
        log.debug("%s", reason)
        return True

    def _reconfigure(self) -> None:
        if self.configure is None:
            return
        try:
            config = self.configure(self.cycle_number)
        except Exception:  # a bad reload must not stop measuring: keep the last config
            log.exception(
                "reconfiguring for cycle %d failed; keeping the config", self.cycle_number
            )
            return
        fixed = ("name", "archive", "log_dir")
        changed = [
            k for k in fixed if getattr(config.monitor, k) != getattr(self.config.monitor, k)
        ]
        if changed:
            log.warning("monitor %s changed: takes effect at restart", ", ".join(changed))
        self.config = config

    async def run_cycle(self) -> CycleReport:
        self.cycle_number += 1
        self._reconfigure()
        report = CycleReport(
            number=self.cycle_number,
            started_at=utcnow(),
            interval_s=self.config.monitor.cycle_interval_s,
        )
        self._report = report
        await self.catch_up()
        await self._notify_watchers("cycle_started")
        self._deferred = report.deferred
        t0 = time.monotonic()
        order = list(self.config.targets)
        self.rng.shuffle(order)
        for target in order:
            report.results.extend(await self.run_target(target))
        report.duration_s = time.monotonic() - t0
        report.finished_at = utcnow()
        report.overran = report.duration_s > report.interval_s
        report.probe_time_s = sum(r.duration_s for r in report.results)
        self.health.cycles += 1
        if report.overran:
            self.health.cycle_overruns += 1
            log.warning(
                "cycle %d took %.1f s, longer than its %.1f s interval; the next starts late",
                report.number,
                report.duration_s,
                report.interval_s,
            )
        n_ok = sum(1 for r in report.results if r.succeeded)
        await self._record_cycle(report, len(report.results), n_ok)
        return report

    async def _record_cycle(self, report: CycleReport, n_results: int, n_ok: int) -> None:
        assert report.finished_at is not None
        cycle = Cycle(
            monitor=self.config.monitor.name,
            started_at=report.started_at,
            finished_at=report.finished_at,
            interval_s=report.interval_s,
            overran=report.overran,
            n_results=n_results,
            n_failed=n_results - n_ok,
        )
        where = await self._persist_cycle(cycle)
        if where != "archive":
            log.warning(
                "cycle %d record kept in the %s until the archive is back", report.number, where
            )
        state = self.health.degraded()
        if state is not None:
            log.warning("cycle %d: %s", report.number, state)

    async def run(
        self,
        *,
        cycles: int | None = None,
        on_cycle: Callable[[CycleReport], object] | None = None,
    ) -> CycleReport | None:
        """Run cycles back to back at the configured interval (forever when ``cycles`` is None).
        Each finished cycle's report goes to ``on_cycle``; only the last is kept (and returned),
        so memory stays flat however long the monitor runs."""
        self._stopping = asyncio.Event()
        live_task = asyncio.create_task(self._live_loop()) if self.live else None
        done = 0
        report: CycleReport | None = None
        try:
            if self.config.schedule is not None:
                return await self._run_schedule(cycles, on_cycle)
            while cycles is None or done < cycles:
                jitter = self.config.monitor.start_jitter_s
                if jitter:
                    await asyncio.sleep(self.rng.uniform(0, jitter))
                t0 = time.monotonic()
                report = None  # the previous cycle's results are not kept through this one
                report = await self.run_cycle()
                done += 1
                if on_cycle is not None:
                    on_cycle(report)
                if cycles is not None and done >= cycles:
                    break
                # Overran: start the next cycle now (late) rather than overlapping.
                interval = self.config.monitor.cycle_interval_s  # may change with the config
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - t0)))
        finally:
            if live_task is not None:
                live_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await live_task
                self._flush_live()  # the last replies, queued behind the last results
            await asyncio.to_thread(self.close)
        return report
