"""The tuner's measurements after a commit need the job's steps: a job that pauses (an
evaluation, a checkpoint) starts none, and one in flight gives the committed mode back
(driven here with a scripted strategy and synthetic steps, no daemon)."""

from __future__ import annotations

import time
from concurrent.futures import Future

from powerd.modes import PowerMode
from powerd.optimize.base import Commit, Measure, Strategy
from powerd.profiler import WindowSpec
from powerd.tuner import REFINE_IDLE_S, Tuner, TunerHooks, WorkloadState

A = PowerMode(4, 1000000, 500000000, 2000000000)
B = PowerMode(8, 1000000, 500000000, 2000000000)


class Scripted(Strategy):
    """Measure A, commit it; after the commit, B is worth measuring."""

    name = "scripted"

    def next_action(self, budget_w, samples):
        return Commit(A) if A in samples else Measure(A)

    def refine(self, budget_w, samples, room):
        return None if B in samples else Measure(B)


class Board:
    def __init__(self) -> None:
        self.applied: list[PowerMode] = []

    def apply(self, mode: PowerMode) -> None:
        self.applied.append(mode)

    def power(self, t0: float, t1: float):
        n = max(3, int((t1 - t0) / 0.005))
        return [(t0 + i * (t1 - t0) / n, 10.0) for i in range(n + 1)]


def _tuner(board: Board) -> Tuner:
    spec = WindowSpec(settle_s=0.02, window_s=0.1, min_steps=3, refine_share=0.5)
    hooks = TunerHooks(
        apply_mode=board.apply,
        power=board.power,
        submit_fit=lambda w: Future(),
        on_sample=lambda w: None,
        on_commit=lambda m, s: None,
    )
    w = WorkloadState("w", "training", Scripted())
    t = Tuner(w, 20.0, spec, hooks)
    t.expected_steps = 10**6
    return t


def _run(t: Tuner, seconds: float, step_s: float | None, until=lambda: False) -> None:
    """Tick for `seconds` (or until `until()`), the job stepping every `step_s` (None:
    paused)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        time.sleep(0.01)
        now = time.monotonic()
        if step_s is not None:
            t.feed_steps([now], [])
        t.tick(now)


def test_a_paused_job_gives_the_committed_mode_back_and_starts_no_measurement() -> None:
    board = Board()
    t = _tuner(board)
    # measure A, commit it, start measuring B after the commit
    _run(t, 2.0, step_s=0.01, until=lambda: t.window is not None and t.window.mode == B)
    assert t.committed is not None and t.committed.mode == A
    assert t.state == "measuring" and t.window is not None and t.window.mode == B
    _run(t, REFINE_IDLE_S + 0.5, step_s=None)  # the job pauses
    assert t.state == "tuned" and board.applied[-1] == A, (t.state, board.applied)
    assert B not in t.workload.samples  # nothing measured without steps
    switches = len(board.applied)
    _run(t, 1.0, step_s=None)  # still paused: no new measurement starts
    assert t.state == "tuned" and len(board.applied) == switches
    _run(t, 1.0, step_s=0.01)  # it steps again: B is measured after all
    assert B in t.workload.samples
