"""``iepm lab``: bring labs up and down, inspect them, run commands and apply events."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

from iepm.cliglue import GuardedTyper
from iepm.errors import ConfigError, LabError
from iepm.lab.lab import Lab, down, running_labs

lab_app = GuardedTyper(
    help="WAN lab: research sites in network namespaces joined by emulated WAN links (root).",
    no_args_is_help=True,
)


def _only_lab(name: str | None) -> str:
    if name is not None:
        return name
    labs = running_labs()
    if len(labs) == 1:
        return labs[0]
    if not labs:
        raise LabError("no lab is up")
    raise LabError(f"several labs are up ({', '.join(labs)}): name one")


def _summary(lab: Lab) -> str:
    how = "up" if lab.created else "already up, unchanged"
    lines = [f"lab {lab.name}: {how} (state {lab.state_file})"]
    for node, role in lab.plan.roles.items():
        lines.append(f"  {node:<12} {role:<8} {lab.address(node):<15} netns {lab.netns(node)}")
    for name, link in lab.plan.links.items():
        ab, ba = link.ab, link.ba
        rate = f"{ab.rate_mbit:g} Mbit/s" if ab.rate_mbit else "unlimited"
        lines.append(
            f"  link {name}: {link.a} <-> {link.b}, {ab.delay_ms:g}/{ba.delay_ms:g} ms one way, "
            f"jitter {ab.jitter_ms:g} ms, loss {ab.loss_percent:g}%, {rate}"
        )
    return "\n".join(lines)


@lab_app.command()
def up(
    file: Path = typer.Argument(..., help="Topology TOML (see examples/lab/)."),
    name: str | None = typer.Option(None, "--name", help="Override [lab] name."),
) -> None:
    """Build the lab described by FILE (no-op if it is already up with the same file)."""
    lab = Lab.up(file, name=name)
    typer.echo(_summary(lab))


@lab_app.command("down")
def down_cmd(
    name: str | None = typer.Argument(None, help="Lab name (default: the only lab up)."),
) -> None:
    """Remove every namespace, TUN device and process of a lab, even after a crash."""
    report = down(_only_lab(name))
    typer.echo(
        f"lab {report['name']}: removed {len(report['namespaces_removed'])} namespaces, "
        f"stopped {len(report['processes_stopped'])} processes"
    )


@lab_app.command()
def status(
    name: str | None = typer.Argument(None, help="Lab name (default: all labs up)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Nodes, addresses, links with their live parameters and counters, processes alive."""
    names = [name] if name else running_labs()
    reports = [Lab.attach(n).status() for n in names]
    if as_json:
        typer.echo(json.dumps(reports if name is None else reports[0], indent=2))
        return
    if not reports:
        typer.echo("no lab is up")
    for rep in reports:
        typer.echo(f"lab {rep['name']} ({rep['phase']}), lab time {rep['lab_time_s'] or 0:.1f} s")
        for node, info in rep["nodes"].items():
            ok = "" if info["netns_exists"] else "  (namespace missing!)"
            typer.echo(f"  {node:<12} {info['role']:<8} {info['address']:<15} {info['netns']}{ok}")
        for lname, link in rep["links"].items():
            ab = link["a_to_b"]["params"]
            stats = link["a_to_b"].get("stats", {})
            state = "up" if ab["up"] else "DOWN"
            typer.echo(
                f"  link {lname} ({link['a']}->{link['b']}) {state}: delay {ab['delay_ms']:g} ms, "
                f"jitter {ab['jitter_ms']:g} ms, loss {ab['loss_percent']:g}%, rate "
                f"{ab['rate_mbit'] or 'unlimited'}; delivered {stats.get('delivered', '?')} pkts"
                + (f"  ERROR {link['error']}" if "error" in link else "")
            )
        for proc in rep["processes"]:
            alive = "alive" if proc["alive"] else "gone"
            typer.echo(f"  pid {proc['pid']:<7} {proc['role']:<10} {alive}  {proc['link'] or ''}")


@lab_app.command(
    "exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}
)
def exec_cmd(
    node: str = typer.Argument(..., help="Node to run in."),
    command: list[str] = typer.Argument(..., help="Command and arguments (after --)."),
    lab_name: str | None = typer.Option(None, "--lab", "-l", help="Lab (default: the only one)."),
) -> None:
    """Run COMMAND inside NODE's namespace: iepm lab exec mon -- ping -c 3 198.18.0.4"""
    lab = Lab.attach(_only_lab(lab_name))
    argv = lab.command(node, command)
    # Replace this process: the command gets the terminal, signals and exit status directly.
    os.execvp(argv[0], argv)


def _parse_value(key: str, raw: str) -> Any:
    if key == "path":
        return [p for p in raw.split(",") if p]
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


@lab_app.command()
def event(
    name: str = typer.Argument(..., help="Lab name."),
    action: str = typer.Argument(..., help="route, link, or the name of an [[events]] entry."),
    settings: list[str] = typer.Argument(None, help="key=value, e.g. link=wan delay_ms=80"),
) -> None:
    """Apply a change now.

    Examples: ``iepm lab event demo route path=mon,r2,cern``;
    ``iepm lab event demo link link=wan up=false``; ``iepm lab event demo link link=wan
    rate_mbit=20 direction=a_to_b``; ``iepm lab event demo backup_route`` (a named event).
    """
    lab = Lab.attach(name)
    named = {e.name: e for e in lab.topology.events if e.name}
    if action in named and not settings:
        lab.apply(named[action])
        typer.echo(f"applied event {action}")
        return
    fields: dict[str, Any] = {"action": action}
    for item in settings or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{item!r}: expected key=value")
        fields[key.strip()] = _parse_value(key.strip(), value.strip())
    lab.apply(fields)
    typer.echo(f"applied {action} " + " ".join(settings or []))
