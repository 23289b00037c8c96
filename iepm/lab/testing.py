"""Lab helpers for test suites (no pytest import): unique names, guaranteed teardown, sweeping.

``tests/lab/conftest.py`` turns these into the ``lab_factory`` / ``module_lab_factory``
fixtures; another test directory can do the same in a few lines::

    @pytest.fixture
    def lab_factory():
        with LabFactory() as factory:
            yield factory
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from iepm.errors import LabError
from iepm.lab.lab import Lab, down, running_labs
from iepm.lab.netns import require_privileges
from iepm.lab.topology import Topology

# Test labs are named <letters><creator pid>x<n>, so a later run can spot those whose creator died.
TEST_LAB_NAME = r"[a-z]+(\d+)x\d+"
_counter = itertools.count()


def unique_lab_name(prefix: str = "t") -> str:
    """A lab name no other process uses (labs of parallel test runs must not collide)."""
    if not re.fullmatch(r"[a-z]+", prefix):
        raise ValueError(f"prefix {prefix!r}: letters a-z only")
    return f"{prefix}{os.getpid()}x{next(_counter)}"


def lab_unavailable() -> str | None:
    """Why labs cannot be built here (no root, no TUN, no ip), or None if they can."""
    try:
        require_privileges()
    except LabError as exc:
        return str(exc)
    return None


# A sleeper at the delay line's own priority (SCHED_FIFO 10, timer slack 1 ns): how late it
# wakes is how late the delay line forwards a packet that found it idle. Stops after its count
# or at SIGTERM, and prints its figures either way.
_TIMER_METER = """
import json, signal, statistics, sys, time
from iepm.lab.delayline import PR_SET_TIMERSLACK, _libc, set_priority
stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
set_priority("realtime")
_libc().prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
period_ns, count, late_us = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
late = []
while len(late) < count and not stopped:
    due = time.perf_counter_ns() + period_ns
    time.sleep(period_ns * 1e-9)
    late.append((time.perf_counter_ns() - due) / 1000)
late = late or [0.0]
print(json.dumps({
    "p50_us": statistics.median(late),
    "p90_us": sorted(late)[int(0.9 * (len(late) - 1))],
    "max_us": max(late),
    "late_share": sum(1 for x in late if x > late_us) / len(late),
    "wakeups": len(late),
}))
"""


def _meter_argv(period_us: int, count: int, late_us: float) -> list[str]:
    return [sys.executable, "-c", _TIMER_METER, str(period_us * 1000), str(count), str(late_us)]


def timer_lateness_us(
    duration_s: float = 0.5, period_us: int = 250, late_us: float = 120
) -> dict[str, float]:
    """How late this host wakes a task of the delay line's priority (p50, p90, max in µs, and
    the share of wake-ups later than ``late_us``) over ``duration_s``: the lab forwards a packet
    that finds its delay line idle that late, so timing-sensitive lab tests (available
    bandwidth's 120 µs) can tell a host stalled under them (a busy hypervisor: ms) from a
    method that fails."""
    count = max(10, int(duration_s * 1e6 / period_us))
    run = subprocess.run(
        _meter_argv(period_us, count, late_us),
        capture_output=True,
        text=True,
        timeout=duration_s * 4 + 30,
        check=True,
    )
    figures: dict[str, float] = json.loads(run.stdout)
    return figures


@contextlib.contextmanager
def host_timer(
    period_us: int = 1000, late_us: float = 120, priority: int = 10
) -> Iterator[dict[str, float]]:
    """:func:`timer_lateness_us` over a whole block: ``with host_timer() as figures: …``, the
    dict filled when the block ends. Wakes every ``period_us`` (1 ms: a light load beside the
    block's) at SCHED_FIFO ``priority`` (the delay line's 10; one above reads what the host takes
    from the delay line rather than the lab's own forwarding). The block starts once the meter
    measures, so a short block is measured too."""
    figures: dict[str, float] = {}
    proc = subprocess.Popen(
        _meter_argv(period_us, 10**9, late_us),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # The meter sets SCHED_FIFO after installing its SIGTERM handler: from then on it
        # measures, and reports when stopped.
        deadline = time.monotonic() + 30.0
        while os.sched_getscheduler(proc.pid) != os.SCHED_FIFO:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LabError("the host timer meter did not start at SCHED_FIFO")
            time.sleep(0.01)
        if priority != 10:
            os.sched_setscheduler(proc.pid, os.SCHED_FIFO, os.sched_param(priority))
        yield figures
    finally:
        proc.terminate()  # the meter prints its figures at SIGTERM
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        if out.strip():
            figures.update(json.loads(out))


def sweep_stale_labs() -> list[str]:
    """Tear down test labs whose creating process is gone (a killed test run)."""
    swept = []
    for name in running_labs():
        m = re.fullmatch(TEST_LAB_NAME, name)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            down(name)
            swept.append(name)
    return swept


class LabFactory:
    """Builds labs with unique names; :meth:`close` (or leaving ``with``) tears all of them down.

    ``factory(topology, name=None, prefix="t") -> Lab`` where ``topology`` is a dict in the TOML's
    shape, a Topology or a TOML path.
    """

    def __init__(self) -> None:
        self.labs: list[Lab] = []

    def __call__(
        self,
        topology: Topology | Mapping[str, Any] | str | Path,
        *,
        name: str | None = None,
        prefix: str = "t",
    ) -> Lab:
        lab = Lab.up(topology, name=name or unique_lab_name(prefix))
        self.labs.append(lab)
        return lab

    def close(self) -> None:
        """Tear down every lab built, all of them even if one fails; then report failures."""
        errors = []
        for lab in reversed(self.labs):
            try:
                lab.down()
            except LabError as exc:
                errors.append(str(exc))
        self.labs.clear()
        if errors:
            raise LabError("; ".join(errors))

    def __enter__(self) -> LabFactory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
