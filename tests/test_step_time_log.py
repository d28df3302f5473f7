"""The daemon log names a step-time job's target and its power cap, not a bare budget: at
registration, on set_budget, and in the tuner's lines about its commits and measurements."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future

import pytest

import powerd
from powerd.modes import PowerMode
from powerd.optimize.base import Commit, Measure, Strategy
from powerd.profiler import WindowSpec
from powerd.sim.harness import EmulatedBoard
from powerd.tuner import Tuner, TunerHooks, WorkloadState

A = PowerMode(4, 1000000, 500000000, 2000000000)
B = PowerMode(8, 1000000, 500000000, 2000000000)


def test_registration_and_set_budget_log_the_target_and_the_cap(nano_trace) -> None:
    with EmulatedBoard("orin-nano", nano_trace, time_scale=0.03) as board:
        with powerd.request(workload="st", endpoint=board.endpoint, step_time_ms=12.5) as job:
            job.set_budget(25)
            deadline = time.monotonic() + 5
            while "power cap now" not in board.daemon_log.read_text():
                assert time.monotonic() < deadline, board.log_tail()
                time.sleep(0.05)
        log = board.daemon_log.read_text()
    # no budget given: the admin's ceiling (EmulatedBoard's max_w, 80 W) caps the search
    assert (
        f"job {job.id} registered: workload st, step-time target 12.5 ms, power cap 80 W "
        "(the admin's budget.max_w)" in log
    )
    assert f"job {job.id}: power cap now 25 W (step-time target 12.5 ms)" in log
    assert "budget 80 W" not in log


class StepTimeScripted(Strategy):
    """A step-time search stand-in: measure A, commit it; after the commit, B."""

    name = "scripted"
    step_time_ms = 15.0

    def next_action(self, budget_w, samples):
        return Commit(A) if A in samples else Measure(A)

    def refine(self, budget_w, samples, room):
        return None if B in samples else Measure(B)


def test_the_tuner_logs_a_step_time_jobs_target_and_cap(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="powerd.tuner")
    spec = WindowSpec(settle_s=0.02, window_s=0.1, min_steps=3, refine_share=0.5)

    def power(t0: float, t1: float) -> list[tuple[float, float]]:
        n = max(3, int((t1 - t0) / 0.005))
        return [(t0 + i * (t1 - t0) / n, 10.0) for i in range(n + 1)]

    hooks = TunerHooks(
        apply_mode=lambda m: None,
        power=power,
        submit_fit=lambda w: Future(),
        on_sample=lambda w: None,
        on_commit=lambda m, s: None,
    )
    w = WorkloadState("st", "training", StepTimeScripted())
    t = Tuner(w, 20.0, spec, hooks, strategy=StepTimeScripted())
    t.expected_steps = 10**6
    end = time.monotonic() + 5
    while time.monotonic() < end and "nothing more to measure" not in caplog.text:
        time.sleep(0.01)
        now = time.monotonic()
        t.feed_steps([now], [])
        t.tick(now)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("st ")]
    said = "\n".join(lines)
    assert "st for 15 ms/step within 20 W: target met" in said
    assert f"st for 15 ms/step within 20 W: measuring {B} after the commit" in said
    assert "st for 15 ms/step within 20 W: nothing more to measure after the commit" in said
    assert "at 20 W" not in said
