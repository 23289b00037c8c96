"""Re-tuning run by the real scheduler against a real iperf3 server on loopback (and a dead port):
a sweep is scheduled exactly once, the budget holds, a failure backs off without stopping the
monitor; and ``iepm tune --due`` (the cron path) sweeps who needs it, then nobody.

What these tests assert is the scheduling around a sweep, not its figures (the lab sweep tests
do), so each point takes the fewest pings (the plan's 10 after each transfer at 0.2 s were 2 of
a point's 3 s) and schedule mode starts at once (no start spread)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import iepm.config
from iepm.cli import app
from iepm.config import load_config_text
from iepm.results import Purpose, Result
from iepm.scheduler import CycleReport, Scheduler
from iepm.store import Archive
from iepm.tuned import load_tuned
from iepm.tuning import routine
from iepm.tuning.plan import SweepPlan
from iepm.tuning.store import list_studies
from testkit.net import free_port, iperf3_server

pytestmark = pytest.mark.servers

HOST = "127.0.0.1"
# few_pings for the CLI, which takes them as options.
FEW_PINGS_ARGS = ["--pings-during", "2", "--pings-after", "1", "--ping-interval", "0.05"]


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """One iperf3 server on a free loopback port for the module's tests (they run one after
    another, one test at a time); stopped by PID."""
    with iperf3_server(HOST) as port:
        yield port


@pytest.fixture(autouse=True)
def few_pings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler's sweep plan (``[monitor] retune_*`` has no ping settings) with 2 pings
    during each transfer and 1 after, instead of 10 and 10 at 0.2 s."""
    plan = functools.partial(SweepPlan, pings_during=2, pings_after=1, after_interval_s=0.05)
    monkeypatch.setattr(iepm.config, "SweepPlan", plan)


class NoSpread(random.Random):
    """Schedule mode spreads its first runs over up to START_SPREAD_S (10 s) at random: here
    they start at once."""

    def uniform(self, a: float, b: float) -> float:
        return a


def config_text(tmp_path: Path, port: int, targets: list[str], gap_h: float = 0) -> str:
    text = f"""
[monitor]
name = "mon"
archive = "sqlite:///{tmp_path / "archive.db"}"
log_dir = "{tmp_path / "raw"}"
cycle_interval_s = 600
alerts = false
live = false
retune = true
retune_windows = ["default", "256K"]
retune_streams = [1, 2]
retune_duration_s = 1
retune_gap_h = {gap_h}

[defaults.iperf3]
duration_s = 1
port = {port}
"""
    for name in targets:
        text += f'\n[[targets]]\nname = "{name}"\naddress = "{HOST}"\nprobes = ["iperf3"]\n'
    return text


def cycles(config: str, archive: Archive, n: int) -> tuple[list[CycleReport], Scheduler]:
    scheduler = Scheduler(load_config_text(config), archive, watchers=[])
    reports: list[CycleReport] = []

    async def go() -> None:
        for _ in range(n):
            reports.append(await scheduler.run_cycle())

    asyncio.run(go())
    return reports, scheduler


def iperf3_runs(archive: Archive) -> list[Result]:
    return list(archive.results(probe="iperf3", order="asc", purpose=None))


def no_overlap(runs: list[Result]) -> None:
    spans = sorted(
        (r.started_at.timestamp(), r.started_at.timestamp() + r.duration_s) for r in runs
    )
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end - 0.05, (end, start)


def test_sweep_runs_once_then_the_tuned_parameters_are_used(tmp_path: Path, server: int) -> None:
    # Two never-tuned paths, one sweep per cycle and none within 6 h of the last: only "a" or
    # "b" is swept, once, in three cycles.
    config = config_text(tmp_path, server, ["a", "b"], gap_h=6)
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as archive:
        reports, scheduler = cycles(config, archive, 3)
        retuned = [r.retuned for r in reports]
        assert len(retuned[0]) == 1 and retuned[1:] == [[], []], retuned
        name, study_id, reasons = retuned[0][0]
        assert reasons == ["never tuned (no complete sweep)"]
        assert scheduler.health.retune_sweeps == 1 and scheduler.health.retune_failures == 0
        # The other path waited for the budget in each later cycle (and in the first: one per
        # cycle).
        assert scheduler.health.retune_put_off == 3
        # /metrics, served beside this scheduler, counts them as they stand.
        from iepm.web.metrics import metrics_text
        from iepm.web.queries import Queries

        queries = Queries(f"sqlite:///{tmp_path / 'archive.db'}", cache_ttl_s=0.0)
        try:
            text = metrics_text(queries, scheduler.health)[0].decode()
        finally:
            queries.close()
        for counter, value in (("sweeps", 1), ("failures", 0), ("put_off", 3)):
            assert f"iepm_retune_{counter}_total {value:.1f}" in text.splitlines()
        (study,) = list_studies(archive, kind="sweep")
        assert study.id == study_id and study.target == name and not study.partial
        assert study.params["retune"] == {"by": "scheduler", "reasons": reasons}
        assert len(study.points) == 5 and all(p["succeeded"] for p in study.points)
        tuned = load_tuned(archive, monitor="mon", target=name, probe="iperf3")
        assert tuned == study.summary["tuned"] and tuned["streams"] in (1, 2)
        # Every routine run of the tuned path, from the first cycle on, used the choice.
        runs = iperf3_runs(archive)
        routine_runs = [r for r in runs if r.purpose == Purpose.ROUTINE and r.target == name]
        assert len(routine_runs) == 3 and all(r.succeeded for r in routine_runs)
        for r in routine_runs:
            assert (r.params["window"], r.params["streams"]) == (
                tuned["window"],
                tuned["streams"],
            )
        assert len([r for r in runs if r.purpose == Purpose.STUDY]) == 5
        no_overlap(runs)


