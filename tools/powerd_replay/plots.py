"""Figures of the decision benchmark (tools/bench_decisions.py --plot): a sweep of 13-32
budgets reads better as a picture than as a table. Benchmark code: not installed with powerd.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class BudgetOutcome:
    """One budget of a sweep, judged on the trace's true values."""

    budget_w: float
    pinned_ms: float  # the mode pinned when the job ended
    pinned_w: float
    first_ms: float  # the mode the job first read `tuned` at
    best_ms: float  # the trace's fastest mode within the budget
    regular_best_ms: float  # the same among rows that are no glitch (nan: none)


def decisions_figure(outcomes: Sequence[BudgetOutcome], title: str) -> Any:
    """Two panels over the budgets: true step time of the pinned mode against the best mode
    under each budget (log time when it spans a decade), and how far the pinned mode's true
    power is from the budget."""
    from powerd.plot import finished, new_figure, time_axis

    rows = sorted(outcomes, key=lambda o: o.budget_w)
    b = [o.budget_w for o in rows]
    fig, (ax_t, ax_p) = new_figure(2, 6, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    ax_t.plot(b, [o.best_ms for o in rows], "-", color="0.3", label="best mode under the budget")
    ax_t.plot(
        b,
        [o.regular_best_ms for o in rows],
        "--",
        color="0.6",
        label="best among rows that are no glitch",
    )
    ax_t.plot(
        b,
        [o.first_ms for o in rows],
        "o",
        mfc="none",
        color="tab:orange",
        label="first commit",
    )
    ax_t.plot(b, [o.pinned_ms for o in rows], "x", color="tab:blue", label="pinned at the end")
    time_axis(ax_t, [o.best_ms for o in rows] + [o.pinned_ms for o in rows])
    ax_t.set_ylabel("true step time (ms)")
    ax_t.set_title(title, fontsize=9)
    # power as its distance to the budget: on a 13-44 W axis a 0.5 W overshoot is invisible
    ax_p.axhline(0.0, color="0.3", label="budget")
    ax_p.axhline(0.5, color="tab:red", ls=":", label="budget + 0.5 W")
    over = [o.pinned_w - o.budget_w for o in rows]
    ax_p.plot(b, over, "x", color="tab:blue", label="pinned mode's power - budget")
    ax_p.set_ylim(min(-2.0, min(over) - 0.3), max(1.0, max(over) + 0.3))
    ax_p.set_xlabel("power budget (W)")
    ax_p.set_ylabel("true power - budget (W)")
    return finished(fig, ax_t, ax_p)


def save_decisions_plot(outcomes: Sequence[BudgetOutcome], title: str, path: str) -> None:
    from powerd.plot import save

    save(decisions_figure(outcomes, title), path)
