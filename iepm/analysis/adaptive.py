"""Adaptive measurement frequency for the bandwidth tests (the seeds' idea).

A bandwidth test costs the path real traffic; a ping costs nothing. So the cheap probes run every
cycle and the exclusive probes (iperf3) run every ``factor``-th cycle, where ``factor`` follows
how predictable the path is:

- ``min_factor`` (default 1: every cycle) until the path is *calm*: after each of its last
  ``calm_runs`` (3) bandwidth samples the forecast's 80% interval was narrow (relative width
  (upper − lower)/forecast at most ``[monitor] adaptive_narrow_percent``, default 20%), and none
  of them was deviant for the step detector (:mod:`iepm.analysis.watch`);
- then it doubles with each further calm sample: 2, 4, 8… up to ``max_factor``;
- back to ``min_factor`` as soon as a sample is deviant or the interval widens (a sample merely
  outside the 80% interval is not enough: one in five should be);
- and when a change is *suspected* on the target — a ping or loss series holds deviant samples
  not yet confirmed, an alert was raised in this cycle or the last, or the route changed — the
  test runs in this cycle (if ``min_factor`` cycles have passed), whatever the factor.

A deferred test is simply not run in that cycle: no result is stored (a "skipped" row every cycle
would fill the archive and every export with non-measurements). The scheduler counts deferrals
(``SchedulerHealth.deferred_runs``) and lists them in each cycle's report with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from iepm.analysis.watch import AlertWatcher, Rule
from iepm.config import Config

CALM_RUNS = 3


@dataclass
class _State:
    waited: int = 0  # cycles since the probe last ran on this path


class Cadence:
    def __init__(
        self,
        watcher: AlertWatcher,
        *,
        min_factor: int = 1,
        max_factor: int = 4,
        calm_runs: int = CALM_RUNS,
    ) -> None:
        if not 1 <= min_factor <= max_factor:
            raise ValueError("1 <= min_factor <= max_factor is required")
        self.watcher = watcher
        watcher.forecasts = True  # the factor follows the forecast's interval
        self.min_factor = min_factor
        self.max_factor = max_factor
        self.calm_runs = calm_runs
        self._state: dict[tuple[str, str], _State] = {}
        self._rules: dict[str, Rule] = {r.probe: r for r in watcher.rules if r.forecast}

    def factor(self, target: str, probe: str) -> int:
        """Run ``probe`` on ``target`` every ``factor``-th cycle (no change suspected)."""
        rule = self._rules.get(probe)
        track = self.watcher.track(target, probe, rule.metric) if rule else None
        if track is None or track.calm_streak < self.calm_runs:
            return self.min_factor
        doublings = track.calm_streak - self.calm_runs + 1
        return min(self.max_factor, self.min_factor * 2**doublings)

    def decide(self, target: str, probe: str) -> str | None:
        """None: run ``probe`` on ``target`` in this cycle; otherwise why it waits."""
        state = self._state.setdefault((target, probe), _State())
        due_in = self.factor(target, probe) - (state.waited + 1)
        if due_in <= 0:
            return None
        suspicion = self.watcher.suspected(target)
        if suspicion is not None and state.waited + 1 >= self.min_factor:
            return None
        state.waited += 1
        return (
            f"adaptive: {probe} on {target} is predictable (narrow, stable forecast); "
            f"next run in {due_in} cycle(s)"
        )

    def ran(self, target: str, probe: str) -> None:
        self._state.setdefault((target, probe), _State()).waited = 0


def cadence_for(config: Config, watcher: AlertWatcher | None) -> Cadence | None:
    """The cadence ``[monitor] adaptive`` asks for (None when off or without a watcher)."""
    m = config.monitor
    if not m.adaptive or watcher is None:
        return None
    return Cadence(watcher, min_factor=m.adaptive_min_factor, max_factor=m.adaptive_max_factor)
