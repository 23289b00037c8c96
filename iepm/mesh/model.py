"""A mesh file: every host of a mesh, its groups and tests, in one TOML file shared by all hosts.

Each host runs ``iepm run --mesh FILE --as HOST``; :func:`derive` turns the mesh into that host's
:class:`~iepm.config.Config` (the host is the monitor, the hosts it tests are its targets).
A test names its probes, its members and its shape:

- ``mesh``: every member to every other (``directions = "both"``), or only i → j for i before j
  in the members' order (``"forward"``, RTPL's i < j) or i after j (``"reverse"``);
- ``disjoint``: every host of ``a`` to every host of ``b`` (``"forward"``), back (``"reverse"``)
  or both;
- ``star``: ``center`` to every member (``"forward"``), every member to it (``"reverse"``) or both.

A host with several addresses (a QoS and an Internet route) lists them as ``addresses``; a test's
``via`` picks labels, and the host is then a target once per label, named ``HOST.LABEL`` — so
the two routes of one pair are two series side by side. Without ``via`` the first address is used
and the target is named after the host, as is a host with a single ``address`` (its only route,
whatever ``via`` asks). Host names hold no '.', so the two never clash.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from iepm.config import MonitorConfig, plausible_address, probe_tables
from iepm.probes import PROBES
from iepm.remote.access import AgentAccess, SshAccess

# No '.': a target is named HOST or HOST.LABEL (one of the host's address labels).
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$")
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,14}$")
ALL = "*"  # in a member list: every host of the mesh

Direction = Literal["both", "forward", "reverse"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _host_name(value: str, what: str = "host") -> str:
    if not HOST_RE.match(value):
        raise ValueError(
            f"{what} names are 1-48 letters, digits, '_' or '-', starting with a letter or digit "
            f"(no '.': it joins a host and an address label in target names)"
        )
    return value


class ControlInfo(StrictModel):
    """``[mesh.control]``: one control host runs the whole mesh through the hosts' agents
    (``iepm run --mesh FILE --control``); the hosts run no ``iepm run`` of their own."""

    # The network namespace the control host's requests to the agents leave from (the lab).
    netns: str | None = None
    # How long a run waits while the source's agent runs its max_runs others.
    busy_wait_s: float = Field(default=60.0, ge=0.0, le=3600.0)


class MeshInfo(StrictModel):
    name: str = "mesh"
    description: str | None = None
    control: ControlInfo | None = None
    # Hold a lease in the archive on both hosts of each bandwidth test (iepm.mesh.leases), so
    # no two meet at one host; a test waits up to lease_wait_s for its hosts, else is skipped.
    leases: bool = True
    lease_wait_s: float = Field(default=600.0, ge=0.0, le=86400.0)


class Host(StrictModel):
    name: str
    # One address, or several by label (e.g. { qos = "…", internet = "…" }); the first is used
    # unless a test asks for others with `via`.
    address: str | None = None
    addresses: dict[str, str] = Field(default_factory=dict)
    site: str | None = None
    group: str | None = None
    # How the other hosts reach this one for a test (as a target's mode in targets.toml).
    mode: Literal["plain", "agent", "ssh"] = "plain"
    agent: AgentAccess | None = None
    ssh: SshAccess | None = None
    ping_expected: bool = True
    # This host's own [monitor] settings over the mesh's (netns, log_dir, …) when it runs.
    monitor: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _host_name(value)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return None if value is None else plausible_address(value)

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, value: dict[str, str]) -> dict[str, str]:
        for label in value:
            if not LABEL_RE.match(label):
                raise ValueError(
                    f"address labels are 1-15 letters, digits, '_' or '-' (got {label!r})"
                )
        return {label: plausible_address(a) for label, a in value.items()}

    @model_validator(mode="after")
    def _one_way_to_address(self) -> Host:
        if (self.address is None) == (not self.addresses):
            raise ValueError("give either address or addresses (a table of labelled addresses)")
        for mode in ("agent", "ssh"):
            table = getattr(self, mode)
            if self.mode == mode and table is None:
                raise ValueError(f"mode = {mode!r} needs a [hosts.{mode}] table")
            if self.mode != mode and table is not None:
                raise ValueError(f"[hosts.{mode}] is given but mode = {self.mode!r}")
        if "name" in self.monitor:
            raise ValueError("[hosts.monitor] may not set name: a monitor is named after its host")
        return self

    def labelled(self) -> dict[str, str]:
        """Address by label; a single ``address`` has the label ``""``."""
        return dict(self.addresses) if self.addresses else {"": self.address or ""}

    def remote(self) -> AgentAccess | SshAccess | None:
        return self.agent if self.mode == "agent" else self.ssh if self.mode == "ssh" else None


class Test(StrictModel):
    name: str
    probes: list[str]
    shape: Literal["mesh", "disjoint", "star"] = "mesh"
    members: list[str] = Field(default_factory=lambda: [ALL])  # mesh, star
    a: list[str] = Field(default_factory=list)  # disjoint
    b: list[str] = Field(default_factory=list)
    center: str | None = None  # star
    directions: Direction = "both"
    # Address labels to test (one target per label); None: each host's first address.
    via: list[str] | None = None
    # Run this test every N-th cycle (a schedule coarser than the mesh's cycle).
    every: int = Field(default=1, ge=1, le=10_000)
    # [tests.PROBE] tables, gathered from the probe-named keys before validation.
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _gather_probe_tables(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "params" in data:  # internal: a probe's parameters go in [tests.PROBE]
                raise ValueError("params: unknown field (a probe's parameters: [tests.PROBE])")
            tables = {k: v for k, v in data.items() if k in PROBES}
            data = {k: v for k, v in data.items() if k not in tables}
            if tables:
                data["params"] = tables
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _host_name(value, "test")

    @field_validator("probes")
    @classmethod
    def _probes(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("a test needs at least one probe")
        for name in value:
            if name not in PROBES:
                raise ValueError(f"unknown probe {name!r} (known: {', '.join(sorted(PROBES))})")
        if len(set(value)) != len(value):
            raise ValueError("a probe is listed twice")
        return value

    @model_validator(mode="after")
    def _shape_has_its_fields(self) -> Test:
        given = {"a": bool(self.a), "b": bool(self.b), "center": self.center is not None}
        needs = {"mesh": (), "disjoint": ("a", "b"), "star": ("center",)}[self.shape]
        for name in needs:
            if not given[name]:
                raise ValueError(f"shape = {self.shape!r} needs {name}")
        for name, present in given.items():
            if present and name not in needs:
                raise ValueError(f"{name} is given but shape = {self.shape!r}")
        strays = [p for p in self.params if p not in self.probes]
        if strays:
            raise ValueError(f"[tests.{strays[0]}] is given but {strays[0]} is not in probes")
        return self


class Mesh(StrictModel):
    mesh: MeshInfo = Field(default_factory=MeshInfo)
    # [monitor]: every host's MonitorConfig, but for its name (the host's).
    monitor: dict[str, Any] = Field(default_factory=dict)
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)
    hosts: list[Host]
    tests: list[Test] = Field(default_factory=list)

    @field_validator("defaults")
    @classmethod
    def _defaults(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return probe_tables(value)

    @field_validator("monitor")
    @classmethod
    def _monitor(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "name" in value:
            raise ValueError("[monitor] may not set name: each monitor is named after its host")
        return value

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def host_names(self) -> list[str]:
        return [h.name for h in self.hosts]


@dataclass(frozen=True)
class Pair:
    """One directed measurement of a test: ``source`` runs ``probes`` towards ``target``."""

    test: int  # index in Mesh.tests
    source: str
    destination: str
    label: str  # address label ("" for a host's only address)
    target: str  # target name at the source: HOST or HOST.LABEL
    address: str


@dataclass
class Expansion:
    """A mesh's pairs, and what was left out (a destination without the asked label)."""

    pairs: list[Pair] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


