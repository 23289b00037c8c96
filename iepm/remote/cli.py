"""``iepm agent`` (the target-host responder) and ``iepm target add|check|bootstrap``
(enrolment)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from iepm.cliglue import GuardedTyper, explain, fail, parse_listen
from iepm.errors import ConfigError, ExitCode, IepmError, exit_code

agent_app = GuardedTyper(
    help="The target-host responder: `iepm agent --listen ADDR:PORT --config agent.toml`.",
    invoke_without_command=True,
)
target_app = GuardedTyper(
    help="Enrol and check targets (agent, SSH or plain).", no_args_is_help=True
)


@agent_app.callback()
def agent(
    ctx: typer.Context,
    listen: Annotated[
        str | None, typer.Option(help="ADDR:PORT to serve the API on, e.g. 198.18.0.10:8700.")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="agent.toml")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning")] = "info",
) -> None:
    """Serve the agent API (facts, exclusive one-shot test servers) until SIGTERM."""
    if ctx.invoked_subcommand is not None:
        return
    if listen is None or config is None:
        raise fail("iepm agent needs --listen ADDR:PORT and --config agent.toml")
    from iepm.remote.agent import serve
    from iepm.remote.trust import load_agent_config

    try:
        host, port = parse_listen(listen, "198.18.0.10:8700")
    except ValueError as exc:
        raise fail(str(exc)) from None
    settings = load_agent_config(config)
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    serve(settings, host, port, log_level=log_level.lower())


@agent_app.command("token")
def agent_token(
    monitor: Annotated[str, typer.Option(help="The monitor this token is for.")],
    output: Annotated[
        Path, typer.Option(help="Write the token here (mode 0600), for the monitor.")
    ],
) -> None:
    """Make a monitor's token: the token goes to --output (copy it to the monitor); the
    monitors stanza with its hash, for the agent's agent.toml, is printed."""
    from iepm.remote.trust import monitor_stanza, new_token, token_digest

    token = new_token()
    _write_secret(output, token + "\n")
    sys.stdout.write(f"# token written to {output}; add this to agent.toml:\n")
    sys.stdout.write(monitor_stanza(monitor, token_digest(token)))


@agent_app.command("check")
def agent_check(config: Annotated[Path, typer.Argument(help="agent.toml")]) -> None:
    """Validate agent.toml (errors name file, line and field)."""
    from iepm.remote.trust import load_agent_config

    settings = load_agent_config(config)
    names = ", ".join(m.name for m in settings.monitors) or "none"
    sys.stdout.write(f"{config}: ok ({len(settings.monitors)} monitors: {names})\n")


def _write_secret(path: Path, text: str) -> None:
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


