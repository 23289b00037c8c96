"""The abw estimator's maths against a simulated FIFO bottleneck (the lab delay line's model),
its receiver's protocol on loopback, and the probe through a real agent on loopback."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iepm import abwtool as tool
from iepm.config import AgentAccess
from iepm.probes import abw
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from iepm.runner import RawRun, SyncSupervised, start_process_sync
from testkit.agent import RunningAgent, running_agent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "abw"
MTU = 1500
PROBE = 64


def bottleneck(
    rate_bps: float,
    utilisation: float,
    seed: int,
    probes: int = 3000,
    probe_gap_packets: float = 7.0,
) -> list[tool.Train]:
    """A back-to-back train, then Poisson probes, through a FIFO link of ``rate_bps`` shared
    with Poisson cross traffic of full-size packets at ``utilisation`` of it: the delay line's
    model (start = max(arrival, link free); free = start + size·8/rate), times in ns."""
    rng = random.Random(seed)
    packet_ns = MTU * 8 / rate_bps * 1e9
    # (arrival, size, kind, seq): kind 0 capacity train, 1 probe, 2 cross.
    arrivals = [(1_000_000.0 + i * 1000.0, MTU, 0, i) for i in range(16)]
    t = 1_000_000.0 + 16 * packet_ns * 4
    for seq in range(probes):
        t += rng.expovariate(1.0 / (probe_gap_packets * packet_ns))
        arrivals.append((t, PROBE, 1, seq))
    end = t
    if utilisation > 0:
        t = 0.0
        while t < end:
            t += rng.expovariate(utilisation / packet_ns)
            arrivals.append((t, MTU, 2, 0))
    arrivals.sort()
    free = 0.0
    trains = [tool.Train(MTU, None, [], []), tool.Train(PROBE, None, [], [])]
    for arrival, size, kind, seq in arrivals:
        free = max(arrival, free) + size * 8 / rate_bps * 1e9
        if kind < 2:
            trains[kind].sent_ns.append(int(arrival))
            # A fixed propagation delay and a receiver clock 5 s off: only differences count.
            trains[kind].received.append((seq, int(free + 5e9 + 2e6)))
    return trains


@given(rate_mbit=st.floats(5, 2000), seed=st.integers(0, 2**32))
@settings(max_examples=40, deadline=None)
def test_capacity_is_the_bottleneck_rate_without_cross_traffic(rate_mbit: float, seed: int) -> None:
    trains = bottleneck(rate_mbit * 1e6, 0.0, seed, probes=30)
    capacity = tool.capacity_bps(trains[0])
    assert capacity == pytest.approx(rate_mbit * 1e6, rel=0.002)
    est = tool.estimate(trains, noise_floor_ns=0)
    assert est.available_bps == pytest.approx(capacity)


@given(rate_mbit=st.floats(10, 1000), utilisation=st.floats(0.0, 0.7), seed=st.integers(0, 2**32))
@settings(max_examples=30, deadline=None)
def test_available_bandwidth_is_capacity_less_the_cross_traffic(
    rate_mbit: float, utilisation: float, seed: int
) -> None:
    rate = rate_mbit * 1e6
    est = tool.estimate(bottleneck(rate, utilisation, seed), noise_floor_ns=0)
    assert est.capacity_bps is not None and est.available_bps is not None
    # 3000 probes: the binomial error is ~1% of C; waits under a tenth of a packet are missed.
    assert abs(est.available_bps - rate * (1 - utilisation)) <= 0.08 * rate
    assert 0.0 <= est.quality <= 1.0


@given(seed=st.integers(0, 2**32), extra_us=st.lists(st.floats(0, 5000), min_size=1))
@settings(max_examples=40, deadline=None)
def test_a_probe_that_waited_longer_never_raises_the_estimate(
    seed: int, extra_us: list[float]
) -> None:
    trains = bottleneck(100e6, 0.4, seed, probes=200)
    before = tool.estimate(trains).available_bps
    probes = trains[1]
    for i, extra in enumerate(extra_us):
        seq, ns = probes.received[i % len(probes.received)]
        probes.received[i % len(probes.received)] = (seq, ns + int(extra * 1000))
    after = tool.estimate(trains).available_bps
    assert before is not None and after is not None
    # The empty queue's delay may only grow too (then the same waits look shorter): compare
    # with care.
    if tool.floor_ns(tool.one_way_delays_ns(probes)) == tool.floor_ns(
        tool.one_way_delays_ns(bottleneck(100e6, 0.4, seed, probes=200)[1])
    ):
        assert after <= before


@given(
    utilisation=st.sampled_from([0.0, 0.4]),
    seed=st.integers(0, 2**32),
    lucky_share=st.floats(0.0, tool.FLOOR_QUANTILE),
    wake_up_us=st.floats(130, 400),
)
@settings(max_examples=40, deadline=None)
def test_a_few_probes_delivered_early_do_not_make_the_rest_look_queued(
    utilisation: float, seed: int, lucky_share: float, wake_up_us: float
) -> None:
    """A delay line (or any forwarder) that wakes up late for every packet finding it idle but
    forwards a few at once, already awake for another: those few set no floor (once in CI, 3 of
    6 estimates on an idle 100 Mbit/s path read 0.4-0.7 Mbit/s, every other probe "busy")."""
    rate = 100e6
    trains = bottleneck(rate, utilisation, seed, probes=400, probe_gap_packets=10)
    clean = tool.estimate(trains).available_bps
    probes = trains[1]
    lucky = set(random.Random(seed).sample(range(400), int(lucky_share * 400)))
    probes.received = [
        (seq, ns + (0 if i in lucky else int(wake_up_us * 1000)))
        for i, (seq, ns) in enumerate(probes.received)
    ]
    late = tool.estimate(trains).available_bps
    # What the estimator reads with every probe forwarded on time, give or take the probes
    # around the floor.
    assert clean is not None and late is not None
    assert late == pytest.approx(clean, abs=0.03 * rate)


def test_a_burst_preempted_inside_its_send_call_still_reads_the_capacity() -> None:
    """One sendmmsg burst of 16 at 50 Mbit/s (240 µs a packet) whose sender was preempted twice
    for 2 ms inside the call: the send times, spread evenly over the 4 ms call, make the gaps
    around the preemptions the only "queued" ones (C read 20 Mbit/s so); the receive spacing
    of the pairs the bottleneck queued holds."""
    packet_ns = 1500 * 8 / 50e6 * 1e9
    arrivals = [
        i * 2_000.0 + (2e6 if i >= 5 else 0.0) + (2e6 if i >= 11 else 0.0) for i in range(16)
    ]
    free, received = 0.0, []
    for seq, t in enumerate(arrivals):
        free = max(t, free) + packet_ns
        received.append((seq, int(free + 3e6)))
    sent = [int(4.03e6 * (i + 1) / 16) for i in range(16)]  # spread over the call
    train = tool.Train(1500, None, sent, received, burst=16)
    assert tool.capacity_bps(train) == pytest.approx(50e6, rel=0.01)


def test_two_of_three_bursts_stretched_by_stalls_do_not_pull_the_capacity_down() -> None:
    """Three bursts of 16 at 100 Mbit/s, the 1st and 3rd stretched by a 1 ms stall of the
    bottleneck after every 4th packet (as the delay line under load): their median read them;
    C is the burst that was not stretched."""
    packet_ns = 1500 * 8 / 100e6 * 1e9
    sent: list[int] = []
    received: list[tuple[int, int]] = []
    for burst in range(3):
        start = burst * 60e6
        free = start
        for i in range(16):
            seq = burst * 16 + i
            stall = 1e6 if burst != 1 and i % 4 == 3 else 0.0
            sent.append(int(start + i * 1000))
            free = max(start + i * 1000, free) + packet_ns + stall
            received.append((seq, int(free + 2e6)))
    train = tool.Train(1500, None, sent, received, burst=16)
    readings = tool.burst_capacities(train)
    assert sorted(readings)[1] < 0.8 * 100e6  # the median of three would read low
    assert tool.train_capacity_bps(train) == pytest.approx(100e6, rel=0.01)


def test_a_burst_delivered_in_one_batch_does_not_set_the_capacity() -> None:
    """Three bursts of 16 at 50 Mbit/s sent at ~5 Gbit/s; the 2nd delivered in one batch after
    a stall of the bottleneck (stamps 2.9 µs apart: it read 4,208 Mbit/s in a benchmark run):
    C is 50 Mbit/s, not the batch's rate."""
    packet_ns = 1500 * 8 / 50e6 * 1e9
    sent: list[int] = []
    received: list[tuple[int, int]] = []
    for burst in range(3):
        start = burst * 60e6
        for i in range(16):
            sent.append(int(start + i * 2400))  # 5 Gbit/s out of the sender
            if burst == 1:
                received.append((burst * 16 + i, int(start + 5e6 + i * 2850)))
            else:
                received.append((burst * 16 + i, int(start + 2e6 + (i + 1) * packet_ns)))
    train = tool.Train(1500, None, sent, received, burst=16)
    assert max(tool.burst_capacities(train)) > 4e9
    assert tool.train_capacity_bps(train) == pytest.approx(50e6, rel=0.01)