def test_failed_sweep_backs_off_and_the_monitor_goes_on(tmp_path: Path) -> None:
    dead = free_port()  # nothing listens there
    config = config_text(tmp_path, dead, ["a", "b"])
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as archive:
        reports, scheduler = cycles(config, archive, 3)
        # One sweep per cycle: "a" and "b" each fail once; then both back off.
        swept = [[name for name, _, _ in r.retuned] for r in reports]
        assert sorted(swept[0] + swept[1]) == ["a", "b"] and swept[2] == [], swept
        assert scheduler.health.retune_failures == 2
        studies = list_studies(archive, kind="sweep")
        assert len(studies) == 2 and all(s.partial and routine.scheduled(s) for s in studies)
        for s in studies:
            assert s.summary["partial_reason"].startswith("stopped after 2 of 5 points")
            assert load_tuned(archive, monitor="mon", target=s.target, probe="iperf3") == {}
        # The routine bandwidth tests still ran every cycle, and failed as data.
        routine_runs = [r for r in iperf3_runs(archive) if r.purpose == Purpose.ROUTINE]
        assert len(routine_runs) == 6 and not any(r.succeeded for r in routine_runs)
        assert all(len(r.retuned) <= 1 for r in reports)


def test_tune_due_sweeps_who_needs_it_then_nobody(tmp_path: Path, server: int) -> None:
    path = tmp_path / "targets.toml"
    path.write_text(config_text(tmp_path, server, ["a"]).replace("retune = true", ""))
    args = ["tune", "--due", "--config", str(path), "--windows", "default,256K"]
    args += ["--streams", "1,2", "--duration", "1", *FEW_PINGS_ARGS]
    first = CliRunner().invoke(app, [*args, "--json"])
    assert first.exit_code == 0, first.output
    assert "a: never tuned (no complete sweep)" in first.output  # why, on stderr
    swept = json.loads(first.stdout)
    assert swept["target"] == "a" and not swept["partial"]
    assert swept["summary"]["tuned_saved"] is True
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "no target needs tuning now" in again.output
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as archive:
        (study,) = list_studies(archive, kind="sweep")
        assert "retune" not in study.params  # the cron path: not the scheduler's budget
        tuned = load_tuned(archive, monitor="mon", target="a", probe="iperf3")
        assert tuned == swept["summary"]["tuned"]
    missing = CliRunner().invoke(app, ["tune", "--due"])
    assert missing.exit_code == 2 and "--due needs --config" in missing.output


def test_schedule_mode_sweeps_in_the_heavy_slot_before_the_run(tmp_path: Path, server: int) -> None:
    """With a [schedule] table the sweep runs in the heavy loop, before the probe's run."""
    config = config_text(tmp_path, server, ["a"]) + "\n[schedule]\niperf3 = 300\n"
    with Archive.open(f"sqlite:///{tmp_path / 'archive.db'}") as archive:
        seen: list[Result] = []

        def on_result(result: Result) -> None:
            seen.append(result)
            scheduler.stop()  # the first routine run ends the test's period

        scheduler = Scheduler(
            load_config_text(config), archive, watchers=[], on_result=on_result, rng=NoSpread()
        )
        report = asyncio.run(scheduler.run(cycles=1))
        assert report is not None and len(report.retuned) == 1, report
        (study,) = list_studies(archive, kind="sweep")
        assert not study.partial and study.params["retune"]["by"] == "scheduler"
        (run,) = seen
        assert run.succeeded and run.started_at > study.started_at
        tuned = study.summary["tuned"]
        assert (run.params["window"], run.params["streams"]) == (tuned["window"], tuned["streams"])
        no_overlap(iperf3_runs(archive))
