"""An emulated training job: the real client API, step times from a trace.

It reads the mode the emulated hardware is running at from the same files a real kernel
would show (online mask, cur frequencies), sleeps that mode's traced step time (scaled),
and calls `job.step()`, exactly like a training loop would.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import powerd
from powerd.modes import PowerMode
from powerd.sim.emulator import read_effective_mode
from powerd.sim.trace import Trace

if TYPE_CHECKING:
    from powerd.sim.gpu import Gpu


MODE_READ_S = 0.005  # how stale the mode a step runs at may be


@dataclass
class JobRun:
    steps: int = 0
    seconds: float = 0.0
    phases: list[tuple[float, str]] = field(default_factory=list)  # (t since start, phase)
    final_mode: PowerMode | None = None
    final_phase: str = ""
    tuned_after_s: float | None = None
    first_tuned_mode: PowerMode | None = None  # the mode the job first read `tuned` at
    final_feasible: bool | None = None  # the daemon's last word on whether its goal is met


def run_training_job(
    root: str | Path,
    trace: Trace,
    budget_w: float | None,
    workload: str,
    time_scale: float,
    *,
    endpoint: str | None = None,
    stay_tuned_s: float = 1.0,
    max_s: float = 600.0,
    noise: float = 0.02,
    seed: int = 0,
    on_step: Callable[[powerd.Job, JobRun], None] | None = None,
    set_budget_at: list[tuple[int, float]] | None = None,
    gpu: Gpu | None = None,
    expected_steps: int | None = None,
    run_after_tuned_s: float = 0.0,
    step_time_ms: float | None = None,
) -> JobRun:
    """Train until the daemon has held a tuned mode for `stay_tuned_s` (and at least
    `run_after_tuned_s` has passed since the job first read tuned), or `max_s` passed.

    With `gpu`, each step runs on the emulated GPU (queued FIFO with other jobs' work, board
    power following it) instead of a plain sleep. With `step_time_ms` (in the emulated, scaled
    milliseconds the daemon measures) the job asks for that step time within `budget_w`."""
    rng = random.Random(seed)
    run = JobRun()
    pending_budgets = sorted(set_budget_at or [])
    t0 = time.monotonic()
    with powerd.request(
        budget_w=budget_w,
        workload=workload,
        endpoint=endpoint,
        expected_steps=expected_steps,
        step_time_ms=step_time_ms,
    ) as job:
        last_phase = ""
        tuned_since: float | None = None
        step_end = time.monotonic()
        mode, mode_read_at = None, -math.inf
        while True:
            now = time.monotonic()
            if job.phase != last_phase:
                last_phase = job.phase
                run.phases.append((now - t0, last_phase))
            if job.phase == "tuned":
                tuned_since = tuned_since if tuned_since is not None else now
                if run.tuned_after_s is None:
                    run.tuned_after_s = now - t0
                    run.first_tuned_mode = job.mode
                if pending_budgets and run.steps >= pending_budgets[0][0]:
                    job.set_budget(pending_budgets.pop(0)[1])
                    tuned_since = None
                    continue
                ran_on = now - t0 - run.tuned_after_s >= run_after_tuned_s
                if now - tuned_since >= stay_tuned_s and not pending_budgets and ran_on:
                    break
            else:
                tuned_since = None
            if now - t0 > max_s:
                break
            if gpu is not None:
                jitter = max(0.5, rng.gauss(1.0, noise))
                gpu.run("training", lambda m: trace.lookup(m).time_ms, gpu_power(trace), jitter)
                job.step()
                run.steps += 1
                if on_step is not None:
                    on_step(job, run)
                continue
            # reading the mode costs ~0.6 ms on a loaded machine: once per step, it set a
            # floor of ~1.3 ms per step, and every mode faster than that (an inference
            # trace at time scale 0.03: 0.5-1 ms) measured alike. A mode switch is still
            # seen within MODE_READ_S, far inside the daemon's settle time.
            if now - mode_read_at >= MODE_READ_S:
                mode, mode_read_at = read_effective_mode(root), now
            step_s = trace.lookup(mode).time_ms / 1000.0 * time_scale
            step_s *= max(0.5, rng.gauss(1.0, noise))
            # sleep to a deadline, so this loop's own overhead does not lengthen the step
            step_end = max(step_end + step_s, time.monotonic())
            time.sleep(max(0.0, step_end - time.monotonic()))
            job.step()
            run.steps += 1
            if on_step is not None:
                on_step(job, run)
        run.final_mode = job.mode
        run.final_phase = job.phase
        run.final_feasible = job.feasible
    run.seconds = time.monotonic() - t0
    return run


def gpu_power(trace: Trace) -> Callable[[PowerMode], float]:
    return lambda mode: trace.lookup(mode).power_w