def test_an_estimate_needs_its_capacity_train_and_enough_probes() -> None:
    trains = bottleneck(50e6, 0.3, 1, probes=100)
    assert tool.estimate([]).error == "no train was sent"
    lost = [tool.Train(MTU, None, trains[0].sent_ns, trains[0].received[:2]), trains[1]]
    assert tool.estimate(lost).error == "the capacity train came back with 2 packets"
    few = [trains[0], tool.Train(PROBE, None, trains[1].sent_ns, trains[1].received[:5])]
    est = tool.estimate(few)
    assert est.available_bps is None and est.error == "fewer than 20 probes came back"


def test_spruce_sees_the_cross_traffic_between_its_pairs() -> None:
    # Train at C; one cross packet of the same size lands in every other gap: X = C/2.
    rate, gap = 100e6, MTU * 8 / 100e6 * 1e9
    sent = [int(i * gap) for i in range(5)]
    received = [(0, 0), (1, int(2 * gap)), (2, int(3 * gap)), (3, int(5 * gap)), (4, int(6 * gap))]
    train = tool.Train(MTU, rate, sent, received)
    assert tool.cross_bps(train, rate) == pytest.approx(rate / 2, rel=1e-6)


# --- the receiver on loopback ------------------------------------------------------------------


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_receiver(port: int, max_bytes: int = 200_000) -> SyncSupervised:
    argv = [sys.executable, abw.TOOL_PATH, "receive", "--port", str(port)]
    argv += ["--bind", "127.0.0.1", "--duration-s", "20", "--max-bytes", str(max_bytes)]
    server = start_process_sync(argv, text=True)
    assert server.popen.stdout is not None
    line = server.popen.stdout.readline()  # the ready line comes at once, or EOF on failure
    assert line.startswith(tool.READY.decode()), line
    return server


