"""powertrain's swap neighbours after a commit (Tuning.swap_modes): when refine's picks and
the long shots find nothing, the pinned mode with one knob a level up and another a level
down is measured where the model predicts it faster, whatever power the model reads there:
a model fitted to samples that never combined those two levels guesses its power."""

from __future__ import annotations

import numpy as np
from interval_models import BUDGET_W, HIGH_EMC, Model, committed_low_emc

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement, best_within
from powerd.optimize.powertrain import PowerTrain

WHY = "a swap neighbour of the pinned mode"


def committed(**tuning: float) -> tuple[PowerTrain, dict[PowerMode, Measurement]]:
    """The low-EMC budget change of interval_models after its commit (the pin: 2 GHz CPU,
    600 MHz GPU), long shots off: Model has no interval, so refine and the long shots
    would measure nothing there anyway."""
    return committed_low_emc(Model(), **{"longshot_modes": 0, **tuning})


def levels(mode: PowerMode) -> np.ndarray:
    return np.array(mode.as_tuple()) > np.array([2, 1_000_000, 300_000_000, 665_000_000])


def test_swap_neighbours_predicted_faster_are_measured_fastest_first_up_to_the_cap() -> None:
    strategy, own = committed(swap_modes=2)
    pinned = best_within(own, BUDGET_W)
    assert pinned is not None and pinned.mode.emc_hz != HIGH_EMC
    pin = levels(pinned.mode)
    seen = []
    while (action := strategy.refine(BUDGET_W, own, room=10)) is not None:
        assert action.why == WHY
        step = levels(action.mode).astype(int) - pin.astype(int)
        assert sorted(step.tolist()) == [-1, 0, 0, 1] and step[3] == 1  # EMC up, one down
        t, p = Model().predict(np.array([action.mode.as_tuple()]))
        assert p[0] > BUDGET_W  # the model alone would never measure it
        seen.append(float(t[0]))
        # read over the budget, cut short as any such window
        own[action.mode] = Measurement(action.mode, float("nan"), 13.0, aborted_over_budget=True)
    assert len(seen) == 2 and seen == sorted(seen)  # the cap; the fastest first
    strategy.next_action(BUDGET_W + 0.5, own)  # a new budget gets its own
    assert strategy._swaps == 0


def test_no_swap_when_off_or_when_none_is_predicted_faster() -> None:
    strategy, own = committed(swap_modes=0)
    assert strategy.refine(BUDGET_W, own, room=10) is None
    # a bar no neighbour clears: predicted at best twice as fast as the pin
    strategy, own = committed(swap_modes=4, swap_gain=0.6)
    assert strategy.refine(BUDGET_W, own, room=10) is None


def test_a_change_may_try_its_swap_before_refine_picks() -> None:
    """change_swap_first: in a budget change, whose few modes refine's own picks could
    spend first, the swap comes first; off, refine's pick does."""
    fast_low_emc = {(2_000_000, 600_000_000, 665_000_000)}  # the two fastest low-EMC modes

    def unmeasured_fast(**tuning: float):
        strategy, own = committed(**tuning)
        for mode in [m for m in own if (m.cpu_khz, m.gpu_hz, m.emc_hz) in fast_low_emc]:
            del own[mode]  # refine's pick: predicted faster than the pin, and fitting
        # the pin 4c/1 GHz/600 MHz/665 MHz, whose swap 2c/.../2133 MHz is predicted faster
        del own[PowerMode(2, 1_000_000, 600_000_000, 665_000_000)]
        pinned = best_within(own, BUDGET_W)
        assert pinned is not None
        assert pinned.mode == PowerMode(4, 1_000_000, 600_000_000, 665_000_000)
        return strategy, own

    strategy, own = unmeasured_fast(change_swap_first=1)
    first = strategy.refine(BUDGET_W, own, room=10)
    assert first is not None and first.why == WHY
    assert first.mode == PowerMode(2, 1_000_000, 600_000_000, HIGH_EMC)
    strategy, own = unmeasured_fast(change_swap_first=0)
    first = strategy.refine(BUDGET_W, own, room=10)
    assert first is not None and first.why != WHY
    assert (first.mode.cpu_khz, first.mode.gpu_hz, first.mode.emc_hz) in fast_low_emc
