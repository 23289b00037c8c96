"""Mathis et al. on lab paths with random loss and no window limit: prediction ≈ measurement.

The model: throughput = MSS / RTT · C / √p per stream, with C = √(3/2) ≈ 1.22 (periodic loss,
Mathis et al. 1997), MSS = 1448 bytes, RTT the median ping RTT and p the pooled ping loss
(round trip; the lab drops packets in both directions, as real lossy paths do). The model
describes Reno's AIMD, so the transfers use ``congestion = "reno"``; a BBR transfer (this host's
default) on the same path ignores random loss and is flagged as far above the prediction.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from iepm.lab.testing import LabFactory
from iepm.probes import iperf3, ping
from iepm.probes.base import ProbeContext
from iepm.store import Archive
from iepm.tuning.mathis import C_PERIODIC, path_table

# Timing: RTT and loss against what the lab was told, throughput against a model of them.
pytestmark = [pytest.mark.lab, pytest.mark.timing]

# (target, one-way delay ms, loss percent per direction)
PATHS = [("lossa", 20, 0.5), ("lossb", 20, 2.0)]
TOPOLOGY = {
    "lab": {"name": "x", "seed": 11},
    "hosts": [{"name": "mon", "role": "monitor"}]
    + [{"name": name, "role": "target"} for name, _, _ in PATHS],
    "links": [
        {"name": f"l_{name}", "a": "mon", "b": name, "delay_ms": delay, "loss_percent": loss}
        for name, delay, loss in PATHS
    ],
}


def test_mathis_prediction_within_factor_two(lab_factory: LabFactory, archive: Archive) -> None:
    assert math.isclose(C_PERIODIC, 1.2247, abs_tol=1e-4)  # the C this test states
    lab = lab_factory(TOPOLOGY, prefix="mathis")
    servers = [lab.popen(name, ["iperf3", "-s", "-B", lab.address(name)]) for name, _, _ in PATHS]
    for name, _, _ in PATHS:
        lab.wait_listening(name)

    def context(name: str) -> ProbeContext:
        return ProbeContext(
            target=name, address=lab.address(name), monitor="labmon", netns=lab.netns("mon")
        )

    async def measure() -> None:
        # Enough pings to see a 1% round-trip loss about ten times; the paths' pings at once
        # (light: some 100 requests a second each, through separate delay lines), then the
        # transfers one at a time.
        pings = ping.Spec(count=1000, interval_s=0.01)
        for result in await asyncio.gather(*(ping.run(pings, context(n)) for n, _, _ in PATHS)):
            archive.add(result)
        for name, _, _ in PATHS:
            # Reno at these losses: a window of a few to a dozen packets, a loss every few
            # RTTs; 4 s is some 100 RTTs, dozens of losses.
            reno = iperf3.Spec(duration_s=4, congestion="reno")
            archive.add(await iperf3.run(reno, context(name)))
        bbr = iperf3.Spec(duration_s=2, congestion="bbr")
        archive.add(await iperf3.run(bbr, context(PATHS[0][0])))

    asyncio.run(measure())
    for server in servers:
        lab.stop(server)

    rows = {(row["target"], row["congestion"]): row for row in path_table(archive)}
    for name, delay, _loss in PATHS:
        row = rows[(name, "reno")]
        assert row["c"] == C_PERIODIC
        assert row["rtt_ms"] == pytest.approx(2 * delay, rel=0.15)
        truth = lab.ground_truth("mon", name)["loss_percent"]
        assert 0.1 <= truth <= 4
        assert row["loss_percent"] == pytest.approx(truth, rel=0.6)
        assert row["predicted_per_stream_bps"] is not None, row
        ratio = row["measured_per_stream_bps"] / row["predicted_per_stream_bps"]
        assert 0.5 <= ratio <= 2.0, row
        assert row["verdict"].startswith("measured ≈ predicted"), row
    bbr = rows[(PATHS[0][0], "bbr")]
    assert bbr["ratio"] > 2 and bbr["verdict"].startswith("measured ≫ predicted"), bbr
