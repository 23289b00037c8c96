"""Read and check a mesh file, and derive one host's configuration from it.

Everything a host's ``iepm run`` would meet is checked at load, for every host at once, so that
``iepm validate mesh.toml`` on any machine finds what would stop any host::

    mesh.toml:41: tests[2].iperf3.streams: Input should be less than or equal to 128 (got 500)
    mesh.toml:12: tests[0].members: 'europa' is neither a host nor a group
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from iepm import tomlload
from iepm.config import Config
from iepm.errors import ConfigError
from iepm.mesh.model import Expansion, Mesh, Pair, expand, monitor_config, resolve_members
from iepm.probes import PROBES

if TYPE_CHECKING:  # the archive's libraries load only when leases are used
    from iepm.mesh.leases import HostLeases

log = logging.getLogger(__name__)

# Top-level tables only a mesh file has (targets.toml has [monitor], [defaults], [[targets]]).
MESH_KEYS = ("hosts", "tests", "mesh", "groups")


@dataclass(frozen=True)
class LoadedMesh:
    mesh: Mesh
    expansion: Expansion
    where: str
    digest: str  # of the file's text: a changed file is seen by its content, not its mtime

    def config_for(self, host: str, cycle: int | None = None) -> Config:
        return derive(self, host, cycle)


def is_mesh(data: dict[str, Any]) -> bool:
    return any(key in data for key in MESH_KEYS) and "targets" not in data


def load_mesh(path: str | Path) -> LoadedMesh:
    return check(tomlload.load(path))


def load_mesh_text(text: str, where: str = "<mesh>") -> LoadedMesh:
    return check(tomlload.parse(text, where))


def check(doc: tomlload.TomlText) -> LoadedMesh:
    """The mesh of a parsed document, checked for every host; a ConfigError lists every
    problem as FILE:LINE: field: message."""
    try:
        mesh = Mesh.model_validate(doc.data)
    except ValidationError as exc:
        # A test's probe tables are validated as its "params": name them as the file does.
        found = [(_file_loc(loc), message) for loc, message in tomlload.problems(exc)]
        raise tomlload.config_error(doc.where, doc.text, found) from None
    errors: list[tomlload.Problem] = []
    names: set[str] = set()
    for i, host in enumerate(mesh.hosts):
        if host.name in names:
            errors.append((("hosts", i, "name"), f"duplicate host name {host.name!r}"))
        names.add(host.name)
    for group, members in mesh.groups.items():
        for member in members:
            if member not in names:
                errors.append((("groups", group), f"{member!r} is not a host"))
    for i, test in enumerate(mesh.tests):
        for key in ("members", "a", "b"):
            try:
                resolve_members(mesh, getattr(test, key))
            except ValueError as exc:
                errors.append((("tests", i, key), str(exc)))
        if test.center is not None and test.center not in names:
            errors.append((("tests", i, "center"), f"{test.center!r} is not a host"))
    for name, values in mesh.defaults.items():
        try:
            PROBES[name].Spec.model_validate(values)
        except ValidationError as exc:
            errors += tomlload.problems(exc, ("defaults", name))
    monitors = {}
    for i, host in enumerate(mesh.hosts):
        try:
            monitors[host.name] = monitor_config(mesh, host)
        except ValidationError as exc:
            for loc, message in tomlload.problems(exc):
                own = bool(loc) and loc[0] in host.monitor
                errors.append(
                    ((*(("hosts", i, "monitor") if own else ("monitor",)), *loc), message)
                )
    errors += _check_tests(mesh, monitors)
    if errors:  # later checks need known members and valid specs
        raise tomlload.config_error(doc.where, doc.text, _unique(errors))
    expansion = expand(mesh)
    errors += _check_pairs(mesh, expansion)
    errors += _check_control(mesh, expansion)
    if errors:
        raise tomlload.config_error(doc.where, doc.text, _unique(errors))
    loaded = LoadedMesh(mesh, expansion, doc.where, hashlib.sha256(doc.text.encode()).hexdigest())
    for i, host in enumerate(mesh.hosts):
        try:
            derive(loaded, host.name)
        except (ValidationError, ConfigError) as exc:  # a bug in derive rather than in the file
            errors.append((("hosts", i), f"cannot derive its configuration: {exc}"))
    if errors:
        raise tomlload.config_error(doc.where, doc.text, errors)
    return loaded


def _file_loc(loc: tomlload.Loc) -> tomlload.Loc:
    if len(loc) > 3 and loc[0] == "tests" and loc[2] == "params":
        return (*loc[:2], *loc[3:])
    return loc


def _unique(errors: list[tomlload.Problem]) -> list[tomlload.Problem]:
    return list(dict.fromkeys(errors))


def _check_tests(mesh: Mesh, monitors: dict[str, Any]) -> list[tomlload.Problem]:
    errors: list[tomlload.Problem] = []
    shortest = min((m.cycle_interval_s for m in monitors.values()), default=None)
    for i, test in enumerate(mesh.tests):
        for probe in test.probes:
            own = test.params.get(probe, {})
            if not isinstance(own, dict):
                errors.append((("tests", i, probe), "must be a table of the probe's parameters"))
                continue
            try:
                spec = PROBES[probe].Spec.model_validate({**mesh.defaults.get(probe, {}), **own})
            except ValidationError as exc:
                for loc, message in tomlload.problems(exc):
                    mine = not loc or loc[0] in own
                    base = ("tests", i, probe) if mine else ("defaults", probe)
                    errors.append(((*base, *loc), message))
                continue
            # A measurement must fit in a cycle, or cycles would overlap forever.
            if shortest is not None and spec.deadline_s() >= shortest:
                errors.append(
                    (
                        ("tests", i, probe),
                        f"{probe} may run {spec.deadline_s():g} s, not less than the cycle "
                        f"interval ({shortest:g} s)",
                    )
                )
    return errors


def _check_control(mesh: Mesh, expansion: Expansion) -> list[tomlload.Problem]:
    """In control mode every host that runs tests does so through its agent, and a test that
    needs a server at its destination finds it on that host's agent (or a plain server)."""
    if mesh.mesh.control is None:
        return []
    errors: list[tomlload.Problem] = []
    index = {h.name: i for i, h in enumerate(mesh.hosts)}
    sources = {p.source for p in expansion.pairs}
    for name in sorted(sources, key=index.__getitem__):
        if mesh.host(name).mode != "agent":
            errors.append(
                (
                    ("hosts", index[name], "mode"),
                    f"{name} runs tests and the mesh has [mesh.control]: its tests go through "
                    "its agent, so it needs mode = 'agent' and a [hosts.agent] table",
                )
            )
    for pair in expansion.pairs:
        destination = mesh.host(pair.destination)
        served = [p for p in mesh.tests[pair.test].probes if PROBES[p].META.server]
        if served and destination.mode == "ssh":
            errors.append(
                (
                    ("hosts", index[pair.destination], "mode"),
                    f"{served[0]} to {pair.destination} needs a server there, which in control "
                    "mode comes from its agent (mode = 'agent') or is already running "
                    "(mode = 'plain'), not over SSH",
                )
            )
    return errors


