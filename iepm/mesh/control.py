"""RTPL's model: one control host runs the whole mesh through the hosts' agents.

``iepm run --mesh FILE --control`` (the mesh has a ``[mesh.control]`` table) runs, in one
process, one scheduler per host that has tests — each exactly the scheduler ``iepm run --mesh
FILE --as HOST`` would run (the same derived targets, cycles, sanity rule, and the archive's host
leases on both ends of a bandwidth test, held by the source host's name) — but each probe runs
on the source host: :class:`AgentExecutor` sends it to that host's ``iepm agent``
(``POST /v1/runs``), which runs ``iepm probe`` there within its ``[monitors.runs]`` limits and
answers with the result envelope and the raw log. The result is stored with the source host as
its monitor, so the grid and pair pages show it as usual, and its raw-log record is appended to
the control host's raw log (``iepm extract`` works there). A bandwidth test's server comes from
the destination's agent, asked by the source's agent with its own token.

Refusals (a limit, a credential, an unreachable agent) are failed results whose error says what
to change, never exceptions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from iepm.config import Config, TargetConfig
from iepm.errors import ConfigError, RemoteError
from iepm.mesh.load import LoadedMesh, MeshSource, load_mesh, pairs_from
from iepm.probes.base import ProbeContext, ProbeSpec, failed_result
from iepm.rawlog import read_log
from iepm.remote.access import AgentAccess
from iepm.remote.client import AgentClient, Refusal
from iepm.remote.protocol import RunAnswer, RunRequest, ServerAgent
from iepm.results import Outcome, Result

if TYPE_CHECKING:
    from iepm.mesh.leases import HostLeases
    from iepm.scheduler import CycleReport, Scheduler
    from iepm.store import Archive

log = logging.getLogger(__name__)

# Time the run's deadline leaves for starting `iepm probe` on the source host: a Python start,
# which takes seconds on a loaded host (over 18 s seen at a load average of 12-15 on 2 cores).
START_MARGIN_S = 30.0
# The answer's own deadline past the run's (the agent answers as soon as the run ends).
ANSWER_MARGIN_S = 5.0


def sources(loaded: LoadedMesh) -> list[str]:
    """The hosts that run tests, in the mesh's order."""
    running = {p.source for p in loaded.expansion.pairs}
    return [h for h in loaded.mesh.host_names() if h in running]


def control_mesh(path: str | Path) -> LoadedMesh:
    """The mesh, which must have ``[mesh.control]`` (checked for control mode at load)."""
    loaded = load_mesh(path)
    if loaded.mesh.mesh.control is None:
        raise ConfigError(
            f"{loaded.where}: --control needs a [mesh.control] table in the mesh file (without "
            "it each host runs its own `iepm run --mesh FILE --as HOST`)"
        )
    return loaded


@dataclass
class AgentExecutor:
    """The scheduler's ``execute`` for one source host: each probe runs on that host's agent."""

    host: str
    access: AgentAccess
    netns: str | None = None
    busy_wait_s: float = 60.0
    # Added by the scheduler to the probe's deadline and host lease: the run's start margin,
    # the answer, and a wait while the agent is busy.
    overhead_s: float = START_MARGIN_S + ANSWER_MARGIN_S

    def __post_init__(self) -> None:
        self.overhead_s = START_MARGIN_S + ANSWER_MARGIN_S + self.busy_wait_s

    def request(self, module: ModuleType, spec: ProbeSpec, target: TargetConfig) -> RunRequest:
        server = None
        setup_s = 0.0
        if module.META.server is not None and target.mode == "agent":
            assert target.agent is not None
            server = ServerAgent(url=target.agent.url, slot_wait_s=target.agent.slot_wait_s)
            setup_s = target.agent.setup_budget_s()
        return RunRequest(
            probe=module.NAME,
            target=target.name,
            address=target.address,
            # What the mesh and the tuned values set; `iepm probe` there fills in the defaults.
            params=spec.model_dump(mode="json", exclude_defaults=True, exclude_none=True),
            deadline_s=round(spec.deadline_s() + setup_s + START_MARGIN_S, 3),
            server_agent=server,
        )

    async def __call__(
        self, module: ModuleType, spec: ProbeSpec, ctx: ProbeContext, target: TargetConfig
    ) -> Result:
        t0 = time.monotonic()

        def failed(why: str, outcome: Outcome = Outcome.FAILED, diags: str = "") -> Result:
            result = failed_result(module, spec, ctx, why, outcome=outcome, diags=diags)
            return result.model_copy(update={"duration_s": time.monotonic() - t0})

        if module.META.server is not None and target.mode == "ssh":
            return failed(
                f"{module.NAME} from {self.host} to {target.name}: in control mode a server "
                "comes from the destination's agent or is already running; SSH targets are not "
                "reached (make it mode = 'agent' in the mesh file)"
            )
        try:
            request = self.request(module, spec, target)
            client = AgentClient.from_access(self.access, netns=self.netns)
            client.timeout_s = min(client.timeout_s, ANSWER_MARGIN_S)
            answer = await self._run(client, request)
        except Refusal as exc:
            return failed(f"{self.host}'s agent refused {module.NAME} to {target.name}: {exc}")
        except (RemoteError, ConfigError) as exc:
            return failed(f"{self.host}'s agent could not run {module.NAME}: {exc}")
        except ValueError as exc:  # a request the wire model refuses (a parameter's shape)
            first = str(exc).splitlines()
            return failed(
                f"{module.NAME} to {target.name} cannot be sent to {self.host}'s agent: "
                f"{' '.join(first[:3])}"
            )
        self._keep_raw_log(answer, ctx)
        return self._result(answer, module, spec, ctx, failed)

    async def _run(self, client: AgentClient, request: RunRequest) -> RunAnswer:
        """The run; while the agent runs its max_runs others (409), wait as it advises."""
        give_up = time.monotonic() + self.busy_wait_s
        while True:
            try:
                return await client.run(request)
            except Refusal as exc:
                left = give_up - time.monotonic()
                if exc.status != 409 or left <= 0:
                    raise
                await asyncio.sleep(min(left, float(exc.retry_after_s or 1.0)))

    def _keep_raw_log(self, answer: RunAnswer, ctx: ProbeContext) -> None:
        if ctx.raw_log is None or not answer.raw_log:
            return
        with tempfile.TemporaryDirectory(prefix="iepm-run-") as tmp:
            path = Path(tmp) / "run.log"
            path.write_text(answer.raw_log, encoding="utf-8")
            for run in read_log(path):
                ctx.raw_log.append(ctx.target, answer.probe, run.raw, run.params)

    def _result(
        self,
        answer: RunAnswer,
        module: ModuleType,
        spec: ProbeSpec,
        ctx: ProbeContext,
        failed: Callable[..., Result],
    ) -> Result:
        where = f"[run {answer.run_id} on {self.host}'s agent {answer.agent}: {answer.state}]"
        stderr = answer.stderr.strip().splitlines()
        if answer.envelope is None:
            if answer.state == "killed_at_deadline":
                return failed(
                    f"{module.NAME} on {self.host} to {ctx.target} reached its deadline "
                    f"and was killed there",
                    Outcome.TIMEOUT,
                    where,
                )
            why = stderr[-1] if stderr else f"exit {answer.exit_code}, no result printed"
            return failed(f"{module.NAME} on {self.host} to {ctx.target}: {why}", diags=where)
        try:
            result = Result.model_validate(answer.envelope)
        except ValueError as exc:
            return failed(
                f"{self.host}'s agent returned a result this host cannot read: "
                f"{str(exc).splitlines()[0]}",
                diags=where,
            )
        if result.probe != module.NAME:
            return failed(f"{self.host}'s agent returned a {result.probe} result", diags=where)
        return result.model_copy(
            update={
                "monitor": self.host,
                "target": ctx.target,
                "diags": f"{result.diags or ''}\n{where}".lstrip("\n"),
            }
        )


