"""``/metrics``: the archive's figures in Prometheus exposition format, in base units.

Everything except the in-process scheduler counters is read from the archive, so a separate
``iepm serve`` process exposes what the monitors wrote. Families:

- ``iepm_<probe>_<figure>_<unit>{monitor,target}``: the latest value per path (paths with a
  result in the last 28 days) of every metric a registered probe declares, e.g.
  ``iepm_ping_rtt_avg_seconds``, ``iepm_ping_loss_ratio``,
  ``iepm_iperf3_throughput_bits_per_second``. A path whose latest run failed keeps its series:
  the metric's down value (a dead ping reads loss 1), else NaN (no figure, but not gone), so
  an alert on loss fires and one on absence is not needed;
- ``iepm_probe_success{monitor,target,probe}``: 1 when the latest run succeeded, else 0 (as
  blackbox_exporter's ``probe_success``); ``iepm_last_result_timestamp_seconds`` and, under
  its older name, ``iepm_last_result_success``;
- ``iepm_runs_total{monitor,probe,outcome}``, ``iepm_cycles_total`` and
  ``iepm_cycle_overruns_total{monitor}``; ``iepm_alerts_total{cause}`` (step changes found by
  the analysis, by likely cause: route, host, tuning, unknown);
- ``iepm_host_lease_seconds_left{host,holder,probe}``: the mesh's host leases held now;
- with a scheduler in the same process: ``iepm_archive_write_failures_total``,
  ``iepm_spooled_results_total``, ``iepm_host_lease_refusals_total``,
  ``iepm_host_lease_wait_seconds_total`` and ``iepm_retune_{sweeps,failures,put_off}_total``
  (a failed archive write is, by its nature, not in the archive), and the gauges of
  ``SchedulerHealth.gauges()`` (``iepm_archive_up``, what waits in the spool or in memory).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from iepm.probes import metrics_of
from iepm.probes.base import Metric as IepmMetric
from iepm.scheduler import SchedulerHealth
from iepm.web.context import WebContext, web
from iepm.web.health import run_value
from iepm.web.queries import Queries
from iepm.web.tables import HISTORY

UNIT_SUFFIX = re.compile(r"_(ms|s|bps|bytes|percent)$")


def family_name(metric: IepmMetric) -> str:
    """``ping.rtt_avg_ms`` → ``iepm_ping_rtt_avg_seconds``; ``throughput_bps`` →
    ``…_throughput_bits_per_second``; ``loss_percent`` → ``…_loss_ratio``."""
    stem = UNIT_SUFFIX.sub("", metric.key)
    unit = f"_{metric.base_unit}" if metric.base_unit else ""
    return f"iepm_{metric.probe}_{stem}{unit}"


class ArchiveCollector(Collector):
    def __init__(self, queries: Queries, health: SchedulerHealth | None) -> None:
        self.queries = queries
        self.health = health

    def collect(self) -> Iterator[Metric]:
        q = self.queries
        since = datetime.now(UTC) - HISTORY
        latest = q.cached(("metrics-latest",), lambda: q.latest(since=since))
        families: dict[str, GaugeMetricFamily] = {}
        stamp = GaugeMetricFamily(
            "iepm_last_result_timestamp_seconds",
            "Start of the newest result per path, Unix time",
            labels=["monitor", "target", "probe"],
        )
        success = GaugeMetricFamily(
            "iepm_last_result_success",
            "1 when the newest result per path succeeded, else 0 (iepm_probe_success)",
            labels=["monitor", "target", "probe"],
        )
        probe_success = GaugeMetricFamily(
            "iepm_probe_success",
            "1 when the newest run of the path succeeded, else 0 (blackbox_exporter's meaning)",
            labels=["monitor", "target", "probe"],
        )
        for result in latest:
            labels = [result.monitor, result.target, result.probe]
            stamp.add_metric(labels, result.started_at.timestamp())
            success.add_metric(labels, 1.0 if result.succeeded else 0.0)
            probe_success.add_metric(labels, 1.0 if result.succeeded else 0.0)
            for metric in metrics_of(result.probe):  # the registry's, at each scrape
                value = run_value(metric, result.succeeded, result.data.get(metric.key))
                if result.succeeded and value is None:
                    continue  # this run has no such figure (an option not used)
                name = family_name(metric)
                if name not in families:
                    dead = metric.down_value
                    down = "NaN" if dead is None else dead * metric.to_base
                    families[name] = GaugeMetricFamily(
                        name,
                        f"Latest {metric.name}, in base units (a failed run: {down})",
                        labels=["monitor", "target"],
                    )
                families[name].add_metric(
                    [result.monitor, result.target],
                    math.nan if value is None else value * metric.to_base,
                )
        yield from families.values()
        yield stamp
        yield success
        yield probe_success
        runs = CounterMetricFamily(
            "iepm_runs", "Runs in the archive by outcome", labels=["monitor", "probe", "outcome"]
        )
        # A whole-archive scan: refreshed 10× less often (a counter lagging a few minutes is
        # fine for rate() over hours).
        counts = q.cached(("metrics-runs",), q.outcome_counts, scale=10)
        for monitor, probe, outcome, count in counts:
            runs.add_metric([monitor, probe, outcome], count)
        yield runs
        cycles = CounterMetricFamily("iepm_cycles", "Scheduler cycles", labels=["monitor"])
        overruns = CounterMetricFamily(
            "iepm_cycle_overruns", "Cycles longer than their interval", labels=["monitor"]
        )
        for monitor, count, overran in q.cached(("metrics-cycles",), q.cycle_counts):
            cycles.add_metric([monitor], count)
            overruns.add_metric([monitor], overran)
        yield cycles
        yield overruns
        alerts = CounterMetricFamily(
            "iepm_alerts", "Alerts (step changes) in the archive by likely cause", labels=["cause"]
        )
        for cause, count in q.cached(("metrics-alerts",), q.alert_counts):
            alerts.add_metric([cause], count)
        yield alerts
        leases = GaugeMetricFamily(
            "iepm_host_lease_seconds_left",
            "Unexpired host leases of a mesh's archive: seconds left, per host and holder",
            labels=["host", "holder", "probe"],
        )
        for host, holder, probe, left_s in q.cached(("metrics-leases",), q.host_leases):
            leases.add_metric([host, holder, probe], left_s)
        yield leases
        if self.health is not None:
            yield CounterMetricFamily(
                "iepm_host_lease_refusals",
                "Exclusive tests not run: their hosts stayed leased for the whole wait",
                value=self.health.lease_refusals,
            )
            yield CounterMetricFamily(
                "iepm_host_lease_wait_seconds",
                "Time exclusive tests waited for their hosts' leases",
                value=self.health.lease_wait_s,
            )
            for name, text, value in (
                ("iepm_retune_sweeps", "Re-tuning sweeps the scheduler ran ([monitor] retune)",
                 self.health.retune_sweeps),
                ("iepm_retune_failures", "Re-tuning sweeps that failed (then backed off)",
                 self.health.retune_failures),
                ("iepm_retune_put_off", "Re-tuning sweeps due but put off by budget or back-off",
                 self.health.retune_put_off),
            ):  # fmt: skip
                yield CounterMetricFamily(name, text, value=value)
            yield CounterMetricFamily(
                "iepm_archive_write_failures",
                "Results this monitor could not write to the archive (spooled instead)",
                value=self.health.archive_write_failures,
            )
            yield CounterMetricFamily(
                "iepm_spooled_results",
                "Results written to the spool file",
                value=self.health.spooled_results,
            )
            for name, text, value in self.health.gauges():
                yield GaugeMetricFamily(name, text, value=value)


def metrics_text(queries: Queries, health: SchedulerHealth | None) -> tuple[bytes, str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ArchiveCollector(queries, health))
    return generate_latest(registry), CONTENT_TYPE_LATEST


def router() -> APIRouter:
    metrics = APIRouter(tags=["metrics"])

    @metrics.get(
        "/metrics", response_class=PlainTextResponse, summary="Prometheus exposition format"
    )
    def metrics_page(w: Annotated[WebContext, Depends(web)]) -> Response:
        """Latest value per path and probe in base units (seconds, bits/s, bytes, ratio), runs
        by outcome and cycle overruns from the archive, and (in the monitor's process) its
        archive write failures."""
        body, content_type = metrics_text(w.queries, w.health)
        return Response(body, media_type=content_type)

    return metrics
