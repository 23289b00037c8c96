"""Agentless targets: start the test server over SSH, kill it and its files afterwards.

What IEPM-BW learnt the hard way, and what this module does about it:

* a lost key left tests hanging at a password prompt → only public-key authentication is
  offered (no password, keyboard-interactive, GSS or agent), no config file is read, and every
  step (connect + log in, each remote command) has a deadline;
* servers and files were left behind → the server runs under ``timeout -s KILL`` on the target
  (so it dies at its deadline even if this monitor dies or the connection drops), in its own
  process group (sshd makes the session a new group), and the stop step kills that group and
  removes the test's directory;
* host keys are always checked against ``known_hosts``.

Commands are sent to the target's shell as one string (that is how SSH works); every word of
them is quoted with ``shlex.quote``, so a value can never become shell syntax.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shlex
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from iepm.errors import RemoteError
from iepm.remote.access import SshAccess
from iepm.remote.netns import connect_in_netns
from iepm.remote.servers import KINDS, ServerKind

log = logging.getLogger(__name__)

STOP_GRACE_S = 0.5


@dataclass(frozen=True)
class SshServer:
    port: int
    pgid: int
    workdir: str
    ready_ms: float


def _describe(exc: BaseException, where: str, step_s: float) -> str:
    if isinstance(exc, asyncssh.PermissionDenied):
        return (
            f"SSH to {where}: the target refused this monitor's key (public-key only, never a "
            "password) — install the key with `iepm target add --mode ssh`, or it was revoked"
        )
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        return (
            f"SSH to {where}: the host key is not in known_hosts or does not match — check it "
            "and add it (`iepm target add --mode ssh` prints the ssh-keyscan line)"
        )
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return (
            f"SSH to {where}: no answer within the {step_s:g} s step deadline (host down, "
            "firewall, or a server stuck before authentication)"
        )
    if isinstance(exc, ConnectionRefusedError):
        return f"SSH to {where}: connection refused — is sshd running on that port?"
    if isinstance(exc, FileNotFoundError | PermissionError | asyncssh.KeyImportError):
        return f"SSH to {where}: cannot use the key or known_hosts file: {exc}"
    return f"SSH to {where} failed: {type(exc).__name__}: {exc}"


async def connect(
    access: SshAccess, address: str, netns: str | None
) -> asyncssh.SSHClientConnection:
    """Log in with the key only, within ``step_timeout_s``; RemoteError says why not."""
    step = float(access.step_timeout_s)
    where = f"{access.user}@{address}:{access.port}"
    options: dict[str, Any] = {
        "username": access.user,
        "client_keys": [str(Path(access.key_file).expanduser())],
        "known_hosts": str(Path(access.known_hosts).expanduser()),
        "config": None,  # no ~/.ssh/config: nothing may add password or agent auth
        "agent_path": None,
        "password_auth": False,
        "kbdint_auth": False,
        "gss_auth": False,
        "gss_kex": False,
        "host_based_auth": False,
        "preferred_auth": "publickey",
        "passphrase": None,
        "connect_timeout": step,
        "login_timeout": step,
        "keepalive_interval": step,
        "keepalive_count_max": 2,
    }
    try:
        if netns is not None:
            sock = await asyncio.to_thread(connect_in_netns, netns, address, access.port, step)
            options["sock"] = sock
            coro = asyncssh.connect(address, access.port, **options)
        else:
            coro = asyncssh.connect(address, access.port, **options)
        return await asyncio.wait_for(coro, step + 1.0)
    except (OSError, asyncssh.Error, TimeoutError, asyncssh.KeyImportError) as exc:
        raise RemoteError(_describe(exc, where, step)) from None


async def run_remote(
    conn: asyncssh.SSHClientConnection, argv: list[str], step_s: float
) -> asyncssh.SSHCompletedProcess:
    """Run one command (argv, quoted word by word) with a deadline."""
    try:
        return await asyncio.wait_for(conn.run(shlex.join(argv), check=False), step_s)
    except (TimeoutError, asyncssh.Error, OSError) as exc:
        raise RemoteError(
            f"remote command {argv[0]} failed: {_describe(exc, 'target', step_s)}"
        ) from None


def _start_command(access: SshAccess, argv: list[str], deadline_s: float) -> str:
    """Make a private directory, report it and the process group, then become the server.

    ``exec`` keeps the shell's PID, which sshd made a session and group leader; ``timeout``
    kills the server at the deadline on the target itself."""
    template = shlex.quote(access.work_dir.rstrip("/") + "/iepm-XXXXXXXX")
    server = shlex.join(["timeout", "-s", "KILL", str(int(deadline_s)), *argv])
    return (
        f'umask 077 && d=$(mktemp -d {template}) && cd "$d" && echo "iepm-dir $d" && '
        f'echo "iepm-pgid $$" && exec {server}'
    )


def _stop_command(pgid: int, workdir: str) -> str:
    group = shlex.quote(f"-{pgid}")
    return (
        f"kill -TERM -- {group} 2>/dev/null && sleep {STOP_GRACE_S}; "
        f"kill -KILL -- {group} 2>/dev/null; rm -rf -- {shlex.quote(workdir)}; true"
    )


async def _await_ready(
    process: asyncssh.SSHClientProcess[str], ready: str, step: float
) -> tuple[str, int, list[str]]:
    workdir, pgid, lines = "", 0, []
    loop = asyncio.get_running_loop()
    give_up = loop.time() + step
    while True:
        left = give_up - loop.time()
        if left <= 0:
            raise TimeoutError
        line = await asyncio.wait_for(process.stdout.readline(), left)
        if not line:
            err = await asyncio.wait_for(process.stderr.read(), 1.0)
            lines.append(err.strip())
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("iepm-dir "):
            workdir = line[len("iepm-dir ") :].rstrip("\n")
        elif line.startswith("iepm-pgid "):
            pgid = int(line.split()[1])
        elif ready in line:
            return workdir, pgid, lines
    return workdir, pgid, lines


def _start_failure(access: SshAccess, kind: ServerKind, program: str, where: str, said: str) -> str:
    low = said.lower()
    if "no space left" in low:
        return (
            f"{where}: the target's {access.work_dir} is full (No space left on device) — "
            f"free space there or set ssh.work_dir; it said: {said}"
        )
    if "not found" in low and program.split("/")[-1] in low:
        return (
            f"{where}: {program} is not installed on the target "
            f"(Debian: apt-get install {kind.package or kind.program}); it said: {said}"
        )
    if "in use" in low:
        return f"{where}: port {access.server_port} is in use on the target; it said: {said}"
    return f"{where}: the {program} server did not start; it said: {said or '(nothing)'}"


def _kind(name: str) -> ServerKind:
    kind = KINDS.get(name)
    if kind is None:
        raise RemoteError(
            f"an SSH target cannot start a {name!r} server (known: {', '.join(KINDS)})"
        )
    if kind.setup is not None:
        # Its configuration would have to be written on the target first: agent targets only.
        raise RemoteError(f"an SSH target cannot start a {name!r} server; run the iepm agent there")
    return kind


@contextlib.asynccontextmanager
async def server(
    access: SshAccess, kind_name: str, address: str, test_s: float, *, netns: str | None = None
) -> AsyncIterator[SshServer]:
    """A one-shot server of ``kind_name`` on the target for one test; always stopped and
    cleaned afterwards."""
    kind = _kind(kind_name)
    program = access.program(kind.name, kind.program)
    # No agent holds an SSH test to a grant: the monitor's own spec is its only limit.
    argv = kind.argv(program, access.server_port, None, None)
    ready_text = kind.ready.decode()
    step = float(access.step_timeout_s)
    where = f"{access.user}@{address}"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    conn = await connect(access, address, netns)
    try:
        deadline_s = test_s + 2 * step + 5
        command = _start_command(access, argv, deadline_s)
        try:
            process = await asyncio.wait_for(conn.create_process(command), step)
            workdir, pgid, lines = await _await_ready(process, ready_text, step)
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            raise RemoteError(
                f"{where}: starting the {kind.name} server: {_describe(exc, where, step)}"
            ) from None
        ready = ready_text in "\n".join(lines)
        try:
            if not ready:
                said = " | ".join(x for x in lines if x)
                raise RemoteError(_start_failure(access, kind, program, where, said))
            if not workdir.startswith(access.work_dir.rstrip("/") + "/iepm-") or pgid <= 1:
                raise RemoteError(f"{where}: unexpected start-up output: {lines!r}")
            yield SshServer(access.server_port, pgid, workdir, (loop.time() - t0) * 1000)
        finally:
            process.close()
            if workdir.startswith(access.work_dir.rstrip("/") + "/iepm-") and pgid > 1:
                try:
                    await asyncio.wait_for(
                        conn.run(_stop_command(pgid, workdir), check=False), step
                    )
                except (TimeoutError, asyncssh.Error, OSError) as exc:
                    # The remote `timeout` still kills the server at its deadline.
                    log.warning("%s: stopping the server failed (%s)", where, exc)
    finally:
        conn.close()
        with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
            await asyncio.wait_for(conn.wait_closed(), 2.0)


# --- a directory for a copy over SSH -------------------------------------------------------------

# In a copy's directory: the process group of each tool the copy started there (one per line),
# so that whoever removes the directory first kills them.
PIDS_FILE = ".iepm-pids"


@dataclass(frozen=True)
class SshDirectory:
    path: str
    pgid: int
    ready_ms: float


def _sweep(directory: str) -> str:
    """Shell: kill the copy's recorded process groups, then remove its directory."""
    return (
        f"for p in $(cat {directory}/{PIDS_FILE} 2>/dev/null); do kill -KILL -- -$p 2>/dev/null; "
        f"done; rm -rf -- {directory}"
    )


