"""Continuous ping: each line read as it comes, one result per window of sequence numbers.

Parsed from a real ``ping -D -O -i 1`` (iputils 20221126) with a 4-second outage in the middle;
the stream itself runs the real ping against loopback.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from iepm.probes import ping
from iepm.probes.base import ProbeContext
from iepm.rawlog import RawLog
from iepm.results import Result
from iepm.runner import RawRun

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures/ping/ping-20221126--continuous-D-outage.out"
)
ARGV = ("ping", "-n", "-O", "-D", "-i", "1", "-w", "14", "--", "198.18.0.1")
HAVE_PING = shutil.which("ping") is not None


def test_each_line_gives_its_time_sequence_and_rtt() -> None:
    lines = [ping.stream_line(line) for line in FIXTURE.read_text().splitlines()]
    packets = [x for x in lines if x.seq is not None]
    assert [x.seq for x in packets] == list(range(1, 15))
    assert lines[0] == ping.StreamLine(None, None, None)  # the header
    assert packets[0] == ping.StreamLine(1795569027.387720, 1, 0.022)
    # The outage: ping's "no answer yet" lines are losses (no RTT), with their own times.
    assert [(x.seq, x.rtt_ms) for x in packets[5:9]] == [(6, None), (7, None), (8, None),
                                                        (9, None)]  # fmt: skip
    assert packets[5].t_s == 1795569033.530439
    assert all(x.rtt_ms is not None for x in packets[:5] + packets[9:])


def windows_of(text: str, n: int) -> list[str]:
    """Split a continuous ping's output into windows of ``n`` sequence numbers, as Stream
    does (the header goes with the first)."""
    windows: dict[int, list[str]] = {}
    header: list[str] = []
    for line in text.splitlines():
        seen = ping.stream_line(line)
        if seen.seq is None:
            if not windows and line.strip():
                header.append(line)
            continue
        windows.setdefault((seen.seq - 1) // n, list(header) if seen.seq <= n else []).append(line)
    return ["\n".join(lines) + "\n" for _, lines in sorted(windows.items())]


def test_a_window_mid_run_counts_its_own_packets() -> None:
    # Windows of 5: seq 1-5 (with the header), 6-10 (the outage), 11-14 (cut by the end).
    first, outage, last = (
        ping.parse(RawRun(argv=ARGV, stdout=w, returncode=None))
        for w in windows_of(FIXTURE.read_text(), 5)
    )
    assert (first["packets_sent"], first["packets_received"]) == (5, 5)
    assert (outage["packets_sent"], outage["packets_received"]) == (5, 1)
    assert outage["lost_seq_ranges"] == [[6, 9]] and outage["seqs"] == [10]
    assert outage["loss_percent"] == 80.0 and outage["rtts_ms"] == [0.026]
    assert (last["packets_sent"], last["packets_received"], last["seqs"]) == (
        4,
        4,
        [11, 12, 13, 14],
    )
    # Together they are exactly what ping's own summary says of the whole run.
    whole = ping.parse(RawRun(argv=ARGV, stdout=FIXTURE.read_text()))
    assert sum(w["packets_sent"] for w in (first, outage, last)) == whole["packets_sent"] == 14
    assert sum(w["packets_received"] for w in (first, outage, last)) == 10
    assert first["rtts_ms"] + outage["rtts_ms"] + last["rtts_ms"] == whole["rtts_ms"]


@pytest.mark.skipif(not HAVE_PING, reason="iputils ping not installed")
def test_a_stream_hands_on_each_reply_and_stores_one_result_per_window(tmp_path: Path) -> None:
    samples: list[tuple[float, float | None]] = []
    results: list[Result] = []
    spec = ping.Spec(interval_s=0.2)
    ctx = ProbeContext(target="lo", address="127.0.0.1", raw_log=RawLog(tmp_path))

    async def on_result(result: Result) -> None:
        results.append(result)

    async def main() -> ping.Stream:
        stream = ping.Stream(
            spec, ctx, window_s=1.0, on_sample=lambda t, v: samples.append((t, v)),
            on_result=on_result,
        )  # fmt: skip
        task = asyncio.create_task(stream.run())
        # Wait for three whole windows (5 packets each) to be stored, then stop.
        for _ in range(300):
            if len(results) >= 3:
                break
            await asyncio.sleep(0.1)
        stream.stop()
        await asyncio.wait_for(task, 30)
        return stream

    stream = asyncio.run(main())
    assert stream.processes == 1
    assert len(results) >= 4  # three whole windows and the one open at the stop
    for i, result in enumerate(results[:3]):
        assert result.succeeded, result.error
        assert result.data["packets_sent"] == 5 and result.data["seqs"] == [
            5 * i + s for s in range(1, 6)
        ]
        assert len(result.data["rtts_ms"]) == 5
        assert "-D" in result.diags and result.raw_token
    # Every reply went to the live view as it came, in order, with ping's own timestamps.
    stored = [rtt for r in results for rtt in r.data["rtts_ms"]]
    assert [v for _, v in samples] == stored
    times = [t for t, _ in samples]
    assert times == sorted(times) and times[-1] - times[0] >= 0.2 * (len(times) - 2)
    # The raw log holds each window's lines: a re-extract gives the same windows.
    assert len(list(tmp_path.rglob("lo.ping.log"))) == 1


@pytest.mark.skipif(not HAVE_PING, reason="iputils ping not installed")
def test_a_stream_that_cannot_start_stores_the_failure_as_data() -> None:
    results: list[Result] = []

    async def on_result(result: Result) -> None:
        results.append(result)

    async def main() -> None:
        stream = ping.Stream(
            ping.Spec(), ProbeContext(target="nowhere", address="no-such-host.invalid"),
            window_s=60.0, on_sample=lambda t, v: None, on_result=on_result,
        )  # fmt: skip
        task = asyncio.create_task(stream.run())
        for _ in range(300):
            if results:
                break
            await asyncio.sleep(0.05)
        stream.stop()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert len(results) == 1
    assert not results[0].succeeded
    assert "could not be resolved" in (results[0].error or ""), results[0].error
