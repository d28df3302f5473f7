"""The daemon's inference planner (powerd.inference_planner.InferenceJobsPlanner) measures a
pair again when its power read within noise of the budget, and pools the two windows; a rate
change measures only as many new pairs as `rate_change_pairs` allows: driven
here with synthetic batches and power readings, no emulator (the planner's own clock is used
for the windows, the batches and readings are placed on it)."""

from __future__ import annotations

import bisect
import dataclasses
import math
import time

import numpy as np
import pytest
from inference_planner_harness import inference_planner, register_job

from powerd.inference_planner import InferenceJobsPlanner
from powerd.modes import PowerMode
from powerd.optimize.inference import MeasurePair, Pair, ServePair
from powerd.planner import JobSpec
from powerd.profiler import WindowSpec

MODES = np.array([(4, 1000, g, 1000) for g in (1, 2, 3)])
BUDGET_W = 11.0
BATCH_S = 0.035  # g=2 at b=1; the drain limit at 20/s is 45 ms, g=1 (70 ms) cannot drain


class Model:
    """Batch time (50 + 20b)/g ms; power 7 + 1.75g W (g=2: 10.5 W, a candidate under 11 W)."""

    def predict(self, modes, b):
        g = np.asarray(modes)[:, 2].astype(float)
        b = np.asarray(b, float)
        return (50 + 20 * b) / g, 7 + 1.75 * g


class Board:
    """Power readings every 5 ms: `levels[k]` (W) during the k-th measuring window of a pair,
    +-0.3 W alternating (a spread like the sensor's 1-2 % noise)."""

    def __init__(self, levels: list[float]):
        self.levels = levels
        self.calls = 0
        self.applied: list[PowerMode] = []
        self.windows: list[float] = []  # when each window's batches began (run_window)

    def apply(self, mode: PowerMode) -> None:
        self.applied.append(mode)

    def power(self, t0: float, t1: float):
        # the window a reading falls in picks its level (the planner reads a window more
        # than once: for the over-budget check and for the measurement)
        k = bisect.bisect_right(self.windows, t1) - 1 if self.windows else self.calls
        level = self.levels[min(max(k, 0), len(self.levels) - 1)]
        self.calls += 1
        ts = np.arange(t0, t1 + 1e-9, 0.005)
        return [(float(t), level + (0.3 if i % 2 else -0.3)) for i, t in enumerate(ts)]


def planner(board: Board, rate_change_pairs: int = 8) -> InferenceJobsPlanner:
    return inference_planner(
        MODES,
        Model(),
        (1,),
        apply_mode=board.apply,
        power=board.power,
        rate_change_pairs=rate_change_pairs,
    )


def run_window(pl: InferenceJobsPlanner, job_id: str) -> None:
    """Batches of 35 ms back to back for 0.3 s from now, then the tick that ends the window."""
    t0 = time.monotonic() + 0.001
    pl.hooks.power.__self__.windows.append(t0)  # the Board: a new window's level from here
    starts = t0 + BATCH_S * np.arange(9)
    pl.feed(job_id, list(starts + BATCH_S), [BATCH_S] * len(starts))
    pl.tick(t0 + 9 * BATCH_S + 0.01)


def register(
    pl: InferenceJobsPlanner, job_id: str = "j1", batch_sizes: tuple[int, ...] | None = (1,)
) -> JobSpec:
    return register_job(pl, BUDGET_W, 20.0, 100.0, job_id=job_id, batch_sizes=batch_sizes)


def test_a_pair_read_just_over_the_budget_is_measured_again_and_served_on_the_pooled_reading():
    board = Board([11.02, 10.97])  # the true draw is just under 11 W
    pl = planner(board)
    register(pl)
    g2 = Pair(PowerMode(4, 1000, 2, 1000), 1)
    assert pl.window is not None and pl.window.pair == g2  # the seed
    run_window(pl, "j1")
    job = pl.jobs["j1"]
    assert job.samples[g2].power_w > BUDGET_W and job.samples[g2].windows == 1
    # the reading is within 2.5 standard errors of the budget: the same pair once more
    assert pl.window is not None and pl.window.pair == g2
    run_window(pl, "j1")
    m = job.samples[g2]
    assert m.windows == 2 and m.power_n > 40
    assert abs(m.power_w - (11.02 + 10.97) / 2) < 0.01
    served = pl.serving["j1"]
    assert isinstance(served, ServePair) and served.pair == g2 and served.feasible
    assert len(job.samples) == 1  # one pair profiled, two windows


