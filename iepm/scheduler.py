"""Measurement cycles that never hang and never lose a finished result.

A cycle visits every target once, in a new random order each cycle (so that no target always
meets the same time of day or the same neighbour). For each target the background probes
(ping, traceroute, load) run side by side, then the exclusive probes (bandwidth tests) run one
at a time — never two bandwidth tests from this monitor at once. If ping is expected to work and
fails, the heavy probes are skipped and recorded as skipped, with the reason (the seeds' sanity
rule: a dead path would otherwise cost a full iperf3 timeout per probe).

Each result is written to the archive in its own transaction as soon as its probe finishes.
If the archive cannot be written, the result is appended to a spool file beside the raw logs and
written back at the start of the next cycle. A cycle that overruns its interval is recorded and
the next one starts late rather than overlapping.

After each result is stored it goes to the *watchers* (by default the alert watcher of
:mod:`iepm.analysis.watch`, as ``[monitor] alerts`` asks): a watcher that fails is logged and
counted, never allowed to stop the cycle. With ``[monitor] adaptive`` the exclusive probes of a
predictable path are not scheduled in every cycle (:mod:`iepm.analysis.adaptive`); each such
deferral is counted and listed in the cycle's report, and no result is stored for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Protocol

from pydantic import ValidationError

from iepm.analysis.adaptive import cadence_for
from iepm.analysis.watch import AlertWatcher, watcher_for
from iepm.config import Config, TargetConfig
from iepm.errors import StoreError
from iepm.probes import PROBES, gating_probes
from iepm.probes.base import ProbeContext, ProbeSpec, failed_result, skipped_result
from iepm.rawlog import RawLog
from iepm.results import Outcome, Result, utcnow
from iepm.store import Archive, Cycle
from iepm.tuned import load_tuned

log = logging.getLogger(__name__)

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

    @property
    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome.value for r in self.results)


@dataclass
class SchedulerHealth:
    """Counters that /metrics and the CLI expose: failures must be visible."""

    runs_by_outcome: Counter[str] = field(default_factory=Counter)
    cycles: int = 0
    cycle_overruns: int = 0
    archive_write_failures: int = 0
    spooled_results: int = 0
    watcher_errors: int = 0
    deferred_runs: int = 0


ResultCallback = Callable[[Result], None]
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


class Scheduler:
    def __init__(
        self,
        config: Config,
        archive: Archive,
        *,
        on_result: ResultCallback | None = None,
        rng: random.Random | None = None,
        watchers: Sequence[ResultWatcher] | None = None,
    ) -> None:
        """``watchers``: None for those the config asks for (``[monitor] alerts``/``adaptive``),
        or an explicit list (``[]`` for none)."""
        self.config = config
        self.archive = archive
        self.raw_log = RawLog(config.monitor.log_dir)
        self.spool_path = Path(config.monitor.log_dir) / "spool.jsonl"
        self.on_result = on_result
        self.rng = rng or random.Random()
        self.exclusive = asyncio.Lock()
        self.health = SchedulerHealth()
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

    # -- storing -------------------------------------------------------------------------------

    def _store(self, result: Result) -> None:
        self.health.runs_by_outcome[result.outcome.value] += 1
        try:
            self.archive.add(result)
        except StoreError as exc:
            self.health.archive_write_failures += 1
            log.error("archive write failed, result spooled to %s: %s", self.spool_path, exc)
            self._spool(result)
        if self.on_result is not None:
            self.on_result(result)
        for watcher in self.watchers:
            try:
                watcher.observe(result)
            except Exception:  # a watcher's bug must never stop measurements
                self.health.watcher_errors += 1
                log.exception("watcher %s failed on result %s", type(watcher).__name__, result.id)

    def _notify_watchers(self, hook: str, *args: object) -> None:
        for watcher in self.watchers:
            method = getattr(watcher, hook, None)
            if method is None:
                continue
            try:
                method(*args)
            except Exception:
                self.health.watcher_errors += 1
                log.exception("watcher %s failed in %s", type(watcher).__name__, hook)

    def close(self) -> None:
        """Let the watchers finish (e.g. webhook deliveries in flight), for a bounded time."""
        self._notify_watchers("close", WATCHER_CLOSE_S)

    def _spool(self, result: Result) -> None:
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        with self.spool_path.open("a", encoding="utf-8") as spool:
            spool.write(json.dumps(result.envelope()) + "\n")
            spool.flush()
        self.health.spooled_results += 1

    def flush_spool(self) -> int:
        """Write spooled results back into the archive; returns how many were written."""
        if not self.spool_path.exists():
            return 0
        pending = [
            Result.model_validate(json.loads(line))
            for line in self.spool_path.read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        try:
            self.archive.add_many(pending)
        except StoreError as exc:
            log.error("archive still not writable, %d results stay spooled: %s", len(pending), exc)
            return 0
        self.spool_path.unlink()
        return len(pending)

    # -- running -------------------------------------------------------------------------------

    def _context(self, target: TargetConfig) -> ProbeContext:
        return ProbeContext(
            target=target.name,
            address=target.address,
            monitor=self.config.monitor.name,
            raw_log=self.raw_log,
            netns=self.config.monitor.netns,
            remote=target.remote(),
        )

    def _spec(self, target: TargetConfig, probe: str) -> ProbeSpec:
        tuned: dict[str, object] = {}
        if target.use_tuned:
            try:
                tuned = load_tuned(
                    self.archive, monitor=self.config.monitor.name, target=target.name, probe=probe
                )
            except StoreError as exc:
                log.warning("using untuned %s parameters for %s: %s", probe, target.name, exc)
        try:
            return self.config.spec_for(target, probe, tuned)
        except ValidationError as exc:
            # A stored choice that no longer validates (e.g. after an upgrade) must not stop
            # the path being measured.
            log.warning("ignoring tuned %s parameters for %s: %s", probe, target.name, exc)
            return self.config.spec_for(target, probe)

    async def _run_probe(self, module: ModuleType, target: TargetConfig) -> Result:
        spec = self._spec(target, module.NAME)
        ctx = self._context(target)
        try:
            result: Result = await asyncio.wait_for(
                module.run(spec, ctx), spec.deadline_s() + _setup_budget_s(target) + PROBE_GUARD_S
            )
        except TimeoutError:
            result = failed_result(
                module,
                spec,
                ctx,
                f"{module.NAME} to {target.name} overran its deadline and was abandoned",
                outcome=Outcome.TIMEOUT,
            )
        self._store(result)
        return result

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
                spec = self._spec(target, module.NAME)
                result = skipped_result(module, spec, self._context(target), skip_reason)
                self._store(result)
                results.append(result)
                continue
            if self._deferred_by_cadence(target, module.NAME):
                continue
            async with self.exclusive:
                results.append(await self._run_probe(module, target))
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

    async def run_cycle(self) -> CycleReport:
        self.cycle_number += 1
        report = CycleReport(
            number=self.cycle_number,
            started_at=utcnow(),
            interval_s=self.config.monitor.cycle_interval_s,
        )
        self.flush_spool()
        self._notify_watchers("cycle_started")
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
        try:
            self.archive.add_cycle(
                Cycle(
                    monitor=self.config.monitor.name,
                    started_at=report.started_at,
                    finished_at=report.finished_at,
                    interval_s=report.interval_s,
                    overran=report.overran,
                    n_results=len(report.results),
                    n_failed=sum(1 for r in report.results if not r.succeeded),
                )
            )
        except StoreError as exc:
            self.health.archive_write_failures += 1
            log.error("could not record cycle %d: %s", report.number, exc)
        return report

    async def run(self, *, cycles: int | None = None) -> list[CycleReport]:
        """Run cycles back to back at the configured interval (forever when ``cycles`` is None)."""
        reports: list[CycleReport] = []
        interval = self.config.monitor.cycle_interval_s
        try:
            while cycles is None or len(reports) < cycles:
                jitter = self.config.monitor.start_jitter_s
                if jitter:
                    await asyncio.sleep(self.rng.uniform(0, jitter))
                t0 = time.monotonic()
                report = await self.run_cycle()
                reports.append(report)
                if cycles is not None and len(reports) >= cycles:
                    break
                # Overran: start the next cycle now (late) rather than overlapping.
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - t0)))
        finally:
            await asyncio.to_thread(self.close)
        return reports
