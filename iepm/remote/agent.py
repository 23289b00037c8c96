"""``iepm agent``: the responder a target host runs so that monitors can test it safely.

Over an authenticated HTTP API it reports host facts and grants **exclusive slots**: one
bandwidth test at a time on this host, in a one-shot server (``iperf3 -s -1``) on a port the
agent picks. Whatever the monitor does afterwards, the server is killed with its whole process
group at the slot's deadline and the test's work directory is removed.

Restart-safe: every server is recorded (PID and kernel start time) in ``<state_dir>/state.json``
before the grant is answered; at start-up the agent kills recorded servers that are still alive
(orphans of a previous run) and removes their work directories.

A mesh's control host may also have this host run one probe towards another (``POST /v1/runs``,
``iepm.remote.runs``): iepm's own ``iepm probe`` command, supervised and killed at its deadline,
within the monitor's ``[monitors.runs]`` limits; the answer holds the result and its raw log.

Nothing from a request reaches a shell: servers are started from an argv list, and the only
request fields that reach it are validated numbers and sizes.

The grant is enforced on what runs, not on what the monitor declared: the server kind's guard
reads the server's output as streams connect and the test starts, and the agent compares the
server's socket buffers (``ss -m``) with the granted window; a test beyond its grant is cut (its
server killed) and the slot says why. Server kinds live in ``servers.py``; the HTTP front (token
before body, size and time limits, strict JSON) in ``httpguard.py``; wire models in
``protocol.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import shutil
import signal
import socket
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from iepm import __version__
from iepm.errors import ToolNotFound
from iepm.remote.facts import host_facts, tcp_buffer_defaults
from iepm.remote.httpguard import (
    Gate,
    QuietAccept,
    connection_cap,
    refusal_response,
    unauthorized,
    uvicorn_options,
)
from iepm.remote.protocol import (
    SLOT_ID_PATTERN,
    Facts,
    Health,
    Refusal,
    RunAnswer,
    RunRequest,
    SlotGrant,
    SlotPhase,
    SlotRequest,
    SlotState,
    Usage,
)
from iepm.remote.runs import Refused, Runs
from iepm.remote.servers import KINDS, Grant, Guard, ServerKind, buffer_excess, buffer_sizes
from iepm.remote.trust import AgentConfig, MonitorEntry
from iepm.runner import (
    PIPE,
    STDOUT,
    Supervised,
    run_command,
    signal_group,
    start_process,
    tool_version,
)
from iepm.units import size_bytes

log = logging.getLogger("iepm.agent")

STATE_FILE = "state.json"
HOUR_S = 3600.0
# Finished slots kept for GET/DELETE after the fact (idempotent release).
RECENT_SLOTS = 64
# Deadline of one look at the server's sockets (ss).
SS_TIMEOUT_S = 3.0


def process_start_ticks(pid: int) -> int | None:
    """Kernel start time of a process (field 22 of /proc/PID/stat): PID plus this identifies it
    across PID reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


# The agent's servers are started and stopped by the project's one supervisor (iepm.runner):
# own process group, dying with the agent (also when it runs unprivileged), TERM then KILL.


async def spawn_server(argv: list[str], workdir: Path) -> Supervised:
    """A server with its output on one pipe and nothing of the environment but PATH."""
    return await start_process(
        argv,
        stdout=PIPE,
        stderr=STDOUT,
        cwd=workdir,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )


# ---------------------------------------------------------------------------------------------
# the agent


