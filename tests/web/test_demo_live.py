"""What `make demo` gives the live pages: each ping run's replies and the monitor's interface
rates (from its real /proc/net/dev), published to the live ring while it measures."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from iepm.ifrates import parse_net_dev as interface_counters
from iepm.ifrates import rates_mbps as interface_rates
from iepm.store import Archive, live

ROOT = Path(__file__).resolve().parents[2]
TRANSFER_BYTES = 20_000_000


def loopback_transfer(n_bytes: int) -> None:
    """Send ``n_bytes`` over a TCP connection on 127.0.0.1 (traffic that ``lo`` counts)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(10)
        port = server.getsockname()[1]

        def sink() -> None:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(10)
                while conn.recv(1 << 16):
                    pass

        reader = threading.Thread(target=sink)
        reader.start()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(b"\0" * n_bytes)
        reader.join(15)
        assert not reader.is_alive()


def test_interface_rates_count_a_real_loopback_transfer() -> None:
    read = Path("/proc/net/dev").read_text
    before, then_s = interface_counters(read()), time.monotonic()
    assert "lo" in before and all(rx >= 0 and tx >= 0 for rx, tx in before.values())
    loopback_transfer(TRANSFER_BYTES)
    after, now_s = interface_counters(read()), time.monotonic()
    rx_mbps, tx_mbps = interface_rates(before, after, now_s - then_s)["lo"]
    # At least the transfer (other tests on this host may add to it, never take from it).
    assert rx_mbps * 1e6 / 8 * (now_s - then_s) >= TRANSFER_BYTES
    assert tx_mbps == pytest.approx(rx_mbps)  # lo sends what it receives


def test_a_counter_that_went_back_gives_no_rate() -> None:
    assert interface_rates({"eth0": (100, 100)}, {"eth0": (50, 200)}, 2.0) == {}
    assert interface_rates({"eth0": (0, 0)}, {"eth0": (250_000, 0)}, 2.0) == {"eth0": (1.0, 0.0)}


@pytest.mark.servers  # `iepm demo --loopback`: iperf3 servers on 127.0.0.x
def test_loopback_demo_publishes_replies_and_interface_rates(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "iepm.cli", "demo", "--workdir", str(tmp_path), "--loopback",
            "--cycles", "1", "--no-serve"]  # fmt: skip
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as archive:
        pings = archive.results(probe="ping")
        samples = [s for _i, s in live.read_since(archive, 0)]
    replies = [s for s in samples if s.probe == "ping"]
    # One sample per packet sent, by target, as each run's result counted them.
    for result in pings:
        mine = [s for s in replies if s.target == result.target]
        assert len(mine) == result.data["packets_sent"]
        assert sorted(v for v in (s.value for s in mine) if v is not None) == sorted(
            result.data["rtts_ms"]
        )
    rates = [s for s in samples if s.probe == "interface"]
    assert {s.metric for s in rates} == {"rx_mbps", "tx_mbps"}
    # The scheduler publishes every interface of the monitor's host: lo carried the tests.
    assert "lo" in {s.target for s in rates}
    # The iperf3 tests of the cycle went over lo: some 2-s rate shows them.
    assert max(s.value or 0.0 for s in rates if s.metric == "rx_mbps" and s.target == "lo") > 1.0