def _check_pairs(mesh: Mesh, expansion: Expansion) -> list[tomlload.Problem]:
    """One probe runs once per cycle from a source to a target: two tests asking for the same
    probe on the same pair (with maybe different parameters) is a mistake in the file."""
    errors: list[tomlload.Problem] = []
    seen: dict[tuple[str, str, str], int] = {}
    for pair in expansion.pairs:
        for probe in mesh.tests[pair.test].probes:
            key = (pair.source, pair.target, probe)
            first = seen.setdefault(key, pair.test)
            if first != pair.test:
                errors.append(
                    (
                        ("tests", pair.test, "probes"),
                        f"{probe} from {pair.source} to {pair.target} is already in test "
                        f"{mesh.tests[first].name!r}",
                    )
                )
    return _unique(errors)


def derive(loaded: LoadedMesh, host: str, cycle: int | None = None) -> Config:
    """``host``'s configuration: it is the monitor, the destinations of its pairs are its
    targets. ``cycle``: only the tests due in that cycle (``every``); None: all of them."""
    mesh = loaded.mesh
    try:
        me = mesh.host(host)
    except KeyError:
        raise ConfigError(
            f"{loaded.where}: no host named {host!r} (hosts: {', '.join(mesh.host_names())})"
        ) from None
    targets: dict[str, dict[str, Any]] = {}
    for pair in pairs_from(loaded.expansion, host):
        test = mesh.tests[pair.test]
        destination = mesh.host(pair.destination)
        entry = targets.setdefault(pair.target, _target_entry(pair, destination))
        if cycle is not None and (cycle - 1) % test.every:
            continue  # not due this cycle; the target stays listed with the probes due
        for probe in test.probes:
            entry["probes"].append(probe)
            if probe in test.params:
                entry[probe] = test.params[probe]
    # Validated from plain data: TargetConfig keeps its probe tables only when it reads them.
    return Config.model_validate(
        {
            "monitor": monitor_config(mesh, me).model_dump(),
            "defaults": mesh.defaults,
            "targets": [t for t in targets.values() if t["probes"]],
        }
    )


