"""Cycles on loopback targets with the real tools, stored in a real archive."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from pathlib import Path

import pytest

from iepm.config import load_config_text
from iepm.errors import StoreError
from iepm.rawlog import RawLog
from iepm.results import Result
from iepm.scheduler import CycleReport, Scheduler
from iepm.store import Archive
from testkit.net import blackhole_netns, iperf3_server, is_root

pytestmark = pytest.mark.servers  # real iperf3 servers/tools (or iepm processes) on loopback


def config_text(
    tmp_path: Path, archive_url: str, port: int, extra: str = "", interval: float = 300
) -> str:
    return f"""
[monitor]
name = "test-mon"
cycle_interval_s = {interval}
archive = "{archive_url}"
log_dir = "{tmp_path}/raw"

[defaults.ping]
count = 3
interval_s = 0.2

[defaults.traceroute]
max_hops = 5
wait_s = 1

[defaults.iperf3]
duration_s = 1

[[targets]]
name = "up"
address = "127.0.0.1"
[targets.iperf3]
port = {port}

[[targets]]
name = "no-server"
address = "127.0.0.2"
[targets.iperf3]
port = {port}
{extra}
"""


def test_a_cycle_measures_stores_and_logs_every_probe(tmp_path: Path, archive_url: str) -> None:
    with iperf3_server("127.0.0.1") as port:
        config = load_config_text(config_text(tmp_path, archive_url, port))
        seen: list[Result] = []
        with Archive.open(config.monitor.archive) as archive:
            scheduler = Scheduler(config, archive, on_result=seen.append, rng=random.Random(1))
            report = asyncio.run(scheduler.run_cycle())
            stored = {r.id: r for r in archive.results()}
    assert len(report.results) == 6
    by = {(r.target, r.probe): r for r in report.results}
    assert by[("up", "ping")].succeeded and by[("up", "ping")].data["loss_percent"] == 0
    assert by[("up", "traceroute")].data["reached"]
    assert by[("up", "iperf3")].succeeded, by[("up", "iperf3")].error
    assert by[("up", "iperf3")].data["throughput_bps"] > 1e6
    failed = by[("no-server", "iperf3")]
    assert failed.outcome.value == "failed" and "127.0.0.2" in (failed.error or "")
    assert "iperf3 -c 127.0.0.2" in failed.diags
    # Every result is in the archive, exactly as reported, and in the callback.
    assert set(stored) == {r.id for r in report.results} == {r.id for r in seen}
    assert stored[failed.id].envelope() == failed.envelope()
    # Every run has its raw record, findable by token.
    tokens = {run.raw.token for run in RawLog(tmp_path / "raw").runs()}
    assert {r.raw_token for r in report.results} <= tokens
    assert report.duration_s < report.interval_s and not report.overran
    assert scheduler.health.runs_by_outcome["ok"] == 5


def test_bandwidth_tests_never_overlap(tmp_path: Path, archive_url: str) -> None:
    extra = """
[[targets]]
name = "up-too"
address = "127.0.0.1"
"""
    with iperf3_server("127.0.0.1") as port:
        text = config_text(tmp_path, archive_url, port, extra).replace(
            'name = "up-too"\naddress = "127.0.0.1"',
            f'name = "up-too"\naddress = "127.0.0.1"\n[targets.iperf3]\nport = {port}',
        )
        config = load_config_text(text)
        with Archive.open(config.monitor.archive) as archive:
            report = asyncio.run(Scheduler(config, archive).run_cycle())
    runs = sorted(
        (r.started_at.timestamp(), r.started_at.timestamp() + r.duration_s)
        for r in report.results
        if r.probe == "iperf3"
    )
    assert len(runs) == 3
    for (_, end), (start, _) in itertools.pairwise(runs):
        assert start >= end - 0.01


def test_order_is_randomised_per_cycle(tmp_path: Path, archive_url: str) -> None:
    extra = "".join(
        f'\n[[targets]]\nname = "t{i}"\naddress = "127.0.0.{i + 10}"\nprobes = ["ping"]\n'
        for i in range(5)
    )
    config = load_config_text(
        config_text(tmp_path, archive_url, 9, extra).replace(
            "count = 3\ninterval_s = 0.2", "count = 1"
        )
    )
    config.targets = config.targets[2:]
    with Archive.open(config.monitor.archive) as archive:
        scheduler = Scheduler(config, archive, rng=random.Random(7))
        orders = [[r.target for r in asyncio.run(scheduler.run_cycle()).results] for _ in range(3)]
    assert len({tuple(o) for o in orders}) > 1


class FlakyArchive:
    """Wraps a real archive; its first writes fail as a dead database would."""

    def __init__(self, archive: Archive, failures: int) -> None:
        self.archive = archive
        self.failures = failures

    def add(self, result: Result) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise StoreError("database is locked (injected)")
        self.archive.add(result)

    def __getattr__(self, name: str) -> object:
        return getattr(self.archive, name)


def test_results_are_spooled_when_the_archive_fails_and_written_later(
    tmp_path: Path, archive_url: str
) -> None:
    config = load_config_text(config_text(tmp_path, archive_url, 9).replace("probes", "x"))
    for target in config.targets:
        target.probes = ["ping"]
    with Archive.open(config.monitor.archive) as archive:
        flaky = FlakyArchive(archive, failures=2)
        scheduler = Scheduler(config, flaky)  # type: ignore[arg-type]
        first = asyncio.run(scheduler.run_cycle())
        assert scheduler.health.archive_write_failures == 2
        assert archive.count() == 0
        assert scheduler.spool_path.exists()
        asyncio.run(scheduler.run_cycle())
        ids = {r.id for r in archive.results()}
    assert {r.id for r in first.results} <= ids
    assert len(ids) == 4
    assert not scheduler.spool_path.exists()


@pytest.mark.lab
@pytest.mark.skipif(not is_root(), reason="needs root to create a network namespace")
def test_failed_ping_skips_heavy_probes_when_ping_is_expected(
    tmp_path: Path, archive_url: str
) -> None:
    with blackhole_netns() as (netns, dead):
        text = f"""