@pytest.fixture
def receiver() -> Iterator[tuple[SyncSupervised, int]]:
    port = free_udp_port()
    server = start_receiver(port)
    try:
        yield server, port
    finally:
        server.stop()


def test_the_receiver_returns_kernel_stamps_of_every_packet(
    receiver: tuple[SyncSupervised, int],
) -> None:
    server, port = receiver
    plan = tool.Plan(probes=300, spread_s=0.2)
    before_ns = time.time_ns()
    doc = tool.send("127.0.0.1", port, plan, deadline_s=5.0)
    after_ns = time.time_ns()
    assert doc["problems"] == []
    trains = tool.trains_from_doc(doc)
    # A probe the sender was late for is skipped, never sent late (send()).
    sent = 300 - doc["probes_skipped"]
    assert [len(t.received) for t in trains] == [3 * 16, sent] == [len(t.sent_ns) for t in trains]
    assert sent > tool.MAX_REPORT_ENTRIES  # more than one report page
    stamps = [ns for t in trains for _, ns in t.received]
    assert all(before_ns <= ns <= after_ns for ns in stamps)  # CLOCK_REALTIME, this run's
    assert server.wait(5) == 0
    assert server.popen.stdout is not None
    assert f"done: {3 * 16 * 1500 + sent * 64} bytes, kernel stamps" in server.popen.stdout.read()


