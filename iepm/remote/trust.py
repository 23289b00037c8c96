"""``agent.toml``: who may test this host, with what, and within which limits.

Each monitor authenticates with its own bearer token; the agent keeps only the token's SHA-256
(tokens are 256-bit random strings, so a plain hash is enough: nothing to brute-force). Errors
name the file, the line and the field, as for ``targets.toml``::

    agent.toml:14: monitors[0].limits.max_streams: Input should be less than or equal to 128
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import ErrorDetails

from iepm import tomlload
from iepm.errors import ConfigError
from iepm.remote.servers import IPERF3, KINDS, SERVER_START_TIMEOUT_S
from iepm.units import size_bytes

MONITOR_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
TOKEN_PREFIX = "iepm1."


def _known_kinds(kinds: list[str]) -> list[str]:
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown server kind {kind!r} (known: {', '.join(sorted(KINDS))})")
    return kinds


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Limits(StrictModel):
    """What one monitor may ask for; a request beyond any of them is refused, naming it."""

    max_duration_s: int = Field(default=60, ge=1, le=3600)
    max_streams: int = Field(default=8, ge=1, le=128)
    max_window: str = "64M"
    # Highest total bit rate (UDP target rate; TCP is held to it by iperf3's
    # --server-bitrate-limit). None: no limit.
    max_rate: str | None = None
    tests_per_hour: int = Field(default=12, ge=1, le=3600)
    # Largest file a copy (xrootd) may write here.
    max_size: str = "1G"

    @field_validator("max_window", "max_size")
    @classmethod
    def _window(cls, value: str) -> str:
        try:
            size_bytes(value, base=1024)
        except ValueError:
            raise ValueError(f"{value!r} is not a size like 256K or 16M") from None
        return value

    @field_validator("max_rate")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                size_bytes(value, base=1000)
            except ValueError:
                raise ValueError(f"{value!r} is not a bit rate like 100M or 1G") from None
        return value

    @property
    def max_window_bytes(self) -> int:
        return size_bytes(self.max_window, base=1024)

    @property
    def max_size_bytes(self) -> int:
        return size_bytes(self.max_size, base=1024)

    @property
    def max_rate_bps(self) -> int | None:
        return None if self.max_rate is None else size_bytes(self.max_rate, base=1000)


PROBE_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class RunLimits(StrictModel):
    """``[monitors.runs]``: third-party tests — which probes this monitor (a mesh's control
    host) may have this host run, towards which address ranges, how long and how often. Absent:
    none at all."""

    probes: list[str] = Field(default_factory=list)
    # CIDR ranges a test may go to (its address, and the destination agent's address).
    destinations: list[str] = Field(default_factory=list)
    # The longest a run may take, all included; it is killed with its process group then.
    max_duration_s: int = Field(default=120, ge=1, le=3600)
    tests_per_hour: int = Field(default=120, ge=1, le=36000)

    @field_validator("probes")
    @classmethod
    def _probe_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not PROBE_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a probe name")
        return value

    @field_validator("destinations")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for net in value:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"{net!r} is not an address range like 198.18.0.0/15") from None
        return value

    def allows(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return any(ip in ipaddress.ip_network(n, strict=False) for n in self.destinations)


class MonitorEntry(StrictModel):
    name: str
    token_sha256: str
    # Server kinds this monitor may ask for (the key keeps its first name: existing files).
    probes: list[str] = Field(default_factory=lambda: list(KINDS))
    limits: Limits = Field(default_factory=Limits)
    runs: RunLimits | None = None

    @field_validator("probes")
    @classmethod
    def _kinds(cls, value: list[str]) -> list[str]:
        return _known_kinds(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not MONITOR_NAME_RE.match(value):
            raise ValueError(f"monitor names are letters, digits, '.', '_', '-' (got {value!r})")
        return value

    @field_validator("token_sha256")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not SHA256_RE.match(value):
            raise ValueError(
                "token_sha256 must be 64 lower-case hex digits: the SHA-256 of the monitor's "
                "token as printed by `iepm agent token` (never the token itself)"
            )
        return value


class AgentSettings(StrictModel):
    name: str = "iepm-agent"
    # State file and per-test work directories; must survive agent restarts.
    state_dir: str = "/var/lib/iepm-agent"
    # Work directories of slots whose files must stay in memory (a copy's sink): a tmpfs.
    memory_dir: str = "/dev/shm/iepm-agent"
    # Ports the agent may pick for one-shot servers (inclusive).
    server_ports: tuple[int, int] = (5301, 5399)
    # Address the servers bind to (default: all of this host's addresses).
    server_bind: str | None = None
    # Slot deadline = test duration + omit + this; the server is killed then, whatever happens.
    slot_grace_s: float = Field(default=10.0, ge=1.0, le=600.0)
    # How long a new server may take to listen (see SERVER_START_TIMEOUT_S).
    server_start_timeout_s: float = Field(default=SERVER_START_TIMEOUT_S, ge=0.5, le=120.0)
    # Program of each server kind, when not the one on PATH: {iperf3 = "/opt/iperf3/bin/iperf3"}.
    programs: dict[str, str] = Field(default_factory=dict)
    # Older name for programs.iperf3.
    iperf3_path: str | None = None
    # A request's headers and body must arrive within this (slow clients hold no connection).
    request_timeout_s: float = Field(default=10.0, ge=0.5, le=120.0)
    # Open connections at once; more are closed at once (so the agent never runs out of fds).
    max_connections: int = Field(default=128, ge=4, le=4096)
    # Largest request body; bigger ones get 413 without being read.
    max_body_bytes: int = Field(default=16384, ge=1024, le=1048576)
    # TLS (optional): the agent's certificate and key; with client_ca, mutual TLS is required.
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # Third-party tests ([monitors.runs]): the command that runs one probe (default: this
    # Python's `-m iepm.cli`), runs at once, and the token this host presents to the destination's
    # agent for a server (it is enrolled there as a monitor; never sent by the control host).
    iepm_command: list[str] = Field(default_factory=list)
    max_runs: int = Field(default=4, ge=1, le=64)
    run_credential_file: str | None = None

    @field_validator("server_ports")
    @classmethod
    def _ports(cls, value: tuple[int, int]) -> tuple[int, int]:
        low, high = value
        if not 1024 <= low <= high <= 65535:
            raise ValueError(f"server_ports must be [low, high] within 1024-65535 (got {value})")
        return value

    @field_validator("programs")
    @classmethod
    def _known_programs(cls, value: dict[str, str]) -> dict[str, str]:
        _known_kinds(list(value))
        return value

    def program(self, kind: str) -> str:
        if kind == IPERF3.name and self.iperf3_path is not None and kind not in self.programs:
            return self.iperf3_path
        return self.programs.get(kind) or KINDS[kind].program

    @model_validator(mode="after")
    def _tls_pair(self) -> AgentSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
        return self


class AgentConfig(StrictModel):
    agent: AgentSettings = Field(default_factory=AgentSettings)
    monitors: list[MonitorEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> AgentConfig:
        names = [m.name for m in self.monitors]
        if len(set(names)) != len(names):
            raise ValueError("a monitor is listed twice")
        digests = [m.token_sha256 for m in self.monitors]
        if len(set(digests)) != len(digests):
            raise ValueError("two monitors share one token; give each its own")
        return self

    def authenticate(self, token: str | None) -> MonitorEntry | None:
        """The monitor this bearer token belongs to, or None. Compares every entry in constant
        time, so timing does not tell which digests exist."""
        if not token:
            return None
        digest = token_digest(token)
        found = None
        for monitor in self.monitors:
            if hmac.compare_digest(monitor.token_sha256, digest):
                found = monitor
        return found


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.strip().encode("utf-8")).hexdigest()


def read_token(path: str | Path) -> str:
    """A monitor's token from its credential file; the error names the file, never its text."""
    path = Path(path).expanduser()
    try:
        token = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the agent credential: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: the agent credential is not text") from None
    if not token or any(c.isspace() for c in token) or len(token) > 512:
        raise ConfigError(f"{path}: expected one token on one line (as `iepm agent token` prints)")
    return token


