"""A private OpenSSH server for tests: its own host key, config and authorized_keys in a temp
dir, on a port we choose, optionally inside a lab namespace; stopped by PID afterwards."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from iepm.config import SshAccess
from iepm.runner import start_process_sync
from tests.helpers import wait_listening

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")


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
        fields: dict[str, object] = {
            "user": "root",
            "key_file": str(self.client_key),
            "port": self.port,
            "known_hosts": str(self.known_hosts),
            "step_timeout_s": 5.0,
        }
        return SshAccess.model_validate({**fields, **changes})

    def revoke(self) -> None:
        self.authorized_keys.write_text("")

    def log(self) -> str:
        return (self.dir / "sshd.log").read_text(errors="replace")


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        timeout=30,
        capture_output=True,
    )


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
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o700)
    _keygen(tmp / "host_key")
    _keygen(tmp / "client_key")
    authorized = tmp / "authorized_keys"
    authorized.write_text((tmp / "client_key.pub").read_text())
    host = address if port == 22 else f"[{address}]:{port}"
    host_pub = (tmp / "host_key.pub").read_text().split()
    (tmp / "known_hosts").write_text(f"{host} {host_pub[0]} {host_pub[1]}\n")
    config = tmp / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                f"ListenAddress {address}",
                f"HostKey {tmp / 'host_key'}",
                f"PidFile {tmp / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PermitRootLogin prohibit-password" if not password_auth else "PermitRootLogin yes",
                f"PasswordAuthentication {'yes' if password_auth else 'no'}",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "LoginGraceTime 20",
                *extra_config,
                "",
            ]
        )
    )
    # sshd's privilege-separation directory is shared by every sshd on the host — other suites'
    # private ones running now too: it is made when missing and never removed (removing it
    # while another sshd accepts a connection resets that connection: "Missing privilege
    # separation directory"). It is what Debian's openssh-server creates at boot, empty.
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    argv = [SSHD, "-D", "-e", "-f", str(config)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    log = (tmp / "sshd.log").open("wb")
    tool = start_process_sync(argv, stdout=log, stderr=log)
    proc = tool.popen
    try:
        wait_listening(address, port, timeout_s=10, netns=netns)
        yield Sshd(address, port, tmp, tmp / "client_key", tmp / "known_hosts", authorized, proc)
    finally:
        tool.stop()  # the project's one supervisor: TERM, grace, KILL, sweep the group
        log.close()
