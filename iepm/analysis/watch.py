"""The alert watcher: fed every stored result, it runs the online step detector per path and
metric, and turns each detection into a stored, attributed and delivered alert.

Series watched (:func:`alert_rules`): every metric a probe declares with an ``alert`` (today iperf3
``throughput_bps``, ping ``rtt_avg_ms`` and ping ``loss_percent``). A failed run is no sample (a
failed iperf3 has no throughput; it is not 0), unless the metric counts failed runs: a ping that
got no reply at all is a sample of 100% loss.

Each series has its own :class:`~iepm.analysis.changes.OnlineDetector` with the floors its
metric declares, which keep alerts meaningful to people (a change must be ≥ 15% of the
throughput, ≥ 5% and ≥ 0.5 ms of the RTT, ≥ 2 percentage points of loss), and ``confirm = 3``:
an alert is raised at the third sample of a new level, never on a single outlier, and one
outlier among those three does not hold it back (:class:`AlertDetector`). When the
watcher first meets a series (e.g. after a restart) it replays the last ``history`` results
from the archive, so it neither needs a new warm-up nor raises alerts about the past.

On a detection the cause is looked up (:func:`iepm.analysis.cause.attribute`), the alert is
stored in the ``alerts`` table and queued for the webhook (:mod:`iepm.analysis.webhook`).

A route change is an alert of its own, raised at the first traceroute on the new route
(:meth:`AlertWatcher._watch_route`; silent hops never count): probe ``traceroute``, metric
``route``, with the hops that changed. A step the route caused is still its own alert, with
cause ``route`` and ``details["route"]["alert_id"]`` naming the route alert (one event).

For the adaptive scheduler (:mod:`iepm.analysis.adaptive`) the watcher also keeps, per bandwidth
series, the ensemble forecast of the next sample with its 80% interval and the number of calm
samples in a row (not deviant for the step detector, forecast interval narrow), and it knows
when a change is *suspected* on a target: a detector holds deviant samples awaiting
confirmation, an alert was raised this cycle or the last, or the route changed.
"""

from __future__ import annotations

import copy
import logging
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from iepm.analysis.alerts import ROUTE_METRIC, Alert, finite_or_none, store_alert
from iepm.analysis.cause import ROUTE_PROBE, Route, aligned, attribute, route_of, same_route
from iepm.analysis.changes import ChangePoint, OnlineDetector
from iepm.analysis.forecast import forecast_next
from iepm.analysis.series import AnalysisError
from iepm.analysis.webhook import Notifier, WebhookSender
from iepm.config import Config
from iepm.probes import all_metrics, metrics_of
from iepm.results import Result, format_time, utcnow
from iepm.store import Archive

log = logging.getLogger(__name__)

HISTORY = 200  # results replayed when a series is first met
WINDOW = 20  # earlier traceroutes looked at, route alerts kept, per target
FORECAST_HISTORY = 60  # samples the cadence's forecast looks at


# Alerts reach people: 5 robust standard deviations (the benchmark's detector uses 4, chosen for
# F1 on hand labels), confirmed by 3 samples in a row.
ALERTING: dict[str, float | int] = {"threshold": 5.0, "confirm": 3}


@dataclass(frozen=True)
class Rule:
    probe: str
    metric: str
    detector: dict[str, float | int] = field(default_factory=dict)
    forecast: bool = False  # keep a forecast (for the adaptive cadence)


def alert_rules() -> tuple[Rule, ...]:
    """One rule per registered metric that declares an alert: the watcher's defaults
    (``ALERTING``) under the metric's own detector parameters. Forecast (bandwidth) series come
    first, then registry order: a reader that takes the first watched metric a table has (the
    analysis CLI on an iperf3 export) picks throughput, not the UDP loss column beside it."""
    alerting = [m for m in all_metrics().values() if m.alert is not None]
    return tuple(
        Rule(m.probe, m.key, {**ALERTING, **m.alert}, forecast=m.forecast)
        for m in sorted(alerting, key=lambda m: not m.forecast)  # stable: registry order kept
    )


def metric_value(result: Result, metric: str) -> float | None:
    """The sample ``result`` gives for ``metric``, or None when it gives none."""
    if not result.succeeded:
        counts_failed = any(m.key == metric and m.failed_runs for m in metrics_of(result.probe))
        if not counts_failed:
            return None
    value = result.data.get(metric)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


