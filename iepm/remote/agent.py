"""``iepm agent``: the responder a target host runs so that monitors can test it safely.

Over an authenticated HTTP API it reports host facts and grants **exclusive slots**: one
bandwidth test at a time on this host, in a one-shot server (``iperf3 -s -1``) on a port the
agent picks. Whatever the monitor does afterwards, the server is killed with its whole process
group at the slot's deadline and the test's work directory is removed.

Restart-safe: every server is recorded (PID and kernel start time) in ``<state_dir>/state.json``
before the grant is answered; at start-up the agent kills recorded servers that are still alive
(orphans of a previous run) and removes their work directories.

Nothing from a request reaches a shell: servers are started from an argv list, and the only
request fields that reach it are validated numbers and sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import math
import os
import platform
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
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Request
from fastapi import Path as PathParam
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator

from iepm import __version__
from iepm.probes import load
from iepm.probes.iperf3 import SIZE_RE, size_bytes
from iepm.remote.trust import AgentConfig, MonitorEntry
from iepm.runner import run_command, tool_version

log = logging.getLogger("iepm.agent")

STATE_FILE = "state.json"
SLOT_ID_PATTERN = r"^[0-9a-f]{32}$"
KILL_GRACE_S = 1.0
HOUR_S = 3600.0
# Finished slots kept for GET/DELETE after the fact (idempotent release).
RECENT_SLOTS = 64

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_agent() -> None:
    """In the server before exec: if the agent is killed, so is the server (the state file
    sweep at the next start is the second line of defence)."""
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def process_start_ticks(pid: int) -> int | None:
    """Kernel start time of a process (field 22 of /proc/PID/stat): PID plus this identifies it
    across PID reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


# ---------------------------------------------------------------------------------------------
# API models


class SlotRequest(BaseModel):
    """What the monitor will run against the server. Checked against its limits before anything
    starts."""

    model_config = ConfigDict(extra="forbid")

    probe: Literal["iperf3"] = "iperf3"
    duration_s: int = Field(default=10, ge=1, le=3600)
    omit_s: int = Field(default=0, ge=0, le=60)
    streams: int = Field(default=1, ge=1, le=128)
    window: str | None = Field(default=None, max_length=16)
    udp: bool = False
    rate: str | None = Field(default=None, max_length=16)
    reverse: bool = False
    # Free text the monitor attaches (its target name, say): stored, never executed.
    label: str | None = Field(default=None, max_length=128)

    @field_validator("window", "rate")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None and not SIZE_RE.match(value):
            raise ValueError("must be a number with an optional K/M/G suffix, e.g. 256K or 100M")
        return value


class SlotGrant(BaseModel):
    slot_id: str
    probe: str
    port: int
    bind: str | None
    monitor: str
    label: str | None
    granted_at: datetime
    deadline_at: datetime
    deadline_s: float
    ready_ms: float


class SlotState(BaseModel):
    slot_id: str
    monitor: str
    port: int
    # running: server up; finished: the test ended, the slot is held until released (so the
    # next test cannot start before this monitor's client is done) or until its deadline.
    state: Literal["running", "finished", "released", "killed_at_deadline", "expired"]
    granted_at: datetime
    ended_at: datetime | None
    server_exit: int | None
    server_output: str


class Refusal(BaseModel):
    error: Literal["unauthorized", "forbidden", "limit", "busy", "rate_limited", "failed"]
    message: str
    limit: str | None = None
    retry_after_s: float | None = None


class Health(BaseModel):
    status: Literal["ok"]
    agent: str
    version: str


class Facts(BaseModel):
    agent: str
    version: str
    hostname: str
    os: str | None
    machine: str
    kernel: str | None
    cpu_count: int | None
    cpu_mhz: float | None
    cpu_model: str | None
    memory_total_bytes: int | None
    tcp_rmem_bytes: list[int] | None
    tcp_wmem_bytes: list[int] | None
    rmem_max_bytes: int | None
    wmem_max_bytes: int | None
    tcp_congestion_control: str | None
    tcp_available_congestion_control: list[str] | None
    nics: dict[str, dict[str, Any]]
    tools: dict[str, str | None]


class Usage(BaseModel):
    monitor: str
    busy: bool
    retry_after_s: float | None
    tests_last_hour: int
    limits: dict[str, Any]


# ---------------------------------------------------------------------------------------------
# the agent


