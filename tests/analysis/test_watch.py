"""The alert watcher, the cause lookup and the adaptive cadence, on real series and results.

Results here are built from real measurements: the NDT throughput series of ../shared/data/ndt/
(its 515 → 315 Mbit/s step of 2023-08-21) and the load probe's recorded fixtures.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iepm.analysis.adaptive import Cadence
from iepm.analysis.alerts import Alert, load_alerts
from iepm.analysis.alerts import events as alert_events
from iepm.analysis.cause import attribute, same_route
from iepm.analysis.series import read_series
from iepm.analysis.watch import AlertWatcher, metric_series, metric_value
from iepm.config import load_config_text
from iepm.results import Outcome, Result
from iepm.scheduler import Scheduler
from iepm.store import Archive
from iepm.tuned import save_tuned

REPO = Path(__file__).resolve().parents[2]
LOAD_FIXTURES = REPO / "tests" / "fixtures" / "load"
STEP_AT = datetime(2023, 8, 21, 16, 13, 27, tzinfo=UTC)


def result(probe: str, when: datetime, data: dict[str, Any], **over: Any) -> Result:
    fields: dict[str, Any] = {
        "probe": probe,
        "tool": probe,
        "monitor": "mon",
        "target": "gig03",
        "started_at": when,
        "data": data,
    }
    fields.update(over)
    return Result(**fields)


def ndt_results(step_file: Path) -> list[Result]:
    s = read_series(step_file)
    return [
        result(
            "iperf3",
            datetime.fromtimestamp(t, UTC),
            {"throughput_bps": y * 1e6},
            params={"streams": 1, "window": None},
        )
        for t, y in zip(s.t, s.y, strict=True)
    ]


def feed(archive: Archive, watcher: AlertWatcher, results: list[Result]) -> None:
    for r in results:
        archive.add(r)
        watcher.observe(r)


def test_the_step_of_a_real_series_raises_one_stored_alert_within_3_samples(
    tmp_path: Path, step_file: Path
) -> None:
    results = ndt_results(step_file)
    upto = [r for r in results if r.started_at < STEP_AT + timedelta(days=3)]
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        watcher = AlertWatcher(archive, "mon")
        feed(archive, watcher, upto)
        stored = load_alerts(archive)
    step = [a for a in stored if abs(a.change_at - STEP_AT) < timedelta(hours=1)]
    assert len(step) == 1, [a.summary for a in stored]
    alert = step[0]
    assert alert.direction == "down" and alert.metric == "throughput_bps"
    assert alert.before == pytest.approx(515e6, rel=0.03)
    assert alert.after == pytest.approx(315e6, rel=0.03)
    assert alert.change_percent == pytest.approx(-39, abs=2)
    assert alert.details["samples_to_alert"] == 3
    # Nothing on the path changed that the archive knows of.
    assert alert.cause == "unknown" and alert.details["causes"] == []
    assert alert.delivered_at is None and alert.delivery_attempts == 0
    # Real throughput is noisy; the watcher stays quiet through most of four months.
    assert len(stored) <= 6, [a.summary for a in stored]


def test_a_restarted_watcher_replays_history_and_repeats_no_alert(
    tmp_path: Path, step_file: Path
) -> None:
    results = ndt_results(step_file)
    cut = next(i for i, r in enumerate(results) if r.started_at > STEP_AT + timedelta(days=2))
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        first = AlertWatcher(archive, "mon")
        feed(archive, first, results[:cut])
        second = AlertWatcher(archive, "mon")  # a restarted monitor
        feed(archive, second, results[cut : cut + 5])
        # It replayed the last 200 results: no warm-up, and the step is in the past.
        assert second.tracks[("gig03", "iperf3", "throughput_bps")].count == 200 + 5
        assert not any(abs(a.change_at - STEP_AT) < timedelta(hours=1) for a in second.alerts)
        assert len(load_alerts(archive)) == len(first.alerts) + len(second.alerts)
        t, y = metric_series(archive, target="gig03", probe="iperf3", metric="throughput_bps")
    assert len(y) == cut + 5 and np.all(np.diff(t) > 0)


def test_metric_values_skip_failures_but_count_a_dead_path_as_loss() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    dead = result(
        "ping",
        now,
        {"packets_sent": 3, "packets_received": 0, "loss_percent": 100.0, "rtt_avg_ms": None},
        outcome=Outcome.FAILED,
        succeeded=False,
    )
    assert metric_value(dead, "loss_percent") == 100.0
    assert metric_value(dead, "rtt_avg_ms") is None
    failed = result("iperf3", now, {}, outcome=Outcome.FAILED, succeeded=False)
    assert metric_value(failed, "throughput_bps") is None
    nan = result("iperf3", now, {"throughput_bps": float("nan")})
    assert metric_value(nan, "throughput_bps") is None


def load_result(name: str, when: datetime) -> Result:
    recorded = json.loads((LOAD_FIXTURES / f"{name}.json").read_text())
    return result("load", when, recorded["data"])


def test_cause_names_the_host_when_its_facts_changed_and_tuning_when_parameters_did(
    tmp_path: Path,
) -> None:
    t0 = datetime(2026, 3, 2, 12, tzinfo=UTC)
    step = timedelta(minutes=90)
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        # Two real snapshots: the host itself, and a namespace with reno and other buffers.
        for i in range(4):
            archive.add(load_result("procfs--host", t0 + i * step))
        for i in range(4, 7):
            archive.add(load_result("procfs--netns-reno", t0 + i * step))
        cause, details = attribute(
            archive,
            monitor="mon",
            target="gig03",
            probe="iperf3",
            last_before=t0 + 3 * step,
            change_at=t0 + 4 * step,
            now=t0 + 6 * step,
        )
        assert cause == "host", details
        changed = details["host"]["changed"]
        assert changed["tcp_congestion_control"][1] == "reno"
        assert changed["tcp_congestion_control"][0] != "reno"
        # A change whose sample before is the ambiguous one (same cycle) is not blamed on it.
        cause, _ = attribute(
            archive,
            monitor="mon",
            target="gig03",
            probe="iperf3",
            last_before=t0 + 5 * step,
            change_at=t0 + 6 * step,
            now=t0 + 6 * step,
        )
        assert cause == "unknown"
        # Tuned parameters stored between the levels make it "tuning" (when nothing else moved).
        save_tuned(
            archive,
            monitor="mon",
            target="gig03",
            probe="iperf3",
            params={"streams": 8},
            set_at=t0 + 5.5 * step,
        )
        cause, details = attribute(
            archive,
            monitor="mon",
            target="gig03",
            probe="iperf3",
            last_before=t0 + 5 * step,
            change_at=t0 + 6 * step,
            now=t0 + 6 * step,
        )
        assert cause == "tuning" and details["tuning"]["tuned_params"][0]["params"] == {
            "streams": 8
        }


def test_silent_hops_match_any_address() -> None:
    assert same_route(["198.18.0.1", None, "198.18.0.9"], ["198.18.0.1", "198.18.0.4", None])
    assert not same_route(["198.18.0.1", "198.18.0.2"], ["198.18.0.1", "198.18.0.3"])
    assert not same_route(["198.18.0.1"], ["198.18.0.1", "198.18.0.2"])


def test_cadence_stretches_calm_paths_and_comes_back_on_a_change(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    t0 = datetime(2026, 3, 2, tzinfo=UTC)
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        watcher = AlertWatcher(archive, "mon", store=False, forecasts=True)
        cadence = Cadence(watcher, min_factor=1, max_factor=4)
        factors = []
        for i in range(20):
            value = 100e6 * (1 + 0.01 * rng.standard_normal())
            watcher.observe(result("iperf3", t0 + timedelta(hours=i), {"throughput_bps": value}))
            factors.append(cadence.factor("gig03", "iperf3"))
        assert factors[:5] == [1] * 5  # no forecast yet
        assert 2 in factors and factors[-1] == 4 and max(factors) == 4
        # While calm, the test waits; the reason says why.
        reasons = [cadence.decide("gig03", "iperf3") for _ in range(3)]
        assert all(r and "adaptive" in r for r in reasons)
        assert cadence.decide("gig03", "iperf3") is None  # the 4th cycle runs
        cadence.ran("gig03", "iperf3")
        # A change suspected by ping (a deviant RTT) makes the next cycle test at once.
        for i in range(8):
            rtt = {"packets_sent": 3, "loss_percent": 0.0, "rtt_avg_ms": 20.0 + 0.01 * i}
            watcher.observe(result("ping", t0 + timedelta(hours=30 + i), rtt))
        assert cadence.decide("gig03", "iperf3") is not None
        watcher.observe(
            result(
                "ping",
                t0 + timedelta(hours=40),
                {"packets_sent": 3, "loss_percent": 0.0, "rtt_avg_ms": 60.0},
            )
        )
        assert watcher.suspected("gig03")
        assert cadence.decide("gig03", "iperf3") is None
        # A deviant throughput sample resets the factor to the minimum.
        watcher.observe(result("iperf3", t0 + timedelta(hours=41), {"throughput_bps": 40e6}))
        assert cadence.factor("gig03", "iperf3") == 1


class Broken:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def observe(self, result: Result) -> None:
        self.seen.append(result.id)
        raise RuntimeError("watcher bug")

    def cycle_started(self) -> None:
        raise RuntimeError("another watcher bug")


def test_a_failing_watcher_never_breaks_the_cycle(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config_text(
        f"""
