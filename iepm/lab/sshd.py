"""A private OpenSSH server for a lab site (the demo's SSH targets): its own host key, client
key, known_hosts and sshd_config in one directory, key login only. The caller starts
:func:`sshd_argv` in the site's namespace and stops it by PID; removing the directory removes
everything else."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"
# sshd's privilege-separation directory, shared by every sshd on the host: made when missing,
# never removed (another sshd accepting a connection now would lose it).
PRIVSEP_DIR = Path("/run/sshd")
KEYGEN_S = 30.0


@dataclass(frozen=True)
class PrivateSshd:
    address: str
    port: int
    config: Path
    client_key: Path
    known_hosts: Path

    def access(self) -> dict[str, object]:
        """A ``[targets.ssh]`` table logging in as root with the client key."""
        return {
            "user": "root",
            "key_file": str(self.client_key),
            "port": self.port,
            "known_hosts": str(self.known_hosts),
        }


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        timeout=KEYGEN_S,
        capture_output=True,
    )


def prepare_sshd(
    directory: Path,
    address: str,
    port: int,
    password_auth: bool = False,
    extra_config: tuple[str, ...] = (),
) -> PrivateSshd:
    """Write the keys, known_hosts and sshd_config of an sshd on ``address``:``port`` into
    ``directory`` (made here if missing, mode 0700: sshd and ssh refuse keys others can read).
    ``password_auth``: the server offers passwords too (root may log in with one);
    ``extra_config``: more sshd_config lines."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    _keygen(directory / "host_key")
    _keygen(directory / "client_key")
    authorized = directory / "authorized_keys"
    authorized.write_text((directory / "client_key.pub").read_text())
    host = address if port == 22 else f"[{address}]:{port}"
    kind, key = (directory / "host_key.pub").read_text().split()[:2]
    (directory / "known_hosts").write_text(f"{host} {kind} {key}\n")
    config = directory / "sshd_config"
    lines = [
        f"Port {port}",
        f"ListenAddress {address}",
        f"HostKey {directory / 'host_key'}",
        f"PidFile {directory / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}",
        "PermitRootLogin yes" if password_auth else "PermitRootLogin prohibit-password",
        f"PasswordAuthentication {'yes' if password_auth else 'no'}",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "LoginGraceTime 20",
        *extra_config,
    ]
    config.write_text("\n".join(lines) + "\n")
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    return PrivateSshd(address, port, config, directory / "client_key", directory / "known_hosts")


def sshd_argv(sshd: PrivateSshd) -> list[str]:
    """sshd in the foreground, logging to stderr (the caller's log file)."""
    return [SSHD, "-D", "-e", "-f", str(sshd.config)]