@target_app.command("add")
def target_add(
    name: Annotated[str, typer.Argument(help="Target name (letters, digits, . _ -).")],
    address: Annotated[str, typer.Argument(help="IP address or host name.")],
    mode: Annotated[str, typer.Option(help="plain, agent or ssh.")] = "plain",
    monitor: Annotated[
        str | None, typer.Option(help="This monitor's name (agent mode; default: host name).")
    ] = None,
    agent_url: Annotated[
        str | None, typer.Option(help="Agent URL (default http://ADDRESS:8700).")
    ] = None,
    credential_dir: Annotated[
        Path, typer.Option(help="Where this monitor keeps agent tokens / SSH keys.")
    ] = Path("/etc/iepm/credentials"),
    ssh_user: Annotated[str, typer.Option(help="SSH user on the target.")] = "iepm",
    ssh_port: Annotated[int, typer.Option(help="SSH port.")] = 22,
    known_hosts: Annotated[
        Path, typer.Option(help="known_hosts file the monitor checks host keys against.")
    ] = Path("/etc/iepm/known_hosts"),
    scan_host_key: Annotated[
        bool,
        typer.Option(help="SSH: fetch the host key now and add it to --known-hosts (verify it!)."),
    ] = False,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Append the [[targets]] entry to this targets.toml."),
    ] = None,
) -> None:
    """Enrol a target: makes the credential, prints what the target's admin must do and the
    targets.toml entry (appended to --config after validation)."""
    import socket

    from iepm import tomlload
    from iepm.config import TargetConfig, load_config_text

    lines = ["", "[[targets]]", f"name = {_toml_str(name)}", f"address = {_toml_str(address)}"]
    lines.append(f"mode = {_toml_str(mode)}")
    steps: list[str] = []
    try:
        TargetConfig.model_validate({"name": name, "address": address})
        if mode == "agent":
            from iepm.remote.trust import monitor_stanza, new_token, token_digest

            me = monitor or socket.gethostname()
            url = agent_url or f"http://{address}:8700"
            token_file = credential_dir / f"{name}.token"
            token = new_token()
            _write_secret(token_file, token + "\n")
            lines += [
                "[targets.agent]",
                f"url = {_toml_str(url)}",
                f"credential_file = {_toml_str(str(token_file))}",
            ]
            steps.append(
                f"On {address}, add to the agent's agent.toml (then restart `iepm agent`):\n\n"
                + monitor_stanza(me, token_digest(token))
            )
            steps.append(f"This monitor's token was written to {token_file} (mode 0600).")
        elif mode == "ssh":
            key_file = credential_dir / "iepm_ssh_ed25519"
            public = _ensure_ssh_key(key_file)
            lines += [
                "[targets.ssh]",
                f"user = {_toml_str(ssh_user)}",
                f"key_file = {_toml_str(str(key_file))}",
                f"port = {ssh_port}",
                f"known_hosts = {_toml_str(str(known_hosts))}",
            ]
            steps.append(
                f"On {address}, as {ssh_user}, append this line to ~/.ssh/authorized_keys "
                "(`restrict`: no forwarding, no pty):\n\n"
                f"restrict {public}\n"
                f"\nThe target needs iperf3 (Debian: apt-get install iperf3) and space in /tmp."
            )
            if scan_host_key:
                entry = asyncio.run(_scan_host_key(address, ssh_port))
                known_hosts.parent.mkdir(parents=True, exist_ok=True)
                with known_hosts.open("a") as f:
                    f.write(entry + "\n")
                steps.append(
                    f"Host key added to {known_hosts} — compare it with the target's:\n  {entry}"
                )
            else:
                steps.append(
                    f"Add the target's host key to {known_hosts} after checking its fingerprint, "
                    f"e.g. ssh-keyscan -p {ssh_port} {address} >> {known_hosts}, or re-run with "
                    "--scan-host-key."
                )
        elif mode != "plain":
            raise ConfigError(f"--mode must be plain, agent or ssh (got {mode!r})")
        else:
            steps.append(f"Nothing to install: run `iperf3 -s` on {address} (port 5201).")
        stanza = "\n".join(lines) + "\n"
        if config is not None:
            text = tomlload.read_text(config) if config.exists() else ""
            load_config_text(text + stanza, config)  # refuse to write a file that won't load
            with config.open("a", encoding="utf-8") as f:
                f.write(stanza)
            steps.append(f"Added target {name} to {config}.")
        else:
            steps.append("Add to targets.toml:\n" + stanza)
    except (IepmError, ValueError, OSError) as exc:
        message, code = explain(exc) or (str(exc), ExitCode.USAGE)
        raise fail(message, code) from None
    sys.stdout.write("\n\n".join(steps) + "\n")


def _ensure_ssh_key(key_file: Path) -> str:
    """This monitor's SSH key (created once, 0600, no passphrase: it runs unattended)."""
    import asyncssh

    if not key_file.exists():
        key = asyncssh.generate_private_key("ssh-ed25519", comment="iepm-monitor")
        _write_secret(key_file, key.export_private_key().decode())
        key_file.with_suffix(".pub").write_bytes(key.export_public_key())
    key = asyncssh.read_private_key(str(key_file))
    return key.export_public_key().decode().strip()


async def _scan_host_key(address: str, port: int) -> str:
    import asyncssh

    key = await asyncio.wait_for(asyncssh.get_server_host_key(address, port), 15.0)
    if key is None:
        raise ConfigError(f"{address}:{port} offered no host key")
    host = address if port == 22 else f"[{address}]:{port}"
    return f"{host} {key.export_public_key().decode().strip()}"


