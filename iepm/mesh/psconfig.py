"""``iepm mesh import``: a perfSONAR pSConfig JSON template as an iepm mesh file.

What maps (the README's table says the same):

- ``addresses`` → ``[[hosts]]`` (name made safe: '.' → '-'); ``labels`` → labelled
  ``addresses``; ``_meta.organization`` → ``site``; ``disabled`` ones are left out.
- ``groups``: ``mesh`` → a mesh test (both directions), ``disjoint`` → A × B (both directions,
  or a → b when ``unidirectional``), ``list`` with a test whose ``dest`` is a fixed host → a star
  from that host's point of view (each member measures it); a member's ``label`` or the group's
  ``default-address-label`` → the test's ``via``.
- ``tests``: ``throughput`` → iperf3, ``rtt`` → ping, ``latency``/``latencybg`` (one-way, OWAMP)
  → ping (round trip), ``trace`` → traceroute, with the parameters that have an equivalent.
- ``schedules``: the shortest ``repeat`` of the tasks becomes the cycle interval, each task runs
  every round(repeat / cycle) cycles; ``slip`` becomes the start jitter (at most a cycle).

Everything else (archives, contexts, excludes, remote-addresses, tools other than the probe's,
one task repeating a probe on pairs another task already measures, …) is listed in
:attr:`Imported.unmapped` with the reason, and written as comments at the top of the file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iepm.config import plausible_address
from iepm.errors import ConfigError
from iepm.mesh.model import HOST_RE, LABEL_RE, Host, Mesh, Test, expand

MAX_BYTES = 16 * 1024 * 1024
_DURATION = re.compile(
    r"^P(?:(?P<w>\d+(?:\.\d+)?)W)?(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)
_TEMPLATE = re.compile(r"\{%.*%\}|^\$")  # "{% address[1] %}", "$group::1": filled per pair
MIN_CYCLE_S = 60.0
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")

# pSConfig test type → (probe, {spec key: (probe field, converter)}).
_IDENT = float


def _seconds(value: Any) -> float:
    return iso_seconds(str(value))


_TESTS: dict[str, tuple[str, dict[str, tuple[str, Any]]]] = {
    "throughput": (
        "iperf3",
        {
            "duration": ("duration_s", _seconds),
            "omit": ("omit_s", lambda v: int(_seconds(v))),
            "parallel": ("streams", int),
            "udp": ("udp", bool),
            "bandwidth": ("rate", lambda v: str(int(v))),
            "window-size": ("window", lambda v: str(int(v))),
            "reverse": ("reverse", bool),
            "congestion": ("congestion", str),
        },
    ),
    "rtt": (
        "ping",
        {
            "count": ("count", int),
            "interval": ("interval_s", _seconds),
            "length": ("size_bytes", int),
        },
    ),
    "latency": (
        "ping",
        {"packet-count": ("count", int), "packet-interval": ("interval_s", _IDENT)},
    ),
    "latencybg": (
        "ping",
        {"packet-count": ("count", int), "packet-interval": ("interval_s", _IDENT)},
    ),
    "trace": (
        "traceroute",
        {
            "hops": ("max_hops", int),
            "wait": ("wait_s", _seconds),
            "probe-type": ("method", str),
            "queries": ("queries", int),
        },
    ),
}
# Spec keys that say which pair a test runs on (the mesh's shape says that) or need no mapping.
_PAIR_KEYS = {"source", "dest", "schema"}


@dataclass
class Imported:
    text: str
    hosts: int
    tests: int
    unmapped: list[str] = field(default_factory=list)


def iso_seconds(text: str) -> float:
    """Seconds of an ISO 8601 duration (``PT4H``, ``P1DT30M``, ``PT0.5S``)."""
    match = _DURATION.match(text.strip())
    if not match or text.strip() in ("P", "PT"):
        raise ValueError(f"not an ISO 8601 duration: {text!r}")
    factors = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
    return sum(float(match[k] or 0) * f for k, f in factors.items())


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB; not a template")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        where = f":{exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise ConfigError(f"{path}{where}: not a JSON pSConfig template: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: a pSConfig template is a JSON object")
    return doc


def _safe_name(raw: str, taken: set[str]) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "-", raw).strip("-_")[:48] or "host"
    if not HOST_RE.match(name):
        name = f"h{name}"[:48]
    base, n = name, 2
    while name in taken:
        suffix = f"-{n}"
        name, n = base[: 48 - len(suffix)] + suffix, n + 1
    taken.add(name)
    return name


class _Importer:
    def __init__(self, doc: dict[str, Any], where: str) -> None:
        self.doc = doc
        self.where = where
        self.unmapped: list[str] = []
        self.hosts: dict[str, dict[str, Any]] = {}  # pSConfig address name → host entry
        self.tests: list[dict[str, Any]] = []
        self.repeats: dict[int, float | None] = {}  # test index → repeat (s), None: none given
        self.slip_s = 0.0
        self.test_names: set[str] = set()

    def note(self, text: str) -> None:
        if text not in self.unmapped:
            self.unmapped.append(text)

    def table(self, key: str) -> dict[str, Any]:
        value = self.doc.get(key, {})
        if not isinstance(value, dict):
            self.note(f"{key}: not an object, ignored")
            return {}
        return value

    def run(self) -> Imported:
        known = ("addresses", "groups", "tests", "schedules", "tasks", "hosts", "_meta")
        for key in self.doc:
            if key == "archives":
                self.note("archives (also of hosts and tasks): one archive for the mesh, [monitor]")
            elif key not in known:
                self.note(f"{key}: not mapped (no iepm equivalent)")
        for name, host in self.table("hosts").items():
            if isinstance(host, dict) and host.get("disabled"):
                self.note(f"hosts.{name}: disabled; its addresses are imported all the same")
        self._addresses()
        tasks = self.table("tasks")
        for name, task in tasks.items():
            if not isinstance(task, dict):
                self.note(f"tasks.{name}: not an object, ignored")
                continue
            self._task(name, task)
        return self._write()

    # -- addresses -----------------------------------------------------------------------------

    def _addresses(self) -> None:
        taken: set[str] = set()
        shared: dict[str, list[str]] = {}
        for key, spec in self.table("addresses").items():
            if not isinstance(spec, dict) or not isinstance(spec.get("address"), str):
                self.note(f"addresses.{key}: no address, left out")
                continue
            if spec.get("disabled"):
                self.note(f"addresses.{key}: disabled, left out")
                continue
            entry: dict[str, Any] = {"name": _safe_name(key, taken)}
            labels = {
                label: v.get("address")
                for label, v in (spec.get("labels") or {}).items()
                if isinstance(v, dict) and isinstance(v.get("address"), str)
            }
            bad = [label for label in labels if not LABEL_RE.match(label) or label == "default"]
            for label in bad:
                self.note(f"addresses.{key}.labels.{label}: not a usable label name, left out")
                labels.pop(label)
            if labels:
                entry["addresses"] = {"default": spec["address"], **labels}
            else:
                entry["address"] = spec["address"]
            meta = spec.get("_meta") if isinstance(spec.get("_meta"), dict) else {}
            if isinstance(meta.get("organization"), str):
                entry["site"] = meta["organization"]
            if spec.get("remote-addresses"):
                self.note(
                    f"addresses.{key}.remote-addresses: not mapped (iepm tests a host at its own "
                    "addresses, whoever measures it)"
                )
            if spec.get("no-agent"):
                self.note(f"addresses.{key}.no-agent: not needed (iepm tests plain endpoints)")
            if isinstance(spec.get("host"), str):
                shared.setdefault(spec["host"], []).append(key)
            try:
                Host.model_validate(entry)
            except ValueError as exc:
                self.note(f"addresses.{key}: left out: {_first_error(exc)}")
                continue
            self.hosts[key] = entry
        for host, keys in shared.items():
            if len(keys) > 1:
                self.note(
                    f"hosts.{host}: its addresses {', '.join(keys)} become separate iepm hosts "
                    "(a monitor per address)"
                )

    # -- tasks ---------------------------------------------------------------------------------

    def _task(self, name: str, task: dict[str, Any]) -> None:
        if task.get("disabled"):
            self.note(f"tasks.{name}: disabled, left out")
            return
        for key in ("reference", "subtasks", "priority", "scheduled-by"):
            if key in task:
                self.note(f"tasks.{name}.{key}: not mapped (no iepm equivalent)")
        tests, groups = self.table("tests"), self.table("groups")
        test = tests.get(task.get("test"))
        group = groups.get(task.get("group"))
        if not isinstance(test, dict):
            self.note(f"tasks.{name}: test {task.get('test')!r} is not defined, left out")
            return
        if not isinstance(group, dict):
            self.note(f"tasks.{name}: group {task.get('group')!r} is not defined, left out")
            return
        kind = test.get("type")
        if kind not in _TESTS:
            self.note(f"tasks.{name}: test type {kind!r} has no iepm probe, left out")
            return
        probe, fields = _TESTS[kind]
        if kind in ("latency", "latencybg"):
            self.note(f"tasks.{name}: {kind} (one-way, OWAMP) measured as round-trip ping")
        for tool in task.get("tools") or []:
            if tool != probe and not (probe == "ping" and tool in ("ping", "fping")):
                self.note(f"tasks.{name}.tools: {tool} not available, measured with {probe}")
        params = self._params(name, test.get("spec") or {}, fields)
        entry: dict[str, Any] = {"name": _safe_name(name, self.test_names), "probes": [probe]}
        if not self._shape(name, group, task.get("group"), test.get("spec") or {}, entry):
            return
        if params:
            entry[probe] = params
        self._schedule(name, task.get("schedule"), entry)
        clash = self._overlap(entry)
        if clash is not None:
            self.note(
                f"tasks.{name}: {probe} already runs on {clash[1]} of its pairs for task "
                f"{clash[0]} (one {probe} per pair and cycle in iepm), left out"
            )
            return
        self.tests.append(entry)

    def _params(self, task: str, spec: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in spec.items():
            if key in _PAIR_KEYS:
                continue
            if key not in fields:
                self.note(f"tasks.{task}: test parameter {key} = {json.dumps(value)} not mapped")
                continue
            target, convert = fields[key]
            try:
                out[target] = convert(value)
            except (TypeError, ValueError):
                self.note(
                    f"tasks.{task}: test parameter {key} = {json.dumps(value)} not understood"
                )
        return out

    def _members(self, task: str, items: Any, labels: set[str]) -> list[str]:
        out: list[str] = []
        for item in items or []:
            name = item.get("name") if isinstance(item, dict) else None
            if name not in self.hosts:
                self.note(f"tasks.{task}: member {name!r} is not an (enabled) address, left out")
                continue
            if isinstance(item.get("label"), str):
                labels.add(item["label"])
            out.append(self.hosts[name]["name"])
        return out

    def _shape(
        self, task: str, group: dict[str, Any], gname: Any, spec: dict[str, Any], entry: dict
    ) -> bool:
        kind = group.get("type")
        labels: set[str] = set()
        if isinstance(group.get("default-address-label"), str):
            labels.add(group["default-address-label"])
        for key in ("excludes", "excludes-self"):
            if key in group:
                self.note(f"groups.{gname}.{key}: not mapped (every pair of the shape is tested)")
        if kind == "mesh":
            members = self._members(task, group.get("addresses"), labels)
            if len(members) < 2:
                self.note(f"tasks.{task}: fewer than two hosts in group {gname}, left out")
                return False
            entry.update(shape="mesh", members=members, directions="both")
        elif kind == "disjoint":
            a = self._members(task, group.get("a-addresses"), labels)
            b = self._members(task, group.get("b-addresses"), labels)
            if not a or not b:
                self.note(f"tasks.{task}: an empty side of disjoint group {gname}, left out")
                return False
            one_way = bool(group.get("unidirectional"))
            entry.update(shape="disjoint", a=a, b=b, directions="forward" if one_way else "both")
        elif kind == "list":
            members = self._members(task, group.get("addresses"), labels)
            dest = spec.get("dest")
            if not isinstance(dest, str) or _TEMPLATE.search(dest) or not members:
                self.note(
                    f"tasks.{task}: list group {gname} without a fixed dest in its test "
                    "(single-host tests), left out"
                )
                return False
            try:
                plausible_address(dest)
            except ValueError:
                self.note(f"tasks.{task}: dest {dest!r} is not an address, left out")
                return False
            center = self._external(dest)
            entry.update(shape="star", center=center, members=members, directions="reverse")
        else:
            self.note(f"tasks.{task}: group type {kind!r} not mapped, left out")
            return False
        labels.discard("default")
        if len(labels) > 1:
            self.note(f"tasks.{task}: members use labels {sorted(labels)}; each test uses one")
        usable = sorted(label for label in labels if LABEL_RE.match(label))
        if usable:
            entry["via"] = usable[:1]
        return True

    def _external(self, address: str) -> str:
        """A list group's fixed destination as a host of its own (it runs no monitor)."""
        for host in self.hosts.values():
            if host.get("address") == address:
                return str(host["name"])
        taken = {h["name"] for h in self.hosts.values()}
        entry = {"name": _safe_name(address, taken), "address": address}
        self.hosts[f"(dest) {address}"] = entry
        return str(entry["name"])

    def _schedule(self, task: str, name: Any, entry: dict[str, Any]) -> None:
        index = len(self.tests)
        if name is None:
            self.note(f"tasks.{task}: no schedule (continuous in pScheduler), runs every cycle")
            self.repeats[index] = None
            return
        schedule = self.table("schedules").get(name)
        if not isinstance(schedule, dict):
            self.note(f"tasks.{task}: schedule {name!r} is not defined, runs every cycle")
            self.repeats[index] = None
            return
        try:
            self.repeats[index] = iso_seconds(schedule["repeat"])
        except (KeyError, ValueError):
            self.note(f"schedules.{name}: no repeat iepm can read, runs every cycle")
            self.repeats[index] = None
        if "slip" in schedule:
            try:
                self.slip_s = max(self.slip_s, iso_seconds(schedule["slip"]))
            except ValueError:
                self.note(f"schedules.{name}.slip: not an ISO 8601 duration")
        for key in schedule:
            if key not in ("repeat", "slip", "sliprand", "_meta"):
                self.note(f"schedules.{name}.{key}: not mapped (iepm runs in cycles)")

    def _overlap(self, entry: dict[str, Any]) -> tuple[str, int] | None:
        """(earlier task, shared pairs) if ``entry`` repeats a probe on pairs already tested."""
        if not self.tests:
            return None
        mesh = self._mesh([*self.tests, entry])
        probe = entry["probes"][0]
        pairs: dict[int, set[tuple[str, str]]] = {}
        for pair in expand(mesh).pairs:
            pairs.setdefault(pair.test, set()).add((pair.source, pair.target))
        mine = pairs.get(len(self.tests), set())
        for i, other in enumerate(self.tests):
            shared = mine & pairs.get(i, set())
            if probe in other["probes"] and shared:
                return other["name"], len(shared)
        return None

    def _mesh(self, tests: list[dict[str, Any]]) -> Mesh:
        return Mesh(
            hosts=[Host.model_validate(h) for h in self.hosts.values()],
            tests=[Test.model_validate(t) for t in tests],
        )

    # -- output --------------------------------------------------------------------------------

    def _cycle(self) -> float:
        given = [r for r in self.repeats.values() if r]
        return max(MIN_CYCLE_S, min(given)) if given else 3600.0

    def _write(self) -> Imported:
        cycle = self._cycle()
        for index, entry in enumerate(self.tests):
            repeat = self.repeats.get(index)
            if repeat:
                every = max(1, round(repeat / cycle))
                if abs(every * cycle - repeat) > 1:
                    self.note(
                        f"tasks.{entry['name']}: repeat {repeat:g} s rounded to every {every} "
                        f"cycles of {cycle:g} s"
                    )
                if every > 1:
                    entry["every"] = every
        meta = self.doc.get("_meta") if isinstance(self.doc.get("_meta"), dict) else {}
        lines = ["[mesh]", f"name = {_q(_mesh_name(meta, self.where))}"]
        lines += ["", "[monitor]", f"cycle_interval_s = {cycle:g}"]
        if self.slip_s:  # pScheduler's slip: start anywhere in a window; at most half a cycle
            lines.append(f"start_jitter_s = {min(self.slip_s, cycle / 2, 3600.0):g}")
        for entry in self.hosts.values():
            lines += ["", "[[hosts]]"] + [f"{k} = {_value(v)}" for k, v in entry.items()]
        for entry in self.tests:
            probe = entry["probes"][0]
            lines += ["", "[[tests]]"]
            lines += [f"{k} = {_value(v)}" for k, v in entry.items() if k != probe]
            if probe in entry:
                lines += [f"[tests.{probe}]"]
                lines += [f"{k} = {_value(v)}" for k, v in entry[probe].items()]
        body = "\n".join(lines) + "\n"
        self._check_cycle(body, cycle)
        header = [
            f"# Imported by `iepm mesh import` from {self.where}.",
            "# Every host is imported as a plain endpoint (an `iperf3 -s` running there): set",
            '# mode = "agent" or "ssh" per host where iepm should start its servers.',
        ]
        if self.unmapped:
            header += ["#", "# Not mapped:"] + [f"#   - {note}" for note in self.unmapped]
        # Names from the template may hold anything: a line break must not end a comment.
        text = "\n".join(_CONTROL.sub("?", line) for line in header) + "\n\n" + body
        return Imported(text, len(self.hosts), len(self.tests), list(self.unmapped))

    def _check_cycle(self, text: str, cycle: float) -> None:
        """Say when a host's cycle (its targets one after another) may outlast the interval."""
        from iepm.mesh.load import load_mesh_text

        loaded = load_mesh_text(text, self.where)
        for host in loaded.mesh.host_names():
            config = loaded.config_for(host)
            longest = 0.0
            for target in config.targets:
                specs = {p: config.spec_for(target, p).deadline_s() for p in target.probes}
                background = [d for p, d in specs.items() if not _exclusive(p)]
                longest += max(background, default=0.0)
                longest += sum(d for p, d in specs.items() if _exclusive(p))
            if longest > cycle:
                self.note(
                    f"cycle: {host} may need {longest:g} s for one cycle of its tests, more "
                    f"than the {cycle:g} s interval; its cycles will start late"
                )
                return


def _exclusive(probe: str) -> bool:
    from iepm.probes import PROBES

    return PROBES[probe].META.scheduling == "exclusive"


def _mesh_name(meta: dict[str, Any], where: str) -> str:
    name = meta.get("display-name")
    return name if isinstance(name, str) and name.strip() else Path(where).stem


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return str(errors()[0]["msg"])
    return str(exc)


def _q(text: str) -> str:
    # JSON's string escapes are TOML basic-string escapes.
    return json.dumps(text, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return _q(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_q(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def import_template(path: str | Path) -> Imported:
    """The mesh file text equivalent to the pSConfig template at ``path``, and what did not map."""
    path = Path(path)
    return _Importer(_read(path), str(path)).run()
