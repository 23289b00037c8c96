"""A private OpenSSH server for tests: its own host key, config and authorized_keys in a temp
dir, on a port we choose, optionally inside a lab namespace; stopped by PID afterwards."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from iepm.config import SshAccess
from iepm.lab.sshd import prepare_sshd, sshd_argv
from iepm.runner import start_process_sync
from testkit.agent import await_listening


@dataclass
class Sshd:
    address: str
    port: int
    dir: Path
    client_key: Path
    known_hosts: Path
    authorized_keys: Path
    proc: subprocess.Popen[bytes]

    def access(self, **changes: object) -> SshAccess:
        """Access to this server; each SSH step has the product's default deadline (one that
        holds on a busy host) unless ``changes`` says otherwise."""
        fields: dict[str, object] = {
            "user": "root",
            "key_file": str(self.client_key),
            "port": self.port,
            "known_hosts": str(self.known_hosts),
        }
        return SshAccess.model_validate({**fields, **changes})

    def revoke(self) -> None:
        self.authorized_keys.write_text("")

    def log(self) -> str:
        return (self.dir / "sshd.log").read_text(errors="replace")


@contextlib.contextmanager
def private_sshd(
    tmp: Path,
    address: str,
    port: int,
    netns: str | None = None,
    password_auth: bool = True,
    extra_config: tuple[str, ...] = (),
) -> Iterator[Sshd]:
    """``password_auth``: the server offers passwords too (the IEPM-BW "password prompt" case:
    a monitor whose key is refused must fail, never wait at the prompt). ``extra_config``:
    more sshd_config lines (``SetEnv PATH=…``: a target lacking a program)."""
    prepared = prepare_sshd(tmp, address, port, password_auth, extra_config)
    argv = sshd_argv(prepared)
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    log = (tmp / "sshd.log").open("wb")
    tool = start_process_sync(argv, stdout=log, stderr=log)
    proc = tool.popen
    try:
        try:
            await_listening(proc, address, port, netns)
        except AssertionError as exc:
            log.flush()
            raise AssertionError(
                f"sshd did not start: {exc}\n{(tmp / 'sshd.log').read_text(errors='replace')}"
            ) from None
        yield Sshd(
            address,
            port,
            tmp,
            prepared.client_key,
            prepared.known_hosts,
            tmp / "authorized_keys",
            proc,
        )
    finally:
        tool.stop()  # the project's one supervisor: TERM, grace, KILL, sweep the group
        log.close()