# How far before the detector's change point the step may be moved (samples), and how many
# samples before those the old level is judged on.
REFINE_BACK = 3
REFINE_CONTEXT = 10


def _unix(moment: datetime) -> float:
    return moment.timestamp()


def _moment(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


class AlertDetector:
    """The step detector of one watched series, tolerant of one outlier in a new level.

    :class:`~iepm.analysis.changes.OnlineDetector` confirms a new level only when its
    ``confirm`` samples are consistent (their spread at most ``consistency`` times the step),
    so that a scattered burst of noise is no alert. But one spike among them (a delayed packet,
    a busy delay line) made the spread as large as the step: the demo's cern route switch, with
    two RTT spikes three samples apart, was confirmed seven cycles late. So beside that detector
    (``strict``) runs the same one without the consistency test (``lenient``); a run the lenient
    one confirms is a new level when it is consistent once its sample farthest from the run's
    median is set aside. A scattered burst still fails (two or more samples away from the rest);
    a level with one spike is confirmed at its ``confirm``-th sample. After each decision the
    two detectors are made the same again, so that no change is reported twice.
    """

    def __init__(self, **params: float) -> None:
        self.strict = OnlineDetector(**params)  # type: ignore[arg-type]
        self.consistency = self.strict.consistency
        self.confirm = self.strict.confirm
        self.lenient = self._without_consistency(self.strict)
        self._values: deque[tuple[int, float]] = deque(maxlen=4 * self.confirm)
        self._index = -1

    @staticmethod
    def _without_consistency(detector: OnlineDetector) -> OnlineDetector:
        twin = copy.deepcopy(detector)
        twin.consistency = 0.0
        return twin

    @property
    def pending(self) -> bool:
        return self.strict.pending or self.lenient.pending

    def update(self, value: float) -> ChangePoint | None:
        self._index += 1
        self._values.append((self._index, value))
        strict = self.strict.update(value)
        lenient = self.lenient.update(value)
        if strict is not None or self.consistency <= 0:
            self.lenient = self._without_consistency(self.strict)
            return strict
        if lenient is None:
            return None
        assert lenient.alert_index is not None
        run = [v for i, v in self._values if lenient.index <= i <= lenient.alert_index]
        if consistent_but_one(run, lenient.before, lenient.after, self.consistency):
            self.strict = copy.deepcopy(self.lenient)
            self.strict.consistency = self.consistency
            return lenient
        self.lenient = self._without_consistency(self.strict)  # a burst: as strict judged it
        return None


def consistent_but_one(run: list[float], before: float, after: float, consistency: float) -> bool:
    """A confirmed run is a new level when, its sample farthest from ``after`` (the run's
    median) set aside, its spread is at most ``consistency`` times the step."""
    values = [v for v in run if math.isfinite(v)]
    if len(values) >= 3:
        values.remove(max(values, key=lambda v: abs(v - after)))
    if not values:
        return False
    return max(values) - min(values) <= consistency * abs(after - before)


@dataclass
class Track:
    """One series: its detector, its recent samples and its forecast state."""

    rule: Rule
    detector: AlertDetector
    samples: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=HISTORY))
    times: dict[int, float] = field(default_factory=dict)  # detector index → time
    count: int = 0
    # Forecast of the next sample: (forecast, lower, upper), its relative width, and how many
    # samples in a row were calm: no deviant sample, a narrow forecast (the cadence's measure).
    next_interval: tuple[float, float, float] | None = None
    calm_streak: int = 0
    last_width: float = math.inf

    def spacing(self) -> float:
        """Median time between recent samples (s); 0 with fewer than two."""
        if len(self.samples) < 2:
            return 0.0
        t = np.fromiter((s[0] for s in self.samples), dtype=np.float64)
        return float(np.median(np.diff(t[-21:])))

    def feed(self, t: float, value: float) -> ChangePoint | None:
        index = self.count
        self.count += 1
        self.times[index] = t
        # Only the pending run and the sample before it can be named by an alert.
        for old in [i for i in self.times if i < index - 4 * self.detector.confirm - 2]:
            del self.times[old]
        self.samples.append((t, value))
        return self.detector.update(value)