def test_a_probe_the_sender_is_late_for_is_skipped_not_sent_with_the_next(
    receiver: tuple[SyncSupervised, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every 4th probe's moment is missed by 2 ms (a sender descheduled): those are skipped,
    not sent late, and every probe sent is stamped."""
    _, port = receiver
    real = tool._pace_until
    calls = 0

    def late_every_fourth(t_ns: int, spin_ns: int = 300_000) -> None:
        nonlocal calls
        calls += 1
        real(t_ns + (2_000_000 if calls % 4 == 0 else 0), spin_ns)

    monkeypatch.setattr(tool, "_pace_until", late_every_fourth)
    doc = tool.send("127.0.0.1", port, tool.Plan(probes=200, spread_s=0.4), deadline_s=5.0)
    probes = tool.trains_from_doc(doc)[1]
    assert doc["probes_skipped"] >= 50  # the 50 missed, and any this host's load made late
    assert len(probes.sent_ns) == 200 - doc["probes_skipped"]
    assert len(probes.received) == len(probes.sent_ns)


def test_the_receiver_stops_past_its_byte_budget() -> None:
    port = free_udp_port()
    server = start_receiver(port, max_bytes=10_000)
    try:
        doc = tool.send("127.0.0.1", port, tool.Plan(probes=50, spread_s=0.05), deadline_s=3.0)
        assert server.wait(5) == 3
        assert server.popen.stdout is not None
        # The probes sent (50 less any skipped: 3,200 B at most) go first, then the capacity
        # train: the packet that crosses the grant is cut.
        probe_bytes = 64 * (50 - doc["probes_skipped"])
        expected = probe_bytes + 1500 * ((10_000 - probe_bytes) // 1500 + 1)
        assert f"cut: {expected} probe bytes exceed the 10000 granted" in server.popen.stdout.read()
        assert any("no answer" in p or "failed" in p for p in doc["problems"]), doc["problems"]
    finally:
        server.stop()


def test_the_receiver_answers_only_the_sender_of_the_probes(
    receiver: tuple[SyncSupervised, int],
) -> None:
    _, port = receiver
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.bind(("127.0.0.1", 0))
        sender.connect(("127.0.0.1", port))
        sender.send(tool.PROBE.pack(tool.MAGIC_PROBE, 7, 0, 0, 1) + b"\0" * 100)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
            stranger.bind(("127.0.0.2", 0))
            stranger.settimeout(0.3)
            stranger.sendto(tool.QUERY.pack(tool.MAGIC_QUERY, 7, 0), ("127.0.0.1", port))
            with pytest.raises(TimeoutError):
                stranger.recv(2048)
        sender.settimeout(5.0)
        sender.send(tool.QUERY.pack(tool.MAGIC_QUERY, 7, 0))
        magic, sid, offset, n, total = tool.REPORT.unpack_from(sender.recv(2048))
        assert (magic, sid, offset, n, total) == (tool.MAGIC_REPORT, 7, 0, 1, 1)


def test_a_sender_without_receiver_reports_the_problem() -> None:
    doc = tool.send("127.0.0.1", free_udp_port(), tool.Plan(), deadline_s=2.0)
    assert any("Connection refused" in p or "no answer" in p for p in doc["problems"]), doc
    est = tool.estimate(tool.trains_from_doc(doc))
    assert est.available_bps is None


# --- the probe: parse, spec, and through an agent ----------------------------------------------


def fixture_cases() -> list[str]:
    return sorted(p.stem for p in FIXTURES.glob("*.out"))


@pytest.mark.parametrize("case", fixture_cases())
def test_parse_recorded_lab_runs(case: str) -> None:
    out = (FIXTURES / f"{case}.out").read_text()
    raw = RawRun(argv=("abwtool.py", "send"), returncode=0, stdout=out, stderr="")
    expected = json.loads((FIXTURES / f"{case}.json").read_text())
    assert abw.parse(raw, abw.Spec()) == expected


def test_a_spec_over_its_budget_is_refused_naming_the_sum() -> None:
    with pytest.raises(ValueError, match="= 163200 bytes exceeds budget_bytes = 100000"):
        abw.Spec(capacity_packets=20, probes=1200, probe_size_bytes=61)
    assert abw.Spec().total_bytes() <= 100_000


def test_output_that_is_not_the_document_is_a_parse_error() -> None:
    from iepm.errors import ParseError, ToolFailed

    with pytest.raises(ParseError, match="not its JSON document"):
        abw.parse(RawRun(argv=("x",), returncode=0, stdout="hello", stderr=""))
    with pytest.raises(ToolFailed, match="iepm-abw failed: boom"):
        abw.parse(RawRun(argv=("x",), returncode=1, stdout="", stderr="trace\nboom"))


@pytest.fixture(scope="module")
def abw_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    with running_agent(tmp_path_factory.mktemp("abw-agent"), kinds=("abw",)) as agent:
        yield agent


@pytest.mark.servers
def test_the_probe_leases_a_receiver_from_the_agent(abw_agent: RunningAgent) -> None:
    access = AgentAccess(url=abw_agent.url, credential_file=str(abw_agent.token_file("mon1")))
    ctx = ProbeContext(
        target="lo", address="127.0.0.1", monitor="mon1", servers=server_source(access)
    )
    result = asyncio.run(abw.run(abw.Spec(), ctx))
    assert result.succeeded, f"{result.error}\n{result.diags[-1500:]}"
    data = result.data
    # The plan at most: a probe the sender is late for is skipped (send()).
    probes = data["probe_packets"] - 3 * 16
    assert 0 < probes <= 400 and data["received_packets"] == data["probe_packets"]
    assert data["probe_bytes"] == 3 * 16 * 1500 + probes * 64 <= abw.Spec().total_bytes()
    assert abw.Spec().total_bytes() <= 100_000
    assert data["estimate_s"] <= 1.0
    assert data["capacity_bps"] > 0 and 0 <= data["available_bps"] <= data["capacity_bps"]
    assert "[agent " in result.diags and "slot" in result.diags


def test_the_delay_lines_trace_holds_the_queue_wait_of_the_packets_of_one_size() -> None:
    """The lab's ground truth for the probes (benchmarks/abw.py): the model's own queue wait of
    each packet of the traced size, nothing of other sizes, read and cleared by a request."""
    from iepm.lab.delayline import DelayLine

    line = DelayLine({"ab": {"rate_mbit": 10.0}, "ba": {}})
    assert line.handle({"cmd": "trace", "dir": "ab", "size": PROBE, "count": 2})["trace"] == []
    ab = line.dirs["ab"]
    ab.admit(MTU, 0.0)  # 1.2 ms at 10 Mbit/s
    ab.admit(PROBE, 0.0002)  # waits 1 ms behind it
    ab.admit(PROBE, 0.01)  # finds the link idle
    ab.admit(PROBE, 0.02)  # past the count asked for
    trace = line.handle({"cmd": "trace", "dir": "ab"})["trace"]
    assert [t for t, _, _ in trace] == [0.0002, 0.01]
    assert [w for _, w, _ in trace] == pytest.approx([0.001, 0.0])
    assert [b for _, _, b in trace] == [MTU, MTU + PROBE]  # what arrived before each
    assert line.handle({"cmd": "trace", "dir": "ab"})["trace"] == []
    assert not line.handle({"cmd": "trace", "dir": "xy"})["ok"]