def test_a_pair_clearly_over_the_budget_is_not_measured_again():
    board = Board([11.4, 10.97])  # 0.4 W over: no noise explains that
    pl = planner(board)
    register(pl)
    g2 = Pair(PowerMode(4, 1000, 2, 1000), 1)
    run_window(pl, "j1")
    job = pl.jobs["j1"]
    assert job.samples[g2].windows == 1
    action = job.session.next_action(job.samples)
    assert not (isinstance(action, MeasurePair) and action.pair == g2)
    assert pl.window is None or pl.window.pair != g2


@pytest.mark.parametrize("level, above, above_1w", [(10.5, 0.0, 0.0), (11.4, 1.0, 0.0)])
def test_what_a_window_cost_is_accounted_to_its_workload(level, above, above_1w):
    """Each finished window's readings count towards the workload's profiling cost (time
    above the budget and above the budget + 1 W), as a training window's do."""
    pl = planner(Board([level]))
    register(pl)
    run_window(pl, "j1")
    cost = pl.store.costs["w"].as_dict()
    assert cost["modes_measured"] == 1 and cost["seconds"] > 0.3
    assert cost["share_above_budget"] == pytest.approx(above, abs=0.05)
    assert cost["share_above_budget_1w"] == pytest.approx(above_1w, abs=0.05)
    pl.store.forget(set())  # its pairs leave memory when its jobs are gone; its cost stays
    assert pl.store.costs["w"].as_dict() == cost


@pytest.mark.parametrize(
    "level, durations, ends_early",
    [
        (12.0, [BATCH_S] * 4, True),  # 1 W over the budget, steady batches
        (10.9, [BATCH_S] * 4, False),  # within the budget: the whole window
        (12.0, [0.02, 0.05] * 2, False),  # over, but the batch time is not known yet
    ],
)
def test_a_window_clearly_over_the_budget_ends_once_its_batch_time_is_known(
    level, durations, ends_early
):
    """A pair over the budget by far more than its readings' noise cannot be served: its
    window ends at min_steps batches when they are steady, keeping its time and in-batch
    power (below the abort line of budget + 1 W: no early stop before this)."""
    pl = planner(Board([level]))
    register(pl)
    w = pl.window
    t0 = time.monotonic() + 0.001
    pl.hooks.power.__self__.windows.append(t0)
    ends = t0 + np.cumsum(durations)
    pl.feed("j1", list(ends), list(durations))
    pl.tick(float(ends[-1]) + 0.005)  # before window_s (0.2 s) has passed
    m = pl.jobs["j1"].samples.get(w.pair)
    assert (m is not None) == ends_early
    if ends_early:
        assert m.batches == len(durations) and m.power_w == pytest.approx(level, abs=0.05)
        assert m.batch_ms == pytest.approx(BATCH_S * 1000, rel=0.01)
    else:
        assert pl.window is w


