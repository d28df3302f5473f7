"""Measuring one (mode, batch size) pair from the batches a client reports: the batch times,
and the board's power while batches run (powerd.inference_planner.PairWindow)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from powerd.inference_planner import PairWindow, in_batch_power
from powerd.modes import PowerMode
from powerd.optimize.inference import Pair
from powerd.profiler import WindowSpec

PAIR = Pair(PowerMode(8, 422400, 318750000, 665600000), 16)
SPEC = WindowSpec(settle_s=0.5, window_s=2.0, min_steps=3)


def test_in_batch_power_is_the_mean_of_symmetric_noise_not_a_high_quantile() -> None:
    rng = np.random.default_rng(0)
    readings = 15.0 * (1.0 + rng.normal(0.0, 0.01, 400))
    got = in_batch_power(readings)
    assert got == pytest.approx(float(np.mean(readings)), abs=0.01)
    # the 90th percentile reads ~1.3 sigma (0.19 W) high: a 14.95 W pair would fail 15 W
    assert float(np.percentile(readings, 90)) - got > 0.15


def test_in_batch_power_drops_stale_idle_readings() -> None:
    rng = np.random.default_rng(1)
    busy = 15.0 * (1.0 + rng.normal(0.0, 0.01, 80))
    stale = np.full(20, 12.0)  # a late update still showing the idle gap before the batch
    readings = np.concatenate([busy, stale])
    assert float(np.mean(readings)) < 14.5  # the plain mean would be diluted
    assert in_batch_power(readings) == pytest.approx(float(np.mean(busy)), abs=0.01)


def test_in_batch_power_drops_readings_at_the_gaps_level_even_when_they_are_half() -> None:
    """A batch of one gets a few readings; when half still show the idle gap before it, the
    median lies between the levels and no rule on the readings alone finds the busy half.
    The readings between the batches show the idle level."""
    rng = np.random.default_rng(3)
    busy = [20.6, 20.8, 20.7] * 3  # enough for their mean (MEAN_READINGS)
    stale = [16.5, 16.4, 16.6] * 3
    gap = list(16.5 * (1.0 + rng.normal(0.0, 0.01, 40)))
    assert in_batch_power(busy + stale) < 19.0  # without the gaps: read 2 W low
    assert in_batch_power(busy + stale, gap) == pytest.approx(20.7)
    # a part-updated reading (some rails still idle) goes by the median rule after
    assert in_batch_power([*busy, 18.2, 16.5], gap) == pytest.approx(20.7)
    # fewer readings: the same drops, then the mean of the busy ones plus its standard error
    # (their spread, 0.1 W, is below the sensor's floor of 0.5 %)
    few = in_batch_power([20.6, 20.8, 20.7, 16.5, 16.4, 16.6], gap)
    assert few == pytest.approx(20.7 + 0.005 * 20.7 / math.sqrt(3))


@pytest.mark.parametrize(
    "readings, gap_level, expected",
    [
        ([16.5, 16.45, 16.55], 16.5, 16.5),  # a batch that draws what the gaps draw: kept
        ([20.6, 20.7, 20.8], 16.5, 20.7),  # nothing at the gaps' level: all kept
        ([20.6, 20.7, 20.8], 22.0, 20.7),  # gaps above the batches (another job): all kept
        # batches back to back: the gaps still show the batches' level, and dropping the
        # readings at it would keep only the noise's high tail (21.075)
        ([20.6, 20.7, 20.8, 21.05, 21.1], 20.7, 20.85),
    ],
)
def test_the_gaps_level_drops_only_some_readings_never_all(readings, gap_level, expected) -> None:
    gap = [gap_level] * 10
    # three windows' worth: enough readings for their mean (MEAN_READINGS)
    assert in_batch_power(readings * 3, gap) == pytest.approx(expected, abs=1e-9)


def test_too_few_gap_readings_leave_the_median_rule_alone() -> None:
    readings = [20.6, 20.7, 20.8, 16.5, 16.5, 16.5]
    assert in_batch_power(readings, [16.5] * 4) == in_batch_power(readings)


def test_few_readings_add_their_standard_error_as_straddling_ones_read_low() -> None:
    """A batch of one lasts a few ms: a conversion that straddles its start reads part of
    the gap, a few % low and too close to the busy level for the drop rules. These are a
    window's readings of a 17.46 W pair (b=1, ResNet-18 on Orin AGX, through the daemon
    under load): gaps at 13.91 W, two readings at the gaps' level, three busy ones of
    which two straddled."""
    gap = [13.91] * 20
    busy = [16.77, 16.98, 17.6]
    mean = float(np.mean(busy))
    assert mean < 17.46 - 0.3  # their mean: a pair that draws 17.46 W reads 17.12 W
    got = in_batch_power([*busy, 14.05, 13.76], gap)
    assert got == pytest.approx(mean + float(np.std(busy, ddof=1)) / math.sqrt(3))
    assert abs(got - 17.46) < 0.15
    # two readings: their highest
    assert in_batch_power([16.77, 17.6], gap) == pytest.approx(17.6)
    # with enough readings the mean: straddling ones are a minority there
    rng = np.random.default_rng(5)
    many = list(17.46 * (1.0 + rng.normal(0.0, 0.01, 12)))
    assert in_batch_power(many, gap) == pytest.approx(float(np.mean(many)))


def test_in_batch_power_of_noise_free_readings_is_their_value() -> None:
    assert in_batch_power([15.0] * 10) == 15.0
    assert in_batch_power([15.0] * 8 + [14.0]) == 15.0  # 1 W below: not the busy level


def _window(batches: list[tuple[float, float]]) -> PairWindow:
    w = PairWindow(PAIR, applied=0.0, spec=SPEC)
    for s, e in batches:
        w.add(s, e)
    return w


def test_a_pair_s_power_counts_only_readings_inside_its_batches() -> None:
    # batches of 0.2 s every 0.5 s; busy 15 W, idle 12 W between them; a reading every 10 ms
    batches = [(1.0 + 0.5 * k, 1.2 + 0.5 * k) for k in range(6)]

    def power(t0: float, t1: float):
        ts = np.arange(0.0, 5.0, 0.01)
        out = []
        for t in ts:
            busy = any(s <= t <= e for s, e in batches)
            if t0 <= t <= t1:
                out.append((float(t), 15.0 if busy else 12.0))
        return out

    m = _window([(0.2, 0.4)] + batches).measure(power, lag_s=0.05)  # 0.2 s: still settling
    assert m.batches == len(batches)
    assert m.batch_ms == pytest.approx(200.0)
    assert m.power_w == pytest.approx(15.0)


def test_a_pair_s_power_is_not_diluted_by_batches_whose_readings_show_the_gap() -> None:
    """Short batches whose first readings show the idle gap (the GPU's work began after the
    client's clock, or the sensor updated late): the pair reads its busy level, as the
    readings between its batches tell which level is the gap's."""
    batches = [(1.0 + 0.1 * k, 1.004 + 0.1 * k) for k in range(10)]  # 4 ms batches
    lag = 0.001

    def power(t0: float, t1: float):
        out = []
        for s, e in batches:
            out.append((s + 0.0015, 16.5))  # stale: shows the gap
            out.append((s + 0.0035, 20.7))
            out.append((e + 0.03, 16.5))  # between batches
            out.append((e + 0.06, 16.5))
        return [(t, w) for t, w in out if t0 <= t <= t1]

    m = _window(batches).measure(power, lag_s=lag)
    assert m.power_n == len(batches)
    assert m.power_w == pytest.approx(20.7)


def test_batches_too_short_for_readings_take_the_largest_reading() -> None:
    batches = [(1.0 + 0.5 * k, 1.01 + 0.5 * k) for k in range(4)]  # 10 ms batches

    def power(t0: float, t1: float):
        # one reading per 100 ms, none of them inside a batch past the sensor lag
        return [
            (float(t), 15.0 if k % 5 == 0 else 12.0) for k, t in enumerate(np.arange(t0, t1, 0.1))
        ]

    m = _window(batches).measure(power, lag_s=0.05)
    assert m.power_w == 15.0  # never an idle-diluted value


def test_a_window_reports_its_readings_spread_and_the_store_keeps_the_pooled_reading() -> None:
    import math

    from powerd.inference_planner import InferenceSamples
    from powerd.optimize.inference import pooled

    rng = np.random.default_rng(2)
    batches = [(1.0 + 0.5 * k, 1.3 + 0.5 * k) for k in range(6)]
    ts = np.arange(0.0, 5.0, 0.01)
    noise = rng.normal(0.0, 0.15, len(ts))

    def power(t0: float, t1: float):
        return [
            (float(t), 15.0 + float(z)) for t, z in zip(ts, noise, strict=True) if t0 <= t <= t1
        ]

    m = _window(batches).measure(power, lag_s=0.05)
    assert m.power_n >= 100 and m.windows == 1
    assert m.power_sd_w == pytest.approx(0.15, rel=0.2)
    assert m.power_se_w == pytest.approx(m.power_sd_w / math.sqrt(m.power_n))
    both = pooled(m, m)
    assert both.windows == 2 and both.power_n == 2 * m.power_n

    saved: dict = {}
    store = InferenceSamples(lambda name: saved.get(name), saved.__setitem__)
    store.of("w", persistent=True)[PAIR] = both
    store.save("w", persistent=True)
    back = InferenceSamples(lambda name: saved.get(name), saved.__setitem__).of("w", True)
    assert back[PAIR] == both


@pytest.mark.parametrize(
    "level, readings_per_batch, over",
    [
        (15.5, 3, True),  # 0.5 W over on 18 steady readings
        (15.02, 3, False),  # noise-free readings 0.02 W over: within the sensor's noise
        (15.5, 1, False),  # 6 readings: too few to call it
    ],
)
def test_a_window_is_clearly_over_only_beyond_the_sensors_noise(
    level, readings_per_batch, over
) -> None:
    """clearly_over ends a window early only on enough in-batch readings, and never on a
    spread read from them below the sensor's noise (noise-free readings would otherwise
    make 0.02 W over the budget look certain)."""
    batches = [(1.0 + 0.1 * k, 1.05 + 0.1 * k) for k in range(6)]  # 50 ms batches

    def power(t0: float, t1: float):
        step = 0.05 / (readings_per_batch + 1)
        ts = [s + step * (i + 1) for s, _ in batches for i in range(readings_per_batch)]
        return [(t, level) for t in ts if t0 <= t <= t1]

    assert _window(batches).clearly_over(power, 15.0) is over


def _levels(before_w: float, after_w: list[float]):
    """Readings every 10 ms (at 5, 15, 25 ... ms): `before_w` until the switch at t=0, then
    `after_w` in turn (the last one held)."""

    def power(t0: float, t1: float):
        out = []
        for i in range(-100, 500):
            t = i * 0.01 + 0.005
            w = before_w if t < 0 else after_w[min(i, len(after_w) - 1)]
            if t0 <= t <= t1:
                out.append((t, w))
        return out

    return power


def test_a_pair_over_the_budget_is_stopped_while_it_settles() -> None:
    """The settle (2 s on a board) is no time to hold a pair 1 W over the budget: three
    readings over the limit stop it, as they stop a training probe. Before, an inference
    window checked nothing until its settle had passed."""
    w = PairWindow(PAIR, applied=0.0, spec=SPEC)  # opens at 0.5 s
    power = _levels(14.0, [17.0])
    assert w.over_budget(power, 15.0, now=0.02) is None  # two readings so far
    assert w.over_budget(power, 15.0, now=0.03) == pytest.approx(17.0)
    # within the limit (budget + 1 W): no stop
    assert PairWindow(PAIR, 0.0, SPEC).over_budget(_levels(14.0, [15.9]), 15.0, 0.3) is None


def test_a_previous_pairs_falling_tail_does_not_stop_a_settling_pair() -> None:
    # the board was over the limit before the switch: readings falling from it are that
    # pair's tail, and the new pair is judged only once they stop falling
    falling = [18.0, 17.5, 17.0, 16.5, 16.2, 16.1, 15.5]
    w = PairWindow(PAIR, applied=0.0, spec=SPEC)
    assert w.over_budget(_levels(18.0, falling), 15.0, now=0.06) is None
    w2 = PairWindow(PAIR, applied=0.0, spec=SPEC)
    assert w2.over_budget(_levels(18.0, falling), 15.0, now=0.3) is None  # settled at 15.5
    # a level over the limit once the tail has passed (6 readings at 17 W): stopped
    w3 = PairWindow(PAIR, applied=0.0, spec=SPEC)
    over = _levels(18.0, [18.0, 17.0])
    assert w3.over_budget(over, 15.0, now=0.06) is None  # 18, 17 x 5: still falling
    assert w3.over_budget(over, 15.0, now=0.08) == pytest.approx(17.0)


def test_a_pair_stopped_while_it_settles_keeps_the_times_of_its_settle_batches() -> None:
    """The model needs the batch time of a pair over the budget as much as any: stopped
    in its settle, the pair is timed on the batches it ran since the switch (with none
    timed, a search at 15 W walked through six 12-core modes, each stopped untimed)."""
    w = PairWindow(PAIR, applied=0.0, spec=SPEC)  # opens at 0.5 s
    w.add(-0.05, 0.02)  # began before the switch: the previous pair's
    w.add(0.03, 0.10)
    w.add(0.11, 0.18, size=4)  # another batch size
    w.add(0.19, 0.26)
    m = w.stopped_over(17.0)
    assert m.batches == 2 and m.batch_ms == pytest.approx(70.0)
    assert w.batches == []  # the window's own batches start after the settle
    assert math.isnan(PairWindow(PAIR, 0.0, SPEC).stopped_over(17.0).batch_ms)
