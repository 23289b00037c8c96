"""WAN lab: research sites in network namespaces joined by emulated wide-area links.

Public API (see :class:`Lab` for details)::

    from iepm.lab import Lab, load_topology
    with Lab.up("examples/lab/wan.toml") as lab:
        lab.exec("mon", ["ping", "-c", "3", lab.address("cern")])
"""

from iepm.lab.lab import Lab, down, running_labs
from iepm.lab.topology import Topology, load_topology, validate

__all__ = ["Lab", "Topology", "down", "load_topology", "running_labs", "validate"]
