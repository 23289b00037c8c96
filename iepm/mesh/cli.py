"""``iepm mesh``: look at a mesh file host by host, and import a perfSONAR pSConfig template."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from iepm import tomlload
from iepm.cliglue import GuardedTyper
from iepm.errors import UsageError
from iepm.mesh.load import LoadedMesh, check, is_mesh, load_mesh, pairs_from

mesh_app = GuardedTyper(help="Meshes: one file for every host of a mesh.", no_args_is_help=True)

MeshArg = Annotated[Path, typer.Argument(help="The mesh file (TOML).")]


def mesh_or_none(path: Path) -> LoadedMesh | None:
    """The checked mesh if ``path`` is a mesh file, None if it is some other TOML file."""
    doc = tomlload.load(path)
    return check(doc) if is_mesh(doc.data) else None


def describe_mesh(path: Path, loaded: LoadedMesh) -> str:
    mesh = loaded.mesh
    sources = {p.source for p in loaded.expansion.pairs}
    lines = [
        f"{path}: ok — mesh {mesh.mesh.name}, {len(mesh.hosts)} hosts, {len(mesh.tests)} tests, "
        f"{len(loaded.expansion.pairs)} directed pairs from {len(sources)} monitoring hosts"
    ]
    lines += [f"  left out: {why}" for why in loaded.expansion.left_out]
    from iepm.mesh.control import describe_control

    lines += describe_control(loaded)
    return "\n".join(lines)


@mesh_app.command("show")
def show_cmd(
    mesh: MeshArg,
    host: Annotated[
        str | None, typer.Option("--as", help="Only this host's targets, as it derives them.")
    ] = None,
) -> None:
    """List the pairs of a mesh: per monitoring host, its targets, probes and tests."""
    loaded = load_mesh(mesh)
    hosts = [host] if host else loaded.mesh.host_names()
    out = [describe_mesh(mesh, loaded)]
    for name in hosts:
        config = loaded.config_for(name)  # an unknown --as is a ConfigError naming the hosts
        tests: dict[str, list[str]] = {}
        for pair in pairs_from(loaded.expansion, name):
            tests.setdefault(pair.target, []).append(loaded.mesh.tests[pair.test].name)
        out.append(f"{name} ({len(config.targets)} targets):")
        for target in config.targets:
            out.append(
                f"  {target.name:<24} {target.address:<18} {target.mode:<6} "
                f"{','.join(target.probes):<24} tests: {','.join(tests[target.name])}"
            )
    sys.stdout.write("\n".join(out) + "\n")


@mesh_app.command("import")
def import_cmd(
    template: Annotated[Path, typer.Argument(help="A pSConfig JSON template.")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Mesh file to write (default stdout).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --output.")] = False,
) -> None:
    """Write the mesh file equivalent to a perfSONAR pSConfig template; what cannot be mapped
    is listed on stderr (and as comments in the file) with the reason."""
    from iepm.mesh.psconfig import import_template

    if output is not None and output.exists() and not force:
        raise UsageError(f"{output} exists; give --force to overwrite it")
    imported = import_template(template)
    check(tomlload.parse(imported.text, str(output or "<imported mesh>")))  # never write junk
    if output is None:
        sys.stdout.write(imported.text)
    else:
        output.write_text(imported.text, encoding="utf-8")
    for note in imported.unmapped:
        sys.stderr.write(f"not mapped: {note}\n")
    sys.stderr.write(
        f"imported {imported.hosts} hosts and {imported.tests} tests"
        f"{f' into {output}' if output else ''}; {len(imported.unmapped)} parts not mapped\n"
    )


@mesh_app.command("leases")
def leases_cmd(
    mesh: MeshArg,
    host: Annotated[str, typer.Option("--as", help="Read the archive this host writes to.")],
) -> None:
    """List the host leases held now in the mesh's archive (who tests what, for how long)."""
    from iepm.cliglue import existing_archive_url
    from iepm.mesh.leases import HostLeases

    config = load_mesh(mesh).config_for(host)
    url = existing_archive_url(config.monitor.archive, None)
    leases = HostLeases(url, host, str, wait_s=0)
    try:
        rows = leases.current()
    finally:
        leases.close()
    lines = [f"{len(rows)} host leases held"]
    lines += [
        f"  {h:<20} held by {who:<20} testing {probe} to {target} ({left:.0f} s left)"
        for h, who, target, probe, left in rows
    ]
    sys.stdout.write("\n".join(lines) + "\n")


def register(app: typer.Typer) -> None:
    """Add ``iepm mesh`` to the ``iepm`` command."""
    app.add_typer(mesh_app, name="mesh")
