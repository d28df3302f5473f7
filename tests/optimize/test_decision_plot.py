"""The decision benchmark's --plot: what it draws is what the sweep measured."""

from __future__ import annotations

import math

import pytest

from powerd_replay.plots import BudgetOutcome, decisions_figure, save_decisions_plot


def _outcomes() -> list[BudgetOutcome]:
    # given out of budget order (a mixed-order sweep): the plot sorts by budget
    return [
        BudgetOutcome(20.0, 250.0, 19.6, 260.0, 240.0, 240.0),
        BudgetOutcome(14.0, 980.0, 13.7, 980.0, 460.0, 727.0),
        BudgetOutcome(17.0, 370.0, 16.9, 400.0, 300.0, math.nan),
    ]


def test_the_time_panel_plots_pinned_first_and_best_per_budget_in_budget_order() -> None:
    pytest.importorskip("matplotlib")
    fig = decisions_figure(_outcomes(), "a sweep")
    ax_t, ax_p = fig.axes
    lines = {ln.get_label(): ln for ln in ax_t.get_lines()}
    assert list(lines["pinned at the end"].get_xdata()) == [14.0, 17.0, 20.0]
    assert list(lines["pinned at the end"].get_ydata()) == [980.0, 370.0, 250.0]
    assert list(lines["first commit"].get_ydata()) == [980.0, 400.0, 260.0]
    assert list(lines["best mode under the budget"].get_ydata()) == [460.0, 300.0, 240.0]
    regular = list(lines["best among rows that are no glitch"].get_ydata())
    assert regular[0] == 727.0 and math.isnan(regular[1])
    # step times spanning less than a decade stay on a linear axis, in plain ms
    assert ax_t.get_yscale() == "linear"
    power = {ln.get_label(): ln for ln in ax_p.get_lines()}
    drawn = power["pinned mode's power - budget"].get_ydata()
    assert [round(float(v), 6) for v in drawn] == [-0.3, -0.1, -0.4]
    assert list(power["budget + 0.5 W"].get_ydata()) == [0.5, 0.5]


def test_the_plot_is_written_as_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.png"
    save_decisions_plot(_outcomes(), "a sweep", str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
