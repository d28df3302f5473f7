import math
import random

import pytest

from powerd.modes import PowerMode
from powerd.profiler import ModeWindow, ProfilingCost, WindowSpec

MODE = PowerMode(4, 1_000_000, 600_000_000, 2_000_000_000)
SPEC = WindowSpec(settle_s=1.0, window_s=2.0, min_steps=5)


def power_at(watts):
    """A sampler stand-in: one sample every 0.1 s at a constant power."""

    def samples(t0, t1):
        n = int((t1 - t0) / 0.1)
        return [(t0 + 0.1 * i, watts) for i in range(n)]

    return samples


def drive(win, step_s, until, watts, start=0.0):
    t = start
    result = None
    while t < until and result is None:
        t += step_s
        win.add_steps([t])
        result = win.poll(t, power_at(watts))
    return result


def test_settle_then_window_measures_median_step_and_mean_power():
    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    m = drive(win, 0.25, until=20, watts=15.0)
    assert m is not None and not m.aborted_over_budget
    assert math.isclose(m.time_ms, 250.0, rel_tol=1e-6)
    assert m.power_w == 15.0
    assert m.steps >= 5


def test_steps_before_the_switch_and_during_settle_do_not_count():
    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=10.0)
    win.add_steps([9.0, 9.5])  # old mode
    # slow steps during settle, then fast ones
    t = 10.0
    for _ in range(2):
        t += 0.5
        win.add_steps([t])
        win.poll(t, power_at(10))
    m = drive(win, 0.1, until=30, watts=10, start=t)
    assert m is not None
    assert m.time_ms < 150


def test_slow_mode_waits_for_min_steps():
    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    m = drive(win, 0.9, until=60, watts=10)
    assert m is not None
    assert m.steps >= SPEC.min_steps
    assert math.isclose(m.time_ms, 900.0, rel_tol=1e-6)


def test_power_clearly_over_budget_stops_early():
    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    m = drive(win, 0.1, until=20, watts=23.0)
    assert m is not None and m.aborted_over_budget
    assert m.power_w == 23.0
    # stopped well before a full window
    assert m.steps < 20


def test_a_pause_cancels_the_window_instead_of_corrupting_it():
    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    t = 0.0
    for _ in range(14):  # settle + a few window steps
        t += 0.1
        win.add_steps([t])
        assert win.poll(t, power_at(10)) is None
    # the job pauses (evaluation, checkpoint) for 5 s without stepping
    for _ in range(50):
        t += 0.1
        assert win.poll(t, power_at(10)) is None
    assert win.cancelled == 1
    m = drive(win, 0.1, until=t + 10, watts=10, start=t)
    assert m is not None
    assert math.isclose(m.time_ms, 100.0, rel_tol=1e-3)  # the 5 s gap is not a step


def test_cost_accounts_time_above_budget():
    cost = ProfilingCost()
    samples = [(0.0, 10.0), (1.0, 21.5), (2.0, 20.5), (3.0, 10.0)]
    cost.account(samples, budget_w=20)
    assert cost.seconds == 3.0
    assert cost.seconds_above_budget == 2.0
    assert cost.seconds_above_budget_1w == 1.0


def test_rising_power_far_over_budget_stops_during_settle():
    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    m = None
    t = 0.0
    while m is None and t < SPEC.settle_s:
        t += 0.1
        m = win.poll(t, power_at(24.0))
    assert m is not None and m.aborted_over_budget
    assert t < SPEC.settle_s  # did not wait for the window


def test_a_falling_tail_of_the_previous_mode_does_not_abort():
    def falling(t0, t1):
        n = int((t1 - t0) / 0.1)
        return [(t0 + 0.1 * i, 30.0 - 0.5 * i) for i in range(n)]

    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    t = 0.0
    while t < SPEC.settle_s - 0.1:
        t += 0.1
        assert win.poll(t, falling) is None


def test_from_a_mode_within_the_budget_over_budget_power_stops_sooner():
    """No tail to wait out when the board was within budget + margin before the switch."""

    def step_up(t0, t1):
        n = int(round((t1 - t0) / 0.1))
        return [(t0 + 0.1 * i, 15.0 if t0 + 0.1 * i < 0 else 24.0) for i in range(n)]

    def stopped_at(power):
        win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
        t, m = 0.0, None
        while m is None and t < SPEC.settle_s:
            t += 0.1
            m = win.poll(t, power)
        assert m is not None and m.aborted_over_budget
        return t

    from_within = stopped_at(step_up)
    from_above = stopped_at(power_at(24.0))  # over before the switch too: wait out a tail
    assert from_within < from_above
    assert from_within <= 0.1 * (SPEC.min_abort_samples + 1) + 1e-9


