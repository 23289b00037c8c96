"""What every probe module shares: its metadata, the run context and the execute step.

A probe module exposes::

    NAME: str                       # "ping"
    TOOL: str                       # program it drives, "ping"
    META: ProbeMeta                 # scheduling class and how to ask the tool its version
    COLUMNS: list[Column]           # scalar fields of ``data`` exported as table columns
    class Spec(ProbeSpec)           # pydantic parameters, with deadline_s()
    def build_argv(spec, address) -> list[str]
    def parse(raw: RawRun, spec: Spec | None = None) -> dict
                                    # pure: the same output and spec give the same data;
                                    # raises ParseError / ToolFailed
    def check(data, spec) -> str | None   # why a parsed run is still a failure, or None
    async def run(spec, ctx) -> Result    # usually: return await execute(<module>, spec, ctx)
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from iepm.errors import ParseError, ToolFailed, ToolNotFound
from iepm.rawlog import RawLog
from iepm.results import Outcome, Result, utcnow
from iepm.runner import RawRun, run_command, tool_version

if TYPE_CHECKING:
    from iepm.config import AgentAccess, SshAccess

Scheduling = Literal["exclusive", "background"]


@dataclass(frozen=True)
class ProbeMeta:
    """``exclusive`` probes (bandwidth tests) run one at a time on a monitor; ``background``
    probes (ping, load) may overlap each other."""

    scheduling: Scheduling
    version_argv: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Column:
    """A table column: a key of ``Result.data`` (unit in its name) and its description."""

    name: str
    description: str


class ProbeSpec(BaseModel):
    """Base for probe parameters: unknown fields are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    def deadline_s(self) -> float:
        raise NotImplementedError


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
    remote: AgentAccess | SshAccess | None = None

    def wrap(self, argv: Sequence[str]) -> list[str]:
        if self.netns:
            return ["ip", "netns", "exec", self.netns, *argv]
        return list(argv)


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
        succeeded=False,
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
        succeeded=outcome is Outcome.OK,
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
    try:
        raw = await run_command(argv, spec.deadline_s())
    except ToolNotFound as exc:
        return failed_result(module, spec, ctx, str(exc), diags=shlex.join(argv))
    if ctx.raw_log is not None:
        ctx.raw_log.append(ctx.target, module.NAME, raw, params=spec.model_dump(mode="json"))
    return result_from_raw(module, spec, ctx, raw, version)