def _shown(value: object) -> str:
    # Never echo a token-looking value back.
    if isinstance(value, str) and value.startswith(TOKEN_PREFIX):
        return "…"
    return tomlload.shown(value)


def _describe(error: ErrorDetails) -> str:
    return tomlload.describe(error, unknown="see examples/agent.toml", shown=_shown)


def load_agent_config_text(text: str, path: Path | None = None) -> AgentConfig:
    doc = tomlload.parse(text, str(path) if path else "<agent config>")
    return tomlload.validate(AgentConfig, doc, describe=_describe)


def load_agent_config(path: str | Path) -> AgentConfig:
    """Read, decode, parse and validate an ``agent.toml``; errors name file:line: field."""
    return tomlload.validate(AgentConfig, tomlload.load(path), describe=_describe)


def monitor_stanza(name: str, digest: str, limits: Limits | None = None) -> str:
    """The ``[[monitors]]`` entry that enrols a monitor (what `iepm agent token` prints)."""
    limits = limits or Limits()
    lines = [
        "[[monitors]]",
        f'name = "{name}"',
        f'token_sha256 = "{digest}"',
        f"probes = {json.dumps(sorted(KINDS))}",
        "[monitors.limits]",
        f"max_duration_s = {limits.max_duration_s}",
        f"max_streams = {limits.max_streams}",
        f'max_window = "{limits.max_window}"',
        f"tests_per_hour = {limits.tests_per_hour}",
    ]
    if limits.max_rate is not None:
        lines.append(f'max_rate = "{limits.max_rate}"')
    return "\n".join(lines) + "\n"
