"""``iepm target bootstrap``: make a Debian host an agent target over SSH, as IEPM-BW installed
its remote side, and say what changed. Running it again changes nothing.

Steps, each checked before it acts:

1. **packages**: the tools' Debian packages (``dpkg-query``); only missing ones are installed
   (``apt-get install``, which needs root there);
2. **iepm**: ``PREFIX/bin/iepm version`` must be this monitor's version; otherwise a virtualenv
   is made at PREFIX and iepm installed into it from a wheelhouse this monitor built (``pip
   wheel``: iepm and its pinned dependencies), copied over SFTP — the target needs no index;
3. **agent.toml**: ``ETC/agent.toml`` holds this monitor with the SHA-256 of its token; a token
   is made (and kept in ``--token-file`` on the monitor, 0600) when there is none yet;
4. **service**: where systemd runs, the ``iepm-agent`` unit (deploy/systemd) is installed,
   enabled and (re)started; elsewhere (a lab host, a container) the agent is started directly
   in its own session, its PID in ``STATE/agent.pid``; restarted when its config changed;
5. **check**: the monitor asks the agent for its facts with the token, as a test would.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shlex
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from iepm import __version__
from iepm.config import SshAccess
from iepm.errors import RemoteError
from iepm.remote.ssh import connect
from iepm.remote.trust import (
    load_agent_config_text,
    monitor_stanza,
    new_token,
    read_token,
    token_digest,
)

PACKAGES = ("iperf3", "python3", "python3-venv")
REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "systemd" / "iepm-agent.service"
APT_S = 900.0  # installing packages may take minutes
PIP_S = 900.0
WHEEL_S = 1800.0  # building the wheelhouse fetches every dependency once


@dataclass(frozen=True)
class Layout:
    prefix: str = "/opt/iepm"
    etc: str = "/etc/iepm"
    state: str = "/var/lib/iepm"

    @property
    def iepm(self) -> str:
        return f"{self.prefix}/bin/iepm"

    @property
    def agent_toml(self) -> str:
        return f"{self.etc}/agent.toml"


@dataclass
class Report:
    address: str
    changes: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        head = f"{self.address}: " + (
            f"{len(self.changes)} changes" if self.changes else "nothing changed"
        )
        return [head, *(f"  changed: {c}" for c in self.changes),
                *(f"  as it was: {u}" for u in self.unchanged)]  # fmt: skip


def wheelhouse(dest: Path) -> Path:
    """iepm and its pinned dependencies as wheels in ``dest``, built from this iepm's source
    tree. The dependencies are kept while pyproject.toml is unchanged (fetching them is the
    slow part); iepm's own wheel is rebuilt every time, so it is the code running here."""
    pyproject = REPO / "pyproject.toml"
    if not pyproject.exists():
        raise RemoteError(f"cannot build a wheelhouse: no iepm source tree at {REPO}")
    dest.mkdir(parents=True, exist_ok=True)
    marker = dest / f".deps-{hashlib.sha256(pyproject.read_bytes()).hexdigest()[:16]}"
    for old in dest.glob("iepm-*.whl"):
        old.unlink()
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
            "-w", str(dest)]  # fmt: skip
    if marker.exists():
        argv.append("--no-deps")
    try:
        done = subprocess.run(
            [*argv, str(REPO)], capture_output=True, text=True, timeout=WHEEL_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(f"pip wheel did not finish within {WHEEL_S:g} s") from None
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RemoteError(f"pip wheel failed (exit {done.returncode}): {tail}")
    marker.touch()
    return dest


class _Remote:
    def __init__(self, conn: asyncssh.SSHClientConnection, step_s: float) -> None:
        self.conn = conn
        self.step_s = step_s

    async def sh(self, script: str, *, deadline_s: float | None = None) -> tuple[int, str, str]:
        try:
            done = await asyncio.wait_for(
                self.conn.run(script, check=False), deadline_s or self.step_s
            )
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            raise RemoteError(f"remote step failed: {type(exc).__name__}: {exc}") from None
        return int(done.exit_status or 0), str(done.stdout or ""), str(done.stderr or "")

    async def must(self, script: str, what: str, *, deadline_s: float | None = None) -> str:
        code, out, err = await self.sh(script, deadline_s=deadline_s)
        if code != 0:
            said = (err.strip() or out.strip() or "no output").splitlines()[-1][:300]
            raise RemoteError(f"{what} failed on the target (exit {code}): {said}")
        return out


async def bootstrap(
    access: SshAccess,
    address: str,
    *,
    monitor: str,
    token_file: Path,
    layout: Layout,
    listen: str,
    wheels: Path,
    netns: str | None = None,
    service: str = "auto",
) -> Report:
    report = Report(address)
    conn = await connect(access, address, netns)
    try:
        remote = _Remote(conn, float(access.step_timeout_s))
        await _packages(remote, report)
        await _iepm(remote, conn, report, layout, wheels)
        config_changed = await _agent_toml(remote, report, layout, monitor, token_file, address)
        await _service(remote, report, layout, listen, service, config_changed)
    finally:
        conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.wait_closed(), 2.0)
    return report


