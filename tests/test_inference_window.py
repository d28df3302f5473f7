"""Measuring one (mode, batch size) pair from the batches a client reports: the batch times,
and the board's power while batches run (powerd.inference_planner.PairWindow)."""

from __future__ import annotations

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


def test_in_batch_power_of_noise_free_readings_is_their_value() -> None:
    assert in_batch_power([15.0] * 10) == 15.0
    assert in_batch_power([15.0, 15.0, 15.0, 14.0]) == 15.0  # 1 W below: not the busy level


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
