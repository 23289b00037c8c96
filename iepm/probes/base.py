"""What every probe module shares: its contract (:class:`Probe`), its self-description
(:class:`ProbeMeta`, :class:`Metric`, :class:`Column`), the run context and the execute step.

A probe module exposes::

    NAME: str                       # "ping"
    TOOL: str                       # program it drives, "ping"
    META: ProbeMeta                 # scheduling class, gate, server kind, default, version argv
    METRICS: tuple[Metric, ...]     # the scalars of ``data`` that views plot, roll up, alert on
    COLUMNS: list[Column]           # scalar fields of ``data`` exported as table columns
    class Spec(ProbeSpec)           # pydantic parameters (each with description and range),
                                    # with deadline_s(); a field's CLI option name may be given
                                    # as json_schema_extra={"cli": "interval"}
    def build_argv(spec, address) -> list[str]
    def parse(raw: RawRun, spec: Spec | None = None) -> dict
                                    # pure: the same output and spec give the same data;
                                    # raises ParseError / ToolFailed
    def check(data, spec) -> str | None   # why a parsed run is still a failure, or None
    def summary(data) -> str        # one readable line of a run's figures (console, demo)
    async def run(spec, ctx) -> Result    # usually: return await execute(<module>, spec, ctx)

Everything else (config tables, ``iepm probe NAME``, charts, ``/metrics``, the daily rollup,
alert rules, console lines) is derived from these through :data:`iepm.probes.PROBES`.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from iepm.errors import ParseError, RemoteError, ToolFailed, ToolNotFound
from iepm.rawlog import RawLog
from iepm.results import Outcome, Result, utcnow
from iepm.runner import RawRun, run_command, tool_version

Scheduling = Literal["exclusive", "background"]
Better = Literal["higher", "lower"]


@dataclass(frozen=True)
class ProbeMeta:
    """How a probe is scheduled and what it needs.

    ``exclusive`` probes (bandwidth tests) run one at a time on a monitor; ``background``
    probes (ping, load) may overlap each other."""

    scheduling: Scheduling
    version_argv: tuple[str, ...] | None = None
    # A failed run of a gating probe skips the target's exclusive probes that cycle (when the
    # target's ping_expected is true): no bandwidth test towards a path that is down.
    gates: bool = False
    # Kind of server the probe needs on the target ("iperf3"), leased through the run
    # context; None: the target only has to answer (ping, traceroute).
    server: str | None = None
    # In a target's probe list when targets.toml gives none.
    default: bool = False
    # Measures the monitor host itself (load): ``iepm probe NAME`` then takes no TARGET.
    local: bool = False
    # An application copy and what it moves between ("memory": a generated source to a memory
    # sink, "disk": file to file); the compare page sets copies against iperf3 and each other.
    copy: Literal["memory", "disk"] | None = None


@dataclass(frozen=True)
class Health:
    """Absolute thresholds that colour a path by a metric (as MaDDash and Smokeping do), in
    the metric's own terms: ``kind`` "value": the value itself (loss above 0.1 %, 1 %);
    "over_baseline": percent above the path's baseline, its lowest level of the last 28 days
    (RTT: propagation with no queueing), ignoring excesses under ``floor`` (metric's unit);
    "share_of_expected": percent of the path's expected rate (given or tuned, else its usual
    level) that the value falls below. Sites override them per target or group."""

    kind: Literal["value", "over_baseline", "share_of_expected"]
    warn: float
    critical: float
    floor: float = 0.0


@dataclass(frozen=True)
class Metric:
    """One scalar of a probe's ``data`` that views plot (unit in the key, as stored).

    ``to_base``/``base_unit``: factor to the Prometheus base unit (ms → s 1e-3, percent →
    ratio 1e-2) and that unit's name. ``rollup``: summarised per day (long-term views).
    ``alert``: parameters of the step detector that turns a change into an alert (None: no
    alert); ``forecast``: the watcher forecasts it (the adaptive cadence). ``headline``: the
    overview grid colours paths by it. ``failed_runs``: a failed run's value is still a sample
    (a ping with no reply at all is 100% loss; a failed iperf3 has no throughput, not 0)."""

    probe: str
    key: str
    label: str
    better: Better
    to_base: float = 1.0
    base_unit: str = ""
    rollup: bool = False
    alert: dict[str, float | int] | None = field(default=None, hash=False)
    forecast: bool = False
    headline: bool = False
    failed_runs: bool = False
    down_value: float | None = None
    health: Health | None = None

    @property
    def name(self) -> str:
        return f"{self.probe}.{self.key}"


@dataclass(frozen=True)
class Column:
    """A table column: a key of ``Result.data`` (unit in its name) and its description."""

    name: str
    description: str


def figure(value: Any, fmt: str = ".3g") -> str:
    """A number for a summary line; "-" when the run has none."""
    return "-" if value is None else format(value, fmt)


class ProbeSpec(BaseModel):
    """Base for probe parameters: unknown fields are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    def deadline_s(self) -> float:
        raise NotImplementedError