class Refused(Exception):
    def __init__(self, status: int, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.status = status
        self.refusal = refusal


@dataclass
class Slot:
    slot_id: str
    monitor: str
    request: SlotRequest
    port: int
    workdir: Path
    process: asyncio.subprocess.Process
    start_ticks: int | None
    granted_at: datetime
    deadline_mono: float
    expected_end_mono: float
    state: str = "running"
    ended_at: datetime | None = None
    output: bytearray = field(default_factory=bytearray)
    watcher: asyncio.Task[None] | None = None

    def view(self) -> SlotState:
        return SlotState(
            slot_id=self.slot_id,
            monitor=self.monitor,
            port=self.port,
            state=self.state,  # type: ignore[arg-type]
            granted_at=self.granted_at,
            ended_at=self.ended_at,
            server_exit=self.process.returncode,
            server_output=self.output[-4000:].decode("utf-8", errors="replace"),
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
        self._facts: tuple[float, Facts] | None = None

    # -- start-up / shutdown -------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    @property
    def work_root(self) -> Path:
        return self.state_dir / "work"

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
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
                log.warning("killed orphan server pid %d of slot %s", pid, entry.get("slot_id"))
        # Grants of the last hour survive a restart, so a restart does not reset the limits.
        now = time.time()
        for monitor, stamps in (state.get("grants") or {}).items():
            self.grants[monitor] = deque(t for t in stamps if now - t < HOUR_S)
        shutil.rmtree(self.work_root, ignore_errors=True)
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
        state = {"servers": servers, "grants": {m: list(d) for m, d in self.grants.items()}}
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
        if self._facts is not None and time.monotonic() - self._facts[0] < 60.0:
            return self._facts[1]
        raw = await run_command(load.build_argv(load.Spec(), ""), 10.0)
        data = load.parse(raw)
        os_name = None
        with contextlib.suppress(OSError):
            for line in Path("/etc/os-release").read_text().splitlines():
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
        facts = Facts(
            agent=self.settings.name,
            version=__version__,
            hostname=socket.gethostname(),
            os=os_name,
            machine=platform.machine(),
            kernel=data.get("kernel_release"),
            cpu_count=data.get("cpu_count"),
            cpu_mhz=data.get("cpu_mhz"),
            cpu_model=data.get("cpu_model"),
            memory_total_bytes=data.get("memory_total_bytes"),
            tcp_rmem_bytes=data.get("tcp_rmem_bytes"),
            tcp_wmem_bytes=data.get("tcp_wmem_bytes"),
            rmem_max_bytes=data.get("rmem_max_bytes"),
            wmem_max_bytes=data.get("wmem_max_bytes"),
            tcp_congestion_control=data.get("tcp_congestion_control"),
            tcp_available_congestion_control=data.get("tcp_available_congestion_control"),
            nics=data.get("nics") or {},
            tools={"iperf3": await tool_version([self.settings.iperf3_path, "--version"])},
        )
        self._facts = (time.monotonic(), facts)
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

        if req.probe not in monitor.probes:
            raise Refused(
                403,
                Refusal(
                    error="forbidden",
                    message=f"monitor {monitor.name} may not run {req.probe} tests here",
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
            req.probe,
            slot.port,
            req.duration_s,
            req.label,
        )
        deadline_s = slot.deadline_mono - time.monotonic()
        return SlotGrant(
            slot_id=slot.slot_id,
            probe=req.probe,
            port=slot.port,
            bind=self.settings.server_bind,
            monitor=monitor.name,
            label=req.label,
            granted_at=slot.granted_at,
            deadline_at=slot.granted_at + timedelta(seconds=deadline_s),
            deadline_s=round(deadline_s, 3),
            ready_ms=round(slot_ready_ms, 3),
        )

    def _server_argv(self, monitor: MonitorEntry, port: int) -> list[str]:
        argv = [self.settings.iperf3_path, "-s", "-1", "-p", str(port), "--forceflush"]
        if self.settings.server_bind is not None:
            argv += ["-B", self.settings.server_bind]
        if monitor.limits.max_rate is not None:
            # iperf3 ends a test whose average total rate exceeds this.
            argv += ["--server-bitrate-limit", monitor.limits.max_rate]
        return argv

    def _candidate_ports(self) -> list[int]:
        low, high = self.settings.server_ports
        ports = list(range(low, high + 1))
        random.shuffle(ports)
        return ports[:8]

    async def _start_server(self, monitor: MonitorEntry, req: SlotRequest) -> Slot:
        slot_id = uuid.uuid4().hex
        workdir = self.work_root / slot_id
        workdir.mkdir(parents=True)
        failures = []
        for port in self._candidate_ports():
            argv = self._server_argv(monitor, port)
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=workdir,
                    start_new_session=True,
                    preexec_fn=_die_with_agent,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
                )
            except OSError as exc:
                shutil.rmtree(workdir, ignore_errors=True)
                raise Refused(
                    503,
                    Refusal(error="failed", message=f"cannot start {argv[0]}: {exc.strerror}"),
                ) from None
            output = bytearray()
            if await self._wait_listening(process, output):
                now = time.monotonic()
                test_s = req.duration_s + req.omit_s
                return Slot(
                    slot_id=slot_id,
                    monitor=monitor.name,
                    request=req,
                    port=port,
                    workdir=workdir,
                    process=process,
                    start_ticks=process_start_ticks(process.pid),
                    granted_at=datetime.now(UTC),
                    deadline_mono=now + test_s + self.settings.slot_grace_s,
                    expected_end_mono=now + test_s + 2.0,
                    output=output,
                )
            await self._kill_group(process)
            failures.append(f"port {port}: {output.decode(errors='replace').strip()[-200:]}")
            if b"in use" not in output:
                break
        shutil.rmtree(workdir, ignore_errors=True)
        raise Refused(
            503,
            Refusal(
                error="failed", message="the iperf3 server did not start: " + "; ".join(failures)
            ),
        )

    async def _wait_listening(self, process: asyncio.subprocess.Process, output: bytearray) -> bool:
        assert process.stdout is not None
        deadline = time.monotonic() + self.settings.server_start_timeout_s
        while time.monotonic() < deadline:
            try:
                line = await asyncio.wait_for(
                    process.stdout.readline(), deadline - time.monotonic()
                )
            except TimeoutError:
                return False
            if not line:
                return False
            output.extend(line)
            if b"Server listening on" in line:
                return True
        return False

    async def _watch(self, slot: Slot) -> None:
        """Keep the server's output; kill it at the deadline; free the slot then at the latest."""
        assert slot.process.stdout is not None
        stream = slot.process.stdout

        async def drain() -> None:
            while chunk := await stream.read(65536):
                slot.output.extend(chunk)
                del slot.output[:-65536]

        try:
            await asyncio.wait_for(
                asyncio.gather(drain(), slot.process.wait()),
                max(0.0, slot.deadline_mono - time.monotonic()),
            )
        except TimeoutError:
            log.warning(
                "slot %s of %s reached its deadline; killing the server", slot.slot_id, slot.monitor
            )
            await self._end(slot, "killed_at_deadline")
            return
        # The one-shot server is done: sweep its group and files, hold the slot for the release.
        slot.state = "finished"
        await self._kill_group(slot.process)
        shutil.rmtree(slot.workdir, ignore_errors=True)
        self._save_state()
        await asyncio.sleep(max(0.0, slot.deadline_mono - time.monotonic()))
        await self._end(slot, "expired")

    async def _kill_group(self, process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), KILL_GRACE_S)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), 5.0)

    async def _end(self, slot: Slot, how: str) -> None:
        if slot.state not in ("running", "finished"):
            return
        slot.state = how
        await self._kill_group(slot.process)
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


