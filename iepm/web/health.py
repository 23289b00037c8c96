"""How healthy a path is, by absolute thresholds (the registry's ``Metric.health``, overridden
per target or group), and what a failed run stands for on a chart or in ``/metrics``.

Colour answers "is the network all right?", the same way for every path: a path whose RTT is
twice its usual is not healthy just because it has been so for a while, and 0.3 ms of noise on a
5 ms path is not a fault. Whether a value is unusual for its own path (the share of its 28 days
that was better) is kept beside it as a second mark.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from iepm.analysis.statistics import FloatArray
from iepm.errors import ConfigError
from iepm.probes import all_metrics
from iepm.probes.base import Health, Metric

Status = Literal["ok", "warn", "critical", "failed", "nodata"]


def run_value(metric: Metric, succeeded: bool, value: Any) -> float | None:
    """The figure a run gives for ``metric``: its own value when it succeeded (or when a
    failed run's value still counts, a ping with no reply), else the metric's down value
    (a timed-out ping: 100 % loss), else None (nothing to show)."""
    number = None
    if not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value):
        number = float(value)
    if succeeded or (metric.failed_runs and number is not None):
        return number
    return metric.down_value


class Override(BaseModel):
    """A site's thresholds for one metric; what is not given keeps the registry's default.
    ``reference``: the path's baseline (RTT) or expected rate (throughput), in the metric's
    unit, instead of the one read from its history."""

    model_config = ConfigDict(extra="forbid")

    warn: float | None = Field(default=None, ge=0)
    critical: float | None = Field(default=None, ge=0)
    floor: float | None = Field(default=None, ge=0)
    reference: float | None = Field(default=None, gt=0)


class ThresholdsFile(BaseModel):
    """thresholds.toml: ``[defaults."ping.loss_percent"]``, ``[groups.NAME."metric"]`` and
    ``[targets.NAME."metric"]`` tables; a target's own win over its group's, which win over
    the defaults, which win over the registry's."""

    model_config = ConfigDict(extra="forbid")

    defaults: dict[str, Override] = Field(default_factory=dict)
    groups: dict[str, dict[str, Override]] = Field(default_factory=dict)
    targets: dict[str, dict[str, Override]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _metrics_are_known(self) -> ThresholdsFile:
        known = all_metrics()
        tables = [("defaults", self.defaults)]
        tables += [(f"groups.{g}", t) for g, t in self.groups.items()]
        tables += [(f"targets.{n}", t) for n, t in self.targets.items()]
        for where, table in tables:
            for name in table:
                if name not in known:
                    raise ValueError(
                        f"[{where}] names unknown metric {name!r} (known: {', '.join(known)})"
                    )
        return self


class Rule(NamedTuple):
    """The thresholds in force for one metric of one path."""

    health: Health
    reference: float | None  # given by the site; else read from the path's history


class Verdict(NamedTuple):
    status: Status
    reference: float | None  # the baseline or expected rate judged against
    rule: str  # what the colour means, for the cell's title and the legend


@dataclass(frozen=True)
class Thresholds:
    """The registry's default thresholds with a site's overrides."""

    file: ThresholdsFile = field(default_factory=ThresholdsFile)

    def rule(self, metric: Metric, target: str, group: str | None) -> Rule | None:
        if metric.health is None:
            return None
        layers = [
            self.file.defaults.get(metric.name),
            self.file.groups.get(group or "", {}).get(metric.name) if group else None,
            self.file.targets.get(target, {}).get(metric.name),
        ]
        health, reference = metric.health, None
        for layer in layers:
            if layer is None:
                continue
            given = {k: v for k, v in layer.model_dump().items() if v is not None}
            reference = given.pop("reference", reference)
            health = replace(health, **given)
        return Rule(health, reference)


def judge(metric: Metric, rule: Rule | None, value: float | None, history: FloatArray) -> Verdict:
    """How healthy ``value`` is by ``rule``; ``history``: the path's successful values of
    the last 28 days (for a baseline or expected rate the site did not give)."""
    if rule is None:
        return Verdict("nodata", None, "no thresholds for this metric")
    h, unit = rule.health, _unit(metric.key)
    history = history[np.isfinite(history)]
    if h.kind == "value":
        than = _than(metric)
        text = f"warn {than} {h.warn:g}{unit}, critical {than} {h.critical:g}{unit}"
        if value is None:
            return Verdict("nodata", None, text)
        return Verdict(_level(metric, value, h.warn, h.critical), None, text)
    if h.kind == "over_baseline":
        ref = rule.reference if rule.reference is not None else _pick(history, np.min)
        baseline = "the path's baseline" if ref is None else f"the baseline {ref:.4g}{unit}"
        text = (
            f"warn {h.warn:g} %, critical {h.critical:g} % above {baseline}"
            f" (and {h.floor:g}{unit} more)"
        )
        if value is None or ref is None or ref <= 0:
            return Verdict("nodata", ref, text)
        excess = value - ref
        if excess <= h.floor:
            return Verdict("ok", ref, text)
        share = 100.0 * excess / ref
        status = "critical" if share >= h.critical else "warn" if share >= h.warn else "ok"
        return Verdict(status, ref, text)
    ref = (
        rule.reference
        if rule.reference is not None
        else _pick(history, lambda v: np.percentile(v, 90))
    )
    expected = "the path's expected rate" if ref is None else f"the expected {ref:.4g}{unit}"
    text = f"warn below {h.warn:g} %, critical below {h.critical:g} % of {expected}"
    if value is None or ref is None or ref <= 0:
        return Verdict("nodata", ref, text)
    share = 100.0 * value / ref
    status = "critical" if share < h.critical else "warn" if share < h.warn else "ok"
    return Verdict(status, ref, text)


def _level(metric: Metric, value: float, warn: float, critical: float) -> Status:
    if metric.better == "lower":
        return "critical" if value > critical else "warn" if value > warn else "ok"
    return "critical" if value < critical else "warn" if value < warn else "ok"


def _than(metric: Metric) -> str:
    return "above" if metric.better == "lower" else "below"


def _pick(history: FloatArray, of: Any) -> float | None:
    return float(of(history)) if len(history) else None


def _unit(key: str) -> str:
    for suffix, unit in (("_ms", " ms"), ("_percent", " %"), ("_bps", " bit/s"), ("_s", " s")):
        if key.endswith(suffix):
            return unit
    return ""


def load_thresholds(path: str | None) -> Thresholds:
    """The thresholds of ``path`` (thresholds.toml), or the registry's defaults; a bad file is
    a ConfigError naming the file and the problem in one line."""
    if path is None:
        return Thresholds()
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
        return Thresholds(ThresholdsFile.model_validate(raw))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not TOML: {exc}") from None
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}".removeprefix(": ")
            for e in exc.errors()
        ]
        raise ConfigError(f"{path}: " + "; ".join(problems)) from None