[monitor]
name = "test-mon"
cycle_interval_s = 300
archive = "{archive_url}"
log_dir = "{tmp_path}/raw"
netns = "{netns}"

[defaults.ping]
count = 2
interval_s = 0.2

[[targets]]
name = "dead"
address = "{dead}"
probes = ["ping", "iperf3"]

[[targets]]
name = "dead-no-icmp"
address = "{dead}"
probes = ["ping", "iperf3"]
ping_expected = false
[targets.iperf3]
duration_s = 1
connect_timeout_ms = 1000
"""
        config = load_config_text(text)
        with Archive.open(config.monitor.archive) as archive:
            report = asyncio.run(Scheduler(config, archive).run_cycle())
    by = {(r.target, r.probe): r for r in report.results}
    assert by[("dead", "ping")].outcome.value == "failed"
    skipped = by[("dead", "iperf3")]
    assert skipped.outcome.value == "skipped"
    assert "ping to dead" in (skipped.error or "") and "ping_expected=true" in (skipped.error or "")
    # Not expected to answer ping: the bandwidth test is still tried (and fails on its own).
    tried = by[("dead-no-icmp", "iperf3")]
    assert tried.outcome.value in ("failed", "timeout")
    assert tried.raw_token is not None


def test_an_overrun_is_recorded_and_the_next_cycle_starts_late_not_overlapping(
    tmp_path: Path, archive_url: str
) -> None:
    # Each ping may run 13 s (its deadline), so 13.5 s is a valid interval; ten targets of
    # 1.4 s each make a 14 s cycle: an overrun.
    targets = "".join(
        f'\n[[targets]]\nname = "t{i}"\naddress = "127.0.0.{i + 1}"\nprobes = ["ping"]\n'
        for i in range(10)
    )
    config = load_config_text(
        f"""
[monitor]
name = "test-mon"
cycle_interval_s = 13.5
archive = "{archive_url}"
log_dir = "{tmp_path}/raw"
[defaults.ping]
count = 2
interval_s = 1.4
{targets}"""
    )
    with Archive.open(config.monitor.archive) as archive:
        scheduler = Scheduler(config, archive)
        reports: list[CycleReport] = []
        last = asyncio.run(scheduler.run(cycles=2, on_cycle=reports.append))
        first, second = reports
        assert last is second  # only the last report is kept
        cycles = archive.cycles()
    assert first.overran and first.duration_s > 13.5
    assert scheduler.health.cycle_overruns >= 1
    assert first.finished_at is not None
    gap = (second.started_at - first.finished_at).total_seconds()
    assert 0 <= gap < 1.0  # late, at once, and never overlapping
    assert [c.overran for c in cycles][:1] == [True]
    assert all(c.n_results == 10 for c in cycles)


# --- schedule mode: each probe at its own interval ---------------------------------------------


def schedule_text(tmp_path: Path, archive_url: str, port: int, period_s: float) -> str:
    pingers = "".join(
        f'\n[[targets]]\nname = "p{i}"\naddress = "127.0.0.{i + 10}"\nprobes = ["ping"]\n'
        for i in range(4)
    )
    return f"""
[monitor]
name = "test-mon"
cycle_interval_s = {period_s}
archive = "{archive_url}"
log_dir = "{tmp_path}/raw"

[schedule]
light_limit = 3
ping = 1
iperf3 = 2

[defaults.ping]
count = 4
interval_s = 0.2

[defaults.iperf3]
duration_s = 1

[[targets]]
name = "bw1"
address = "127.0.0.1"
probes = ["ping", "iperf3"]
[targets.iperf3]
port = {port}