def _hold_command(base: str, hold_s: float) -> str:
    """Make a private directory and hold it while the SSH channel is open, at most ``hold_s``:
    when the monitor goes away (its connection closes, ``cat`` reads EOF) or the time is up,
    the target itself kills the copy's tools and removes the directory."""
    template = shlex.quote(base.rstrip("/") + "/iepm-XXXXXXXX")
    # --foreground: timeout stays in this shell's group, which the monitor's stop step kills.
    hold = shlex.join(["timeout", "--foreground", "-s", "KILL", str(int(hold_s)), "cat"])
    return (
        f'umask 077 && d=$(mktemp -d {template}) && echo "iepm-dir $d" && echo "iepm-pgid $$" '
        f"&& {{ echo iepm-ready; {hold} >/dev/null; {_sweep(chr(34) + '$d' + chr(34))}; }}"
    )


def remote_pids_file(directory: str) -> str:
    return f"{directory.rstrip('/')}/{PIDS_FILE}"


@contextlib.asynccontextmanager
async def directory(
    access: SshAccess, address: str, base: str, hold_s: float, *, netns: str | None = None
) -> AsyncIterator[SshDirectory]:
    """A fresh directory under ``base`` on the target for one copy; the tools recorded in it
    are killed and it is removed afterwards (by the monitor, else by the target at EOF or
    ``hold_s`` + the step deadlines)."""
    step = float(access.step_timeout_s)
    where = f"{access.user}@{address}"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    conn = await connect(access, address, netns)
    try:
        command = _hold_command(base, hold_s + 2 * step + 5)
        try:
            process = await asyncio.wait_for(conn.create_process(command), step)
            path, pgid, lines = await _await_ready(process, "iepm-ready", step)
        except (TimeoutError, asyncssh.Error, OSError) as exc:
            raise RemoteError(
                f"{where}: making the copy's directory: {_describe(exc, where, step)}"
            ) from None
        mine = path.startswith(base.rstrip("/") + "/iepm-") and pgid > 1
        try:
            if "iepm-ready" not in lines or not mine:
                said = " | ".join(x for x in lines if x) or "(nothing)"
                raise RemoteError(_directory_failure(base, where, said))
            yield SshDirectory(path, pgid, (loop.time() - t0) * 1000)
        finally:
            process.close()
            if mine:
                group = shlex.quote(f"-{pgid}")
                stop = (
                    f"{_sweep(shlex.quote(path))}; kill -TERM -- {group} 2>/dev/null && "
                    f"sleep {STOP_GRACE_S}; kill -KILL -- {group} 2>/dev/null; true"
                )
                try:
                    await asyncio.wait_for(conn.run(stop, check=False), step)
                except (TimeoutError, asyncssh.Error, OSError) as exc:
                    # The holder still removes it when the channel closes or its time is up.
                    log.warning("%s: removing %s failed (%s)", where, path, exc)
    finally:
        conn.close()
        with contextlib.suppress(TimeoutError, asyncssh.Error, OSError):
            await asyncio.wait_for(conn.wait_closed(), 2.0)


