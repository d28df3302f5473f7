"""The daemon's inference planner drains a client's backlog with the fastest fit pair, then
returns to the least-power one (powerd.inference_planner + powerd.optimize.backlog): driven
with synthetic batches on the planner's own clock, no emulator. The workload's pairs are
measured beforehand, so the job is served at once and nothing is profiled."""

from __future__ import annotations

import time

import numpy as np

from powerd.cli import _job_detail
from powerd.inference_planner import InferenceJobsPlanner, InferenceSamples, InferenceSettings
from powerd.modes import PowerMode
from powerd.optimize.inference import Pair, PairMeasurement
from powerd.planner import BoardHooks, JobSpec
from powerd.profiler import WindowSpec

MODES = np.array([(4, 1000, g, 1000) for g in (1, 2, 3)])
BUDGET_W = 15.0
RATE = 100.0  # requests/s: a batch of 10 fills in 100 ms
B = 10
# measured: g=1 the least power at 88 % busy, g=3 the fastest fit (40 % busy)
MEASURED = {1: (88.0, 11.0), 2: (70.0, 13.0), 3: (40.0, 14.5)}


def pair(g: int) -> Pair:
    return Pair(PowerMode(4, 1000, g, 1000), B)


class Model:
    def predict(self, modes, b):
        g = np.asarray(modes)[:, 2].astype(int)
        return np.array([MEASURED[x][0] for x in g]), np.array([MEASURED[x][1] for x in g])


def planner(applied: list[PowerMode]) -> InferenceJobsPlanner:
    hooks = BoardHooks(
        apply_mode=applied.append,
        power=lambda t0, t1: [],
        submit_fit=lambda w: None,
        persist=lambda w: None,
        on_commit=lambda m, s, b: None,
        workload=lambda kind, name, persistent: None,
    )
    spec = WindowSpec(settle_s=0.0, window_s=0.2, min_steps=3)
    settings = InferenceSettings(batch_sizes=(B,), max_pairs=3, sensor_lag_s=0.0)
    store = InferenceSamples(lambda name: None, lambda name, doc: None)
    known = store.of("w", False)
    for g, (t, p) in MEASURED.items():
        known[pair(g)] = PairMeasurement(pair(g), t, p, t, 40, 0.1, 50)
    return InferenceJobsPlanner(hooks, spec, MODES, store, lambda: lambda s: Model(), settings)


def register(pl: InferenceJobsPlanner, rate_hz: float = RATE, registered: float | None = None):
    """Register job j1 at `rate_hz` (again, with its `registered` time: a rate change)."""
    spec = JobSpec(
        id="j1",
        kind="inference",
        workload="w",
        persistent=False,
        budget_w=BUDGET_W,
        registered=time.monotonic() if registered is None else registered,
        latency_ms=400.0,
        rate_hz=rate_hz,
        batch_sizes=(B,),
    )
    pl.sync([spec], BUDGET_W, time.monotonic())
    pl.tick(time.monotonic())


def run_batches(pl: InferenceJobsPlanner, batch_s: float, period_s: float, n: int = 10) -> None:
    """n batches from now on, one every `period_s` (back to back when 0), then a tick."""
    t = time.monotonic() + 0.001
    ends, durations = [], []
    for _ in range(n):
        ends.append(t + batch_s)
        durations.append(batch_s)
        t = max(t + period_s, t + batch_s)
    pl.feed("j1", ends, durations)
    pl.tick(t)


def test_a_backlog_is_drained_with_the_fastest_fit_pair_then_the_least_power_pair_returns():
    applied: list[PowerMode] = []
    pl = planner(applied)
    register(pl)
    job = pl.jobs["j1"]
    assert pl.window is None  # every pair measured: served at once
    assert pl.serving["j1"].pair == pair(1)
    # an empty queue: each batch of the least-power pair waits for its requests (88 % busy)
    run_batches(pl, 0.088, 0.100)
    assert pl.serving["j1"].pair == pair(1) and not job.draining
    # a backlog: the batches run back to back
    run_batches(pl, 0.088, 0.0)
    assert job.draining
    assert pl.serving["j1"].pair == pair(3)  # the most spare capacity, within the budget
    assert pl.serving["j1"].power_w <= BUDGET_W and pl.serving["j1"].feasible
    assert applied[-1] == pair(3).mode
    assert pl.phase_of("j1").phase == "tuned"
    assert pl.job_extra("j1")["draining_backlog"] is True
    assert "draining a backlog" in _job_detail({"kind": "inference", **pl.job_extra("j1")})
    # still queued: the faster pair's batches back to back too; it keeps serving
    run_batches(pl, 0.040, 0.0)
    assert job.draining and pl.serving["j1"].pair == pair(3)
    # drained: its batches wait for requests (40 % busy), and the least power returns
    run_batches(pl, 0.040, 0.100)
    assert not job.draining and pl.job_extra("j1")["draining_backlog"] is False
    assert pl.serving["j1"].pair == pair(1) and applied[-1] == pair(1).mode
    assert len(job.samples) == 3  # nothing was profiled


def test_a_rate_change_while_draining_re_solves_for_the_new_rate():
    pl = planner([])
    register(pl)
    job = pl.jobs["j1"]
    run_batches(pl, 0.088, 0.0)
    assert job.draining
    register(pl, rate_hz=50.0, registered=job.spec.registered)
    # at 50/s the least-power pair is 44 % busy and no pair drains twice as fast: no draining
    assert not job.draining and pl.serving["j1"].pair == pair(1)