@dataclass(frozen=True)
class ServerNeed:
    """What a probe will run against a server on the target. An agent checks it against the
    monitor's limits and holds the server to it; sizes in bytes, rates in bit/s."""

    kind: str
    duration_s: int
    omit_s: int = 0
    streams: int = 1
    window_bytes: int | None = None
    rate_bps: int | None = None
    udp: bool = False
    reverse: bool = False
    # A transfer server: the largest file the copy writes, and where the target keeps it
    # ("memory": a memory file system, "disk": a real one).
    size_bytes: int | None = None
    storage: Literal["memory", "disk"] = "disk"


# Server kind of a copy over SSH: no server is started, the lease is a private directory on the
# target and the login that reaches it (SSH targets only).
SSH_LOGIN = "ssh"


@dataclass(frozen=True)
class SshLogin:
    """How a copy over SSH logs in to the target: the lease's own access (key only, host key
    checked, no config file), for tools that run OpenSSH's client themselves (rsync -e)."""

    user: str
    port: int
    key_file: str
    known_hosts: str
    connect_timeout_s: float
    # The copy tool's program on the target ([targets.ssh] rsync_path).
    rsync_path: str = "rsync"

    def ssh_argv(self, *extra: str, connect_timeout_s: float | None = None) -> list[str]:
        """``ssh`` and the options that hold it to the lease's terms (never a prompt)."""
        timeout_s = self.connect_timeout_s if connect_timeout_s is None else connect_timeout_s
        return [
            "ssh", "-F", "none", "-p", str(self.port), "-i", self.key_file,
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
            "-o", "PreferredAuthentications=publickey",
            "-o", f"ConnectTimeout={max(1, round(timeout_s))}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2",
            *extra,
        ]  # fmt: skip


@dataclass(frozen=True)
class ServerLease:
    """A server the probe may use until the lease ends. ``port`` None: the probe's own port (a
    plain endpoint, nothing was started); ``note``: one line for the result's diags.
    ``directory``: a private directory on the target for the run's files (removed with the
    lease); ``login``: how to log in to the target over SSH (kind "ssh")."""

    address: str
    port: int | None = None
    note: str = ""
    directory: str | None = None
    login: SshLogin | None = None


class ServerSource(Protocol):
    """Starts servers on a target for the length of one probe run (``iepm.remote`` implements it
    for agent and SSH targets); probes see it only through ``ProbeContext.server``."""

    def lease(
        self, need: ServerNeed, *, target: str, address: str, netns: str | None
    ) -> AbstractAsyncContextManager[ServerLease]: ...


@runtime_checkable
class FactsSource(Protocol):
    """Reads the target host's facts (``iepm.remote``: an agent's ``/v1/facts``, or ``argv``
    run over SSH); the answer is a RawRun whose stdout is the JSON document received.
    RemoteError when the target cannot be reached in ``deadline_s``."""

    async def facts(
        self, argv: list[str], *, target: str, address: str, netns: str | None, deadline_s: float
    ) -> RawRun: ...


class Probe(Protocol):
    """The contract of a probe module (see the module docstring); modules satisfy it as they
    are, so :data:`iepm.probes.PROBES` is typed without a base class."""

    NAME: str
    TOOL: str
    META: ProbeMeta
    METRICS: tuple[Metric, ...]
    COLUMNS: Sequence[Column]
    Spec: type[ProbeSpec]

    def build_argv(self, spec: Any, address: str) -> list[str]: ...

    def parse(self, raw: RawRun, spec: Any = None) -> dict[str, Any]: ...

    def check(self, data: dict[str, Any], spec: Any) -> str | None: ...

    def summary(self, data: dict[str, Any]) -> str: ...

    async def run(self, spec: Any, ctx: ProbeContext) -> Result: ...


# What register() checks a module has (the Protocol's members).
CONTRACT = (
    "NAME", "TOOL", "META", "METRICS", "COLUMNS", "Spec",
    "build_argv", "parse", "check", "summary", "run",
)  # fmt: skip