def own_dirs(config: Config, shared: bool) -> Config:
    """A source's config with a log directory of its own (raw log, spool) when the mesh gives
    every host the same one: ``LOG_DIR/HOST``."""
    if not shared:
        return config
    log_dir = str(Path(config.monitor.log_dir) / config.monitor.name)
    monitor = config.monitor.model_copy(update={"log_dir": log_dir})
    return config.model_copy(update={"monitor": monitor})


@dataclass
class Source:
    host: str
    scheduler: Scheduler
    leases: HostLeases | None


class Control:
    """The control host's schedulers, one per source host, and what they hold."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.loaded = control_mesh(path)
        self.hosts = sources(self.loaded)
        self.sources: list[Source] = []

    def build(
        self,
        archive_for: Callable[[Config], Archive],
        on_result: Callable[[Result], None] | None = None,
    ) -> list[Source]:
        from iepm.scheduler import Scheduler

        mesh = self.loaded.mesh
        info = mesh.mesh.control
        assert info is not None
        configs = {h: self.loaded.config_for(h) for h in self.hosts}
        dirs = [c.monitor.log_dir for c in configs.values()]
        shared = len(set(dirs)) != len(dirs)
        for host in self.hosts:
            source = MeshSource(self.path, host)
            access = mesh.host(host).agent
            assert access is not None  # checked at load: control mode needs agent hosts

            def configure(cycle: int, source: MeshSource = source) -> Config:
                return own_dirs(source(cycle), shared)

            leases = source.leases()
            config = own_dirs(configs[host], shared)
            scheduler = Scheduler(
                config,
                archive_for(config),
                on_result=on_result,
                configure=configure,
                host_lease=leases,
                execute=AgentExecutor(host, access, info.netns, info.busy_wait_s),
            )
            self.sources.append(Source(host, scheduler, leases))
        return self.sources

    async def run(
        self, cycles: int | None, on_cycle: Callable[[str, CycleReport], None] | None = None
    ) -> None:
        """Every source's cycles side by side (forever when ``cycles`` is None)."""

        async def one(source: Source) -> None:
            def report(r: CycleReport) -> None:
                if on_cycle is not None:
                    on_cycle(source.host, r)

            await source.scheduler.run(cycles=cycles, on_cycle=report)

        await asyncio.gather(*(one(s) for s in self.sources))

    def close(self) -> None:
        for source in self.sources:
            if source.leases is not None:
                with contextlib.suppress(Exception):
                    source.leases.close()


def describe_control(loaded: LoadedMesh) -> list[str]:
    """Lines for ``iepm validate`` and ``iepm mesh show`` about control mode."""
    info = loaded.mesh.mesh.control
    if info is None:
        return []
    hosts = sources(loaded)
    lines = [
        f"  control mode: one `iepm run --mesh FILE --control` runs the tests of {len(hosts)} "
        "hosts through their agents (POST /v1/runs; each host's agent.toml needs "
        "a monitors.runs table for the control host)"
    ]
    for host in hosts:
        access = loaded.mesh.host(host).agent
        n = len(pairs_from(loaded.expansion, host))
        lines.append(f"    {host:<20} via {access.url if access else '?'} ({n} pairs)")
    return lines
