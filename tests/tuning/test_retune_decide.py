"""Re-tuning as a routine mode: when the scheduler sweeps a path (conditions, budget, back-off)
and how its settings are checked. No network: the studies and alerts are written as the sweep
and the alert watcher write them."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert

from iepm.config import MonitorConfig, load_config_text
from iepm.errors import ConfigError
from iepm.store import Archive
from iepm.store.schema import alerts
from iepm.tuning import routine
from iepm.tuning.store import Study, StudyRecorder
from iepm.tuning.sweep import KIND

T0 = datetime.fromisoformat("2026-11-01T12:00:00+00:00")
MON = "mon"


def policy(**changes: float) -> routine.Policy:
    base = routine.Policy.of(MonitorConfig(name=MON, retune=True))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def sweep(
    archive: Archive,
    target: str,
    at: datetime,
    *,
    partial: bool = False,
    by_scheduler: bool = True,
    reason: str = "stopped after 2 of 5 points: the target stopped answering",
) -> Study:
    params: dict[str, object] = {"route": None}
    if by_scheduler:
        params["retune"] = {"by": "scheduler", "reasons": ["never tuned (no complete sweep)"]}
    recorder = StudyRecorder(archive, Study(KIND, MON, target, params, started_at=at))
    summary = {"partial_reason": reason if partial else None, "tuned_saved": not partial}
    return recorder.finish(summary, partial=partial)


def alert(archive: Archive, target: str, at: datetime, cause: str) -> None:
    with archive.writing("test alert") as conn:
        conn.execute(
            insert(alerts).values(
                id=uuid.uuid4().hex, monitor=MON, target=target, probe="iperf3",
                metric="throughput_bps", detected_at=at, change_at=at - timedelta(hours=1),
                direction="down", before=1e8, after=5e7, change_percent=-50.0, cause=cause,
                details={}, delivery_attempts=0,
            )
        )  # fmt: skip


def decide(
    archive: Archive, target: str, now: datetime, p: routine.Policy | None = None, done: int = 0
) -> routine.Decision:
    return routine.decide(
        archive, p or policy(), monitor=MON, target=target, swept_this_cycle=done, now=now
    )


def test_never_tuned_runs_tuned_does_not(archive: Archive) -> None:
    first = decide(archive, "a", T0)
    assert first.run and first.reasons == ["never tuned (no complete sweep)"]
    sweep(archive, "a", T0)
    assert decide(archive, "a", T0 + timedelta(days=1)).reasons == []
    assert not decide(archive, "a", T0 + timedelta(days=1)).run


def test_too_old_and_step_changes_are_reasons(archive: Archive) -> None:
    sweep(archive, "a", T0)  # (route changes: the lab test)
    old = decide(archive, "a", T0 + timedelta(days=31))
    assert old.run and old.reasons[0].startswith("last tuned 31.0 days ago (period 30 days)")
    # A change the tuning itself explains is not a reason (each sweep would cause another).
    alert(archive, "a", T0 + timedelta(hours=2), "tuning")
    assert decide(archive, "a", T0 + timedelta(hours=3)).reasons == []
    alert(archive, "a", T0 + timedelta(hours=4), "unknown")
    step = decide(archive, "a", T0 + timedelta(hours=5), policy(gap_s=0.0))
    assert step.run
    assert step.reasons == ["unknown change in iperf3 throughput_bps at 2026-11-01 15:00Z"]
    # An alert older than the sweep is not a reason.
    sweep(archive, "a", T0 + timedelta(hours=6))
    assert decide(archive, "a", T0 + timedelta(hours=7)).reasons == []


def test_budget_per_cycle_and_gap(archive: Archive) -> None:
    p = policy(per_cycle=1, gap_s=6 * 3600.0)
    full = decide(archive, "a", T0, p, done=1)
    assert full.reasons and not full.run
    assert full.wait == "budget: 1 sweep(s) this cycle already (retune_per_cycle = 1)"
    assert decide(archive, "a", T0, p, done=0).run
    sweep(archive, "b", T0)  # the monitor's last scheduled sweep, another path
    soon = decide(archive, "a", T0 + timedelta(hours=5), p)
    assert not soon.run and soon.wait is not None and "retune_gap_h = 6 h" in soon.wait
    assert decide(archive, "a", T0 + timedelta(hours=6, seconds=1), p).run
    # A sweep run by hand (`iepm tune`) is not the scheduler's: no budget spent.
    sweep(archive, "c", T0 + timedelta(hours=7), by_scheduler=False)
    assert decide(archive, "a", T0 + timedelta(hours=7, minutes=1), p).run
    # No gap: only the per-cycle budget.
    assert decide(archive, "a", T0 + timedelta(minutes=1), policy(gap_s=0.0)).run


def test_failures_back_off_doubling_and_a_success_clears_it(archive: Archive) -> None:
    p = policy(gap_s=0.0, backoff_s=6 * 3600.0)
    sweep(archive, "a", T0, partial=True)
    waiting = decide(archive, "a", T0 + timedelta(hours=5), p)
    assert waiting.reasons == ["never tuned (no complete sweep)"] and not waiting.run
    assert waiting.wait == (
        "back-off: 1 failed sweep(s) in a row (the last: stopped after 2 of 5 points: the target "
        "stopped answering); next try after 2026-11-01 18:00:00Z"
    )
    assert decide(archive, "a", T0 + timedelta(hours=6, seconds=1), p).run
    sweep(archive, "a", T0 + timedelta(hours=7), partial=True)
    twice = decide(archive, "a", T0 + timedelta(hours=18), p)
    assert not twice.run and twice.wait is not None and "2 failed sweep(s)" in twice.wait
    assert decide(archive, "a", T0 + timedelta(hours=19, seconds=1), p).run
    # The back-off never exceeds retune_after_days.
    short = dataclasses.replace(p, after_s=8 * 3600.0)
    assert decide(archive, "a", T0 + timedelta(hours=15, seconds=1), short).run
    # Another path's failures are not this one's; a hand-run partial sweep is no failure.
    sweep(archive, "b", T0 + timedelta(hours=20), partial=True, by_scheduler=False)
    assert decide(archive, "b", T0 + timedelta(hours=20, minutes=1), p).run
    # A complete sweep ends the run of failures.
    sweep(archive, "a", T0 + timedelta(hours=20))
    sweep(archive, "a", T0 + timedelta(days=40), partial=True)
    assert decide(archive, "a", T0 + timedelta(days=40, hours=6, seconds=1), p).run


def test_failed_sweep_is_recorded_with_its_reason(archive: Archive) -> None:
    """A sweep refused before it starts (here: the target's iperf3 is UDP) is still a stored,
    partial, scheduled study with the refusal as its reason — so back-off sees it."""
    import asyncio

    from iepm.probes import iperf3
    from iepm.probes.base import ProbeContext

    ctx = ProbeContext(target="a", address="198.18.0.9", monitor=MON)
    study = asyncio.run(
        routine.run(archive, ctx, policy(), ["never tuned"], base=iperf3.Spec(udp=True))
    )
    assert study.partial and routine.scheduled(study)
    assert study.params["retune"]["reasons"] == ["never tuned"]
    reason = routine.failure_reason(study)
    assert reason is not None and "settings say udp = true" in reason
    now = study.started_at + timedelta(minutes=1)
    later = decide(archive, "a", now, policy(gap_s=0.0))
    assert not later.run and later.wait is not None and later.wait.startswith("back-off: 1 failed")


def test_settings_are_checked_with_file_and_line(tmp_path: Path) -> None:
    def load(monitor: str) -> None:
        load_config_text(
            f'[monitor]\nname = "m"\nretune = true\n{monitor}\n'
            '[[targets]]\nname = "a"\naddress = "198.18.0.2"\n',
            tmp_path / "t.toml",
        )

    with pytest.raises(ConfigError) as bad_window:
        load('retune_windows = ["default", "64Q"]')
    assert str(bad_window.value).startswith(f"{tmp_path / 't.toml'}:4: monitor.retune_windows: ")
    assert "window '64Q' is not like iperf3's -w" in str(bad_window.value)
    with pytest.raises(ConfigError) as bad_streams:
        load("retune_streams = [1, 200]")
    assert ":4: monitor.retune_streams[1]: Input should be less than or equal to 128" in str(
        bad_streams.value
    )
    with pytest.raises(ConfigError) as too_long:
        load("retune_duration_s = 60\nretune_max_total_s = 100")
    message = str(too_long.value)
    assert ":1: monitor: sweep refused before it started: 5 windows × 4 stream counts" in message
    assert "exceeds the limit of 100 s total" in message and "raise retune_max_total_s" in message
    with pytest.raises(ConfigError, match=r":4: monitor.retune_gap_h: .*greater than or equal"):
        load("retune_gap_h = -1")
    load('retune_windows = ["default", "1M"]\nretune_streams = [1, 4]\nretune_gap_h = 0')


def test_off_loop_runs_in_a_thread_and_cancelling_reaches_it() -> None:
    """The sweep runs on a loop of its own (its archive writes never hold up the scheduler's);
    cancelling the scheduler's side cancels the sweep and waits for its cleanup."""
    import asyncio
    import threading

    seen: list[str] = []

    async def answer() -> int:
        return threading.get_ident()

    async def long_work() -> None:
        seen.append("started")
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        seen.append("finished")

    async def main() -> None:
        assert await routine.off_loop(answer) != threading.get_ident()
        task = asyncio.create_task(routine.off_loop(long_work))
        async with asyncio.timeout(30):
            while not seen:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert seen == ["started", "cancelled"]

    asyncio.run(main())
