"""The probe registry: adding a probe means adding its module here and nothing else."""

from __future__ import annotations

from types import ModuleType

from iepm.probes import iperf3, load, ping, traceroute

PROBES: dict[str, ModuleType] = {
    ping.NAME: ping,
    traceroute.NAME: traceroute,
    iperf3.NAME: iperf3,
    load.NAME: load,
}


def get_probe(name: str) -> ModuleType:
    try:
        return PROBES[name]
    except KeyError:
        known = ", ".join(sorted(PROBES))
        raise KeyError(f"unknown probe '{name}' (known: {known})") from None
