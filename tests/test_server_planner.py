"""The training planner on its own (fake board hooks): what makes it re-plan, and what not."""

from concurrent.futures import Future

import pytest

from powerd.optimize.binary_search import BinarySearch
from powerd.planner import BoardHooks, JobSpec
from powerd.profiler import WindowSpec
from powerd.sim.trace import TRACE_DIR, Trace
from powerd.training import TrainingPlanner
from powerd.tuner import WorkloadState
from powerd_replay.training import GridSpace

SPEC = WindowSpec(settle_s=1.0, window_s=2.0, min_steps=5)


@pytest.fixture
def planner():
    trace = Trace.load(TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv")
    space = GridSpace.from_trace(trace)
    workloads = {}
    applied = []

    def workload(kind, name, persistent):
        return workloads.setdefault(name, WorkloadState(name, kind, BinarySearch(space)))

    hooks = BoardHooks(
        apply_mode=applied.append,
        power=lambda t0, t1: [],
        submit_fit=lambda w: Future(),
        persist=lambda w: None,
        on_commit=lambda *_: None,
        workload=workload,
    )
    pl = TrainingPlanner(hooks, SPEC)
    pl.applied = applied
    return pl


def job(i, budget, workload="w", t=0.0):
    return JobSpec(
        id=i, kind="training", workload=workload, persistent=True, budget_w=budget, registered=t
    )


def test_a_measurement_in_flight_survives_changes_that_leave_it_valid(planner):
    a = job("a", 12)
    planner.sync([a], 12, 0.0)
    planner.tick(0.0)
    window = planner.tuner.window
    assert window is not None and planner.phase_of("a").phase == "profiling"
    # a second job of the same workload with a higher budget: nothing changes
    planner.sync([a, job("b", 15, t=1.0)], 12, 0.1)
    planner.tick(0.1)
    assert planner.tuner.window is window and len(planner.applied) == 1
    # the effective budget drops: the window is kept, its abort limit follows the budget
    planner.sync([job("a", 10), job("b", 15, t=1.0)], 10, 0.2)
    planner.tick(0.2)
    assert planner.tuner.window is window and window.budget_w == 10
    # the job that registered the workload leaves; the other one of the workload carries on
    planner.sync([job("b", 15, t=1.0)], 15, 0.3)
    planner.tick(0.3)
    assert planner.tuner.window is window and planner.tuner_job == "b"
    assert len(planner.applied) == 1
    assert planner.phase_of("b").phase == "profiling"


def test_a_new_workload_queues_behind_the_one_being_profiled(planner):
    planner.sync([job("a", 12)], 12, 0.0)
    planner.tick(0.0)
    planner.sync([job("a", 12), job("c", 12, workload="other", t=1.0)], 12, 0.1)
    planner.tick(0.1)
    view = planner.phase_of("c")
    assert view.phase == "queued" and "waiting for job a" in view.message
    # the workload being profiled leaves: its probe is no longer anyone's, the other goes next
    planner.sync([job("c", 12, workload="other", t=1.0)], 12, 0.2)
    planner.tick(0.2)
    assert planner.tuner_job == "c" and planner.tuner.workload.name == "other"


def test_a_step_time_job_searches_under_the_budget_cap_and_hands_over_no_search(planner):
    st = JobSpec(
        id="s",
        kind="training",
        workload="w",
        persistent=True,
        budget_w=15,
        registered=0.0,
        step_time_ms=80.0,
    )
    planner.sync([st], 15, 0.0)
    planner.tick(0.0)
    t = planner.tuner
    assert planner.tuner_job == "s" and t.strategy.step_time_ms == 80.0 and t.budget_w == 15
    # a budget job of the same workload: the lower budget caps the step-time search
    planner.sync([st, job("a", 10, t=1.0)], 10, 0.1)
    planner.tick(0.1)
    assert planner.tuner is t and t.budget_w == 10
    assert planner.phase_of("a").phase == "queued"  # its own objective gets its own turn
    # the step-time job leaves: the budget job is not served by the step-time search
    planner.sync([job("a", 10, t=1.0)], 10, 0.2)
    planner.tick(0.2)
    assert planner.tuner_job == "a" and planner.tuner.strategy is None


def test_a_job_of_unknown_length_earns_measurements_after_its_commit_as_it_runs():
    """Its length is the steps run so far (it runs at least as long again): refine_share of
    them, a settle + window of steps per measurement at the pinned mode's speed."""
    from dataclasses import replace

    from powerd.optimize.base import Commit, Measurement

    trace = Trace.load(TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv")
    space = GridSpace.from_trace(trace)
    hooks = BoardHooks(
        apply_mode=lambda m: None,
        power=lambda t0, t1: [],
        submit_fit=lambda w: Future(),
        persist=lambda w: None,
        on_commit=lambda *_: None,
        workload=lambda kind, name, persistent: WorkloadState(name, kind, BinarySearch(space)),
    )
    pl = TrainingPlanner(hooks, replace(SPEC, refine_share=0.1))
    a = job("a", 12)
    pl.sync([a], 12, 0.0)
    pl.tick(0.0)
    tuner = pl.tuner
    mode = trace.rows[0].mode
    tuner.workload.samples[mode] = Measurement(mode, 100.0, 10.0, steps=30)
    tuner.committed = Commit(mode)
    per_probe = (SPEC.settle_s + SPEC.window_s) / 0.1  # 30 steps at 100 ms
    # the registry counts the steps the job reports; each control step syncs them
    pl.sync([replace(a, steps=299)], 12, 0.1)
    pl.tick(0.1)
    assert tuner.steps_run == 299 and tuner.refine_room() == int(0.1 * 299 / per_probe) == 0
    pl.sync([replace(a, steps=901)], 12, 0.2)
    pl.tick(0.2)
    assert tuner.refine_room() == 3  # 901 steps run: 90.1 steps of room, 3 measurements
    # a length the job said wins over the steps it ran
    pl.sync([replace(a, steps=901, expected_steps=30_000)], 12, 0.3)
    pl.tick(0.3)
    assert tuner.refine_room() == 100
    # without refine_share nothing is measured after the commit, however long the job
    off = TrainingPlanner(hooks, SPEC)
    off.sync([a], 12, 0.0)
    off.tick(0.0)
    off.tuner.committed = Commit(mode)
    off.tuner.workload.samples[mode] = Measurement(mode, 100.0, 10.0, steps=30)
    off.sync([replace(a, steps=5000)], 12, 0.1)
    off.tick(0.1)
    assert off.tuner.refine_room() == 0


def test_a_job_that_has_not_stepped_yet_gives_its_turn_to_one_that_steps(planner):
    """A job registered first but not stepping (loading its data) held the profiling turn,
    a probe applied, until STALL_S passed; a stepping job now goes first at once."""
    import dataclasses

    planner.sync([job("n", 12, workload="loads")], 12, 0.0)
    planner.tick(0.0)
    assert planner.tuner_job == "n"
    steps = dataclasses.replace(job("a", 12, workload="steps", t=0.5), steps=3)
    planner.sync([job("n", 12, workload="loads"), steps], 12, 0.6)
    planner.tick(0.6)
    assert planner.tuner_job == "a" and planner.tuner.workload.name == "steps"
    assert planner.phase_of("a").phase == "profiling"
    view = planner.phase_of("n")
    assert view.phase == "queued" and "waiting for job a" in view.message
