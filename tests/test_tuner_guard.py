"""The tuned state's guard: a pinned mode whose power drifts over the budget is recorded at
what it now draws and the job chooses again (driven by tests/tuner_harness.py: a scripted strategy,
synthetic steps, a board whose power follows the mode)."""

from __future__ import annotations

import math

from tuner_harness import BUDGET_W, FAST, SLOW, Board, make_tuner, run_until

from powerd.tuner import GUARD_MARGIN_W


class Drifting(Board):
    """Readings alternate 0.2 W either side of the mode's power, as a sensor's do."""

    def power(self, t0: float, t1: float):
        return [(t, w + (0.2 if k % 2 else -0.2)) for k, (t, w) in enumerate(super().power(t0, t1))]


def test_a_drift_over_the_budget_is_recorded_with_its_standard_error_and_decided_again():
    board = Drifting({SLOW: 9.0, FAST: 11.0})
    t, fits = make_tuner(board, [FAST, SLOW])
    run_until(t, board, lambda: t.state == "fitting")
    fits[-1].set_result(None)
    run_until(t, board, lambda: t.state == "tuned")
    assert board.mode == FAST
    steps_before = t.workload.samples[FAST].steps
    board.watts[FAST] = BUDGET_W + GUARD_MARGIN_W + 1.5  # the job's load changed
    run_until(t, board, lambda: t.workload.samples[FAST].power_w > BUDGET_W + GUARD_MARGIN_W)
    drifted = t.workload.samples[FAST]
    assert abs(drifted.power_w - board.watts[FAST]) < 0.1
    assert drifted.steps == steps_before and not drifted.aborted_over_budget
    # the readings' spread over their count, as a profiled window reports it
    assert drifted.power_se_w is not None
    assert 0.2 / 40 < drifted.power_se_w < 0.2 / math.sqrt(3)
    assert t.committed is None or t.committed.mode != FAST
