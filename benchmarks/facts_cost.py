"""What reading a target's facts costs each cycle, against the monitor's own ``load`` snapshot
(the light probe it sits beside), in one run on loopback:

* ``figure``: median wall time of the ``facts`` probe through a loopback ``iepm agent``
  (one authenticated ``GET /v1/facts``, facts read afresh);
* ``baseline``: median wall time of the ``load`` probe (the local snapshot program);
* ``ratio`` = figure ÷ baseline;
* ``ssh_s``: the same facts over SSH to a private sshd on loopback (log in, run the snapshot
  with the target's python3), and its ratio to the baseline.

    .venv/bin/python benchmarks/facts_cost.py [--runs 15]

Prints one JSON object. Needs sshd (openssh-server) for the SSH figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.probes import facts, load
from iepm.probes.base import ProbeContext
from iepm.remote.access import AgentAccess
from iepm.remote.lease import AgentServers, SshServers
from testkit.agent import running_agent
from testkit.net import free_port
from testkit.sshd import private_sshd


def median_s(ctx: ProbeContext, module: object, spec: object, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = asyncio.run(module.run(spec, ctx))  # type: ignore[attr-defined]
        times.append(time.perf_counter() - t0)
        if not result.succeeded:
            raise SystemExit(f"{result.probe} failed: {result.error}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    local = ProbeContext("here", "127.0.0.1")
    with tempfile.TemporaryDirectory() as tmp:
        with running_agent(Path(tmp) / "agent") as agent:
            access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("mon1")))
            via_agent = ProbeContext("here", "127.0.0.1", servers=AgentServers(access))
            baseline = median_s(local, load, load.Spec(), args.runs)
            figure = median_s(via_agent, facts, facts.Spec(), args.runs)
        with private_sshd(Path(tmp) / "sshd", "127.0.0.1", free_port()) as sshd:
            via_ssh = ProbeContext("here", "127.0.0.1", servers=SshServers(sshd.access()))
            ssh_s = median_s(via_ssh, facts, facts.Spec(), args.runs)
    print(
        json.dumps(
            {
                "figure": "facts probe through a loopback agent, median wall time (s)",
                "value": round(figure, 4),
                "baseline": "load probe (local snapshot), median wall time (s), same run",
                "baseline_value": round(baseline, 4),
                "ratio": round(figure / baseline, 2),
                "ssh_s": round(ssh_s, 4),
                "ssh_ratio": round(ssh_s / baseline, 2),
                "runs": args.runs,
            }
        )
    )


if __name__ == "__main__":
    main()