[[targets]]
name = "bw2"
address = "127.0.0.1"
probes = ["ping", "iperf3"]
[targets.iperf3]
port = {port}
{pingers}
"""


def spans(results: list[Result], probe: str) -> list[tuple[float, float]]:
    return sorted(
        (r.started_at.timestamp(), r.started_at.timestamp() + r.duration_s)
        for r in results
        if r.probe == probe
    )


TARGETS = ["bw1", "bw2", *(f"p{i}" for i in range(4))]


def ping_during_iperf(seen: list[Result]) -> bool:
    iperf, pings = spans(seen, "iperf3"), spans(seen, "ping")
    return any(s < i_end and e > i_start for s, e in pings for i_start, i_end in iperf)


def test_schedule_mode_runs_light_probes_concurrently_and_heavy_ones_alone(
    tmp_path: Path, archive_url: str
) -> None:
    from iepm.store import live

    seen: list[Result] = []
    running_seen: set[tuple[str, str]] = set()
    with iperf3_server("127.0.0.1") as port:
        config = load_config_text(schedule_text(tmp_path, archive_url, port, period_s=5))
        with Archive.open(config.monitor.archive) as archive:
            scheduler = Scheduler(config, archive, on_result=seen.append, rng=random.Random(3))

            async def watch_running() -> None:
                # What the live page would see: the tests marked as running now.
                while True:
                    now = await asyncio.to_thread(live.running, archive)
                    running_seen.update((r.probe, r.target) for r in now)
                    await asyncio.sleep(0.2)

            def enough(reports: list[CycleReport]) -> bool:
                pinged = Counter(r.target for r in seen if r.probe == "ping")
                return (
                    len(reports) >= 2
                    and sum(r.probe == "iperf3" for r in seen) >= 3
                    and all(pinged[t] >= 4 for t in TARGETS)
                    and scheduler.health.light_running_max >= 2
                    and ping_during_iperf(seen)
                )

            async def main() -> list[CycleReport]:
                # Runs until what is asserted below has had its chance to happen (or 180 s):
                # a loaded machine runs fewer tests per period, never different ones.
                reports: list[CycleReport] = []
                watcher = asyncio.create_task(watch_running())

                async def stop_when_enough() -> None:
                    loop = asyncio.get_running_loop()
                    deadline = loop.time() + 180.0
                    while not enough(reports) and loop.time() < deadline:
                        await asyncio.sleep(0.2)
                    scheduler.stop()

                stopper = asyncio.create_task(stop_when_enough())
                await scheduler.run(on_cycle=reports.append)
                stopper.cancel()
                watcher.cancel()
                return reports

            reports = asyncio.run(main())
            left_running = live.running(archive)
            interface = live.read_window(archive, 0.0, probe="interface")
    iperf = spans(seen, "iperf3")
    pings = spans(seen, "ping")
    assert all(r.succeeded for r in seen), [r.error for r in seen if not r.succeeded]
    # Heavy: each target's iperf3 every 2 s, one at a time, never overlapping.
    assert len(iperf) >= 3, iperf
    for (_, end), (start, _) in itertools.pairwise(iperf):
        assert start >= end - 0.01
    # Light: every target pinged about every second, several at once (within the limit of 3),
    # and while a bandwidth test ran.
    for target in TARGETS:
        assert sum(r.target == target and r.probe == "ping" for r in seen) >= 4, target
    assert 2 <= scheduler.health.light_running_max <= 3
    assert any(s < i_end and e > i_start for s, e in pings for i_start, i_end in iperf)
    # The periods reported (as cycles), numbered in turn, counting what they saw.
    assert len(reports) >= 2 and [r.number for r in reports] == list(range(1, len(reports) + 1))
    assert sum(r.n_results for r in reports) <= len(seen)
    assert all(r.outcomes["ok"] == r.n_results > 0 for r in reports)
    # The live view: each bandwidth test was marked running while it ran, and none is left;
    # the monitor's interface rates were published every 2 s (lo carried the iperf3 tests).
    assert {("iperf3", "bw1"), ("iperf3", "bw2")} <= running_seen
    assert left_running == []
    lo_rx = [s.value for _, s in interface if s.target == "lo" and s.metric == "rx_mbps"]
    assert len(lo_rx) >= 3 and max(v or 0.0 for v in lo_rx) > 10.0, lo_rx


def test_schedule_mode_keeps_the_sanity_rule(tmp_path: Path, archive_url: str) -> None:
    with blackhole_netns("schedt") as (netns, dead):
        text = f"""
[monitor]
name = "test-mon"
cycle_interval_s = 3
archive = "{archive_url}"
log_dir = "{tmp_path}/raw"
netns = "{netns}"
live = false

[schedule]
ping = 60
iperf3 = 1

[defaults.ping]
count = 2
interval_s = 0.2

[[targets]]
name = "dead"
address = "{dead}"
probes = ["ping", "iperf3"]
"""
        config = load_config_text(text)
        seen: list[Result] = []
        with Archive.open(config.monitor.archive) as archive:
            scheduler = Scheduler(config, archive, on_result=seen.append)
            asyncio.run(scheduler.run(cycles=1))
    iperf = [r for r in seen if r.probe == "iperf3"]
    assert iperf and all(r.outcome.value == "skipped" for r in iperf)
    assert "ping to dead" in (iperf[0].error or "") and "ping_expected=true" in iperf[0].error
    assert all(r.outcome.value == "failed" for r in seen if r.probe == "ping")
