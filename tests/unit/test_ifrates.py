"""The monitor's interface rates from /proc/net/dev: read, and checked against bytes we send."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from iepm import ifrates


def test_the_real_proc_net_dev_is_read() -> None:
    counters = ifrates.parse_net_dev(ifrates.PROC_NET_DEV.read_text())
    assert "lo" in counters
    assert all(rx >= 0 and tx >= 0 for rx, tx in counters.values())


def test_bytes_sent_over_loopback_show_as_the_rate() -> None:
    # 20 MB through a loopback TCP connection: lo's rx and tx each grow by at least that.
    payload = b"\0" * (1 << 20)
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        received = 0

        def sink() -> None:
            nonlocal received
            conn, _ = server.accept()
            with conn:
                conn.settimeout(30)
                while chunk := conn.recv(1 << 20):
                    received += len(chunk)

        reader = threading.Thread(target=sink)
        reader.start()
        before = asyncio.run(ifrates.read_counters())
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            for _ in range(20):
                conn.sendall(payload)
        reader.join(30)
        after = asyncio.run(ifrates.read_counters())
        elapsed_s = time.monotonic() - t0
    assert received == 20 << 20
    rx_mbps, tx_mbps = ifrates.rates_mbps(before, after, elapsed_s)["lo"]
    floor_mbps = (20 << 20) * 8e-6 / elapsed_s
    assert rx_mbps >= floor_mbps and tx_mbps >= floor_mbps


def test_a_counter_that_went_back_or_a_new_interface_gives_no_rate() -> None:
    before = {"eth0": (1000, 1000), "lo": (5, 5)}
    after = {"eth0": (10, 10), "lo": (1_000_005, 5), "veth1": (1, 1)}
    assert ifrates.rates_mbps(before, after, 2.0) == {"lo": (4.0, 0.0)}
