"""RTPL's control mode in the WAN lab: four lab hosts each running only ``iepm agent``, a fifth
the control host (its own file, so the parallel run places it beside the loopback meshes of
``test_control.py`` rather than after them)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from iepm.store import Archive
from tests.mesh.test_control import run_mesh

pytestmark = pytest.mark.servers


@pytest.mark.pg
@pytest.mark.lab
def test_lab_control_host_runs_a_four_host_mesh_through_agents(
    pg_server: Any, lab_factory: Any, tmp_path: Path
) -> None:
    """Four lab hosts each running only `iepm agent`, a fifth the control host, one router
    (2-8 ms, 100 Mbit/s); one PostgreSQL archive; two cycles of ping + iperf3 both ways."""
    names = [f"h{i}" for i in range(1, 5)]
    topology = {
        "lab": {"name": "x", "seed": 5},
        "hosts": [{"name": "core", "role": "router"}, {"name": "ctl", "role": "monitor"}]
        + [{"name": n, "role": "target"} for n in names],
        "links": [{"name": "lc", "a": "core", "b": "ctl", "delay_ms": 1, "rate_mbit": 100}]
        + [
            {"name": f"l{i}", "a": "core", "b": n, "delay_ms": 2 * i, "rate_mbit": 100}
            for i, n in enumerate(names, 1)
        ],
    }
    lab = lab_factory(topology, prefix="ctl")
    for name in names:
        lab.wait_reachable(name)
    database = f"iepm_ctl_{os.getpid()}"
    url = pg_server.create_database(database)
    try:
        Archive.open(url).close()
        addresses = {n: lab.address(n) for n in names}
        figures = run_mesh(tmp_path, url, addresses, lab.netns, "198.18.0.0/15", lab.netns("ctl"))
        print(f"lab control mesh: {json.dumps(figures)}")
        for name in names:  # nothing of the mesh is left running in any host
            pids = subprocess.run(
                ["ip", "netns", "pids", lab.netns(name)], capture_output=True, text=True
            ).stdout.split()
            left = []
            for pid in pids:
                with contextlib.suppress(psutil.NoSuchProcess):
                    argv = psutil.Process(int(pid)).cmdline()
                    if "iepm.lab.delayline" not in argv:  # the lab's own link emulation
                        left.append(argv)
            assert left == [], name
    finally:
        pg_server.drop_database(database)