def test_power_over_budget_ends_a_probe_while_the_job_is_paused():
    """Fails on the old window: a paused window returned before the over-budget check."""

    def rising(t0, t1):  # 15 W until t=6, then 25 W (the paused job's evaluation, say)
        n = int((t1 - t0) / 0.1)
        return [(t0 + 0.1 * i, 15.0 if t0 + 0.1 * i < 6.0 else 25.0) for i in range(n)]

    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    t = 0.0
    while t < 1.6:  # settle, then a few steps of the window
        t += 0.25
        win.add_steps([t])
        assert win.poll(t, rising) is None
    result = None
    while t < 12 and result is None:  # no more steps: the job paused
        t += 0.1
        result = win.poll(t, rising)
    assert win.cancelled >= 1  # the pause was seen (window discarded) ...
    assert result is not None and result.aborted_over_budget  # ... and power still checked
    assert 6.0 < t < 7.5
    assert result.power_w > 21


def test_a_lowered_budget_applies_to_a_window_in_flight():
    win = ModeWindow(MODE, SPEC, budget_w=30, t_switch=0.0)
    assert drive(win, 0.25, until=1.5, watts=25.0) is None
    win.budget_w = 20  # Tuner.set_budget keeps the window, with the new limit
    m = drive(win, 0.25, until=5, watts=25.0, start=1.5)
    assert m is not None and m.aborted_over_budget


def noisy_power(mean_w, rel=0.01, seed=1):
    """A sampler stand-in: one reading every 0.1 s, `rel` relative gaussian noise."""
    rnd = random.Random(seed)
    cache = {}

    def samples(t0, t1):
        out = []
        k = math.ceil(t0 / 0.1 - 1e-9)
        while 0.1 * k < t1:
            if k not in cache:
                cache[k] = mean_w * (1 + rel * rnd.gauss(0.0, 1.0))
            out.append((0.1 * k, cache[k]))
            k += 1
        return out

    return samples


def measure_until_done(win, step_s, power, until=10.0):
    t, m = 0.0, None
    while m is None and t < until:
        t += step_s
        win.add_steps([t])
        m = win.poll(t, power)
    return t, m


def test_a_mode_over_the_budget_within_the_margin_is_timed_on_min_steps_only():
    """0.6 W over a 20 W budget: not enough to stop at once, but clearly over (the readings'
    noise is ~0.05 W per mean): the window ends once min_steps steps are timed, with the
    step time known, rather than holding the board over the budget for window_s."""
    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    t, m = measure_until_done(win, 0.05, noisy_power(20.6))
    assert m is not None and not m.aborted_over_budget
    assert m.steps == SPEC.min_steps and m.time_ms == pytest.approx(50.0)
    assert m.power_w > 20
    assert t < SPEC.settle_s + SPEC.window_s / 2


def test_a_mode_just_under_the_budget_gets_its_whole_window():
    """Read over the budget by noise alone, a mode 0.05 W under it is not cut short: its
    window runs the full window_s, so its power reading is as good as any other's."""
    for seed in range(20):
        win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
        t, m = measure_until_done(win, 0.05, noisy_power(19.95, seed=seed))
        assert m is not None
        assert t >= SPEC.settle_s + SPEC.window_s - 1e-9


def test_a_mode_over_the_budget_with_jittery_steps_is_timed_longer():
    """Steps jittering by ~20 % time a median poorly on 5 steps: the over-budget window then
    runs on (here to window_s) rather than leave a later budget a noisy time to pin on."""
    rnd = random.Random(3)
    win = ModeWindow(MODE, SPEC, budget_w=20, t_switch=0.0)
    power = noisy_power(20.6)
    t, m = 0.0, None
    while m is None and t < 10.0:
        t += 0.05 * max(0.3, rnd.gauss(1.0, 0.2))
        win.add_steps([t])
        m = win.poll(t, power)
    assert m is not None and m.power_w > 20
    assert m.steps > 2 * SPEC.min_steps


def test_a_window_carries_its_readings_standard_error():
    """The mean's standard error rides with the measurement (the search asks it whether a
    reading just over the budget may be noise); steady power has none to speak of."""
    win = ModeWindow(MODE, SPEC, budget_w=30, t_switch=0.0)
    _, m = measure_until_done(win, 0.05, noisy_power(20.0, rel=0.01))
    assert m is not None and m.power_se_w is not None
    # 1 % readings every 0.1 s over a 2 s window: 0.2 W / sqrt(~20) each
    assert 0.02 < m.power_se_w < 0.09
    steady = drive(ModeWindow(MODE, SPEC, budget_w=30, t_switch=0.0), 0.25, 20, watts=15.0)
    assert steady is not None and steady.power_se_w == 0.0
