"""powertrain's long shots after a commit (Tuning.longshot_modes): when refine's own rule (a
chance to fit of 1/2, predicted within the budget) finds nothing, a mode the model puts over
the budget is measured if the model's own power interval there leaves it a real chance to
fit and it would be much faster; at most longshot_modes per budget, and not where the model
says it knows the power well."""

from __future__ import annotations

import numpy as np
from interval_models import BUDGET_W, HIGH_EMC, IntervalModel, Model, committed_low_emc

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement
from powerd.optimize.powertrain import PowerTrain


def committed(fitted, **tuning: float) -> tuple[PowerTrain, dict[PowerMode, Measurement]]:
    """The low-EMC budget change of interval_models after its commit, with the model's
    recorded power misses small (0.1 W). Swaps (a later rule,
    tests/optimize/test_powertrain_swap.py) off: what is left is the long shots'."""
    return committed_low_emc(fitted, **{"swap_modes": 0, **tuning})


def test_a_wide_power_interval_over_the_budget_gets_a_long_shot() -> None:
    strategy, own = committed(IntervalModel())
    action = strategy.refine(BUDGET_W, own, room=10)
    assert action is not None and action.mode.emc_hz == HIGH_EMC
    assert action.why == "a long shot: predicted over the budget"
    t, p = Model().predict(np.array([action.mode.as_tuple()]))
    assert p[0] > BUDGET_W  # the point prediction alone rules it out
    assert t[0] < min(m.time_ms for m in own.values())  # and it would beat the pin


def test_no_long_shot_where_the_model_knows_the_power_or_when_off() -> None:
    strategy, own = committed(Model())  # no interval: the small recorded misses rule
    assert strategy.refine(BUDGET_W, own, room=10) is None
    strategy, own = committed(IntervalModel(), longshot_modes=0)
    assert strategy.refine(BUDGET_W, own, room=10) is None


def test_long_shots_use_the_interval_with_the_interval_doubt_off() -> None:
    # the long shots' power doubt is their own knob: turning refine's interval doubt off
    # must not silently take the model's interval away from them
    off = {"interval_doubt_time": 0.0, "interval_doubt_power": 0.0}
    strategy, own = committed(IntervalModel(), **off)
    action = strategy.refine(BUDGET_W, own, room=10)
    assert action is not None and action.why == "a long shot: predicted over the budget"
    strategy, own = committed(IntervalModel(), longshot_power_doubt=0.0, **off)
    assert strategy.refine(BUDGET_W, own, room=10) is None


def test_long_shots_read_over_prune_what_is_above_them_and_stop_at_the_cap() -> None:
    cap = 2
    strategy, own = committed(IntervalModel(), longshot_modes=cap)
    shots: list[PowerMode] = []
    while (action := strategy.refine(BUDGET_W, own, room=10)) is not None:
        assert action.mode not in own
        # measured over the budget, cut short as any such window
        own[action.mode] = Measurement(
            action.mode, float("nan"), BUDGET_W + 2.0, aborted_over_budget=True
        )
        knobs = np.array(action.mode.as_tuple())
        for earlier in shots:  # never a mode at or above one read over
            assert not np.all(knobs >= np.array(earlier.as_tuple()))
        shots.append(action.mode)
    assert len(shots) == cap
    # a new budget gets its own long shots
    strategy.next_action(BUDGET_W + 0.5, own)
    assert strategy._longshots == 0