[monitor]
name = "mon"
archive = "sqlite:///{tmp_path}/a.db"
log_dir = "{tmp_path}/raw"
[defaults.ping]
count = 2
interval_s = 0.05
[[targets]]
name = "lo"
address = "127.0.0.1"
probes = ["ping"]
"""
    )
    broken = Broken()
    with Archive.open(config.monitor.archive) as archive:
        alerting = AlertWatcher(archive, "mon")
        scheduler = Scheduler(config, archive, watchers=[broken, alerting])
        with caplog.at_level(logging.ERROR, logger="iepm.scheduler"):
            reports = [asyncio.run(scheduler.run_cycle()) for _ in range(2)]
        stored = list(archive.results())
    assert [len(r.results) for r in reports] == [1, 1]
    assert {r.id for r in stored} == set(broken.seen)
    assert scheduler.health.watcher_errors == 4  # two observes and two cycle starts
    assert "watcher bug" in caplog.text
    # The other watcher saw every result all the same.
    assert alerting.tracks[("lo", "ping", "rtt_avg_ms")].count == 2


def test_the_config_builds_the_watcher_and_cadence(tmp_path: Path) -> None:
    base = f"""
[monitor]
name = "mon"
archive = "sqlite:///{tmp_path}/a.db"
log_dir = "{tmp_path}/raw"
"""
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        plain = Scheduler(load_config_text(base), archive)
        assert plain.alert_watcher is not None and plain.alert_watcher.notifier is None
        assert plain.cadence is None
        hooked = Scheduler(
            load_config_text(
                base + 'webhook_url = "http://127.0.0.1:9/x"\nadaptive = true\n'
                "adaptive_max_factor = 6\n"
            ),
            archive,
        )
        assert hooked.alert_watcher is not None and hooked.alert_watcher.notifier is not None
        assert hooked.cadence is not None and hooked.cadence.max_factor == 6
        off = Scheduler(load_config_text(base + "alerts = false\n"), archive)
        assert off.watchers == [] and off.cadence is None
        assert Scheduler(load_config_text(base), archive, watchers=[]).watchers == []


def test_alerts_command_lists_stored_alerts(tmp_path: Path, step_file: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from iepm.analysis.cli import register

    app = typer.Typer()
    register(app)
    url = f"sqlite:///{tmp_path}/a.db"
    upto = [r for r in ndt_results(step_file) if r.started_at < STEP_AT + timedelta(days=1)]
    with Archive.open(url) as archive:
        feed(archive, AlertWatcher(archive, "mon"), upto)
        stored = load_alerts(archive)
    runner = CliRunner()
    res = runner.invoke(app, ["alerts", "--db", url, "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["id"] for r in rows] == [a.id for a in stored] and rows[-1]["cause"] == "unknown"
    assert rows[-1]["delivered_at"] is None and rows[-1]["delivery_attempts"] == 0
    res = runner.invoke(app, ["alerts", "--db", url, "--since", "2023-08-21"])
    assert res.exit_code == 0 and res.stdout.count("\n") == 2  # header and the step
    assert "throughput_bps\tdown" in res.stdout and "no (0 attempts)" in res.stdout
    res = runner.invoke(app, ["alerts"])
    assert res.exit_code == 2 and "give --db URL or --config FILE" in res.stderr
    res = runner.invoke(app, ["alerts", "--db", url, "--since", "last tuesday"])
    assert res.exit_code == 2 and "--since: not an ISO date" in res.stderr


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ('webhook_url = "ftp://ops/x"', "monitor.webhook_url: String should match pattern"),
        ("webhook_attempts = 0", "monitor.webhook_attempts: Input should be greater than or"),
        ("adaptive_min_factor = 5\nadaptive_max_factor = 2", "must not exceed adaptive_max"),
    ],
)
def test_bad_alert_and_adaptive_settings_are_refused_with_their_line(
    fields: str, message: str
) -> None:
    from iepm.errors import ConfigError

    with pytest.raises(ConfigError, match=r"<config>:[0-9]+: ") as err:
        load_config_text(f'[monitor]\nname = "m"\n{fields}\n')
    assert message in str(err.value)


# cern in `make demo` (recorded 2026-11-24, cycles 30 s apart): its route switched to the
# backup path between two cycles, and its ping RTT stepped 148 → 192 ms in the same cycle.
DEMO_START = datetime(2026, 11, 24, 23, 24, 56, tzinfo=UTC)
DEMO_RTT = [148.474, 148.153, 148.074, 192.26, 192.298, 193.461, 192.417, 192.413]
EURO = ["198.18.0.2", "198.18.0.3", "198.18.0.4", "198.18.0.12"]
BACKUP = ["198.18.0.2", "198.18.0.3", "198.18.0.6", "198.18.0.12"]


def _demo_cycles(calm: int) -> list[Result]:
    """``calm`` cycles on the old route at 148 ms (seeded noise), then the recorded demo."""
    rng = np.random.default_rng(5)
    rtts = [148.0 + float(x) for x in rng.uniform(0, 0.6, calm)] + DEMO_RTT
    out = []
    for i, rtt in enumerate(rtts):
        when = DEMO_START + timedelta(seconds=30 * (i - calm))
        hops = EURO if i < calm + 3 else BACKUP
        trace = {
            "reached": True,
            "hops": [{"ttl": n + 1, "address": a} for n, a in enumerate(hops)],
        }
        out.append(result("traceroute", when, trace, target="cern"))
        ping = {"rtt_avg_ms": rtt, "loss_percent": 0.0, "packets_sent": 5, "packets_received": 5}
        out.append(result("ping", when + timedelta(seconds=8), ping, target="cern"))
    return out


@pytest.mark.parametrize("calm", [0, 30])  # 0: as the demo had it, three cycles in
def test_the_demos_route_switch_is_one_alert_caused_by_the_route_at_the_step(
    tmp_path: Path, calm: int
) -> None:
    results = _demo_cycles(calm)
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        watcher = AlertWatcher(archive, "mon")
        feed(archive, watcher, results)
        stored = load_alerts(archive)
    # One event, two alerts: the route change itself (at the first traceroute on the backup
    # route, with the hop that changed) and the RTT step it caused, which names it.
    assert len(stored) == 2 and len(alert_events(stored)) == 1, [a.summary for a in stored]
    route, alert = stored
    first_trace = next(
        r for r in results if r.probe == "traceroute" and r.data["hops"][2]["address"] != EURO[2]
    )
    assert (route.probe, route.metric, route.cause) == ("traceroute", "route", "route")
    assert route.change_at == first_trace.started_at
    assert route.details["hops_changed"] == [{"ttl": 3, "before": EURO[2], "after": BACKUP[2]}]
    assert alert.details["route"]["alert_id"] == route.id
    first_new = next(r for r in results if r.probe == "ping" and r.data["rtt_avg_ms"] > 190)
    # The step is placed at the first sample of the new level (the detector confirms it a few
    # samples later), so the traceroute of the same cycle is the route's change.
    assert alert.change_at == first_new.started_at
    assert alert.cause == "route", alert.details
    assert alert.details["route"]["after"] == BACKUP
    assert alert.details["samples_to_alert"] <= 3


def _scenario_cycle(
    rng: np.random.Generator, when: datetime, cycle: int, events: dict[str, int]
) -> list[Result]:
    """One cycle of the demo's scenario for three paths: cern's route switches at cycle
    ``events["switch"]`` (148 → 192 ms), fnal's bottleneck drops from 70 to 14 Mbit/s at
    ``events["step"]``, ihep's link goes down at ``events["down"]``."""
    out = []
    for target, rtt, rate in (("cern", 148.0, 40e6), ("fnal", 50.3, 70e6), ("ihep", 290.0, 2e6)):
        switched = target == "cern" and cycle >= events["switch"]
        down = target == "ihep" and cycle >= events["down"]
        stepped = target == "fnal" and cycle >= events["step"]
        hops = BACKUP if switched else EURO
        trace = {"reached": not down, "hops": [{"ttl": 1, "address": h} for h in hops]}
        out.append(
            result("traceroute", when, trace, target=target)
            if not down
            else result(
                "traceroute",
                when,
                trace,
                target=target,
                outcome=Outcome.FAILED,
                succeeded=False,
                error="traceroute did not reach ihep",
            )
        )
        level = rtt + (44.0 if switched else 0.0)
        ping = {
            "rtt_avg_ms": level + float(rng.uniform(0, 0.6)),
            "loss_percent": 0.0,
            "packets_sent": 5,
            "packets_received": 5,
        }
        if down:
            dead = {"packets_sent": 5, "packets_received": 0, "loss_percent": 100.0}
            out.append(
                result(
                    "ping",
                    when + timedelta(seconds=8),
                    dead,
                    target=target,
                    outcome=Outcome.FAILED,
                    succeeded=False,
                    error="ping to ihep: no reply",
                )
            )
            out.append(
                result(
                    "iperf3",
                    when + timedelta(seconds=15),
                    {},
                    target=target,
                    outcome=Outcome.SKIPPED,
                    succeeded=False,
                    error="skipped because ping to ihep failed",
                )
            )
            continue
        out.append(result("ping", when + timedelta(seconds=8), ping, target=target))
        throughput = (rate / 5 if stepped else rate) * float(rng.uniform(0.93, 1.05))
        out.append(
            result(
                "iperf3",
                when + timedelta(seconds=15),
                {"throughput_bps": throughput},
                target=target,
                params={"streams": 1},
            )
        )
    return out