async def _packages(remote: _Remote, report: Report) -> None:
    query = "dpkg-query -W -f '${Package} ${db:Status-Status}\\n' " + " ".join(PACKAGES)
    _, out, _ = await remote.sh(query + " 2>/dev/null")
    installed = {
        w[0] for w in (line.split() for line in out.splitlines()) if w[1:] == ["installed"]
    }
    missing = [p for p in PACKAGES if p not in installed]
    if not missing:
        report.unchanged.append(f"packages {', '.join(PACKAGES)} installed")
        return
    await remote.must(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
        + " ".join(missing),
        f"apt-get install {' '.join(missing)}",
        deadline_s=APT_S,
    )
    report.changes.append(f"installed packages {', '.join(missing)}")


async def _iepm(
    remote: _Remote,
    conn: asyncssh.SSHClientConnection,
    report: Report,
    layout: Layout,
    wheels: Path,
) -> None:
    code, out, _ = await remote.sh(f"{shlex.quote(layout.iepm)} version 2>/dev/null")
    if code == 0 and out.strip() == f"iepm {__version__}":
        report.unchanged.append(f"iepm {__version__} in {layout.prefix}")
        return
    staging = (await remote.must("mktemp -d /tmp/iepm-wheels-XXXXXXXX", "mktemp")).strip()
    try:
        files = sorted(wheels.glob("*.whl"))
        if not files:
            raise RemoteError(f"no wheels in {wheels}")
        await _upload(conn, files, staging)
        prefix = shlex.quote(layout.prefix)
        await remote.must(
            f"test -x {prefix}/bin/pip || python3 -m venv {prefix}", "python3 -m venv"
        )
        await remote.must(
            f"{prefix}/bin/pip install -q --disable-pip-version-check --no-index "
            f"--find-links {shlex.quote(staging)} iepm=={__version__}",
            "pip install iepm",
            deadline_s=PIP_S,
        )
    finally:
        await remote.sh(f"rm -rf -- {shlex.quote(staging)}")
    was = out.strip() or "none"
    report.changes.append(f"installed iepm {__version__} in {layout.prefix} (was: {was})")


async def _upload(conn: asyncssh.SSHClientConnection, files: list[Path], into: str) -> None:
    """Copy ``files`` into the directory ``into`` as one tar stream over an exec channel: no
    SFTP subsystem needed (many hardened sshd configurations have none)."""
    with tempfile.TemporaryFile() as packed:
        with tarfile.open(fileobj=packed, mode="w") as tar:
            for f in files:
                tar.add(f, arcname=f.name)
        packed.seek(0)
        try:
            done = await asyncio.wait_for(
                conn.run(f"tar -xf - -C {shlex.quote(into)}", stdin=packed, encoding=None,
                         check=False),
                PIP_S,
            )  # fmt: skip
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            raise RemoteError(
                f"copying the wheelhouse failed: {type(exc).__name__}: {exc}"
            ) from None
    if done.exit_status != 0:
        said = bytes(done.stderr or b"").decode(errors="replace").strip()[-300:]
        raise RemoteError(f"copying the wheelhouse failed (tar exit {done.exit_status}): {said}")


async def _agent_toml(
    remote: _Remote, report: Report, layout: Layout, monitor: str, token_file: Path, name: str
) -> bool:
    """Whether agent.toml changed (the agent must then restart)."""
    token = read_token(token_file) if token_file.exists() else None
    code, text, _ = await remote.sh(f"cat {shlex.quote(layout.agent_toml)} 2>/dev/null")
    existing = text if code == 0 else ""
    if existing:
        config = load_agent_config_text(existing)  # a broken file is named, never overwritten
        mine = [m for m in config.monitors if m.name == monitor]
        if mine and token is not None and mine[0].token_sha256 == token_digest(token):
            report.unchanged.append(f"{layout.agent_toml} lets {monitor} in with its token")
            return False
        if mine:
            raise RemoteError(
                f"{layout.agent_toml} on the target already has monitor {monitor!r} with another "
                f"token: remove that entry, or pass the token it was made for (--token-file)"
            )
    if token is None:
        token = new_token()
        token_file.parent.mkdir(parents=True, exist_ok=True)
        token_file.touch(mode=0o600)
        token_file.write_text(token + "\n")
        report.changes.append(f"made this monitor's token in {token_file} (0600)")
    head = (
        f'[agent]\nname = "{name}"\nstate_dir = "{layout.state}/agent"\n'
        if not existing
        else existing.rstrip("\n") + "\n"
    )
    new_text = head + "\n" + monitor_stanza(monitor, token_digest(token))
    load_agent_config_text(new_text)  # never write what the agent would refuse
    await _write(remote, layout.agent_toml, new_text)
    report.changes.append(f"{layout.agent_toml}: enrolled monitor {monitor}")
    return True