def _directory_failure(base: str, where: str, said: str) -> str:
    low = said.lower()
    if "no space left" in low:
        return f"{where}: the target's {base} is full (No space left on device); it said: {said}"
    if "permission denied" in low or "read-only" in low:
        return f"{where}: cannot write in {base} on the target (permission denied); it said: {said}"
    if "no such file" in low:
        return f"{where}: {base} does not exist on the target; it said: {said}"
    return f"{where}: cannot make a directory in {base} on the target; it said: {said}"


async def check_target(
    access: SshAccess, address: str, netns: str | None = None
) -> dict[str, str | int | None]:
    """Log in and report what a test needs: each server kind's version, rsync's (copies over
    SSH), free space in work_dir and memory_dir."""
    step = float(access.step_timeout_s)
    conn = await connect(access, address, netns)
    versions: dict[str, str | int | None] = {}
    try:
        programs = [
            (kind.name, [access.program(kind.name, kind.program), *kind.version_argv])
            for kind in KINDS.values()
        ]
        for name, argv in [*programs, ("rsync", [access.rsync_path, "--version"])]:
            answer = await run_remote(conn, argv, step)
            out = str(answer.stdout or "")
            versions[name] = out.splitlines()[0] if answer.exit_status == 0 and out else None
        spaces = {
            f"{label}_free_bytes": await run_remote(conn, ["df", "-Pk", path], step)
            for label, path in (("work_dir", access.work_dir), ("memory_dir", access.memory_dir))
        }
    finally:
        conn.close()
    free: dict[str, str | int | None] = {}
    for label, space in spaces.items():
        fields = str(space.stdout or "").splitlines()[-1:]
        free[label] = None
        if fields and re.match(r"^\S+\s+\d+\s+\d+\s+\d+", fields[0]):
            free[label] = int(fields[0].split()[3]) * 1024
    return {**versions, **free}
