"""A mode measured again: the tuner pools the two windows when the strategy asks for a second
look (Measure.pool, a reading near the budget) and keeps only the fresh window otherwise (a
re-check of a reading selected for being good). Scripted strategy, synthetic steps, a board
whose power follows the applied mode; no daemon."""

from __future__ import annotations

import pytest
from tuner_harness import BUDGET_W, FAST, Board, make_tuner, run_until

from powerd.optimize.base import Commit, Measure, Strategy

FIRST_W, SECOND_W = 12.3, 11.7


class TwoLooks(Strategy):
    """Measure FAST, then (its power now SECOND_W) measure it again, then commit it."""

    name = "two-looks"

    def __init__(self, board: Board, pool: bool):
        self.board, self.pool, self.asked = board, pool, False

    def next_action(self, budget_w, samples):
        if FAST not in samples:
            return Measure(FAST)
        if not self.asked:
            self.asked = True
            self.first = samples[FAST]
            self.board.watts[FAST] = SECOND_W
            return Measure(FAST, pool=self.pool)
        return Commit(FAST)


@pytest.mark.parametrize("pool", [True, False], ids=["pooled", "replaced"])
def test_a_second_window_is_pooled_only_when_asked(pool: bool) -> None:
    board = Board({FAST: FIRST_W})
    t, _ = make_tuner(board, [FAST])
    strategy = TwoLooks(board, pool)
    t.workload.strategy = strategy
    run_until(t, board, lambda: t.state == "tuned")
    first, m = strategy.first, t.workload.samples[FAST]
    assert first.power_w == pytest.approx(FIRST_W) and first.steps > 0
    if pool:
        assert m.steps > first.steps
        share = first.steps / m.steps
        assert m.power_w == pytest.approx(share * FIRST_W + (1 - share) * SECOND_W, abs=0.02)
        assert SECOND_W < m.power_w < FIRST_W
    else:
        assert m.power_w == pytest.approx(SECOND_W, abs=1e-9)  # the fresh window alone
    assert m.power_w < BUDGET_W + 0.5