async def _write(remote: _Remote, path: str, text: str) -> None:
    """Write ``text`` to ``path`` on the target atomically (0600: it names who may test)."""
    quoted = shlex.quote(path)
    try:
        done = await asyncio.wait_for(
            remote.conn.run(
                f"umask 077 && mkdir -p {shlex.quote(str(Path(path).parent))} && "
                f"cat > {quoted}.new && mv {quoted}.new {quoted}",
                input=text,
                check=False,
            ),
            remote.step_s,
        )
    except (TimeoutError, asyncssh.Error, OSError) as exc:
        raise RemoteError(f"writing {path} on the target failed: {exc}") from None
    if done.exit_status != 0:
        raise RemoteError(f"writing {path} on the target failed: {str(done.stderr).strip()}")


async def _service(
    remote: _Remote, report: Report, layout: Layout, listen: str, service: str, restart: bool
) -> None:
    code, _, _ = await remote.sh("test -d /run/systemd/system")
    use_systemd = service == "systemd" or (service == "auto" and code == 0)
    if use_systemd:
        await _systemd(remote, report, layout, listen, restart)
    else:
        await _direct(remote, report, layout, listen, restart)


async def _systemd(
    remote: _Remote, report: Report, layout: Layout, listen: str, restart: bool
) -> None:
    unit = (
        UNIT.read_text()
        .replace("/opt/iepm", layout.prefix)
        .replace("/etc/iepm", layout.etc)
        .replace("IEPM_AGENT_LISTEN=0.0.0.0:8700", f"IEPM_AGENT_LISTEN={listen}")
    )
    path = "/etc/systemd/system/iepm-agent.service"
    code, current, _ = await remote.sh(f"cat {path} 2>/dev/null")
    if code != 0 or current != unit:
        await remote.must("id iepm >/dev/null 2>&1 || useradd --system --no-create-home iepm",
                          "useradd iepm")  # fmt: skip
        await _write(remote, path, unit)
        await remote.must("chmod 644 " + path + " && systemctl daemon-reload", "daemon-reload")
        report.changes.append(f"installed {path}")
        restart = True
    await remote.must(f"chown -R iepm:iepm {shlex.quote(layout.etc)}", "chown /etc/iepm")
    code, _, _ = await remote.sh("systemctl is-active --quiet iepm-agent")
    if code == 0 and not restart:
        report.unchanged.append("iepm-agent.service active")
        return
    await remote.must("systemctl enable iepm-agent && systemctl restart iepm-agent",
                      "systemctl restart iepm-agent", deadline_s=60)  # fmt: skip
    report.changes.append("iepm-agent.service enabled and (re)started")


async def _direct(
    remote: _Remote, report: Report, layout: Layout, listen: str, restart: bool
) -> None:
    pidfile = shlex.quote(f"{layout.state}/agent.pid")
    code, out, _ = await remote.sh(f"cat {pidfile} 2>/dev/null")
    pid = out.strip() if code == 0 and out.strip().isdigit() else None
    alive = pid is not None and (await remote.sh(f"kill -0 {pid}"))[0] == 0
    if alive and not restart:
        report.unchanged.append(f"agent running (PID {pid}, no service manager)")
        return
    if alive:
        # Its session's process group: the agent and any server it leased.
        await remote.sh(f"kill -TERM -- -{pid}; for i in $(seq 50); do kill -0 {pid} 2>/dev/null"
                        " || break; sleep 0.1; done")  # fmt: skip
    state = shlex.quote(layout.state)
    argv = shlex.join([layout.iepm, "agent", "--listen", listen, "--config", layout.agent_toml])
    await remote.must(f"mkdir -p {state}", "mkdir state")
    # A simple command in the background, so $! is the agent itself: the shell's child is no
    # group leader, so setsid makes it a session leader without forking, and its output goes
    # to the log (the SSH channel closes at once).
    await remote.must(
        f"setsid {argv} >>{state}/agent.log 2>&1 </dev/null & echo $! > {pidfile}",
        "starting the agent",
    )
    _, out, _ = await remote.sh(f"cat {pidfile}")
    pid = out.strip()
    code, sid, _ = await remote.sh(f"ps -o sid= -p {pid}")
    if code != 0 or sid.strip() != pid:
        raise RemoteError(f"the agent did not start as its own session (PID {pid or '?'})")
    report.changes.append(("restarted" if alive else "started") + " the agent (no service manager)")


def report_json(report: Report) -> str:
    return json.dumps(
        {"address": report.address, "changes": report.changes, "unchanged": report.unchanged,
         "facts": report.facts}, indent=2, default=str,
    )  # fmt: skip


def default_wheelhouse() -> Path:
    """Where the wheelhouse of this version is kept between bootstraps."""
    return Path.home() / ".cache" / "iepm" / f"wheelhouse-{__version__}"


async def check_agent(
    url: str, token_file: Path, netns: str | None, wait_s: float
) -> dict[str, Any]:
    """The agent's facts, asked with this monitor's token as a test would; waits up to
    ``wait_s`` for a just-started agent to listen."""
    from iepm.remote.client import AgentClient, Refusal

    client = AgentClient(url, read_token(token_file), timeout_s=5.0, netns=netns)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        try:
            facts = await client.facts()
            return facts.model_dump(mode="json")
        except Refusal:
            raise  # it answered: waiting will not change a refused token
        except RemoteError:
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(0.5)
