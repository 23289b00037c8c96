"""The delay line's per-direction model, driven with a fake clock (no root needed)."""

from __future__ import annotations

import itertools
import random
import statistics

from iepm.lab.delayline import Direction, Params, steady_state_loss_percent
from testkit.labtools import binomial_interval


def direction(**params: object) -> Direction:
    return Direction(Params.from_dict(params), random.Random(1))


def test_delay_is_added_to_arrival() -> None:
    d = direction(delay_ms=40)
    assert d.admit(100, now=10.0) == 10.04


def test_compensation_is_taken_off_but_never_below_zero() -> None:
    d = direction(delay_ms=1)
    d.compensation_s = 0.0002
    assert abs(d.admit(100, 0.0) - 0.0008) < 1e-12
    d.set_params(Params(delay_ms=0.1))
    assert d.admit(100, 5.0) == 5.0


def test_rate_serialises_and_queue_tail_drops() -> None:
    d = direction(rate_mbit=8, queue_ms=10)  # 1500 B take 1.5 ms at 8 Mbit/s
    times = [d.admit(1500, now=0.0) for _ in range(10)]
    delivered = [t for t in times if t is not None]
    # packet k waits 1.5*k ms: k = 0..6 fit in the 10 ms queue, k = 7.. would wait 10.5 ms
    assert [round(t * 1000, 3) for t in delivered] == [1.5, 3.0, 4.5, 6.0, 7.5, 9.0, 10.5]
    assert d.stats.queue_drops == 3


def test_queue_bytes_is_a_limit_in_time_at_the_rate() -> None:
    assert Params(rate_mbit=8, queue_bytes=15000).queue_limit_s() == 0.015
    assert Params(rate_mbit=None, queue_ms=5).queue_limit_s() is None


def test_bernoulli_loss_within_binomial_interval() -> None:
    d = direction(loss_percent=3)
    n = 20000
    lost = sum(d.admit(100, i * 0.001) is None for i in range(n))
    lo, hi = binomial_interval(n, 0.03)
    assert lo <= lost <= hi


def test_gilbert_elliott_matches_steady_state_and_is_bursty() -> None:
    params = Params(ge_p_percent=1, ge_r_percent=25, ge_loss_bad_percent=100)
    d = Direction(params, random.Random(7))
    outcome = [d.admit(100, i * 0.001) is None for i in range(200_000)]
    rate = 100 * sum(outcome) / len(outcome)
    expected = steady_state_loss_percent(params)
    assert abs(expected - 100 / 26) < 1e-9
    assert abs(rate - expected) < 0.15 * expected
    # bursts: a loss is followed by another far more often than the average rate
    after_loss = [b for a, b in itertools.pairwise(outcome) if a]
    assert sum(after_loss) / len(after_loss) > 0.6


def test_jitter_stdev_and_fifo_order() -> None:
    d = direction(delay_ms=20, jitter_ms=2)
    arrivals = [i * 0.05 for i in range(4000)]
    delays = [d.admit(100, t) - t for t in arrivals]
    assert abs(statistics.pstdev(delays) * 1000 - 2) < 0.1
    assert abs(statistics.mean(delays) * 1000 - 20) < 0.1
    # back to back packets stay in order without reorder
    d2 = direction(delay_ms=20, jitter_ms=5)
    times = [d2.admit(100, 0.0) for _ in range(100)]
    assert times == sorted(times)


def test_reorder_allows_jitter_to_reorder_and_heap_releases_in_time_order() -> None:
    d = direction(delay_ms=20, jitter_ms=5, reorder=True)
    for i in range(100):
        t = d.admit(100, 0.0)
        assert t is not None
        d.push(t, bytes([i]))
    released = d.pop_due(1.0)
    assert len(released) == 100
    assert [b[0] for b in released] != list(range(100))


def test_down_drops_everything() -> None:
    d = direction(delay_ms=1, up=False)
    assert d.admit(100, 0.0) is None
    assert d.stats.down_drops == 1
    assert steady_state_loss_percent(Params(up=False)) == 100.0


def test_params_reject_unknown_keys() -> None:
    try:
        Params().updated({"delay": 3})
    except ValueError as exc:
        assert "delay" in str(exc)
    else:
        raise AssertionError("unknown key accepted")