@target_app.command("bootstrap")
def target_bootstrap(
    address: Annotated[str, typer.Argument(help="The target's address (SSH and the agent).")],
    key_file: Annotated[Path, typer.Option(help="SSH private key that logs in.")],
    known_hosts: Annotated[Path, typer.Option(help="known_hosts holding the target's key.")],
    name: Annotated[str | None, typer.Option(help="Target name (default: the address).")] = None,
    ssh_user: Annotated[str, typer.Option(help="SSH user (root, or one with sudo rights).")] = (
        "root"
    ),
    ssh_port: Annotated[int, typer.Option(help="SSH port.")] = 22,
    monitor: Annotated[
        str | None, typer.Option(help="This monitor's name (default: host name).")
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help="This monitor's token for the target (made if missing)."),
    ] = None,
    prefix: Annotated[str, typer.Option(help="Where iepm goes on the target.")] = "/opt/iepm",
    etc: Annotated[str, typer.Option(help="Configuration directory on the target.")] = (
        "/etc/iepm"
    ),
    state: Annotated[str, typer.Option(help="Data directory on the target.")] = "/var/lib/iepm",
    port: Annotated[int, typer.Option(help="The agent's port.")] = 8700,
    service: Annotated[
        str, typer.Option(help="auto (systemd if it runs), systemd, or direct.")
    ] = "auto",
    wheelhouse: Annotated[
        Path | None,
        typer.Option(help="Wheels of iepm and its dependencies (default: built once, cached)."),
    ] = None,
    netns: Annotated[
        str | None, typer.Option(help="Reach the target from this network namespace.")
    ] = None,
    step_timeout_s: Annotated[float, typer.Option(help="Deadline of each SSH step.")] = 30.0,
) -> None:
    """Make a Debian host an agent target over SSH (packages, iepm, agent.toml with this
    monitor's token, the agent as a service), check it answers, and say what changed. Running
    it again changes nothing."""
    import socket

    from iepm.config import SshAccess, TargetConfig
    from iepm.remote.bootstrap import (
        Layout,
        bootstrap,
        check_agent,
        default_wheelhouse,
    )
    from iepm.remote.bootstrap import (
        wheelhouse as build_wheelhouse,
    )

    if service not in ("auto", "systemd", "direct"):
        raise fail(f"--service must be auto, systemd or direct (got {service!r})")
    target = name or address
    me = monitor or socket.gethostname()
    tokens = token_file or Path("/etc/iepm/credentials") / f"{target}.token"
    try:
        TargetConfig.model_validate({"name": target, "address": address})
        access = SshAccess.model_validate(
            {"user": ssh_user, "key_file": str(key_file), "port": ssh_port,
             "known_hosts": str(known_hosts), "step_timeout_s": step_timeout_s}
        )  # fmt: skip
        wheels = build_wheelhouse(wheelhouse or default_wheelhouse())
        host = f"[{address}]" if ":" in address else address
        url = f"http://{host}:{port}"

        async def go() -> Any:
            done = await bootstrap(
                access, address, monitor=me, token_file=tokens,
                layout=Layout(prefix, etc, state), listen=f"{host}:{port}",
                wheels=wheels, netns=netns, service=service,
            )  # fmt: skip
            done.facts = await check_agent(url, tokens, netns, wait_s=60.0)
            return done

        report = asyncio.run(go())
    except (IepmError, ValueError, OSError) as exc:
        message, code = explain(exc) or (str(exc), ExitCode.REMOTE)
        raise fail(message, code) from None
    facts = report.facts
    lines = report.lines()
    lines.append(
        f"  agent answers at {url}: {facts.get('os', '?')}, kernel {facts.get('kernel', '?')}"
    )
    lines += ["", "[[targets]]", f'name = "{target}"', f'address = "{address}"', 'mode = "agent"',
              "[targets.agent]", f'url = "{url}"', f'credential_file = "{tokens}"']  # fmt: skip
    sys.stdout.write("\n".join(lines) + "\n")


@target_app.command("check")
def target_check(
    name: Annotated[str, typer.Argument(help="Target name in the config.")],
    config: Annotated[Path, typer.Option("--config", "-c", help="targets.toml")],
) -> None:
    """Reach an agent or SSH target the way a test would: facts, limits, tools."""
    from iepm.config import load_config
    from iepm.remote.access import AgentAccess

    try:
        settings = load_config(config)
        target = settings.target(name)
        remote = target.remote()
        netns = settings.monitor.netns
        report: dict[str, Any]
        if remote is None:
            report = {"mode": "plain", "note": "nothing to check beyond `iepm probe`"}
        elif isinstance(remote, AgentAccess):
            from iepm.remote.client import AgentClient

            client = AgentClient.from_access(remote, netns=netns)

            async def ask() -> dict[str, Any]:
                facts, usage = await client.facts(), await client.usage()
                return {
                    "facts": facts.model_dump(mode="json"),
                    "usage": usage.model_dump(mode="json"),
                }

            report = {"mode": "agent", **asyncio.run(ask())}
        else:
            from iepm.remote.ssh import check_target

            report = {
                "mode": "ssh",
                **asyncio.run(check_target(remote, target.address, netns)),
            }
    except IepmError as exc:
        raise fail(str(exc), exit_code(exc)) from None
    sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")


def register(app: typer.Typer) -> None:
    app.add_typer(agent_app, name="agent")
    app.add_typer(target_app, name="target")
