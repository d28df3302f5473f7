"""What jobs read while a tuned workload measures candidate modes after its commit (the
training planner on its own, scripted strategies, synthetic steps, no daemon).

The job whose workload measures reads `profiling` from the switch to a candidate until the
strategy commits again, with one message throughout (`tuned` says the mode in force is the
committed one, and a candidate is not). Another job, whose workload is tuned for the
budget, waits for nothing: it keeps reading `tuned`, not `queued` "to finish profiling"."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import Future

from powerd.modes import PowerMode
from powerd.optimize.base import Commit, Fit, Measure, Strategy
from powerd.planner import BoardHooks, JobSpec
from powerd.profiler import WindowSpec
from powerd.training import TrainingPlanner
from powerd.tuner import WorkloadState

A1 = PowerMode(4, 1000000, 500000000, 2000000000)
B1 = PowerMode(6, 1000000, 500000000, 2000000000)
CANDIDATES = [
    PowerMode(8, 1000000, 500000000, 2000000000),
    PowerMode(8, 1200000, 500000000, 2000000000),
]


class Script(Strategy):
    """Measure `first`, fit after every new sample, commit the first mode; after the commit,
    `candidates` are worth measuring."""

    name = "script"

    def __init__(self, first: PowerMode, candidates: list[PowerMode]):
        self.first, self.candidates, self.fitted = first, candidates, 0
        self.why = ""  # the note of each candidate's Measure

    def next_action(self, budget_w, samples):
        if self.first not in samples:
            return Measure(self.first)
        if self.fitted < len(samples):
            self.fitted = len(samples)
            return Fit()
        return Commit(self.first)

    def refine(self, budget_w, samples, room):
        return next((Measure(c, why=self.why) for c in self.candidates if c not in samples), None)


def _planner() -> tuple[TrainingPlanner, list[PowerMode]]:
    applied: list[PowerMode] = []
    strategies = {"a": Script(A1, []), "b": Script(B1, CANDIDATES)}
    workloads: dict[str, WorkloadState] = {}

    def fit(w: WorkloadState) -> Future:
        f: Future = Future()
        f.set_result(None)  # no predictor: the strategy goes on with what it measured
        return f

    hooks = BoardHooks(
        apply_mode=applied.append,
        power=lambda t0, t1: [(t0 + i * (t1 - t0) / 8, 10.0) for i in range(9)],
        submit_fit=fit,
        persist=lambda w: None,
        on_commit=lambda *_: None,
        workload=lambda kind, name, p: workloads.setdefault(
            name, WorkloadState(name, kind, strategies[name])
        ),
    )
    spec = WindowSpec(settle_s=0.02, window_s=0.08, min_steps=3, refine_share=0.5)
    return TrainingPlanner(hooks, spec), applied


def _job(i: str, t: float) -> JobSpec:
    return JobSpec(
        id=i,
        kind="training",
        workload=i,
        persistent=True,
        budget_w=20.0,
        registered=t,
        expected_steps=10**6,
    )


def _step_until(
    pl: TrainingPlanner, jobs: list[JobSpec], budget_w: float, done: Callable[[], bool]
) -> None:
    """Every job steps every 5 ms, the planner ticks, until `done()` (at most 10 s)."""
    end = time.monotonic() + 10
    steps = 0
    while time.monotonic() < end:
        time.sleep(0.005)
        now = time.monotonic()
        steps += 1
        jobs = [dataclasses.replace(j, steps=steps) for j in jobs]
        pl.sync(jobs, budget_w, now)
        for j in jobs:
            pl.feed(j.id, [now], [])
        pl.tick(now)
        if done():
            return


def _timeline(why: str = "") -> tuple[list, list]:
    """Jobs a then b, both stepping, until b measured both candidates after its commit and
    committed again: (a's view, b's view) before and from b's first commit. `why`: the
    note of b's candidates."""
    pl, applied = _planner()
    pl.hooks.workload("training", "b", True).strategy.why = why
    jobs = [_job("a", 0.0), _job("b", 1.0)]
    # (a's view, b's view) at each tick where either changed: phase, message, feasible
    timeline: list[tuple[tuple, tuple]] = []

    def done() -> bool:
        views = tuple((v.phase, v.message, v.feasible) for v in map(pl.phase_of, ("a", "b")))
        if not timeline or timeline[-1] != views:
            timeline.append(views)  # type: ignore[arg-type]
        return pl.tuner is not None and pl.tuner.refined == 2 and views[1][0] == "tuned"

    _step_until(pl, jobs, 20.0, done)
    assert all(c in applied for c in CANDIDATES), applied
    first = next(i for i, (_, b) in enumerate(timeline) if b[0] == "tuned")
    return timeline[:first], timeline[first:]


def test_a_job_measuring_after_its_commit_reads_profiling_with_one_message() -> None:
    _, after = _timeline()
    # b from its first commit on: one phase and one message per candidate, and the
    # commit's verdict (feasible) stands meanwhile
    b_said = [b for _, b in after]
    b_said = [s for i, s in enumerate(b_said) if i == 0 or s != b_said[i - 1]]
    assert b_said == [
        ("tuned", "", True),
        ("profiling", "measuring a candidate mode after the commit (1 so far)", True),
        ("tuned", "", True),
        ("profiling", "measuring a candidate mode after the commit (2 so far)", True),
        ("tuned", "", True),
    ], b_said


def test_a_candidate_measured_for_a_lower_budget_says_so() -> None:
    _, after = _timeline(why="rehearsing a 12 W budget")
    said = {b[1] for _, b in after if b[0] == "profiling"}
    assert said == {
        "measuring a candidate mode after the commit (1 so far, rehearsing a 12 W budget)",
        "measuring a candidate mode after the commit (2 so far, rehearsing a 12 W budget)",
    }, said


def test_another_job_reads_tuned_while_a_tuned_workload_measures_after_its_commit() -> None:
    before, after = _timeline()
    # b's first profiling: a, tuned before it, waits (README "queued")
    assert any(a[0] == "queued" and "to finish profiling" in a[1] for a, _ in before), before
    # a waits for nothing while b measures after its commit: tuned throughout, told why
    # the board moves
    assert {a[0] for a, _ in after} == {"tuned"}, after
    assert {a[1] for a, _ in after} == {
        "",
        "job b (b) is measuring a candidate mode after its commit",
    }, after


def test_a_job_held_under_its_own_budget_by_another_jobs_reads_why() -> None:
    # The board follows the lowest budget: a at 10 W holds b (20 W) at 10 W. b reads tuned
    # for 10 W, and says it is held there (a user-testing pass: it read tuned with no word
    # of it); a, at its own budget, says nothing of the kind.
    pl, _ = _planner()
    pl.hooks.workload("training", "b", True).strategy.candidates = []  # no refining
    jobs = [
        dataclasses.replace(_job("a", 0.0), budget_w=10.0),
        dataclasses.replace(_job("b", 1.0), expected_steps=None),
    ]
    _step_until(pl, jobs, 10.0, lambda: {pl.phase_of(i).phase for i in "ab"} == {"tuned"})
    a, b = pl.phase_of("a"), pl.phase_of("b")
    assert (a.phase, b.phase) == ("tuned", "tuned")
    assert "held at 10 W" in b.message and "its own: 20 W" in b.message, b.message
    assert "held at" not in a.message, a.message
