"""The conductor: applies a lab's scheduled events and drives its cross traffic.

One process per lab (``python -m iepm.lab.events LAB STATE_DIR``), started by ``up`` when the
topology has ``[[events]]`` or ``[[traffic]]``. Times in the file are lab seconds; lab second
``t`` happens at ``t0 + t / time_compression`` real time, so a lab day can pass in minutes.
Every applied event is appended to ``<state_dir>/<lab>/events.jsonl`` with its real time.

Cross traffic is iperf3: a server in the destination node, and a client in the source node run
once per profile segment (on period, or diurnal step at that step's rate) and stopped by
deadline through :func:`iepm.runner.run_command`, which kills its process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from iepm.errors import LabError
from iepm.lab.lab import Lab
from iepm.lab.topology import EventSpec, TrafficSpec
from iepm.runner import DEVNULL, run_command, start_process

MIN_SEGMENT_REAL_S = 2.0  # shorter iperf3 runs spend most of their time in slow start
MAX_SEGMENT_REAL_S = 3600.0  # iperf3 caps -t at one day; constant flows are re-run hourly
BASE_PORT = 5301


def segments(flow: TrafficSpec, compression: float) -> Iterator[tuple[float, float, float | None]]:
    """(start, end, rate_mbit) in lab seconds for each period the flow's client runs."""
    stop = flow.stop_s if flow.stop_s is not None else math.inf
    t = flow.start_s
    if flow.profile == "constant":
        chunk = MAX_SEGMENT_REAL_S * compression
        while t < stop:
            yield t, min(t + chunk, stop), flow.rate_mbit
            t += chunk
    elif flow.profile == "onoff":
        while t < stop:
            yield t, min(t + flow.on_s, stop), flow.rate_mbit
            t += flow.on_s + flow.off_s
    else:
        step = max(flow.step_s or flow.period_s / 48, MIN_SEGMENT_REAL_S * compression)
        assert flow.rate_mbit is not None
        while t < stop:
            mid = t + step / 2
            phase = 2 * math.pi * (mid - flow.peak_at_s) / flow.period_s
            rate = (
                flow.min_rate_mbit
                + (flow.rate_mbit - flow.min_rate_mbit) * (1 + math.cos(phase)) / 2
            )
            yield t, min(t + step, stop), rate
            t += step


def client_argv(flow: TrafficSpec, address: str, port: int, rate_mbit: float | None) -> list[str]:
    argv = ["iperf3", "-c", address, "-p", str(port), "-t", "86400", "-P", str(flow.streams)]
    if flow.protocol == "udp":
        argv.append("-u")
    if rate_mbit is not None:
        # iperf3's -b is per stream
        argv += ["-b", f"{rate_mbit / flow.streams * 1e6:.0f}"]
    return argv


class Conductor:
    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.log_path = lab.run_dir / "events.jsonl"

    async def _sleep_until_lab(self, lab_s: float) -> None:
        await asyncio.sleep(max(0.0, self.lab.real_time(lab_s) - time.time()))

    def _log(self, record: dict[str, object]) -> None:
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    async def run_events(self) -> None:
        for event in sorted(self.lab.topology.events, key=lambda e: e.at_s):
            await self._sleep_until_lab(event.at_s)
            await self._apply(event)

    async def _apply(self, event: EventSpec) -> None:
        scheduled = self.lab.real_time(event.at_s)
        error = None
        try:
            await asyncio.to_thread(self.lab.apply, event)
        except Exception as exc:  # a failed event is logged; the schedule goes on
            error = str(exc)
        self._log(
            {
                "name": event.name,
                "at_s": event.at_s,
                "scheduled_unix": scheduled,
                "applied_unix": time.time(),
                "error": error,
                "event": event.model_dump(mode="json", exclude_none=True),
            }
        )

    async def run_flow(self, index: int, flow: TrafficSpec) -> None:
        lab = self.lab
        port = flow.port or BASE_PORT + index
        name = flow.name or f"traffic{index}"
        server_argv = lab.command(
            flow.dst, ["iperf3", "-s", "-p", str(port), "-B", lab.address(flow.dst)]
        )
        server = await start_process(server_argv, stdout=DEVNULL, stderr=DEVNULL)
        try:
            try:  # the first client must find the server listening
                await asyncio.to_thread(lab.wait_listening, flow.dst, port)
            except LabError as exc:  # this flow is lost; the events and other flows go on
                self._log({"traffic": name, "error": str(exc)})
                return
            compression = lab.topology.lab.time_compression
            for start, end, rate in segments(flow, compression):
                await self._sleep_until_lab(start)
                # End at the scheduled moment even if this segment started late.
                real_s = lab.real_time(end) - time.time()
                if real_s < 0.5 or (rate is not None and rate <= 0.01):
                    continue
                argv = lab.command(flow.src, client_argv(flow, lab.address(flow.dst), port, rate))
                self._log({"traffic": name, "lab_s": start, "real_s": real_s, "rate_mbit": rate})
                await run_command(argv, real_s)
        finally:
            await server.stop()

    async def run(self) -> None:
        topo = self.lab.topology
        tasks = [self.run_events()] + [self.run_flow(i, f) for i, f in enumerate(topo.traffic)]
        await asyncio.gather(*tasks)


async def _main(lab: Lab) -> None:
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await Conductor(lab).run()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m iepm.lab.events LAB STATE_DIR", file=sys.stderr)
        return 2
    lab = Lab.attach(argv[0], Path(argv[1]))
    asyncio.run(_main(lab))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