def target_name(host: str, label: str) -> str:
    return f"{host}.{label}" if label else host


def resolve_members(mesh: Mesh, names: list[str]) -> list[str]:
    """Host names of a member list (host, group or '*'), in order, without repeats. Raises
    ValueError naming an unknown member."""
    hosts = mesh.host_names()
    by_group: dict[str, list[str]] = {}
    for host in mesh.hosts:
        if host.group:
            by_group.setdefault(host.group, []).append(host.name)
    out: list[str] = []
    for name in names:
        if name == ALL:
            found = hosts
        elif name in mesh.groups:
            found = mesh.groups[name]
        elif name in hosts:
            found = [name]
        elif name in by_group:
            found = by_group[name]
        else:
            raise ValueError(f"{name!r} is neither a host nor a group")
        out += [h for h in found if h not in out]
    return out


def directed(test: Test, mesh: Mesh) -> Iterator[tuple[str, str]]:
    """(source, destination) host pairs of one test, in a stable order."""
    if test.shape == "mesh":
        members = resolve_members(mesh, test.members)
        for i, x in enumerate(members):
            for j, y in enumerate(members):
                if i == j:
                    continue
                if test.directions == "both" or (test.directions == "forward") == (i < j):
                    yield x, y
        return
    if test.shape == "disjoint":
        a, b = resolve_members(mesh, test.a), resolve_members(mesh, test.b)
    else:
        assert test.center is not None
        a = resolve_members(mesh, [test.center])
        b = [h for h in resolve_members(mesh, test.members) if h not in a]
    for x in a:
        for y in b:
            if x == y:
                continue
            if test.directions in ("both", "forward"):
                yield x, y
            if test.directions in ("both", "reverse"):
                yield y, x


def expand(mesh: Mesh) -> Expansion:
    """Every directed pair of every test, one per address label the test goes via."""
    out = Expansion()
    for index, test in enumerate(mesh.tests):
        for source, destination in directed(test, mesh):
            host = mesh.host(destination)
            addresses = host.labelled()
            labels = test.via if test.via is not None else [next(iter(addresses))]
            if "" in addresses:  # one address: the host's only route, whatever the test asks
                labels = [""]
            for label in labels:
                if label not in addresses:
                    out.left_out.append(
                        f"test {test.name}: {source} → {destination} via {label!r}: "
                        f"{destination} has no such address"
                    )
                    continue
                name = target_name(destination, label) if test.via is not None else destination
                out.pairs.append(Pair(index, source, destination, label, name, addresses[label]))
    return out


def monitor_settings(mesh: Mesh, host: Host) -> dict[str, Any]:
    """The [monitor] table of ``host``: the mesh's, then the host's own; ``{host}`` in a path
    or URL is the host's name (several monitors on one machine, as in the lab)."""
    merged = {**mesh.monitor, **host.monitor, "name": host.name}
    return {
        k: v.replace("{host}", host.name) if isinstance(v, str) else v for k, v in merged.items()
    }


def monitor_config(mesh: Mesh, host: Host) -> MonitorConfig:
    return MonitorConfig.model_validate(monitor_settings(mesh, host))