def test_a_rate_change_measures_no_pair_when_the_admin_says_so():
    g2 = Pair(PowerMode(4, 1000, 2, 1000), 1)
    probed = {}
    for allowed in (8, 0):
        board = Board([10.5])
        pl = planner(board, rate_change_pairs=allowed)
        spec = register(pl)
        run_window(pl, "j1")
        assert pl.serving["j1"].pair == g2 and pl.serving["j1"].feasible
        # 30/s: the drain limit is 30 ms; g=2 (35 ms) no longer drains, g=3 (23 ms) would
        # but is predicted over the 11 W budget
        faster = dataclasses.replace(spec, rate_hz=30.0)
        pl.sync([faster], BUDGET_W, time.monotonic())
        pl.tick(time.monotonic())
        probed[allowed] = pl.window is not None
        if not allowed:
            served = pl.serving["j1"]
            assert served.pair == g2 and not served.feasible and served.within_budget
            assert len(pl.jobs["j1"].samples) == 1 and board.applied[-1] == g2.mode
            # the job is told that this is the best of what was measured, not a search's
            # answer, and what would search again
            message = pl.phase_of("j1").message
            assert "this rate change measured no new pair" in message, message
            assert "budget change searches again" in message
    assert probed == {8: True, 0: False}


def test_a_job_the_planner_cannot_set_up_reads_idle_with_the_reason_and_ticks_go_on():
    # no batch sizes at all (the job names none, the config's list is empty): the job is
    # told why and left out; the tick does not fail on it again and again
    board = Board([10.5])
    pl = planner(board)
    pl.settings = dataclasses.replace(pl.settings, batch_sizes=())
    spec = register(pl, "j0", batch_sizes=None)
    view = pl.phase_of("j0")
    assert view.phase == "idle" and "cannot plan for this inference job" in view.message
    assert "batch sizes" in view.message
    pl.sync([spec], BUDGET_W, time.monotonic())  # the next tick: still idle, no raise
    pl.tick(time.monotonic())
    assert pl.phase_of("j0").phase == "idle" and not board.applied


def test_batches_of_another_size_measure_nothing() -> None:
    """A client reports each batch's size: batches formed at the previous size (a b=64 batch
    that began after the switch to b=1) must not count as the new pair's (a user-testing
    pass saw b=1 stored at b=64's 35 ms p99)."""
    board = Board([10.5])
    pl = planner(board)
    register(pl)
    pair = pl.window.pair
    assert pair.batch_size == 1
    t0 = time.monotonic() + 0.001
    slow = t0 + 0.2 * np.arange(4)  # four 200 ms batches of 64 in the window
    pl.feed("j1", list(slow + 0.2), [0.2] * 4, [64] * 4)
    assert pl.window.batches == []
    starts = t0 + 0.8 + BATCH_S * np.arange(9)
    pl.feed("j1", list(starts + BATCH_S), [BATCH_S] * 9, [1] * 9)
    assert len(pl.window.batches) == 9
    pl.tick(starts[-1] + BATCH_S + 0.01)
    m = pl.jobs["j1"].samples[pair]
    assert m.batches == 9 and m.tail_ms < 40.0  # b=1's 35 ms, not b=64's 200 ms
    # a client that reports no sizes (an older one): every batch counts, as before
    pl2 = planner(Board([10.5]))
    register(pl2)
    # timed from pl2's own window: pl's work above may take longer than t0's 1 ms lead
    slow2 = time.monotonic() + 0.001 + 0.2 * np.arange(4)
    pl2.feed("j1", list(slow2 + 0.2), [0.2] * 4)
    assert len(pl2.window.batches) == 4


def test_a_job_that_stops_running_batches_is_left_out_of_a_shared_plan() -> None:
    """Two inference jobs share the board; one stops (a server idle at night). Fails on the
    old planner: the stopped job read `tuned` and stayed in the shared plan, the other paid
    for its batches (a user-testing pass)."""
    pl = planner(Board([10.5]))
    pl.settings = dataclasses.replace(pl.settings, rate_drift_s=0.5)
    s1 = register(pl, "j1")
    s2 = dataclasses.replace(s1, id="j2")
    pl.sync([s1, s2], BUDGET_W, time.monotonic())
    t0 = time.monotonic()
    for k in range(6):  # both run batches: one shared plan
        for job in ("j1", "j2"):
            start = t0 + 0.1 * k
            pl.feed(job, [start + BATCH_S], [BATCH_S])
    pl.tick(t0 + 0.6)
    assert set(pl.joint_ids) == {"j1", "j2"}
    last_j1 = t0 + 0.5 + BATCH_S
    for k in range(6, 20):  # only j2 goes on
        start = t0 + 0.1 * k
        pl.feed("j2", [start + BATCH_S], [BATCH_S])
    pl.tick(last_j1 + 0.4)  # 0.4 s without a batch: not yet
    assert "j1" in pl.joint_ids
    pl.tick(last_j1 + 1.5)
    assert not pl.jobs["j1"].active and "j1" not in pl.joint_ids
    view = pl.phase_of("j1")
    assert view.phase == "queued" and "no batch for" in view.message
    # it runs a batch again: back in the plan
    start = last_j1 + 1.6
    pl.feed("j1", [start + BATCH_S], [BATCH_S])
    pl.tick(start + 0.1)
    assert pl.jobs["j1"].active and set(pl.joint_ids) == {"j1", "j2"}


