"""The daemon's inference planner built for tests without an emulator: hooks that apply a
mode and read power as the test says and do nothing else (no fits, no store), windows of
0.2 s with no settle, and an in-memory sample store (shared by the planner's remeasure,
backlog and floor-recheck tests)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from powerd.inference_planner import InferenceJobsPlanner, InferenceSamples, InferenceSettings
from powerd.modes import PowerMode
from powerd.optimize.inference import Pair, PairMeasurement
from powerd.planner import BoardHooks, JobSpec
from powerd.profiler import WindowSpec


def inference_planner(
    modes: np.ndarray,
    model,
    batch_sizes: Sequence[int],
    apply_mode: Callable[[PowerMode], None] = lambda m: None,
    power: Callable[[float, float], list] = lambda t0, t1: [],
    known: Mapping[Pair, PairMeasurement] | None = None,
    **settings,
) -> InferenceJobsPlanner:
    """A planner over `modes` whose every fit is `model`; `known`: the workload's samples
    before the first job; `settings`: InferenceSettings fields beyond the sizes."""
    hooks = BoardHooks(
        apply_mode=apply_mode,
        power=power,
        submit_fit=lambda w: None,
        persist=lambda w: None,
        on_commit=lambda *_: None,
        workload=lambda kind, name, persistent: None,
    )
    spec = WindowSpec(settle_s=0.0, window_s=0.2, min_steps=3)
    opts = InferenceSettings(
        batch_sizes=tuple(batch_sizes), **{"max_pairs": 3, "sensor_lag_s": 0.0, **settings}
    )
    store = InferenceSamples(lambda name: None, lambda name, doc: None)
    store.of("w", False).update(known or {})
    return InferenceJobsPlanner(hooks, spec, modes, store, lambda: lambda s: model, opts)


def register_job(
    pl: InferenceJobsPlanner,
    budget_w: float,
    rate_hz: float,
    latency_ms: float | None,
    job_id: str = "j1",
    batch_sizes: tuple[int, ...] | None = None,
    registered: float | None = None,
) -> JobSpec:
    """Register an inference job of workload `w` (again, with its `registered` time: a
    goal change) and run a tick; `batch_sizes` default: the planner's."""
    spec = JobSpec(
        id=job_id,
        kind="inference",
        workload="w",
        persistent=False,
        budget_w=budget_w,
        registered=time.monotonic() if registered is None else registered,
        latency_ms=latency_ms,
        rate_hz=rate_hz,
        batch_sizes=pl.settings.batch_sizes if batch_sizes is None else batch_sizes,
    )
    pl.sync([spec], budget_w, time.monotonic())
    pl.tick(time.monotonic())
    return spec