@dataclass
class Slot:
    slot_id: str
    monitor: str
    request: SlotRequest
    grant: Grant
    guard: Guard
    port: int
    workdir: Path
    process: Supervised
    start_ticks: int | None
    granted_at: datetime
    deadline_mono: float
    expected_end_mono: float
    state: SlotPhase = "running"
    ended_at: datetime | None = None
    cut_reason: str | None = None
    output: bytearray = field(default_factory=bytearray)
    watcher: asyncio.Task[None] | None = None

    def view(self) -> SlotState:
        return SlotState(
            slot_id=self.slot_id,
            monitor=self.monitor,
            port=self.port,
            state=self.state,
            granted_at=self.granted_at,
            ended_at=self.ended_at,
            server_exit=self.process.returncode,
            server_output=self.output[-4000:].decode("utf-8", errors="replace"),
            cut_reason=self.cut_reason,
        )


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.settings = config.agent
        self.state_dir = Path(self.settings.state_dir)
        self.current: Slot | None = None
        self.recent: dict[str, Slot] = {}
        self.grants: dict[str, deque[float]] = {}
        self.lock = asyncio.Lock()
        self.buffer_defaults = tcp_buffer_defaults()
        # Third-party tests a mesh's control host asks for (iepm.remote.runs).
        self.runs = Runs(self.settings, on_start=self._save_state)

    # -- start-up / shutdown -------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def work_root(self) -> Path:
        return self.state_dir / "work"

    @property
    def memory_root(self) -> Path:
        return Path(self.settings.memory_dir)

    def sweep_orphans(self) -> list[int]:
        """Kill servers a previous agent run recorded and left alive; remove their files."""
        killed: list[int] = []
        try:
            state = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            state = {}
        except (OSError, ValueError) as exc:
            log.warning(
                "state file %s unreadable (%s); sweeping work dirs only", self.state_path, exc
            )
            state = {}
        for entry in state.get("servers", []):
            pid, ticks = entry.get("pid"), entry.get("start_ticks")
            if isinstance(pid, int) and ticks is not None and process_start_ticks(pid) == ticks:
                signal_group(pid, signal.SIGKILL)
                killed.append(pid)
                log.warning("killed orphan server pid %d of slot %s", pid, entry.get("slot_id"))
        # Grants of the last hour survive a restart, so a restart does not reset the limits.
        now = time.time()
        for monitor, stamps in (state.get("grants") or {}).items():
            self.grants[monitor] = deque(t for t in stamps if now - t < HOUR_S)
        for monitor, stamps in (state.get("runs") or {}).items():
            self.runs.stamps[monitor] = deque(t for t in stamps if now - t < HOUR_S)
        for root in (self.work_root, self.memory_root):
            shutil.rmtree(root, ignore_errors=True)
        self.runs.sweep()
        self.work_root.mkdir(parents=True, exist_ok=True)
        self._save_state()
        return killed

    def _save_state(self) -> None:
        servers = []
        if self.current is not None and self.current.state == "running":
            s = self.current
            servers.append(
                {
                    "slot_id": s.slot_id,
                    "pid": s.process.pid,
                    "start_ticks": s.start_ticks,
                    "workdir": str(s.workdir),
                    "monitor": s.monitor,
                }
            )
        state = {
            "servers": servers,
            "grants": {m: list(d) for m, d in self.grants.items()},
            "runs": {m: list(d) for m, d in self.runs.stamps.items()},
        }
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        # Atomic rename, no fsync: orphans outlive only an agent crash, not a host crash, and
        # the page cache survives the former.
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_path)

    async def shutdown(self) -> None:
        if self.current is not None:
            await self._end(self.current, "released")

    # -- facts ----------------------------------------------------------------------------------

    async def facts(self) -> Facts:
        # Read afresh at each request (a few small files): a monitor's facts probe must see a
        # changed buffer limit at once. Tool versions are cached by tool_version itself.
        data = await asyncio.wait_for(asyncio.to_thread(host_facts), 10.0)
        tools = {
            kind.name: await tool_version([self.settings.program(kind.name), *kind.version_argv])
            for kind in KINDS.values()
        }
        facts = Facts.model_validate(
            {
                **data,
                "agent": self.settings.name,
                "version": __version__,
                "hostname": socket.gethostname(),
                "tools": tools,
            }
        )
        return facts

    # -- limits ---------------------------------------------------------------------------------

    def _recent_grants(self, monitor: str) -> deque[float]:
        stamps = self.grants.setdefault(monitor, deque())
        now = time.time()
        while stamps and now - stamps[0] >= HOUR_S:
            stamps.popleft()
        return stamps

    def check_limits(self, monitor: MonitorEntry, req: SlotRequest) -> None:
        """Refuse, naming the limit, before anything starts."""
        limits = monitor.limits

        def refuse(limit: str, message: str) -> Refused:
            return Refused(403, Refusal(error="limit", limit=limit, message=message))

        if req.server not in monitor.probes:
            known = "" if req.server in KINDS else f" (this agent serves {', '.join(KINDS)})"
            raise Refused(
                403,
                Refusal(
                    error="forbidden",
                    message=f"monitor {monitor.name} may not run {req.server} tests here{known}",
                ),
            )
        test_s = req.duration_s + req.omit_s
        if test_s > limits.max_duration_s:
            raise refuse(
                "max_duration_s",
                f"a {test_s} s test (duration + omit) exceeds max_duration_s = "
                f"{limits.max_duration_s} for monitor {monitor.name}",
            )
        if req.streams > limits.max_streams:
            raise refuse(
                "max_streams",
                f"{req.streams} streams exceed max_streams = {limits.max_streams} for monitor "
                f"{monitor.name}",
            )
        if req.window is not None and size_bytes(req.window, base=1024) > limits.max_window_bytes:
            raise refuse(
                "max_window",
                f"window {req.window} exceeds max_window = {limits.max_window} for monitor "
                f"{monitor.name}",
            )
        max_rate = limits.max_rate_bps
        if max_rate is not None and req.udp:
            asked = size_bytes(req.rate or "1M", base=1000)
            if asked == 0 or asked > max_rate:
                shown = req.rate if asked else "unlimited (0)"
                raise refuse(
                    "max_rate",
                    f"UDP rate {shown} exceeds max_rate = {limits.max_rate} for monitor "
                    f"{monitor.name}",
                )
        if req.size is not None and size_bytes(req.size, base=1024) > limits.max_size_bytes:
            raise refuse(
                "max_size",
                f"a {req.size} byte copy exceeds max_size = {limits.max_size} for monitor "
                f"{monitor.name}",
            )
        stamps = self._recent_grants(monitor.name)
        if len(stamps) >= limits.tests_per_hour:
            retry = max(1.0, math.ceil(stamps[0] + HOUR_S - time.time()))
            raise Refused(
                429,
                Refusal(
                    error="rate_limited",
                    limit="tests_per_hour",
                    message=f"monitor {monitor.name} already ran {len(stamps)} tests in the "
                    f"last hour (tests_per_hour = {limits.tests_per_hour}); retry in {retry:g} s",
                    retry_after_s=retry,
                ),
            )

    def usage(self, monitor: MonitorEntry) -> Usage:
        return Usage(
            monitor=monitor.name,
            busy=self.current is not None,
            retry_after_s=self._retry_after(),
            tests_last_hour=len(self._recent_grants(monitor.name)),
            servers=list(monitor.probes),
            limits=monitor.limits.model_dump(),
        )

    def _retry_after(self) -> float | None:
        if self.current is None:
            return None
        end = min(self.current.expected_end_mono, self.current.deadline_mono)
        return round(max(0.2, end - time.monotonic()), 1)

    # -- slots ----------------------------------------------------------------------------------

    async def open_slot(self, monitor: MonitorEntry, req: SlotRequest) -> SlotGrant:
        self.check_limits(monitor, req)
        async with self.lock:
            if self.current is not None:
                retry = self._retry_after() or 1.0
                holder = "you" if self.current.monitor == monitor.name else "another monitor"
                raise Refused(
                    409,
                    Refusal(
                        error="busy",
                        message=f"a bandwidth test by {holder} is running here; retry in "
                        f"{retry:g} s",
                        retry_after_s=retry,
                    ),
                )
            # Checked again under the lock: two requests of one monitor must not both pass.
            self.check_limits(monitor, req)
            t0 = time.monotonic()
            slot = await self._start_server(monitor, req)
            slot_ready_ms = (time.monotonic() - t0) * 1000
            self.current = slot
            self._recent_grants(monitor.name).append(time.time())
            self._save_state()
            slot.watcher = asyncio.create_task(self._watch(slot))
        log.info(
            "slot %s granted to %s: %s on port %d for %d s (label %r)",
            slot.slot_id,
            monitor.name,
            req.server,
            slot.port,
            req.duration_s,
            req.label,
        )
        deadline_s = slot.deadline_mono - time.monotonic()
        return SlotGrant(
            slot_id=slot.slot_id,
            server=req.server,
            port=slot.port,
            bind=self.settings.server_bind,
            monitor=monitor.name,
            label=req.label,
            granted_at=slot.granted_at,
            deadline_at=slot.granted_at + timedelta(seconds=deadline_s),
            deadline_s=round(deadline_s, 3),
            ready_ms=round(slot_ready_ms, 3),
        )

    def _candidate_ports(self) -> list[int]:
        low, high = self.settings.server_ports
        ports = list(range(low, high + 1))
        random.shuffle(ports)
        return ports[:8]

    async def _start_server(self, monitor: MonitorEntry, req: SlotRequest) -> Slot:
        kind = KINDS[req.server]
        limits = monitor.limits
        grant = Grant(
            streams=req.streams,
            test_s=req.duration_s + req.omit_s,
            udp=req.udp,
            window_bytes=(
                size_bytes(req.window, base=1024) if req.window else limits.max_window_bytes
            ),
            window_granted=req.window is not None,
            rate_bps=limits.max_rate_bps,
            size_bytes=size_bytes(req.size, base=1024) if req.size else limits.max_size_bytes,
        )
        slot_id = uuid.uuid4().hex
        root = self.memory_root if req.storage == "memory" else self.work_root
        workdir = root / slot_id
        workdir.mkdir(parents=True)
        if kind.setup is not None:
            kind.setup(workdir, grant)
        failures = []
        program = self.settings.program(kind.name)
        for port in self._candidate_ports():
            argv = kind.argv(program, port, self.settings.server_bind, grant.rate_bps)
            try:
                process = await spawn_server(argv, workdir)
            except (ToolNotFound, OSError) as exc:
                shutil.rmtree(workdir, ignore_errors=True)
                # The program's own name may be a site's path: the package is what to install.
                message = (
                    f"the {kind.name} server is not installed on this target (Debian: apt-get "
                    f"install {kind.package}): {exc}"
                    if isinstance(exc, ToolNotFound)
                    else str(exc)
                )
                raise Refused(503, Refusal(error="failed", message=message)) from None
            output = bytearray()
            started = time.monotonic()
            if await self._wait_listening(kind, process, output):
                now = time.monotonic()
                return Slot(
                    slot_id=slot_id,
                    monitor=monitor.name,
                    request=req,
                    grant=grant,
                    guard=kind.guard(grant),
                    port=port,
                    workdir=workdir,
                    process=process,
                    start_ticks=process_start_ticks(process.pid),
                    granted_at=datetime.now(UTC),
                    deadline_mono=now + grant.test_s + self.settings.slot_grace_s,
                    expected_end_mono=now + grant.test_s + 2.0,
                    output=output,
                )
            waited_s = time.monotonic() - started
            await process.stop()
            said = output.decode(errors="replace").strip()[-200:]
            if not said:
                # Silence is a reason too: the server hung before listening, or ended mute.
                limit_s = self.settings.server_start_timeout_s
                said = (
                    f"no answer within {limit_s:g} s"
                    if waited_s >= limit_s
                    else f"it ended without a word after {waited_s:.1f} s"
                )
            failures.append(f"port {port}: {said}")
            if b"in use" not in output:
                break
        shutil.rmtree(workdir, ignore_errors=True)
        raise Refused(
            503,
            Refusal(
                error="failed",
                message=f"the {kind.name} server did not start: " + "; ".join(failures),
            ),
        )

    async def _wait_listening(
        self, kind: ServerKind, server: Supervised, output: bytearray
    ) -> bool:
        process = server.process
        assert process.stdout is not None
        deadline = time.monotonic() + self.settings.server_start_timeout_s
        while time.monotonic() < deadline:
            try:
                line = await asyncio.wait_for(
                    process.stdout.readline(), deadline - time.monotonic()
                )
            except (TimeoutError, ValueError):
                return False
            if not line:
                return False
            output.extend(line)
            if kind.is_ready(line):
                return True
        return False

    async def _excess(self, slot: Slot) -> str | None:
        """Whether the server's sockets use bigger buffers than the grant allows (ss -m)."""
        argv = ["ss", "-tumnH", "state", "established", "(", "sport", "=", f":{slot.port}", ")"]
        raw = await run_command(argv, SS_TIMEOUT_S)
        if raw.returncode != 0:
            log.warning("slot %s: cannot read its sockets (%s)", slot.slot_id, raw.stderr[:200])
            return None
        # An untouched socket starts at tcp_[rw]mem's default; when the request named no
        # window it may autotune up to their maximum.
        start, most = self.buffer_defaults
        defaults = start if slot.grant.window_granted else most
        return buffer_excess(buffer_sizes(raw.stdout), slot.guard, slot.grant, defaults)

    async def _watch(self, slot: Slot) -> None:
        """Hold the test to its grant as it runs; kill it at the deadline; free the slot then
        at the latest."""
        stream = slot.process.process.stdout
        assert stream is not None

        async def follow() -> None:
            while True:
                try:
                    line = await stream.readline()
                except ValueError:  # a line longer than the reader's limit: not the guard's
                    line = await stream.read(65536)
                if not line:
                    return
                slot.output.extend(line)
                del slot.output[:-65536]
                reason = slot.guard.line(line)
                if reason is None and slot.guard.inspect_sockets(line):
                    reason = await self._excess(slot)
                if reason is not None:
                    slot.cut_reason = reason
                    return

        try:
            # follow() ends when the server closes its output (it exited) or the test is cut.
            await asyncio.wait_for(follow(), max(0.0, slot.deadline_mono - time.monotonic()))
            if slot.cut_reason is None:
                await asyncio.wait_for(
                    slot.process.process.wait(), max(0.0, slot.deadline_mono - time.monotonic())
                )
        except TimeoutError:
            if slot.cut_reason is None:
                log.warning(
                    "slot %s of %s reached its deadline; killing the server",
                    slot.slot_id,
                    slot.monitor,
                )
                await self._end(slot, "killed_at_deadline")
                return
        if slot.cut_reason is not None:
            log.warning("slot %s of %s cut: %s", slot.slot_id, slot.monitor, slot.cut_reason)
            await self._end(slot, "cut")
            return
        # The one-shot server is done: sweep its group and files, hold the slot for the release.
        slot.state = "finished"
        await slot.process.stop()
        shutil.rmtree(slot.workdir, ignore_errors=True)
        self._save_state()
        await asyncio.sleep(max(0.0, slot.deadline_mono - time.monotonic()))
        await self._end(slot, "expired")

    async def _end(self, slot: Slot, how: SlotPhase) -> None:
        if slot.state not in ("running", "finished"):
            return
        slot.state = how
        await slot.process.stop()
        shutil.rmtree(slot.workdir, ignore_errors=True)
        slot.ended_at = datetime.now(UTC)
        if self.current is slot:
            self.current = None
        self.recent[slot.slot_id] = slot
        while len(self.recent) > RECENT_SLOTS:
            self.recent.pop(next(iter(self.recent)))
        self._save_state()
        if slot.watcher is not None and slot.watcher is not asyncio.current_task():
            slot.watcher.cancel()
        log.info("slot %s of %s ended: %s", slot.slot_id, slot.monitor, how)

    def find(self, monitor: MonitorEntry, slot_id: str) -> Slot:
        slot = self.current if self.current and self.current.slot_id == slot_id else None
        slot = slot or self.recent.get(slot_id)
        # Another monitor's slot is reported as unknown: ids are not for probing.
        if slot is None or slot.monitor != monitor.name:
            raise Refused(404, Refusal(error="forbidden", message=f"no slot {slot_id} of yours"))
        return slot

    async def close_slot(self, monitor: MonitorEntry, slot_id: str) -> SlotState:
        slot = self.find(monitor, slot_id)
        await self._end(slot, "released")
        return slot.view()