def test_a_pair_window_over_the_budget_stops_at_once_not_after_its_batches() -> None:
    """A probe at b=64 and 20/s needs 16 s for its 5 batches; over the budget it must stop
    within a few readings, as a training probe does (a user-testing pass saw 16 s at 44 W
    under a 25 W budget). Fails on the old planner: the window waited for its batches."""
    board = Board([13.5])  # 2.5 W over the 11 W budget (abort margin 1 W)
    pl = planner(board)
    register(pl)
    w = pl.window
    assert w is not None
    g2 = w.pair
    pl.tick(time.monotonic() + 0.05)  # no batch has finished yet
    m = pl.jobs["j1"].samples[g2]
    assert m.power_w == pytest.approx(13.5, abs=0.31) and math.isnan(m.batch_ms)
    assert pl.window is None or pl.window.pair != g2  # not measured again
    assert pl.serving.get("j1") is None or pl.serving["j1"].pair != g2


def test_over_budget_readings_inside_batches_stop_a_window() -> None:
    """Idle gaps read low; the batches' own readings over the budget stop the window."""
    from powerd.inference_planner import PairWindow

    w = PairWindow(Pair(PowerMode(4, 1000, 2, 1000), 4), 0.0, WindowSpec(0.0, 1.0, 5))
    for k in range(3):
        w.add(0.1 + 0.2 * k, 0.15 + 0.2 * k)

    def power(t0, t1):  # 14 W inside the batches, 8 W between them, a reading every 10 ms
        ts = np.arange(0.0, 0.7, 0.01)
        busy = [any(s <= t <= e for s, e in w.batches) for t in ts]
        return [
            (float(t), 14.0 if b else 8.0) for t, b in zip(ts, busy, strict=True) if t0 <= t <= t1
        ]

    assert w.over_budget(power, 15.0, 0.7) is None  # within 15 W + 1 W
    assert w.over_budget(power, 11.0, 0.7) == pytest.approx(14.0)
    stopped = w.stopped_over(14.0)
    assert stopped.batches == 3 and stopped.batch_ms == pytest.approx(50.0)


def test_the_p99_status_shows_is_of_the_pair_the_job_runs_now() -> None:
    """Status read 'b=1 ... measured p99 242.6 ms' from an earlier b=64 probe's batches (a
    user-testing pass): the batch times behind it are the current pair's only."""
    pl = planner(Board([10.5]))
    register(pl)
    t0 = time.monotonic() + 0.001
    slow = t0 + 0.3 * np.arange(20)
    pl.feed("j1", list(slow + 0.25), [0.25] * 20)  # 250 ms batches at the first pair
    assert pl.job_extra("j1")["p99_batch_ms"] == pytest.approx(250.0)
    pl.new_pair(pl.jobs["j1"])  # a switch (another size or mode)
    assert pl.job_extra("j1")["p99_batch_ms"] is None  # nothing of the new pair yet
    t1 = time.monotonic() + 0.001
    fast = t1 + 0.05 * np.arange(20)
    pl.feed("j1", list(fast + BATCH_S), [BATCH_S] * 20)
    assert pl.job_extra("j1")["p99_batch_ms"] == pytest.approx(BATCH_S * 1000.0)