def refusal_response(status: int, refusal: Refusal) -> JSONResponse:
    headers = {}
    if refusal.retry_after_s is not None:
        headers["Retry-After"] = str(math.ceil(refusal.retry_after_s))
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(refusal.model_dump(exclude_none=True), status, headers=headers)


REFUSALS: dict[int | str, dict[str, Any]] = {
    code: {"model": Refusal, "description": why}
    for code, why in {
        401: "no credential, or one this agent does not know",
        403: "not allowed, or a limit exceeded (named in `limit`)",
        404: "no such slot of this monitor",
        409: "another bandwidth test holds the slot; retry after `retry_after_s`",
        429: "tests_per_hour reached",
        503: "the server could not be started",
    }.items()
}


def monitor_of(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> MonitorEntry:
    """The monitor a request's bearer token belongs to; 401 before anything else happens."""
    token = None
    if authorization is not None:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer":
            token = value.strip()
    agent: Agent = request.app.state.agent
    monitor = agent.config.authenticate(token)
    if monitor is None:
        message = (
            "no credential: send 'Authorization: Bearer <token>'"
            if token is None
            else "unknown credential"
        )
        raise Refused(401, Refusal(error="unauthorized", message=message))
    return monitor


Monitor = Annotated[MonitorEntry, Depends(monitor_of)]
SlotId = Annotated[str, PathParam(pattern=SLOT_ID_PATTERN)]


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

    @app.exception_handler(Refused)
    async def _refused(request: Request, exc: Refused) -> JSONResponse:
        return refusal_response(exc.status, exc.refusal)

    @app.get("/v1/health", response_model=Health)
    async def health() -> Health:
        return Health(status="ok", agent=config.agent.name, version=__version__)

    @app.get("/v1/facts", response_model=Facts, responses=REFUSALS)
    async def facts(monitor: Monitor) -> Facts:
        return await agent.facts()

    @app.get("/v1/usage", response_model=Usage, responses=REFUSALS)
    async def usage(monitor: Monitor) -> Usage:
        return agent.usage(monitor)

    @app.post("/v1/slots", response_model=SlotGrant, status_code=201, responses=REFUSALS)
    async def open_slot(monitor: Monitor, request: SlotRequest) -> SlotGrant:
        return await agent.open_slot(monitor, request)

    @app.get("/v1/slots/{slot_id}", response_model=SlotState, responses=REFUSALS)
    async def slot_state(monitor: Monitor, slot_id: SlotId) -> SlotState:
        return agent.find(monitor, slot_id).view()

    @app.delete("/v1/slots/{slot_id}", response_model=SlotState, responses=REFUSALS)
    async def close_slot(monitor: Monitor, slot_id: SlotId) -> SlotState:
        return await agent.close_slot(monitor, slot_id)

    return app


def serve(config: AgentConfig, host: str, port: int, *, log_level: str = "info") -> None:
    """Run the agent until SIGTERM/SIGINT (uvicorn), with TLS if agent.toml configures it."""
    import ssl

    import uvicorn

    settings = config.agent
    options: dict[str, Any] = {}
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