def pairs_from(expansion: Expansion, host: str) -> list[Pair]:
    return [p for p in expansion.pairs if p.source == host]


def _target_entry(pair: Pair, host: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": pair.target,
        "address": pair.address,
        "site": host.site,
        "group": host.group,
        "probes": [],
        "ping_expected": host.ping_expected,
        "mode": host.mode,
    }
    if host.mode in ("agent", "ssh"):
        entry[host.mode] = host.remote().model_dump()
    return entry


class MeshSource:
    """A host's configuration from a mesh file that may change while ``iepm run`` runs: each
    cycle re-reads the file; a changed file that validates takes effect in that cycle, one
    that does not is logged with its errors and the last good mesh stays in use."""

    def __init__(self, path: str | Path, host: str) -> None:
        self.path = Path(path)
        self.host = host
        self.loaded = load_mesh(self.path)
        derive(self.loaded, host)  # an unknown host stops `iepm run` at once
        self.reloads = 0
        self.rejected = 0
        self._bad_digest: str | None = None  # an invalid edit is reported once, not per cycle

    def leases(self) -> HostLeases | None:
        """The archive leases this host's exclusive probes hold (None: the mesh has them off).
        Lease settings are read at start: a change takes effect at restart."""
        from iepm.mesh.leases import HostLeases

        info = self.loaded.mesh.mesh
        if not info.leases:
            return None
        config = derive(self.loaded, self.host)
        # A target is named HOST or HOST.LABEL and host names hold no '.': its host is exact.
        return HostLeases(
            config.monitor.archive,
            self.host,
            lambda target: target.partition(".")[0],
            wait_s=info.lease_wait_s,
        )

    def __call__(self, cycle: int) -> Config:
        self._refresh()
        return derive(self.loaded, self.host, cycle)

    def _refresh(self) -> None:
        try:
            text = tomlload.read_text(self.path)
        except ConfigError as exc:
            log.error("mesh file unreadable, keeping the last good one: %s", exc)
            return
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest in (self.loaded.digest, self._bad_digest):
            return
        try:
            loaded = check(tomlload.parse(text, str(self.path)))
            derive(loaded, self.host)
        except ConfigError as exc:
            self.rejected += 1
            self._bad_digest = digest
            log.error("mesh file changed but is invalid, keeping the last good one:\n%s", exc)
            return
        self.loaded = loaded
        self.reloads += 1
        log.info("mesh file %s changed: reloaded", self.path)