class AlertWatcher:
    """Observes stored results; raises, attributes, stores and delivers alerts."""

    def __init__(
        self,
        archive: Archive,
        monitor: str,
        *,
        notifier: Notifier | None = None,
        store: bool = True,
        narrow: float = 0.2,
        forecasts: bool = False,
        rules: Iterable[Rule] | None = None,
        history: int = HISTORY,
    ) -> None:
        self.archive = archive
        self.monitor = monitor
        self.notifier = notifier
        self.store = store
        self.narrow = narrow
        self.forecasts = forecasts  # only the adaptive cadence needs them (~50 ms per sample)
        # None: the registry's rules, read at each result (a probe registered later is watched).
        self._rules = None if rules is None else tuple(rules)
        self.history = history
        self.tracks: dict[tuple[str, str, str], Track] = {}
        self.alerts: list[Alert] = []  # raised since this watcher started, oldest first
        self.cycle = 0
        # Per target: the known route (silent hops filled from earlier traceroutes), when it
        # was last seen, and the route alerts raised (their steps point at them).
        self._routes: dict[str, tuple[Route, datetime]] = {}
        self._route_alerts: dict[str, list[Alert]] = {}
        self._suspect_until: dict[str, int] = {}

    @property
    def rules(self) -> tuple[Rule, ...]:
        return alert_rules() if self._rules is None else self._rules

    # -- the scheduler's hooks ---------------------------------------------------------------

    def cycle_started(self) -> None:
        self.cycle += 1
        if self.notifier is not None:
            self.notifier.redeliver(self.monitor)

    def observe(self, result: Result) -> list[Alert]:
        """Feed one stored result; returns the alerts it raised."""
        if result.monitor != self.monitor:
            return []
        raised = self._watch_route(result)  # route_of reads only results that carry hops
        for rule in self.rules:
            if rule.probe != result.probe:
                continue
            value = metric_value(result, rule.metric)
            if value is None:
                continue
            track = self._track(rule, result)
            t = _unix(result.started_at)
            cp = track.feed(t, value)
            if rule.forecast and self.forecasts:
                self._forecast(track)
                calm = cp is None and not track.detector.pending and track.last_width <= self.narrow
                track.calm_streak = track.calm_streak + 1 if calm else 0
            if cp is not None:
                alert = self._raise(track, result, cp)
                if alert is not None:
                    raised.append(alert)
        return raised

    def close(self, timeout_s: float = 10.0) -> None:
        if self.notifier is not None:
            self.notifier.close(timeout_s)

    # -- what the cadence asks -----------------------------------------------------------------

    def suspected(self, target: str) -> str | None:
        """Why a change is suspected on ``target`` now, or None."""
        if self._suspect_until.get(target, -1) >= self.cycle:
            return "a change was seen on this path in the last cycle"
        for (tgt, probe, metric), track in self.tracks.items():
            if tgt == target and track.detector.pending:
                return f"{probe} {metric} left its usual range"
        return None

    def track(self, target: str, probe: str, metric: str) -> Track | None:
        return self.tracks.get((target, probe, metric))

    # -- internals -------------------------------------------------------------------------------

    def _suspect(self, target: str) -> None:
        self._suspect_until[target] = self.cycle + 1

    def _watch_route(self, result: Result) -> list[Alert]:
        route = route_of(result)
        if route is None:
            return []
        known = self._routes.get(result.target) or self._route_before(result)
        self._routes[result.target] = (route, result.started_at)
        if known is None:
            return []
        old, old_at = known
        if not same_route(old, route):
            self._suspect(result.target)
            if hops_changed(old, route):  # not when only silent hops make the lengths differ
                return [self._raise_route(result, old, old_at, route)]
            return []
        # The same route: hops silent now keep the address seen there before, so that
        # a-b-c, a-*-c, a-x-c is one change (at a-x-c), as cause.route_changes counts it.
        old, route = aligned(old, route)
        filled = [new if new is not None else prev for prev, new in zip(old, route, strict=True)]
        self._routes[result.target] = (filled, result.started_at)
        return []

    def _route_before(self, result: Result) -> tuple[Route, datetime] | None:
        """The route of the target's latest earlier traceroute in the archive (a restarted
        watcher neither misses a change nor reports an old one)."""
        for old in self.archive.results(
            probe=ROUTE_PROBE,
            target=result.target,
            monitor=self.monitor,
            until=result.started_at,
            order="desc",
            limit=WINDOW,
        ):
            route = route_of(old)
            if route is not None:
                return route, old.started_at
        return None

    def _raise_route(self, result: Result, old: Route, old_at: datetime, route: Route) -> Alert:
        alert = Alert(
            monitor=self.monitor,
            target=result.target,
            probe=ROUTE_PROBE,
            metric=ROUTE_METRIC,
            detected_at=utcnow(),
            change_at=result.started_at,
            direction="changed",
            before=None,
            after=None,
            change_percent=None,
            cause="route",
            details={
                "before": old,
                "after": route,
                "hops_changed": hops_changed(old, route),
                "before_at": format_time(old_at),
                "after_at": format_time(result.started_at),
                "result_id": result.id,
            },
        )
        self._route_alerts.setdefault(result.target, []).append(alert)
        del self._route_alerts[result.target][:-WINDOW]
        self._deliver(alert)
        return alert

    def _route_alert_for(self, target: str, since: datetime, until: datetime) -> Alert | None:
        """The latest route alert of ``target`` whose change lies in [since, until]."""
        return next(
            (
                a
                for a in reversed(self._route_alerts.get(target, []))
                if since <= a.change_at <= until
            ),
            None,
        )

    def _track(self, rule: Rule, result: Result) -> Track:
        key = (result.target, rule.probe, rule.metric)
        track = self.tracks.get(key)
        if track is not None:
            return track
        track = Track(rule, AlertDetector(**rule.detector))
        self.tracks[key] = track
        past = list(
            self.archive.results(
                probe=rule.probe,
                target=result.target,
                monitor=self.monitor,
                until=result.started_at,
                order="desc",
                limit=self.history,
            )
        )
        for old in reversed(past):
            value = metric_value(old, rule.metric)
            if value is not None:
                track.feed(_unix(old.started_at), value)  # replayed: the past raises nothing
        if rule.forecast and self.forecasts:
            self._forecast(track)
        return track

    def _forecast(self, track: Track) -> None:
        """Forecast the next sample (at the usual spacing) with its 80% interval."""
        if len(track.samples) < 6:
            track.next_interval = None
            return
        recent = list(track.samples)[-FORECAST_HISTORY:]
        t = np.array([s[0] for s in recent])
        y = np.array([s[1] for s in recent])
        try:
            fc = forecast_next(t, y, float(t[-1]) + max(track.spacing(), 1.0))
        except AnalysisError:
            track.next_interval = None
            return
        track.next_interval = (fc.forecast, fc.lower, fc.upper)
        track.last_width = (
            (fc.upper - fc.lower) / abs(fc.forecast) if fc.forecast != 0 else math.inf
        )

    def _raise(self, track: Track, result: Result, cp: ChangePoint) -> Alert | None:
        target, rule = result.target, track.rule
        self._suspect(target)
        change_t = track.times.get(cp.index, _unix(result.started_at))
        last_before_t, change_t = step_at(list(track.samples), change_t)
        now = utcnow()
        try:
            cause, details = attribute(
                self.archive,
                monitor=self.monitor,
                target=target,
                probe=rule.probe,
                last_before=_moment(last_before_t),
                change_at=_moment(change_t),
                now=now,
            )
        except Exception:  # attribution is a best effort: the alert itself must not be lost
            log.exception("could not attribute the change of %s %s", target, rule.metric)
            cause, details = "unknown", {"error": "attribution failed; see the monitor's log"}
        if cause == "route":
            # A sample just before the switch can look like the new level (a spike the size of
            # the step); the traceroute says when the route changed: the step is placed there.
            last_before_t, change_t = at_route_change(
                list(track.samples), change_t, details["route"]["first_after_at"]
            )
            route_alert = self._route_alert_for(
                target, datetime.fromisoformat(details["route"]["before_at"]), now
            )
            if route_alert is not None:
                details["route"]["alert_id"] = route_alert.id  # the same event
        details["samples_to_alert"] = (
            (cp.alert_index - cp.index + 1) if cp.alert_index is not None else None
        )
        details["result_id"] = result.id
        alert = Alert(
            monitor=self.monitor,
            target=target,
            probe=rule.probe,
            metric=rule.metric,
            detected_at=now,
            change_at=_moment(change_t),
            direction=cp.direction,
            before=finite_or_none(cp.before),
            after=finite_or_none(cp.after),
            change_percent=finite_or_none(cp.change_percent),
            cause=cause,
            details=details,
        )
        self._deliver(alert)
        return alert

    def _deliver(self, alert: Alert) -> None:
        self.alerts.append(alert)
        log.warning("alert: %s", alert.summary)
        if not self.store:
            return
        store_alert(self.archive, alert)
        if self.notifier is not None:
            self.notifier.submit(alert)