@dataclass
class ProbeContext:
    """Where a probe runs and where its output goes."""

    target: str
    address: str
    monitor: str = socket.gethostname()
    raw_log: RawLog | None = None
    # Run the tool inside this network namespace (the lab's monitor host).
    netns: str | None = None
    # Agent or SSH target: servers are started there for each test (None: a plain endpoint).
    servers: ServerSource | None = None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        if self.netns:
            return ["ip", "netns", "exec", self.netns, *argv]
        return list(argv)

    def server(self, need: ServerNeed) -> AbstractAsyncContextManager[ServerLease]:
        """A server of ``need.kind`` for the block: started (and always stopped) on an agent or
        SSH target; on a plain endpoint, the one already listening there. RemoteError or
        ConfigError when it cannot be had."""
        if self.servers is None:
            return _plain(self.address)
        return self.servers.lease(need, target=self.target, address=self.address, netns=self.netns)

    def can_read_facts(self) -> bool:
        """Whether the target's host facts can be read (an agent or SSH target)."""
        return isinstance(self.servers, FactsSource)

    async def facts(self, argv: list[str], deadline_s: float) -> RawRun:
        """The target's facts document (see :class:`FactsSource`)."""
        if not isinstance(self.servers, FactsSource):
            raise RemoteError(f"{self.target} is a plain endpoint: its facts cannot be read")
        return await self.servers.facts(
            argv, target=self.target, address=self.address, netns=self.netns, deadline_s=deadline_s
        )


@contextlib.asynccontextmanager
async def _plain(address: str) -> AsyncIterator[ServerLease]:
    yield ServerLease(address)


def failed_result(
    module: ModuleType,
    spec: ProbeSpec,
    ctx: ProbeContext,
    error: str,
    *,
    outcome: Outcome = Outcome.FAILED,
    diags: str = "",
    tool_version_text: str | None = None,
) -> Result:
    return Result(
        probe=module.NAME,
        tool=module.TOOL,
        tool_version=tool_version_text,
        monitor=ctx.monitor,
        target=ctx.target,
        target_address=ctx.address,
        started_at=utcnow(),
        outcome=outcome,
        error=error,
        diags=diags,
        params=spec.model_dump(mode="json"),
    )


def skipped_result(module: ModuleType, spec: ProbeSpec, ctx: ProbeContext, why: str) -> Result:
    return failed_result(module, spec, ctx, why, outcome=Outcome.SKIPPED)


def result_from_raw(
    module: ModuleType,
    spec: ProbeSpec,
    ctx: ProbeContext,
    raw: RawRun,
    version: str | None,
) -> Result:
    """Turn a captured run into a Result; failures become data, never exceptions."""
    parse: Callable[[RawRun, Any], dict[str, Any]] = module.parse
    check: Callable[[dict[str, Any], Any], str | None] = module.check
    data: dict[str, Any] = {}
    error: str | None = None
    outcome = Outcome.OK
    try:
        data = parse(raw, spec)
        error = check(data, spec)
    except (ParseError, ToolFailed) as exc:
        error = str(exc)
    if raw.timed_out:
        outcome = Outcome.TIMEOUT
        error = (
            f"{module.TOOL} to {ctx.target} ({ctx.address}) did not finish within its "
            f"{spec.deadline_s():g} s deadline and was killed" + (f"; {error}" if error else "")
        )
    elif error is not None:
        outcome = Outcome.FAILED
    return Result(
        probe=module.NAME,
        tool=module.TOOL,
        tool_version=version,
        monitor=ctx.monitor,
        target=ctx.target,
        target_address=ctx.address,
        started_at=raw.started_at,
        duration_s=round(raw.duration_s, 6),
        outcome=outcome,
        error=error,
        diags=raw.diags(),
        raw_token=raw.token,
        params=spec.model_dump(mode="json"),
        data=data,
    )


async def execute(module: ModuleType, spec: ProbeSpec, ctx: ProbeContext) -> Result:
    """Build argv, run it with the spec's deadline, log it raw, parse it."""
    meta: ProbeMeta = module.META
    version = await tool_version(ctx.wrap(meta.version_argv)) if meta.version_argv else None
    argv = ctx.wrap(module.build_argv(spec, ctx.address))
    # A probe may end its tool once the output says enough (traceroute's gap limit).
    stop_when = module.stop_when(spec) if hasattr(module, "stop_when") else None
    try:
        raw = await run_command(argv, spec.deadline_s(), stop_when=stop_when)
    except ToolNotFound as exc:
        return failed_result(module, spec, ctx, str(exc), diags=shlex.join(argv))
    if ctx.raw_log is not None:
        ctx.raw_log.append(ctx.target, module.NAME, raw, params=spec.model_dump(mode="json"))
    return result_from_raw(module, spec, ctx, raw, version)
