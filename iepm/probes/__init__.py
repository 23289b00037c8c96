"""The probe registry: adding a probe means adding its module here and nothing else.

Every other layer learns about probes from :data:`PROBES` at call time (never a copy taken at
import), so a probe registered later — a plug-in, or a test's probe — is seen everywhere.
"""

from __future__ import annotations

from typing import Any

from iepm.probes import (
    abw,
    facts,
    gridftp_disk,
    gridftp_mem,
    iperf3,
    load,
    ping,
    rsync_disk,
    rsync_mem,
    traceroute,
    xrdcp_disk,
    xrdcp_mem,
)
from iepm.probes.base import CONTRACT, Metric, Probe

PROBES: dict[str, Probe] = {}


def register(module: Any) -> Probe:
    """Add a probe module (anything with the :class:`~iepm.probes.base.Probe` members);
    returns it. A second probe of the same name is an error, not a silent replacement."""
    missing = [name for name in CONTRACT if not hasattr(module, name)]
    if missing:
        raise TypeError(f"probe module {module!r} lacks {', '.join(missing)}")
    name = module.NAME
    if name in PROBES and PROBES[name] is not module:
        raise ValueError(f"a probe named {name!r} is already registered")
    strays = [m.name for m in module.METRICS if m.probe != name]
    if strays:
        raise ValueError(f"probe {name!r} declares metrics of another probe: {strays}")
    # Descriptions become --help and the README's field lists: none may be missing.
    undocumented = [f for f, info in module.Spec.model_fields.items() if not info.description]
    if undocumented:
        raise ValueError(f"probe {name!r}: Spec fields without a description: {undocumented}")
    PROBES[name] = module
    return module  # type: ignore[no-any-return]


def unregister(name: str) -> None:
    PROBES.pop(name, None)


def get_probe(name: str) -> Probe:
    try:
        return PROBES[name]
    except KeyError:
        known = ", ".join(sorted(PROBES))
        raise KeyError(f"unknown probe '{name}' (known: {known})") from None


def all_metrics() -> dict[str, Metric]:
    """Every registered metric by name (``ping.rtt_avg_ms``), in registration order."""
    return {m.name: m for probe in PROBES.values() for m in probe.METRICS}


def metric(name: str) -> Metric:
    """One metric by name (``probe.key``)."""
    probe, _, key = name.partition(".")
    for m in PROBES[probe].METRICS if probe in PROBES else ():
        if m.key == key:
            return m
    raise KeyError(f"unknown metric {name!r} (known: {', '.join(all_metrics())})")


def metrics_of(probe: str) -> tuple[Metric, ...]:
    return PROBES[probe].METRICS if probe in PROBES else ()


def gating_probes() -> list[str]:
    """Probes whose failure skips a target's exclusive probes (ping)."""
    return [name for name, probe in PROBES.items() if probe.META.gates]


def default_probes() -> tuple[str, ...]:
    """A target's probes when targets.toml lists none."""
    return tuple(name for name, probe in PROBES.items() if probe.META.default)


for _module in (
    ping,
    traceroute,
    iperf3,
    load,
    facts,
    xrdcp_mem,
    xrdcp_disk,
    rsync_mem,
    rsync_disk,
    gridftp_mem,
    gridftp_disk,
    abw,
):
    register(_module)
