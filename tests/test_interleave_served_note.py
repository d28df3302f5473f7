"""The log line of an interleaved decision says why the pair is served."""

from powerd.interleave_planner import served_note
from powerd.modes import PowerMode
from powerd.optimize.inference import Pair
from powerd.optimize.interleave import ServeJoint

PAIR = Pair(PowerMode(4, 1_000_000, 600_000_000, 2_000_000_000), 4)


def serve(power_w: float, feasible: bool, drains: bool) -> ServeJoint:
    return ServeJoint(PAIR, feasible, 180.0, power_w, 3.0, 1, drains)


def test_a_pair_held_over_the_budget_is_logged_as_over_the_budget_not_as_a_growing_queue():
    # the planner holds the lowest reading, flagged, with drains=False when nothing
    # measured stays within the budget: the budget is the news, not the queue
    note = served_note(serve(21.3, feasible=False, drains=False), 20.0, 30.0)
    assert note.startswith("over the budget")
    assert "20 W" in note and "queue" not in note


def test_within_the_budget_the_note_follows_feasibility_and_the_queue():
    assert served_note(serve(19.0, True, True), 20.0, 30.0) == "feasible"
    assert served_note(serve(19.0, False, True), 20.0, 30.0) == "latency target cannot be met"
    grows = served_note(serve(19.0, False, False), 20.0, 30.0)
    assert grows.startswith("the queue grows") and "of 30 requests/s" in grows