# ---------------------------------------------------------------------------------------------
# the HTTP app

WHY: dict[int, str] = {
    400: "the body is not JSON this agent accepts (NaN, Infinity, a number too large)",
    401: "no credential, or one this agent does not know (checked before the body is read)",
    403: "not allowed, or a limit exceeded (named in `limit`)",
    404: "no such slot of this monitor",
    409: "another bandwidth test holds the slot (or max_runs runs are going on); retry after "
    "`retry_after_s`",
    413: "the body is larger than the agent's max_body_bytes",
    422: "a field is missing or out of range (named in `message`)",
    429: "tests_per_hour reached",
    503: "the server could not be started",
}


def refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI descriptions of the refusals an operation can answer (all with a Refusal body)."""
    return {code: {"model": Refusal, "description": WHY[code]} for code in codes}


def monitor_of(request: Request) -> MonitorEntry:
    """The monitor the Gate authenticated from this request's token, before its body."""
    monitor: MonitorEntry | None = request.scope.get("state", {}).get("monitor")
    if monitor is None:  # a route the Gate treats as public cannot ask for a monitor
        raise Refused(401, unauthorized(None))
    return monitor


Monitor = Annotated[MonitorEntry, Depends(monitor_of)]
SlotId = Annotated[str, PathParam(pattern=SLOT_ID_PATTERN)]


