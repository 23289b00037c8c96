"""How a monitor reaches a target that starts servers for it: ``[targets.agent]`` (the target runs
``iepm agent``) or ``[targets.ssh]`` (agentless). Plain data, read by config and by the clients;
``iepm.remote.lease`` turns them into the server leases probes receive."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from iepm.remote.servers import IPERF3, SERVER_START_TIMEOUT_S


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


SSH_USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


class AgentAccess(StrictModel):
    """How this monitor reaches a target's ``iepm agent``. The bearer token lives in
    ``credential_file`` (one line, mode 0600), never in this file, logs or results."""

    url: str
    credential_file: str
    # TLS: the agent's CA (verify the agent), and this monitor's own certificate (mutual TLS).
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    # How long to wait for the target's exclusive slot when another monitor holds it.
    slot_wait_s: float = Field(default=10.0, ge=0.0, le=600.0)
    request_timeout_s: float = Field(default=10.0, ge=0.5, le=120.0)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[A-Za-z0-9.\[\]:_-]+(:\d{1,5})?/?$", value):
            raise ValueError(
                f"agent url must be like http://host:8700 or https://host:8700 ({value!r})"
            )
        return value.rstrip("/")

    def setup_budget_s(self) -> float:
        """Longest a test can spend on the agent besides the tool itself: waiting for the slot,
        then the request that opens it (and waits for its server to listen) and the one that
        releases it."""
        return self.slot_wait_s + 2 * self.request_timeout_s + SERVER_START_TIMEOUT_S

    @model_validator(mode="after")
    def _cert_pair(self) -> AgentAccess:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError("client_cert and client_key go together (mutual TLS)")
        return self


class SshAccess(StrictModel):
    """Agentless: log in with a key (never a password), start the server for one test, kill it."""

    user: str
    key_file: str
    port: int = Field(default=22, ge=1, le=65535)
    # Host keys are always checked; `iepm target add --mode ssh` shows how to fill this file.
    known_hosts: str = "~/.ssh/known_hosts"
    # Deadline of each step (connect + key exchange + authenticate, each remote command). Each
    # waits on the target's CPU (sshd forks, exchanges keys, starts a shell): a busy host was
    # seen to take over 5 s for one, so the default holds a loaded target; a host that is down
    # or a refused key still fails at once or at this deadline, never at a password prompt.
    step_timeout_s: float = Field(default=30.0, ge=1.0, le=120.0)
    # Port the iperf3 server is started on at the target.
    server_port: int = Field(default=5201, ge=1, le=65535)
    iperf3_path: str = "iperf3"
    # Directory on the target for the test's files (a fresh one per test, removed after it).
    work_dir: str = "/tmp"
    # Memory file system on the target: where a memory-to-memory copy over SSH writes.
    memory_dir: str = "/dev/shm"
    # rsync on the target (a copy over SSH runs it there through the login shell).
    rsync_path: str = "rsync"

    def program(self, kind: str, default: str) -> str:
        """The program of a server kind on the target (iperf3_path for iperf3's)."""
        return self.iperf3_path if kind == IPERF3.name else default

    def setup_budget_s(self) -> float:
        """Longest a test can spend on SSH besides the tool itself: log in, start the server
        and see it ready, stop it, close (one step deadline each, 2 s to close)."""
        return 4 * self.step_timeout_s + 2

    @field_validator("work_dir", "memory_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or "\n" in value or "\0" in value:
            raise ValueError(f"work_dir must be an absolute path on the target ({value!r})")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not SSH_USER_RE.match(value):
            raise ValueError(f"not a POSIX user name: {value!r}")
        return value

    @field_validator("iperf3_path", "rsync_path")
    @classmethod
    def _program(cls, value: str) -> str:
        # It is sent as one word of a remote command line: no spaces or shell characters.
        if not re.match(r"^[A-Za-z0-9_./+-]+$", value):
            raise ValueError(f"a program path may hold only letters, digits and _./+- ({value!r})")
        return value