def test_the_demo_scenario_gives_one_alert_per_event_with_its_cause_within_3_cycles(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(9)
    events = {"switch": 30, "step": 40, "down": 50}
    start = datetime(2026, 11, 24, 20, 0, tzinfo=UTC)
    cycles = [start + timedelta(seconds=30 * i) for i in range(60)]
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        watcher = AlertWatcher(archive, "mon")
        for i, when in enumerate(cycles):
            feed(archive, watcher, _scenario_cycle(rng, when, i, events))
        stored = load_alerts(archive)
    _assert_one_alert_per_event(cycles, events, stored)


def _spiked(
    results: list[Result], rng: np.random.Generator, rate: float, forced: dict[str, float]
) -> list[Result]:
    """RTT spikes on the pings of a cycle: each with probability ``rate`` (+10 to 60 ms: a run
    with delayed packets), and ``forced`` (target → ms) on top."""
    for r in results:
        if r.probe == "ping" and r.succeeded:
            extra = forced.get(r.target, 0.0)
            if rng.random() < rate:
                extra += float(rng.uniform(10, 60))
            r.data["rtt_avg_ms"] += extra
    return results


def _run_scenario(
    tmp_path: Path, seed: int, rate: float, forced: dict[int, dict[str, float]]
) -> tuple[list[datetime], dict[str, int], list[Any]]:
    rng = np.random.default_rng(seed)
    events = {"switch": 30, "step": 40, "down": 50}
    start = datetime(2026, 11, 24, 20, 0, tzinfo=UTC)
    cycles = [start + timedelta(seconds=30 * i) for i in range(60)]
    with Archive.open(f"sqlite:///{tmp_path}/a.db") as archive:
        watcher = AlertWatcher(archive, "mon")
        for i, when in enumerate(cycles):
            cycle = _scenario_cycle(rng, when, i, events)
            feed(archive, watcher, _spiked(cycle, rng, rate, forced.get(i, {})))
        return cycles, events, load_alerts(archive)


def _assert_one_alert_per_event(
    cycles: list[datetime], events: dict[str, int], stored: list[Alert]
) -> None:
    """Three events, none in the calm 30 cycles. cern's route switch is one event of two
    alerts: the route change (an alert of its own since issue 15) and the RTT step it caused,
    which names the route alert; every other event is one alert."""
    found = {(a.target, a.metric): a for a in stored}
    grouped = alert_events(stored)
    assert len(grouped) == 3, [[a.summary for a in g] for g in grouped]
    assert sorted(len(g) for g in grouped) == [1, 1, 2], [a.summary for a in stored]
    route = found[("cern", "route")]
    assert (route.probe, route.direction, route.cause) == ("traceroute", "changed", "route")
    assert route.change_at == cycles[events["switch"]]  # the switch's own traceroute
    assert found[("cern", "rtt_avg_ms")].details["route"]["alert_id"] == route.id
    expected = {
        ("cern", "rtt_avg_ms"): (events["switch"], "up", "route"),
        ("fnal", "throughput_bps"): (events["step"], "down", "unknown"),
        ("ihep", "loss_percent"): (events["down"], "up", "unknown"),
    }
    for key, (cycle, direction, cause) in expected.items():
        alert = found[key]
        assert (alert.direction, alert.cause) == (direction, cause), alert.summary
        assert cycles[cycle] <= alert.change_at < cycles[cycle + 1], alert.summary
        assert alert.details["samples_to_alert"] <= 3


@pytest.mark.parametrize(
    "spikes",
    [
        # docs/target.png's demo run: 148 → 280 ms (the switch's own cycle), 192, 192, 250.
        {30: 88.0, 33: 58.0},
        # Spikes on the 2nd and 5th samples, and one the size of the step just before it.
        {29: 46.0, 31: 45.0, 34: 40.0},
    ],
)
def test_two_rtt_spikes_after_the_route_switch_do_not_delay_its_alert(
    tmp_path: Path, spikes: dict[int, float]
) -> None:
    """The demo runs the previous note saw: two spikes three samples apart on cern's new level
    made every 3-sample run as wide as the step, and the detector confirmed it cycles late
    (cause unknown: its traceroute was out of reach). One spike among the three is set aside
    now: the alert comes at the third sample of the new level, placed at the switch."""
    forced = {cycle: {"cern": ms} for cycle, ms in spikes.items()}
    cycles, events, stored = _run_scenario(tmp_path, 9, 0.0, forced)
    _assert_one_alert_per_event(cycles, events, stored)
    cern = next(a for a in stored if (a.target, a.metric) == ("cern", "rtt_avg_ms"))
    assert cern.detected_at is not None and cern.details["samples_to_alert"] == 3


# Seeds never used while the fix was made (it was developed on seeds 0-39).
@pytest.mark.parametrize("seed", [2026, 4711, 8191, 65537, 99991])
def test_the_demo_scenario_with_random_rtt_spikes_on_unseen_seeds(
    tmp_path: Path, seed: int
) -> None:
    """5 % of all pings spiked by 10-60 ms (isolated delayed runs), on seeds not tuned on:
    still one alert per event, at its cycle, within 3 samples, and none in the calm period."""
    cycles, events, stored = _run_scenario(tmp_path, seed, 0.05, {})
    _assert_one_alert_per_event(cycles, events, stored)


def test_a_route_caused_step_moves_to_the_route_change_only_when_near() -> None:
    from iepm.analysis.watch import at_route_change

    samples = [(30.0 * i + 8, 148.0) for i in range(20)]  # pings 8 s into each cycle
    at = datetime.fromtimestamp  # the traceroute starts at the cycle's start

    def route(cycle: int) -> str:
        return at(30.0 * cycle, UTC).isoformat()

    change = samples[12][0]
    assert at_route_change(samples, change, route(13)) == (samples[12][0], samples[13][0])
    assert at_route_change(samples, change, route(10)) == (samples[9][0], samples[10][0])
    # Further than REFINE_BACK samples away, or after the change's window: left where it was.
    assert at_route_change(samples, change, route(2)) == (samples[11][0], change)
    assert at_route_change(samples, change, route(19)) == (samples[11][0], change)