def _field_errors(exc: RequestValidationError) -> str:
    """One line naming each bad field: ``streams: Input should be ... (got 500)``."""
    parts = []
    for error in exc.errors()[:5]:
        loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "path", "query")]
        where = ".".join(loc) or "body"
        given = error.get("input")
        shown = f" (got {given!r:.40})" if isinstance(given, int | float | str | bool) else ""
        parts.append(f"{where}: {error.get('msg', 'invalid')}{shown}")
    return "; ".join(parts)


def create_app(config: AgentConfig) -> FastAPI:
    agent = Agent(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        killed = agent.sweep_orphans()
        if killed:
            log.warning("start-up: killed %d orphan server(s) of a previous run", len(killed))
        yield
        await agent.shutdown()

    app = FastAPI(
        title="iepm agent",
        version=__version__,
        lifespan=lifespan,
        description="Target-host responder: host facts and exclusive one-shot test servers.",
    )
    app.state.agent = agent
    app.add_middleware(
        Gate,
        authenticate=config.authenticate,
        public=frozenset({"/v1/health"}),
        max_body_bytes=config.agent.max_body_bytes,
    )

    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> JSONResponse:
        return refusal_response(exc.status, exc.refusal)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return refusal_response(422, Refusal(error="invalid", message=_field_errors(exc)))

    @app.get("/v1/health", response_model=Health, responses=refusals(400, 413))
    async def health() -> Health:
        return Health(status="ok", agent=config.agent.name, version=__version__)

    @app.get("/v1/facts", response_model=Facts, responses=refusals(400, 401, 413))
    async def facts(monitor: Monitor) -> Facts:
        return await agent.facts()

    @app.get("/v1/usage", response_model=Usage, responses=refusals(400, 401, 413))
    async def usage(monitor: Monitor) -> Usage:
        return agent.usage(monitor)

    @app.post(
        "/v1/slots",
        response_model=SlotGrant,
        status_code=201,
        responses=refusals(400, 401, 403, 409, 413, 422, 429, 503),
    )
    async def open_slot(monitor: Monitor, request: SlotRequest) -> SlotGrant:
        return await agent.open_slot(monitor, request)

    @app.get(
        "/v1/slots/{slot_id}", response_model=SlotState, responses=refusals(400, 401, 404, 413, 422)
    )
    async def slot_state(monitor: Monitor, slot_id: SlotId) -> SlotState:
        return agent.find(monitor, slot_id).view()

    @app.delete(
        "/v1/slots/{slot_id}", response_model=SlotState, responses=refusals(400, 401, 404, 413, 422)
    )
    async def close_slot(monitor: Monitor, slot_id: SlotId) -> SlotState:
        return await agent.close_slot(monitor, slot_id)

    @app.post(
        "/v1/runs",
        response_model=RunAnswer,
        responses=refusals(400, 401, 403, 409, 413, 422, 429),
    )
    async def run(monitor: Monitor, request: RunRequest) -> RunAnswer:
        """Run one probe from this host (a mesh's control host asks), within [monitors.runs];
        the answer holds the result envelope and the raw log. A run that fails is an answer
        too (its exit code and stderr), not a refusal."""
        return await agent.runs.run(monitor, request)

    return app


def serve(config: AgentConfig, host: str, port: int, *, log_level: str = "info") -> None:
    """Run the agent until SIGTERM/SIGINT (uvicorn), with TLS if agent.toml configures it."""
    import resource
    import ssl

    import uvicorn

    settings = config.agent
    # Connections are capped below the fd limit (servers, pipes and ss need some), so accept()
    # never fails for want of descriptors.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    fd_limit = None if soft == resource.RLIM_INFINITY else soft
    most = connection_cap(settings.max_connections, fd_limit)
    logging.getLogger("asyncio").addFilter(QuietAccept())
    options: dict[str, Any] = uvicorn_options(settings.request_timeout_s, most)
    if settings.tls_cert is not None:
        options |= {"ssl_certfile": settings.tls_cert, "ssl_keyfile": settings.tls_key}
        if settings.tls_client_ca is not None:
            options |= {"ssl_ca_certs": settings.tls_client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        **options,
    )
