"""``targets.toml``: the monitor, its targets and their probe parameters.

Validation happens at the edge with pydantic; every error names the file, the line and the field::

    targets.toml:23: targets[1].iperf3.streams: Input should be less than or equal to 128 (got 500)
"""

from __future__ import annotations

import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from iepm import tomlload
from iepm.dburl import archive_url_problem
from iepm.errors import ConfigError
from iepm.probes import PROBES, default_probes
from iepm.probes.base import ProbeSpec
from iepm.remote.access import AgentAccess, SshAccess
from iepm.tuning.plan import StudyRefused, SweepLimits, SweepPlan, check_plan, parse_window

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _known_probes() -> str:
    return ", ".join(sorted(PROBES))


def simple_name(value: str, what: str) -> str:
    """``value`` if it is a name safe in paths, logs and URLs (NAME_RE), else a ValueError."""
    if not NAME_RE.match(value):
        raise ValueError(
            f"{what} names are 1-64 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit"
        )
    return value


def plausible_address(value: str) -> str:
    """``value`` stripped if it is an IP address or a host name, else a ValueError."""
    value = value.strip()
    try:
        ipaddress.ip_address(value)
    except ValueError:
        # A host name: resolved by the tools at run time, so a DNS change is followed.
        if not re.match(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$", value):
            raise ValueError(f"not an IP address or host name: {value!r}") from None
    return value


def probe_tables(value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``value`` if each of its keys names a registered probe (``[defaults.PROBE]`` tables of a
    targets or mesh file), else a ValueError naming the known ones."""
    for name in value:
        if name not in PROBES:
            raise ValueError(f"unknown probe {name!r} (known: {_known_probes()})")
    return value


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MonitorConfig(StrictModel):
    name: str = Field(default_factory=socket.gethostname)
    cycle_interval_s: float = Field(default=5400.0, ge=1.0, le=7 * 86400)
    archive: str = "sqlite:///var/lib/iepm/archive.db"
    log_dir: str = "/var/lib/iepm/raw"
    # Retention for `iepm archive prune` (None: keep everything). Daily summaries are kept for
    # ever; raw logs older than compress_logs_after_days are gzipped.
    keep_results_days: float | None = Field(default=None, gt=0.0)
    compress_logs_after_days: float | None = Field(default=None, gt=0.0)
    # Random delay added before each cycle so that monitors do not fall into lock-step.
    start_jitter_s: float = Field(default=0.0, ge=0.0, le=3600.0)
    # Run every probe inside this network namespace (the lab's monitor host).
    netns: str | None = None
    # Step changes in throughput, RTT and loss become alerts in the archive (iepm.analysis.watch),
    # POSTed as JSON to webhook_url when set: webhook_attempts tries per round, with backoff.
    alerts: bool = True
    webhook_url: str | None = Field(default=None, pattern=r"^https?://\S+$")
    webhook_timeout_s: float = Field(default=5.0, gt=0.0, le=60.0)
    webhook_attempts: int = Field(default=4, ge=1, le=10)
    # Adaptive frequency of the bandwidth tests (iepm.analysis.adaptive): a path whose forecast
    # is narrow and stable is tested every 2nd, 4th... cycle, at most every adaptive_max_factor-th;
    # at least every adaptive_min_factor-th, and at once when a change is suspected.
    adaptive: bool = False
    # While `iepm run` runs, publish what it sees now to the archive's live tables (each reply
    # of a continuous ping, the monitor's interface rates, the tests running) for the live pages.
    live: bool = True
    adaptive_min_factor: int = Field(default=1, ge=1, le=100)
    adaptive_max_factor: int = Field(default=4, ge=1, le=100)
    adaptive_narrow_percent: float = Field(default=20.0, gt=0.0, le=1000.0)
    # Re-tuning as a routine mode (iepm.tuning.routine): before a path's scheduled bandwidth
    # test, the scheduler sweeps retune_windows × retune_streams when the path needs it (never
    # tuned, tuned over retune_after_days ago, a step or route change since) — at most
    # retune_per_cycle sweeps per cycle and none within retune_gap_h hours of the last; a failed
    # sweep waits retune_backoff_h (doubling with each failure in a row) before the next try.
    retune: bool = False
    retune_after_days: float = Field(default=30.0, gt=0.0, le=3650.0)
    retune_per_cycle: int = Field(default=1, ge=1, le=100)
    retune_gap_h: float = Field(default=6.0, ge=0.0, le=8760.0)
    retune_backoff_h: float = Field(default=6.0, gt=0.0, le=8760.0)
    retune_windows: list[str] = Field(
        default_factory=lambda: ["default", "64K", "256K", "1M", "4M"], min_length=1
    )
    retune_streams: list[Annotated[int, Field(ge=1, le=128)]] = Field(
        default_factory=lambda: [1, 2, 4, 8], min_length=1
    )
    retune_duration_s: int = Field(default=10, ge=1, le=300)
    retune_max_total_s: float = Field(default=1800.0, gt=0.0, le=86400.0)

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, value: str) -> str:
        # Written into results, raw-log paths and agent requests: no line break, '/' or '..'.
        return simple_name(value, "monitor")

    @field_validator("archive")
    @classmethod
    def _archive_can_work(cls, value: str) -> str:
        problem = archive_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _adaptive_bounds(self) -> MonitorConfig:
        if self.adaptive_min_factor > self.adaptive_max_factor:
            raise ValueError(
                f"adaptive_min_factor ({self.adaptive_min_factor}) must not exceed "
                f"adaptive_max_factor ({self.adaptive_max_factor})"
            )
        return self

    @field_validator("retune_windows")
    @classmethod
    def _windows_parse(cls, value: list[str]) -> list[str]:
        for window in value:
            try:
                parse_window(window)
            except ValidationError as exc:  # iperf3's own words, without its field's path
                raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return value

    @model_validator(mode="after")
    def _retune_sweep_fits(self) -> MonitorConfig:
        try:
            check_plan(self.retune_plan(), SweepLimits(max_total_s=self.retune_max_total_s))
        except StudyRefused as exc:
            raise ValueError(str(exc).replace("--max-total", "retune_max_total_s")) from None
        return self

    def retune_plan(self) -> SweepPlan:
        """The sweep that re-tuning runs (``retune_windows`` × ``retune_streams``)."""
        return SweepPlan(
            windows=[parse_window(w) for w in self.retune_windows],
            streams=list(self.retune_streams),
            duration_s=self.retune_duration_s,
        )


# A probe's interval in a [schedule] table: seconds, or "continuous" (a probe with a Stream).
Every = float | Literal["continuous"]
MIN_EVERY_S = 1.0
MAX_EVERY_S = 7 * 86400.0


class ScheduleConfig(BaseModel):
    """``[schedule]``: per-probe intervals instead of one cycle. Settings below, and one key per
    probe: seconds between runs, or ``"continuous"`` (ping). Probes not named run every
    ``[monitor] cycle_interval_s``. Checked key by key by load_config (file:line)."""

    model_config = ConfigDict(extra="allow")

    # Light (background) probes running at once across targets.
    light_limit: int = Field(default=8, ge=1, le=256)
    # A continuous probe stores one result per window (60 one-second pings by default).
    window_s: float = Field(default=60.0, ge=1.0, le=3600.0)

    def intervals(self) -> dict[str, Any]:
        """The probe keys as written (validated by load_config)."""
        return dict(self.model_extra or {})


class TargetConfig(StrictModel):
    name: str
    address: str
    site: str | None = None
    group: str | None = None
    # Default: the probes whose META says default (ping, traceroute, iperf3).
    probes: list[str] = Field(default_factory=lambda: list(default_probes()))
    # If ping is expected to work and fails, heavy probes are skipped (the seeds' sanity rule).
    ping_expected: bool = True
    # plain: a public iperf3 -s / ping endpoint; agent: the target runs `iepm agent`;
    # ssh: agentless, the monitor starts the server over SSH for each test.
    mode: Literal["plain", "agent", "ssh"] = "plain"
    agent: AgentAccess | None = None
    ssh: SshAccess | None = None
    # Use the parameters `iepm tune` stored for this path (a target's own settings still win).
    use_tuned: bool = True
    # This target's own intervals by probe ([targets.schedule]; seconds or "continuous"), over
    # the [schedule] table's; checked by load_config.
    schedule: dict[str, Any] = Field(default_factory=dict)
    # Per-probe parameters, e.g. [targets.iperf3] streams = 4: a table named after any
    # registered probe (read with params()), validated against its Spec by load_config.
    _probe_tables: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _gather_probe_tables(
        cls, data: Any, handler: ModelWrapValidatorHandler[TargetConfig]
    ) -> TargetConfig:
        tables: dict[str, Any] = {}
        if isinstance(data, dict):
            tables = {k: v for k, v in data.items() if k in PROBES and k not in cls.model_fields}
            data = {k: v for k, v in data.items() if k not in tables}
        errors = [
            InitErrorDetails(type="dict_type", loc=(name,), input=table)
            for name, table in tables.items()
            if not isinstance(table, dict)
        ]
        try:
            target = handler(data)
        except ValidationError as exc:
            errors += [_name_the_table(e) for e in exc.errors()]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        target._probe_tables = tables
        return target

    @field_validator("name")
    @classmethod
    def _name_is_simple(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(
                "target names are 1-64 letters, digits, '.', '_' or '-', starting with a "
                f"letter or digit (got {value!r})"
            )
        return value

    @field_validator("address")
    @classmethod
    def _address_is_plausible(cls, value: str) -> str:
        return plausible_address(value)

    @model_validator(mode="after")
    def _mode_has_its_table(self) -> TargetConfig:
        for mode in ("agent", "ssh"):
            table = getattr(self, mode)
            if self.mode == mode and table is None:
                raise ValueError(f"mode = {mode!r} needs a [targets.{mode}] table")
            if self.mode != mode and table is not None:
                raise ValueError(f"[targets.{mode}] is given but mode = {self.mode!r}")
        return self

    def params(self, probe: str) -> dict[str, Any]:
        """This target's own parameters of ``probe`` (its ``[targets.<probe>]`` table)."""
        return self._probe_tables.get(probe, {})

    def remote(self) -> AgentAccess | SshAccess | None:
        """How servers are started on this target for a test (None: a plain endpoint)."""
        return self.agent if self.mode == "agent" else self.ssh if self.mode == "ssh" else None

    @field_validator("probes")
    @classmethod
    def _probes_are_known(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in PROBES:
                raise ValueError(f"unknown probe {name!r} (known: {_known_probes()})")
        if len(set(value)) != len(value):
            raise ValueError("a probe is listed twice")
        return value


def _name_the_table(error: Any) -> Any:
    """A table of a target that is neither a setting nor a registered probe: say so (an
    unknown plain key keeps pydantic's own "extra_forbidden", worded by _describe)."""
    loc = tuple(error["loc"])
    if error["type"] == "extra_forbidden" and loc and isinstance(error.get("input"), dict):
        message = (
            f"[targets.{loc[-1]}] is neither a target setting nor a probe's table "
            f"(probes: {_known_probes()})"
        )
        custom = PydanticCustomError("unknown_table", message.replace("{", "{{"))
        return InitErrorDetails(type=custom, loc=loc, input=error["input"])
    return error


class Config(StrictModel):
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    targets: list[TargetConfig] = Field(default_factory=list)
    # Per-probe intervals (None: the classic cycle, every probe once per cycle_interval_s).
    schedule: ScheduleConfig | None = None

    @field_validator("defaults")
    @classmethod
    def _defaults_name_probes(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return probe_tables(value)

    @model_validator(mode="after")
    def _unique_target_names(self) -> Config:
        seen: set[str] = set()
        for target in self.targets:
            if target.name in seen:
                raise ValueError(f"duplicate target name {target.name!r}")
            seen.add(target.name)
        return self

    def target(self, name: str) -> TargetConfig:
        for target in self.targets:
            if target.name == name:
                return target
        raise ConfigError(f"no target named {name!r} (known: {', '.join(self.target_names())})")

    def every(self, target: TargetConfig, probe: str) -> float | str:
        """Seconds between runs of ``probe`` on ``target``, or "continuous" (schedule mode)."""
        table = self.schedule.intervals() if self.schedule is not None else {}
        value = target.schedule.get(probe, table.get(probe, self.monitor.cycle_interval_s))
        return value if value == "continuous" else float(value)

    def target_names(self) -> list[str]:
        return [t.name for t in self.targets]

    def spec_for(
        self, target: TargetConfig, probe: str, tuned: dict[str, Any] | None = None
    ) -> ProbeSpec:
        """The validated spec of one probe for one target: defaults, then ``tuned`` (what a
        study chose for the path), then the target's own settings."""
        merged = {**self.defaults.get(probe, {}), **(tuned or {}), **target.params(probe)}
        spec: ProbeSpec = PROBES[probe].Spec.model_validate(merged)
        return spec


def load_config_text(text: str, path: Path | None = None) -> Config:
    """A config from its text (``path`` names it in errors)."""
    return _validated(tomlload.parse(text, str(path) if path else "<config>"))


def load_config(path: str | Path) -> Config:
    """Read, decode, parse and validate a ``targets.toml``; every error names file:line: field."""
    return _validated(tomlload.load(path))


def _validated(doc: tomlload.TomlText) -> Config:
    config = tomlload.validate(Config, doc)
    errors: list[tomlload.Problem] = []
    for name, values in config.defaults.items():
        try:
            PROBES[name].Spec.model_validate(values)
        except ValidationError as exc:
            errors += tomlload.problems(exc, ("defaults", name))
    if config.schedule is not None:
        errors += _interval_problems(config.schedule.intervals(), ("schedule",))
    for index, target in enumerate(config.targets):
        errors += _interval_problems(target.schedule, ("targets", index, "schedule"))
        if target.schedule and config.schedule is None:
            errors.append(
                (("targets", index, "schedule"), "needs a [schedule] table (per-probe intervals)")
            )
    for index, target in enumerate(config.targets):
        for probe in PROBES:
            try:
                spec = config.spec_for(target, probe)
            except ValidationError as exc:
                for loc, message in tomlload.problems(exc):
                    field = loc[0] if loc else None
                    own = field in target.params(probe) or field is None
                    base = ("targets", index, probe) if own else ("defaults", probe)
                    errors.append(((*base, *loc), message))
                continue
            # A measurement must fit in a cycle, or cycles would overlap forever. (In schedule
            # mode a run longer than its interval makes the next start late, never overlap,
            # and is recorded as an overrun: a deadline is a worst case, not a typical run.)
            if probe not in target.probes or config.schedule is not None:
                continue
            if spec.deadline_s() >= config.monitor.cycle_interval_s:
                errors.append(
                    (
                        ("targets", index, probe),
                        f"{probe} may run {spec.deadline_s():g} s, not less than the cycle "
                        f"interval ({config.monitor.cycle_interval_s:g} s)",
                    )
                )
    if errors:
        raise tomlload.config_error(doc.where, doc.text, errors)
    return config


def _interval_problems(intervals: dict[str, Any], base: tuple[str | int, ...]) -> list[Any]:
    """Each probe key of a schedule table must name a probe and give seconds or "continuous"."""
    found: list[Any] = []
    for probe, value in intervals.items():
        loc = (*base, probe)
        if probe not in PROBES:
            found.append((loc, f"unknown probe {probe!r} (known: {_known_probes()})"))
        elif value == "continuous":
            if not hasattr(PROBES[probe], "Stream"):
                found.append((loc, f"{probe} has no continuous mode (give seconds)"))
        elif isinstance(value, bool) or not isinstance(value, int | float):
            found.append((loc, f'give seconds between runs or "continuous" (got {value!r})'))
        elif not MIN_EVERY_S <= value <= MAX_EVERY_S:
            found.append(
                (loc, f"seconds between runs must be {MIN_EVERY_S:g} to {MAX_EVERY_S:g} "
                 f"(got {value!r})")
            )  # fmt: skip
    return found
