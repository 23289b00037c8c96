"""Third-party tests: a mesh's control host has this host's agent run one probe towards another
host (RTPL's single control host; perfSONAR's pScheduler offers the same).

The agent imports no probe: a run is iepm's own command line, ``iepm probe PROBE TARGET --config
RUN.toml --json --log-dir LOGS``, started by the project's one supervisor (:func:`run_command`:
its own process group, killed at the run's deadline) in a private work directory that is
removed afterwards. The request's parameters become the target's probe table in ``RUN.toml``,
so ``iepm probe`` validates them as it validates a targets.toml (an unknown or bad parameter is
its one-line error, returned as the run's stderr). Nothing from a request reaches a shell.

Each monitor's ``[monitors.runs]`` table in agent.toml says which probes it may have run here,
towards which address ranges, for how long at most and how often; without it, nothing. A
bandwidth test towards a host that runs the agent gets its server there with *this* host's own
token (``run_credential_file``): the control host never hands out credentials.

The answer carries the result envelope and the run's raw-log records verbatim, so the control
host keeps the raw log and ``iepm extract`` re-reads it there.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from iepm.errors import ToolNotFound
from iepm.remote.protocol import Refusal, RunAnswer, RunRequest
from iepm.remote.trust import AgentSettings, MonitorEntry, RunLimits
from iepm.runner import run_command

log = logging.getLogger("iepm.agent")

HOUR_S = 3600.0
# What is kept of the command's stderr in the answer.
STDERR_KEEP = 4000
# Largest raw log returned (a run's records; a probe's output is far smaller).
RAW_LOG_MAX = 4 * 1024 * 1024


class Refused(Exception):
    """An HTTP refusal of the agent: its status and the body that says why."""

    def __init__(self, status: int, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.status = status
        self.refusal = refusal


def _toml(value: object) -> str:
    """A TOML value of a validated parameter: JSON's strings, numbers, booleans and arrays of
    them are TOML too."""
    return json.dumps(value)


def run_config(req: RunRequest, agent_name: str, logs: Path, credential: str | None) -> str:
    """The one-target ``targets.toml`` of a run."""
    lines = [
        "[monitor]",
        f"name = {_toml(agent_name)}",
        f"log_dir = {_toml(str(logs))}",
        f"archive = {_toml('sqlite:///' + str(logs.parent / 'unused.db'))}",
        "",
        "[[targets]]",
        f"name = {_toml(req.target)}",
        f"address = {_toml(req.address)}",
        f"probes = [{_toml(req.probe)}]",
        f"mode = {_toml('agent' if req.server_agent else 'plain')}",
    ]
    if req.server_agent is not None:
        assert credential is not None
        lines += [
            "[targets.agent]",
            f"url = {_toml(req.server_agent.url)}",
            f"credential_file = {_toml(credential)}",
            f"slot_wait_s = {_toml(req.server_agent.slot_wait_s)}",
        ]
    lines.append(f"[targets.{req.probe}]")
    lines += [f"{key} = {_toml(value)}" for key, value in req.params.items()]
    return "\n".join(lines) + "\n"


class Runs:
    """The runs of one agent: limits, the runs going on, and the grants of the last hour."""

    def __init__(self, settings: AgentSettings, on_start: Callable[[], None] | None = None) -> None:
        """``on_start``: called as each run starts (the agent saves the last hour's runs, so
        a restart does not reset tests_per_hour)."""
        self.settings = settings
        self.on_start = on_start
        self.running: dict[str, str] = {}  # run id → monitor
        self.stamps: dict[str, deque[float]] = {}

    @property
    def root(self) -> Path:
        return Path(self.settings.state_dir) / "runs"

    def sweep(self) -> None:
        """At start-up: work directories of an earlier agent's runs (their processes died with
        it: the supervisor's groups die with their parent)."""
        shutil.rmtree(self.root, ignore_errors=True)

    def _recent(self, monitor: str) -> deque[float]:
        stamps = self.stamps.setdefault(monitor, deque())
        now = time.time()
        while stamps and now - stamps[0] >= HOUR_S:
            stamps.popleft()
        return stamps

    def check(self, monitor: MonitorEntry, req: RunRequest) -> RunLimits:
        """Refuse, naming the limit, before anything starts."""
        limits = monitor.runs
        who = f"monitor {monitor.name}"
        if limits is None or not limits.probes:
            raise Refused(
                403,
                Refusal(
                    error="forbidden",
                    message=f"{who} may not have this host run tests (agent.toml gives it no "
                    "[monitors.runs] probes)",
                ),
            )
        if req.probe not in limits.probes:
            raise Refused(
                403,
                Refusal(
                    error="forbidden",
                    message=f"{who} may not have this host run {req.probe} (its "
                    f"[monitors.runs] probes: {', '.join(limits.probes)})",
                ),
            )
        if not limits.allows(req.address):
            raise Refused(
                403,
                Refusal(
                    error="limit",
                    limit="destinations",
                    message=f"address {req.address} is outside the destinations {who} may "
                    f"test from here ({', '.join(limits.destinations) or 'none'})",
                ),
            )
        if req.server_agent is not None:
            host = urlsplit(req.server_agent.url).hostname or ""
            try:
                inside = limits.allows(host)
            except ValueError:
                inside = False
            if not inside:
                raise Refused(
                    403,
                    Refusal(
                        error="limit",
                        limit="destinations",
                        message=f"server_agent.url: {host or req.server_agent.url} is not an "
                        f"address in the destinations {who} may test from here",
                    ),
                )
            if self.settings.run_credential_file is None:
                raise Refused(
                    403,
                    Refusal(
                        error="forbidden",
                        message="this agent has no run_credential_file in agent.toml: it "
                        "cannot ask the destination's agent for a server",
                    ),
                )
        if req.deadline_s > limits.max_duration_s:
            raise Refused(
                403,
                Refusal(
                    error="limit",
                    limit="max_duration_s",
                    message=f"a run of up to {req.deadline_s:g} s exceeds max_duration_s = "
                    f"{limits.max_duration_s} for {who} ([monitors.runs])",
                ),
            )
        stamps = self._recent(monitor.name)
        if len(stamps) >= limits.tests_per_hour:
            retry = max(1.0, math.ceil(stamps[0] + HOUR_S - time.time()))
            raise Refused(
                429,
                Refusal(
                    error="rate_limited",
                    limit="tests_per_hour",
                    message=f"{who} already had {len(stamps)} runs here in the last hour "
                    f"([monitors.runs] tests_per_hour = {limits.tests_per_hour}); retry in "
                    f"{retry:g} s",
                    retry_after_s=retry,
                ),
            )
        if len(self.running) >= self.settings.max_runs:
            raise Refused(
                409,
                Refusal(
                    error="busy",
                    message=f"{len(self.running)} runs are going on here (max_runs = "
                    f"{self.settings.max_runs}); retry in a few seconds",
                    retry_after_s=2.0,
                ),
            )
        return limits

    def argv(self, req: RunRequest, config: Path, logs: Path) -> list[str]:
        command = list(self.settings.iepm_command) or [sys.executable, "-m", "iepm.cli"]
        return [
            *command, "probe", req.probe, req.target,
            "--config", str(config), "--json", "--log-dir", str(logs),
        ]  # fmt: skip

    def env(self, workdir: Path) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir)}
        env["LANG"] = "C.UTF-8"
        if "PYTHONPATH" in os.environ:  # an agent run from a source tree runs that tree's iepm
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return env

    async def run(self, monitor: MonitorEntry, req: RunRequest) -> RunAnswer:
        self.check(monitor, req)
        run_id = uuid.uuid4().hex
        workdir = self.root / run_id
        logs = workdir / "logs"
        logs.mkdir(parents=True)
        self.running[run_id] = monitor.name
        self._recent(monitor.name).append(time.time())
        if self.on_start is not None:
            self.on_start()
        started_at, t0 = datetime.now(UTC), time.monotonic()
        try:
            config = workdir / "run.toml"
            config.write_text(
                run_config(req, self.settings.name, logs, self.settings.run_credential_file)
            )
            log.info(
                "run %s for %s: %s to %s (%s), deadline %g s",
                run_id, monitor.name, req.probe, req.target, req.address, req.deadline_s,
            )  # fmt: skip
            try:
                raw = await run_command(
                    self.argv(req, config, logs),
                    req.deadline_s,
                    env=self.env(workdir),
                    cwd=str(workdir),
                )
            except ToolNotFound as exc:
                return self._answer(run_id, monitor, req, "failed_to_start", started_at, t0,
                                    None, None, "", str(exc))  # fmt: skip
            envelope = None
            try:
                parsed = json.loads(raw.stdout) if raw.stdout.strip() else None
                envelope = parsed if isinstance(parsed, dict) else None
            except ValueError:
                envelope = None
            state = "killed_at_deadline" if raw.timed_out else "finished"
            return self._answer(run_id, monitor, req, state, started_at, t0, raw.returncode,
                                envelope, _raw_log(logs), raw.stderr)  # fmt: skip
        finally:
            self.running.pop(run_id, None)
            shutil.rmtree(workdir, ignore_errors=True)

    def _answer(
        self,
        run_id: str,
        monitor: MonitorEntry,
        req: RunRequest,
        state: str,
        started_at: datetime,
        t0: float,
        exit_code: int | None,
        envelope: dict[str, object] | None,
        raw_log: str,
        stderr: str,
    ) -> RunAnswer:
        answer = RunAnswer.model_validate(
            {
                "run_id": run_id,
                "monitor": monitor.name,
                "agent": self.settings.name,
                "probe": req.probe,
                "target": req.target,
                "address": req.address,
                "state": state,
                "started_at": started_at,
                "duration_s": round(time.monotonic() - t0, 3),
                "exit_code": exit_code,
                "envelope": envelope,
                "raw_log": raw_log,
                "stderr": stderr[-STDERR_KEEP:],
            }
        )
        log.info("run %s for %s ended: %s (exit %s)", run_id, monitor.name, state, exit_code)
        return answer


def _raw_log(logs: Path) -> str:
    parts = []
    size = 0
    for path in sorted(logs.glob("*/*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        size += len(text)
        if size > RAW_LOG_MAX:
            break
        parts.append(text)
    return "".join(parts)