def hops_changed(before: Route, after: Route) -> list[dict[str, Any]]:
    """The hops that differ, by TTL: both answered with other addresses, or the hop exists on
    one route only (None on the side without it). A silent hop is never a change, nor a
    destination answering late behind silent hops (``aligned``)."""
    before, after = aligned(before, after)
    out: list[dict[str, Any]] = []
    for i in range(max(len(before), len(after))):
        a = before[i] if i < len(before) else None
        b = after[i] if i < len(after) else None
        beyond = i >= len(before) or i >= len(after)
        if (a is not None and b is not None and a != b) or (beyond and (a or b)):
            out.append({"ttl": i + 1, "before": a, "after": b})
    return out


def step_at(samples: list[tuple[float, float]], change_t: float) -> tuple[float, float]:
    """(last sample of the old level, first of the new) around the detector's ``change_t``.

    On a short history the detector can name a sample up to a few after the step (the first
    new samples look like outliers until the level is confirmed): an alert placed there misses
    the traceroute of the step's own cycle and blames nothing. So the step is moved to the
    split, among the REFINE_BACK samples before ``change_t``, that best separates the two
    levels (least absolute deviation from each side's median); ties keep the detector's."""
    times = [t for t, _v in samples]
    if change_t not in times:
        return change_t, change_t
    p = times.index(change_t)
    values = np.array([v for _t, v in samples], dtype=np.float64)
    start = max(0, p - REFINE_BACK - REFINE_CONTEXT)

    def cost(split: int) -> float:
        left, right = values[start:split], values[split:]
        return float(np.abs(left - np.median(left)).sum() + np.abs(right - np.median(right)).sum())

    best, best_cost = p, cost(p) if p > start else math.inf
    for split in range(p - 1, max(start, p - REFINE_BACK) - 1, -1):
        if split <= start:
            break
        c = cost(split)
        if c < best_cost:
            best, best_cost = split, c
    return (times[best - 1] if best > 0 else times[best]), times[best]


