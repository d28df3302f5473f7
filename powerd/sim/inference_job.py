"""An emulated inference job: requests arrive at rate r, are served in batches of the size
powerd chose, through the real client API, on the emulated GPU.

Arrivals follow a clock of period 1/r, each early or late by a small gaussian jitter
(`arrival_jitter` of a period, no drift), like frames from a camera: the worst-case latency
(b-1)/r + t_inf assumes evenly spaced arrivals. Each request's latency is measured here, from
its arrival to the end of the batch that served it (never reported by the daemon). Batch
times and power come from the inference trace of the batch size, at the mode the board runs
when the batch starts.
"""

from __future__ import annotations

import collections
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

import powerd
from powerd.sim.gpu import Gpu, trace_power, trace_time_ms
from powerd.sim.trace import Trace


@dataclass
class InferenceRun:
    latencies_ms: list[float] = field(default_factory=list)  # per request, trace ms
    batch_sizes: list[int] = field(default_factory=list)
    gate_waits_s: list[float] = field(default_factory=list)
    requests: int = 0
    feasible: bool | None = None
    best_latency_ms: float | None = None
    seconds: float = 0.0

    def p99_ms(self, skip: int = 0) -> float:
        lat = self.latencies_ms[skip:]
        return float(np.percentile(lat, 99)) if lat else float("nan")


def load_batch_traces(path, batch_sizes: Sequence[int] | None = None) -> dict[int, Trace]:
    """One Trace per batch size of an inference trace file."""
    import csv

    with open(path, newline="") as f:
        sizes = sorted({int(r["batch_size"]) for r in csv.DictReader(f)})
    wanted = sizes if batch_sizes is None else [b for b in sizes if b in set(batch_sizes)]
    return {b: Trace.load(path, batch_size=b) for b in wanted}


def run_inference_job(
    gpu: Gpu,
    traces: Mapping[int, Trace],
    rate_hz: float,
    *,
    duration_s: float,
    budget_w: float | None = None,
    latency_ms: float | None = None,
    workload: str = "emulated-inference",
    endpoint: str | None = None,
    noise: float = 0.02,
    arrival_jitter: float = 0.05,
    seed: int = 0,
    rate_changes: Sequence[tuple[float, float]] = (),
    wall_clock_goal: bool = False,
    tell_rate_changes: bool = True,
    on_batch=None,
) -> InferenceRun:
    """Serve requests for `duration_s` trace seconds. `rate_changes`: (trace s, new rate)
    pairs, applied to the arrivals and told to powerd with `set_rate` (unless
    `tell_rate_changes` is False: then the daemon must notice the drift itself).

    `wall_clock_goal`: tell powerd the rate and latency target in wall-clock units (rate /
    scale, latency x scale), as the real daemon measures batch times on the wall clock."""
    rng = random.Random(seed)
    scale = gpu.time_scale
    run = InferenceRun()
    changes = sorted(rate_changes)
    sizes = sorted(traces)
    k = scale if wall_clock_goal else 1.0
    with powerd.request(
        kind="inference",
        budget_w=budget_w,
        latency_ms=None if latency_ms is None else latency_ms * k,
        rate_hz=rate_hz / k,
        workload=workload,
        batch_sizes=sizes,
        endpoint=endpoint,
    ) as inf:
        t0 = time.monotonic()
        end_at = t0 + duration_s * scale
        pending: collections.deque[float] = collections.deque()
        next_arrival = slot = t0
        period = scale / rate_hz
        while True:
            now = time.monotonic()
            if now >= end_at:
                break
            if changes and now - t0 >= changes[0][0] * scale:
                rate_hz = changes.pop(0)[1]
                period = scale / rate_hz
                if tell_rate_changes:
                    inf.set_rate(rate_hz / k)
            while next_arrival <= now:
                pending.append(next_arrival)
                run.requests += 1
                # Frames on a fixed clock, each a little early or late (no drift).
                slot += period
                next_arrival = max(next_arrival, slot + period * rng.gauss(0.0, arrival_jitter))
            b = inf.batch_size
            trace = traces[b] if b in traces else traces[min(sizes, key=lambda s: abs(s - b))]
            if len(pending) < b:
                # Sleep until the request that completes the batch arrives (emulated clock).
                wake = next_arrival + (b - len(pending) - 1) * period
                time.sleep(max(0.0, min(wake, end_at) - time.monotonic()))
                continue
            batch = [pending.popleft() for _ in range(b)]
            with inf.batch(size=b) as handle:
                done = gpu.run(
                    f"inference/{b}",
                    trace_time_ms(trace),
                    trace_power(trace),
                    jitter=max(0.5, rng.gauss(1.0, noise)),
                )
            run.gate_waits_s.append(handle.waited_s)
            run.batch_sizes.append(b)
            run.latencies_ms.extend((done.end - a) / scale * 1000.0 for a in batch)
            if on_batch is not None:
                on_batch(inf, run)
        run.feasible = inf.feasible
        run.best_latency_ms = inf.best_latency_ms
    run.seconds = time.monotonic() - t0
    return run
