"""The agent's wire models: what a monitor sends and what the agent answers, shared by both sides
(``agent.py`` serves them, ``client.py`` reads them). Changing one changes the contract."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from iepm.remote.servers import DEFAULT_KIND, Storage
from iepm.units import SIZE_RE

KIND_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"
SLOT_ID_PATTERN = r"^[0-9a-f]{32}$"


class SlotRequest(BaseModel):
    """What the monitor will run against the server. Checked against its limits before anything
    starts, and held to while the test runs."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # "probe" was the field's name before server kinds; old monitors still send it.
    server: str = Field(
        default=DEFAULT_KIND,
        pattern=KIND_PATTERN,
        validation_alias=AliasChoices("server", "probe"),
        description="server kind to start (the agent's /v1/usage lists those allowed)",
    )
    duration_s: int = Field(default=10, ge=1, le=3600)
    omit_s: int = Field(default=0, ge=0, le=60)
    streams: int = Field(default=1, ge=1, le=128)
    window: str | None = Field(default=None, max_length=16)
    udp: bool = False
    rate: str | None = Field(default=None, max_length=16)
    reverse: bool = False
    # A transfer server: the largest file the copy writes (bytes, K/M/G binary) and whether the
    # slot's files live on a memory file system or a disk.
    size: str | None = Field(default=None, max_length=16)
    storage: Storage = "disk"
    # Free text the monitor attaches (its target name, say): stored, never executed.
    label: str | None = Field(default=None, max_length=128)

    @field_validator("window", "rate", "size")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None and not SIZE_RE.match(value):
            raise ValueError("must be a number with an optional K/M/G suffix, e.g. 256K or 100M")
        return value


class SlotGrant(BaseModel):
    slot_id: str
    server: str
    port: int
    bind: str | None
    monitor: str
    label: str | None
    granted_at: datetime
    deadline_at: datetime
    deadline_s: float
    ready_ms: float


SlotPhase = Literal["running", "finished", "released", "killed_at_deadline", "cut", "expired"]


class SlotState(BaseModel):
    slot_id: str
    monitor: str
    port: int
    # running: server up; finished: the test ended, the slot is held until released (so the
    # next test cannot start before this monitor's client is done) or until its deadline;
    # cut: the agent killed a test that exceeded its grant (``cut_reason`` says how).
    state: SlotPhase
    granted_at: datetime
    ended_at: datetime | None
    server_exit: int | None
    server_output: str
    cut_reason: str | None = None


RefusalCode = Literal[
    "unauthorized",
    "forbidden",
    "limit",
    "busy",
    "rate_limited",
    "failed",
    "invalid",
    "too_large",
]


class Refusal(BaseModel):
    error: RefusalCode
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
    nics: dict[str, dict[str, int | str | None]]
    # Version line of each server kind's program (None: not installed).
    tools: dict[str, str | None]


class Usage(BaseModel):
    monitor: str
    busy: bool
    retry_after_s: float | None
    tests_last_hour: int
    # Server kinds this monitor may ask for, and its limits (agent.toml's [monitors.limits]).
    servers: list[str] = Field(default_factory=list)
    limits: dict[str, int | str | None]


# ---------------------------------------------------------------------------------------------
# third-party tests: a mesh's control host has this host run one probe towards another

RUN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
RUN_ID_PATTERN = SLOT_ID_PATTERN
PARAM_KEY_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
ParamScalar = str | bool | int | float
ParamValue = ParamScalar | list[ParamScalar]


class ServerAgent(BaseModel):
    """The destination's agent, where the run asks for a server (with this host's own token)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(pattern=r"^https?://[A-Za-z0-9.\[\]:_-]+(:\d{1,5})?/?$", max_length=200)
    slot_wait_s: float = Field(default=10.0, ge=0.0, le=600.0)


class RunRequest(BaseModel):
    """One probe run from this host towards ``address``, as ``iepm probe PROBE`` runs it with
    ``params`` as the target's probe table. Checked against [monitors.runs] before it starts."""

    model_config = ConfigDict(extra="forbid")

    probe: str = Field(pattern=KIND_PATTERN)
    # The target's name in results and raw logs (the control host's, e.g. HOST or HOST.LABEL).
    target: str = Field(pattern=RUN_NAME_PATTERN)
    address: str = Field(max_length=64)
    params: dict[str, ParamValue] = Field(default_factory=dict, max_length=64)
    # The run is killed with its process group at this deadline (at most max_duration_s).
    deadline_s: float = Field(ge=1.0, le=3600.0, allow_inf_nan=False)
    server_agent: ServerAgent | None = None

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        import ipaddress

        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError("must be an IP address (a run goes to an address)") from None

    @field_validator("params")
    @classmethod
    def _params(cls, value: dict[str, ParamValue]) -> dict[str, ParamValue]:
        import math
        import re

        for key, item in value.items():
            if not re.match(PARAM_KEY_PATTERN, key):
                raise ValueError(f"{key[:40]!r} is not a parameter name")
            for scalar in item if isinstance(item, list) else [item]:
                if isinstance(scalar, float) and not math.isfinite(scalar):
                    raise ValueError(f"{key}: not a finite number")
                if isinstance(scalar, str) and (len(scalar) > 256 or "\n" in scalar):
                    raise ValueError(f"{key}: a string of at most 256 characters on one line")
            if isinstance(item, list) and len(item) > 64:
                raise ValueError(f"{key}: at most 64 items")
        return value


RunPhase = Literal["finished", "killed_at_deadline", "failed_to_start"]


class RunAnswer(BaseModel):
    run_id: str
    monitor: str
    agent: str
    probe: str
    target: str
    address: str
    state: RunPhase
    started_at: datetime
    duration_s: float
    exit_code: int | None
    # The result envelope `iepm probe --json` printed (None: it printed none, e.g. killed).
    envelope: dict[str, Any] | None
    # The run's raw-log records, verbatim (iepm.rawlog's format), for the control host's log.
    raw_log: str
    # The end of what the command wrote to stderr (its one-line error, if it failed).
    stderr: str