def at_route_change(
    samples: list[tuple[float, float]], change_t: float, route_at: str
) -> tuple[float, float]:
    """(last sample before, first at or after) the first traceroute on the new route, when
    that sample is within REFINE_BACK samples of ``change_t``; else the step stays put."""
    times = [t for t, _v in samples]
    if change_t not in times:
        return change_t, change_t
    p = times.index(change_t)
    spacing = float(np.median(np.diff(times[-21:]))) if len(times) > 1 else 0.0
    # Ping and traceroute of one cycle start together (the traceroute may start first).
    route_t = datetime.fromisoformat(route_at).timestamp() - spacing / 2
    for q in range(max(1, p - REFINE_BACK), min(len(times), p + REFINE_BACK + 1)):
        if times[q - 1] < route_t <= times[q]:
            return times[q - 1], times[q]
    return (times[p - 1] if p > 0 else change_t), change_t


def metric_series(
    archive: Archive,
    *,
    target: str,
    probe: str,
    metric: str,
    monitor: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(Unix times, values) of one metric of a path from the archive, for the analyses."""
    t: list[float] = []
    y: list[float] = []
    for r in archive.results(probe=probe, target=target, monitor=monitor, since=since, until=until):
        value = metric_value(r, metric)
        if value is not None:
            t.append(_unix(r.started_at))
            y.append(value)
    return np.asarray(t, dtype=np.float64), np.asarray(y, dtype=np.float64)


def watcher_for(config: Config, archive: Archive) -> AlertWatcher | None:
    """The watcher ``[monitor]`` asks for: alerts (with the webhook when a URL is set), or only
    the series state the adaptive cadence needs; None when neither is on."""
    m = config.monitor
    if not (m.alerts or m.adaptive):
        return None
    notifier = None
    if m.alerts and m.webhook_url:
        sender = WebhookSender(
            m.webhook_url,
            timeout_s=m.webhook_timeout_s,
            attempts=m.webhook_attempts,
            total_s=m.webhook_attempts * (m.webhook_timeout_s + 8.0),
        )
        notifier = Notifier(archive, sender)
    return AlertWatcher(
        archive,
        m.name,
        notifier=notifier,
        store=m.alerts,
        narrow=m.adaptive_narrow_percent / 100.0,
        forecasts=m.adaptive,
    )
