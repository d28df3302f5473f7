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
import threading
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


@dataclass(frozen=True)
class Request:
    """One served request (time.monotonic() s): when it arrived, when its batch ended, the
    batch size and the mode the board ran the batch in."""

    arrival: float
    end: float
    batch_size: int
    mode: object  # PowerMode


class InferenceClient:
    """An emulated inference job kept alive across goal changes, for benchmarks that move
    one job through many (rate, latency, budget) points: arrivals on a clock of period 1/r
    served in a thread through the real client, while the caller changes the goal with
    `set_rate` (told to powerd, or not: drift), `set_budget` and `set_latency` (a new
    registration of the same workload: the contract has no latency change).

    Goals are given in trace units and told to powerd on the wall clock (see
    `run_inference_job`'s `wall_clock_goal`). Every client call runs on the serving thread
    (one user of the job's sockets); the caller's change returns once it was made."""

    def __init__(
        self,
        gpu: Gpu,
        traces: Mapping[int, Trace],
        rate_hz: float,
        *,
        budget_w: float | None,
        latency_ms: float | None,
        workload: str,
        endpoint: str | None,
        noise: float = 0.02,
        arrival_jitter: float = 0.05,
        seed: int = 0,
    ):
        self.gpu = gpu
        self.traces = traces
        self.sizes = sorted(traces)
        self.scale = gpu.time_scale
        self.rate_hz = rate_hz
        self.budget_w = budget_w
        self.latency_ms = latency_ms
        self.workload = workload
        self.endpoint = endpoint
        self.noise = noise
        self.arrival_jitter = arrival_jitter
        self.rng = random.Random(seed)
        self.requests: list[Request] = []
        self.arrivals: list[float] = []
        self.backlog = 0  # requests waiting for a batch, as of the loop's last turn
        self.job_id: str | None = None
        self.error: BaseException | None = None
        self._todo: collections.deque = collections.deque()
        self._stop = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="inference-client", daemon=True)
        self._ready = threading.Event()

    # ---- the caller's side ------------------------------------------------------------------
    def start(self, timeout_s: float = 10.0) -> InferenceClient:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"the inference client did not register: {self.error}")
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        self._stop = True
        self._thread.join(30)

    def __enter__(self) -> InferenceClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_rate(self, rate_hz: float, tell: bool = True) -> None:
        self._do(("rate", rate_hz, tell))

    def set_budget(self, budget_w: float) -> None:
        self._do(("budget", budget_w))

    def set_latency(self, latency_ms: float | None) -> None:
        self._do(("latency", latency_ms))

    def burst(self, n: int) -> None:
        """n extra requests arrive at once (a backlog for the daemon to drain)."""
        self._do(("burst", n))

    def since(self, t: float) -> list[Request]:
        with self._lock:
            return [q for q in self.requests if q.arrival >= t]

    def arrivals_since(self, t: float) -> list[float]:
        """Arrival times of every request since t, served or not."""
        with self._lock:
            return [a for a in self.arrivals if a >= t]

    def _do(self, cmd: tuple) -> None:
        done = threading.Event()
        self._todo.append((cmd, done))
        if not done.wait(30):
            raise RuntimeError(f"the inference client did not apply {cmd}: {self.error}")
        if self.error is not None:
            raise self.error

    # ---- the serving thread -----------------------------------------------------------------
    def _register(self):
        k = self.scale
        job = powerd.request(
            kind="inference",
            budget_w=self.budget_w,
            latency_ms=None if self.latency_ms is None else self.latency_ms * k,
            rate_hz=self.rate_hz / k,
            workload=self.workload,
            batch_sizes=self.sizes,
            endpoint=self.endpoint,
        )
        self.job_id = job.id
        return job

    def _apply(self, inf, cmd: tuple):
        k = self.scale
        if cmd[0] == "rate":
            self.rate_hz = cmd[1]
            if cmd[2]:
                inf.set_rate(self.rate_hz / k)
        elif cmd[0] == "budget":
            self.budget_w = cmd[1]
            inf.set_budget(self.budget_w)
        elif cmd[0] == "latency":
            self.latency_ms = cmd[1]
            inf.close()
            inf = self._register()
        return inf

    def _serve(self) -> None:
        try:
            inf = self._register()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.error = exc
            self._ready.set()
            return
        self._ready.set()
        pending: collections.deque[float] = collections.deque()
        slot = next_arrival = time.monotonic()
        try:
            while not self._stop:
                while self._todo:
                    cmd, done = self._todo.popleft()
                    try:
                        if cmd[0] == "burst":
                            now = time.monotonic()
                            pending.extend([now] * cmd[1])
                            with self._lock:
                                self.arrivals.extend([now] * cmd[1])
                            continue
                        inf = self._apply(inf, cmd)
                        # a new goal starts from an empty queue: a backlog of the old goal
                        # (a queue that did not drain) would decide the new goal's latencies
                        pending.clear()
                    finally:
                        done.set()
                period = self.scale / self.rate_hz
                now = time.monotonic()
                if next_arrival > now + period:  # the rate went up: the clock restarts
                    slot = next_arrival = now
                while next_arrival <= now:
                    pending.append(next_arrival)
                    with self._lock:
                        self.arrivals.append(next_arrival)
                    slot += period
                    next_arrival = max(
                        next_arrival, slot + period * self.rng.gauss(0.0, self.arrival_jitter)
                    )
                b = inf.batch_size
                self.backlog = len(pending)
                if len(pending) < b:
                    wake = next_arrival + (b - len(pending) - 1) * period
                    time.sleep(min(0.05, max(0.0, wake - time.monotonic())))
                    continue
                trace = self.traces.get(b) or self.traces[min(self.sizes, key=lambda s: abs(s - b))]
                batch = [pending.popleft() for _ in range(b)]
                with inf.batch(size=b):
                    done_slice = self.gpu.run(
                        f"inference/{b}",
                        trace_time_ms(trace),
                        trace_power(trace),
                        jitter=max(0.5, self.rng.gauss(1.0, self.noise)),
                    )
                with self._lock:
                    self.requests.extend(
                        Request(a, done_slice.end, b, done_slice.mode) for a in batch
                    )
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.error = exc
        finally:
            inf.close()
            while self._todo:
                self._todo.popleft()[1].set()
