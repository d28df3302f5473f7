"""The daemon's inference planner: profiles (mode, batch size) pairs while the job serves,
and serves the pair `powerd.optimize.inference.InferencePlanner` picks from measurements.

Measuring a pair: the mode is applied and the job told the batch size; batches that start
after the settle time count. The client reports each batch's end (`Steps.t`) and duration
(`Steps.d`), so each batch is a window [end - d, end] of the daemon's clock
(CLOCK_MONOTONIC on the same machine). A pair's time is the p99 of its batch durations; its
power the mean of the INA3221 samples that fall inside batch windows (power while a batch
runs, not over the gaps). When batches are too short to catch enough samples, the largest
sample of the whole window is taken instead: never below the busy power, so never a pair
that looks within budget only because idle gaps were averaged in.

Rate changes (`set_rate`, or an observed arrival rate off by `rate_drift` for
`rate_drift_s`) re-solve from what is measured: no new pair is profiled while a measured
pair fits the new goal.

Measured pairs are kept per workload in an `InferenceSamples` owned by the control loop
(so a planner change, e.g. interleaving starting and ending, keeps them) and persisted as
`inference.json` next to the workload's training samples.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize.inference import (
    RESOLVE_NEW_PAIRS,
    InferenceGoal,
    InferencePlanner,
    InferenceSession,
    MeasurePair,
    Pair,
    PairMeasurement,
    ServePair,
    worst_latency_ms,
)
from powerd.planner import BoardHooks, JobSpec, JobView
from powerd.profiler import WindowSpec

log = logging.getLogger("powerd.inference")

MIN_POWER_SAMPLES = 3  # in-batch samples needed to trust their mean
RECENT_BATCHES = 512  # per job, for the measured p99 and the observed arrival rate
P99_MIN_BATCHES = 8


@dataclass
class InferenceSettings:
    batch_sizes: tuple[int, ...] = (1, 4, 16, 32, 64)
    max_pairs: int = 30
    rate_drift: float = 0.2
    rate_drift_s: float = 10.0
    # a power reading reflects the load up to one sampling period before it: samples this
    # soon after a batch starts may still show the idle gap before it
    sensor_lag_s: float = 0.1


# ---- measured pairs per workload ------------------------------------------------------------


class InferenceSamples:
    """Measured pairs per inference workload, loaded from and saved to the store."""

    def __init__(self, load: Callable[[str], dict | None], save: Callable[[str, dict], None]):
        self._load = load
        self._save = save
        self._mem: dict[str, dict[Pair, PairMeasurement]] = {}

    def of(self, name: str, persistent: bool) -> dict[Pair, PairMeasurement]:
        if name not in self._mem:
            self._mem[name] = self._read(name) if persistent else {}
        return self._mem[name]

    def save(self, name: str, persistent: bool) -> None:
        if not persistent:
            return
        rows = [
            {
                **m.pair.mode.as_dict(),
                "batch_size": m.pair.batch_size,
                "batch_ms": m.batch_ms,
                "batch_p99_ms": m.batch_p99_ms,
                "power_w": m.power_w,
                "batches": m.batches,
            }
            for m in self._mem.get(name, {}).values()
            if math.isfinite(m.batch_ms) and math.isfinite(m.power_w)
        ]
        try:
            self._save(name, {"format": 1, "pairs": rows})
        except OSError as exc:
            log.error("could not save the inference samples of %s: %s", name, exc)

    def _read(self, name: str) -> dict[Pair, PairMeasurement]:
        doc = self._load(name) or {}
        out: dict[Pair, PairMeasurement] = {}
        try:
            for r in doc.get("pairs", []):
                pair = Pair(
                    PowerMode(
                        int(r["cores"]), int(r["cpu_khz"]), int(r["gpu_hz"]), int(r["emc_hz"])
                    ),
                    int(r["batch_size"]),
                )
                p99 = r.get("batch_p99_ms")
                out[pair] = PairMeasurement(
                    pair,
                    float(r["batch_ms"]),
                    float(r["power_w"]),
                    None if p99 is None else float(p99),
                    int(r.get("batches", 0)),
                )
        except (KeyError, TypeError, ValueError) as exc:
            log.error("ignoring corrupt inference samples of %s: %s", name, exc)
            return {}
        if out:
            log.info("inference workload %s: %d stored pairs", name, len(out))
        return out

    def forget(self, live: set[str]) -> None:
        for name in [n for n in self._mem if n not in live]:
            del self._mem[name]


# ---- measuring one pair -----------------------------------------------------------------------


@dataclass
class PairWindow:
    pair: Pair
    applied: float  # when the mode and batch size were set
    spec: WindowSpec
    batches: list[tuple[float, float]] = field(default_factory=list)  # (start, end)

    @property
    def opens(self) -> float:
        return self.applied + self.spec.settle_s

    def add(self, start: float, end: float) -> None:
        if start >= self.opens:
            self.batches.append((start, end))

    def ready(self, now: float) -> bool:
        if len(self.batches) < self.spec.min_steps:
            return False
        return now - self.opens >= self.spec.window_s

    def measure(
        self, power: Callable[[float, float], Sequence[tuple[float, float]]], lag_s: float = 0.0
    ) -> PairMeasurement:
        d = np.array([(e - s) * 1000.0 for s, e in self.batches])
        inside: list[float] = []
        t0, t1 = self.batches[0][0], self.batches[-1][1]
        samples = list(power(t0, t1))
        k = 0
        for t, w in samples:
            while k < len(self.batches) and self.batches[k][1] < t:
                k += 1
            if k < len(self.batches) and self.batches[k][0] + lag_s <= t <= self.batches[k][1]:
                inside.append(w)
        if len(inside) >= MIN_POWER_SAMPLES:
            short = float(np.median(d)) < 2000.0 * lag_s
            # Batches shorter than two sensor periods: a reading inside one may still show
            # the idle gap before it (a late sensor update), which only ever pulls the mean
            # down; a high quantile keeps the budget safe at ~1 noise sigma of cost.
            pw = float(np.percentile(inside, 90) if short else np.mean(inside))
        elif samples:
            pw = float(max(w for _, w in samples))  # conservative: batches too short to see
        else:
            pw = math.nan
        return PairMeasurement(
            self.pair,
            float(np.median(d)),
            pw,
            float(np.percentile(d, 99)),
            len(d),
        )


# ---- per job ------------------------------------------------------------------------------------


@dataclass
class _InfJob:
    spec: JobSpec
    session: InferenceSession
    samples: dict[Pair, PairMeasurement]
    batches: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_BATCHES)
    )
    served_ends: collections.deque = field(default_factory=lambda: collections.deque(maxlen=512))
    served_since: float = 0.0
    drift_since: float | None = None
    observed_rate: float | None = None
    rate_source: str = "client"  # "client" (register/set_rate) or "observed"
    told_rate: float | None = None  # the rate the client last told us
    resolves: int = 0


def inference_planner(
    modes: np.ndarray, sizes: Sequence[int], fitter, max_pairs: int
) -> InferencePlanner:
    return InferencePlanner(modes, sizes, fitter, max_pairs=max_pairs)


class InferenceJobsPlanner:
    """Drives the board for inference jobs: the earliest registered one is served; others
    wait (`queued`), as training jobs of different workloads do."""

    kinds = frozenset({"inference"})

    def __init__(
        self,
        hooks: BoardHooks,
        spec: WindowSpec,
        modes: np.ndarray,
        samples: InferenceSamples,
        fitter_factory: Callable[[], Any],
        settings: InferenceSettings,
    ):
        self.hooks = hooks
        self.spec = spec
        self.modes = modes
        self.store = samples
        self.fitter_factory = fitter_factory
        self.settings = settings
        self.jobs: dict[str, _InfJob] = {}
        self.released: dict[str, str] = {}
        self.budget_w: float | None = None
        self.window: PairWindow | None = None
        self.window_job: str | None = None
        self.serving: dict[str, ServePair] = {}
        self.batch_size: dict[str, int] = {}
        self.mode: PowerMode | None = None
        self._planners: dict[tuple[int, ...], InferencePlanner] = {}
        self._fitter: Any = None

    # ---- Planner interface ------------------------------------------------------------
    def sync(self, jobs: Sequence[JobSpec], budget_w: float, now: float) -> None:
        ids = {j.id for j in jobs if j.kind == "inference"}
        for gone in [i for i in self.jobs if i not in ids]:
            del self.jobs[gone]
            self.serving.pop(gone, None)
            if gone == self.window_job:
                self.window, self.window_job = None, None
        for gone in [i for i in self.released if i not in ids]:
            del self.released[gone]
        budget_changed = budget_w != self.budget_w
        self.budget_w = budget_w
        for spec in jobs:
            if spec.kind != "inference":
                continue
            job = self.jobs.get(spec.id)
            if job is None:
                if spec.id in self.released:
                    continue
                self.jobs[spec.id] = self._new_job(spec, budget_w)
                continue
            if spec.rate_hz is not None and spec.rate_hz != job.told_rate:
                job.told_rate = spec.rate_hz
                self._resolve(job, spec.rate_hz, "set_rate")
            job.spec = spec
            if budget_changed:
                job.session.set_budget(budget_w)
                self.serving.pop(spec.id, None)
        self.store.forget({j.spec.workload for j in self.jobs.values()})

    def feed(self, job_id: str, ends: Sequence[float], durations: Sequence[float]) -> None:
        job = self.jobs.get(job_id)
        if job is None or not durations:
            return
        served = job_id in self.serving
        for t, d in zip(ends, durations, strict=False):
            job.batches.append((t - d, t))
            if served and t - d >= job.served_since:
                job.served_ends.append((t - d, t))
            if self.window is not None and self.window_job == job_id:
                self.window.add(t - d, t)

    def tick(self, now: float) -> None:
        job = self._driver()
        if job is None:
            return
        self._watch_rate(job, now)
        w = self.window
        if w is not None and self.window_job == job.spec.id:
            if not w.ready(now):
                return
            m = w.measure(self.hooks.power, self.settings.sensor_lag_s)
            job.samples[m.pair] = m
            job.session.measured(m.pair)
            self.store.save(job.spec.workload, job.spec.persistent)
            log.info(
                "job %s: measured %s b=%d: p99 %.1f ms/batch at %.2f W (%d batches)",
                job.spec.id,
                m.pair.mode,
                m.pair.batch_size,
                m.tail_ms,
                m.power_w,
                m.batches,
            )
            self.window, self.window_job = None, None
        action = job.session.next_action(job.samples)
        if isinstance(action, MeasurePair):
            self._set(job, action.pair)
            self.window, self.window_job = (
                PairWindow(action.pair, time.monotonic(), self.spec),
                job.spec.id,
            )
            self.serving.pop(job.spec.id, None)
            return
        before = self.serving.get(job.spec.id)
        self._set(job, action.pair)
        self.serving[job.spec.id] = action
        if before is None or before.pair != action.pair:
            # the arrival rate is read from batches of this size once the client uses it
            job.served_ends.clear()
            job.served_since = time.monotonic() + self.spec.settle_s
        if before is None or before.pair != action.pair or before.feasible != action.feasible:
            g = job.session.goal
            if action.feasible:
                log.info(
                    "job %s: serving %s b=%d: worst-case %.1f ms at %.2f W (rate %g/s, %g W)",
                    job.spec.id,
                    action.pair.mode,
                    action.pair.batch_size,
                    action.latency_ms,
                    action.power_w,
                    g.rate_hz,
                    g.budget_w,
                )
            else:
                log.warning(
                    "job %s: latency %s ms cannot be met under %g W at %g/s: serving the best "
                    "measured, %s b=%d, worst-case %.1f ms at %.2f W",
                    job.spec.id,
                    g.latency_ms,
                    g.budget_w,
                    g.rate_hz,
                    action.pair.mode,
                    action.pair.batch_size,
                    action.latency_ms,
                    action.power_w,
                )

    def phase_of(self, job_id: str) -> JobView:
        b = self.budget_w
        if job_id in self.released:
            return JobView("idle", self.released[job_id], None, b)
        job = self.jobs.get(job_id)
        if job is None:
            return JobView("queued", "registered: waiting for the control loop", None, b)
        driver = self._driver()
        size = self.batch_size.get(job_id)
        if driver is not job:
            return JobView(
                "queued",
                f"waiting for inference job {driver.spec.id if driver else '?'} to be served",
                None,
                b,
                batch_size=size,
            )
        served = self.serving.get(job_id)
        if served is None:
            msg = f"profiling (mode, batch size) pairs: {len(job.samples)} measured"
            if self.window is not None and not job.batches:
                msg += "; no batches reported yet (enter job.batch() for each batch)"
            return JobView("profiling", msg, None, b, batch_size=size)
        if not served.within_budget:
            return JobView(
                "idle",
                "no measured (mode, batch size) pair stays within the budget",
                False,
                b,
                batch_size=size,
                best_latency_ms=served.latency_ms,
            )
        if served.feasible:
            return JobView("tuned", "", True, b, batch_size=size)
        g = job.session.goal
        return JobView(
            "tuned",
            f"latency {g.latency_ms:g} ms cannot be met under {g.budget_w:g} W at "
            f"{g.rate_hz:g}/s: serving with the best, {served.latency_ms:.1f} ms",
            False,
            b,
            batch_size=size,
            best_latency_ms=served.latency_ms,
        )

    def culprit(self) -> tuple[str | None, PowerMode | None]:
        job = self._driver()
        return (None if job is None else job.spec.id), self.mode

    def release(self, job_ids: Sequence[str] | None, message: str) -> None:
        for i in list(self.jobs) if job_ids is None else job_ids:
            if i in self.jobs:
                self.released[i] = message
                self.serving.pop(i, None)
        if self.window_job in self.released:
            self.window, self.window_job = None, None
        self.mode = None  # the control loop restores the board

    def resume(self, job_ids: Sequence[str] | None = None) -> None:
        for i in list(self.released) if job_ids is None else job_ids:
            self.released.pop(i, None)

    def describe(self) -> dict[str, Any] | None:
        job = self._driver()
        if job is None:
            return None
        served = self.serving.get(job.spec.id)
        return {
            "planner": "inference",
            "job": job.spec.id,
            "workload": job.spec.workload,
            "budget_w": self.budget_w,
            "state": "profiling" if served is None else "tuned",
            "measuring": None
            if self.window is None
            else {**self.window.pair.mode.as_dict(), "batch_size": self.window.pair.batch_size},
            "committed": None if served is None else served.pair.mode.as_dict(),
            "batch_size": self.batch_size.get(job.spec.id),
            "feasible": None if served is None else served.feasible,
            "pairs_profiled": len(job.samples),
        }

    def job_extra(self, job_id: str) -> dict[str, Any]:
        """Per-job fields for `powerctl status`."""
        job = self.jobs.get(job_id)
        if job is None:
            return {}
        served = self.serving.get(job_id)
        g = job.session.goal
        return {
            "batch_size": self.batch_size.get(job_id),
            "latency_ms": g.latency_ms,
            "rate_hz": g.rate_hz,
            "observed_rate_hz": job.observed_rate,
            "p99_batch_ms": _p99(job.batches),
            "p99_latency_ms": _p99_latency(job, g),
            "predicted_latency_ms": None if served is None else served.latency_ms,
            "best_latency_ms": None if served is None or served.feasible else served.latency_ms,
            "pairs_profiled": len(job.samples),
            "resolves": job.resolves,
        }

    # ---- internals -----------------------------------------------------------------------
    def _new_job(self, spec: JobSpec, budget_w: float) -> _InfJob:
        sizes = tuple(sorted(set(spec.batch_sizes or self.settings.batch_sizes)))
        planner = self._planners.get(sizes)
        if planner is None:
            if self._fitter is None:
                self._fitter = self.fitter_factory()
            planner = InferencePlanner(
                self.modes, sizes, self._fitter, max_pairs=self.settings.max_pairs
            )
            self._planners[sizes] = planner
        samples = self.store.of(spec.workload, spec.persistent)
        rate = spec.rate_hz or 1.0
        goal = InferenceGoal(rate, budget_w, spec.latency_ms)
        session = InferenceSession(planner, goal, profiled=bool(samples))
        if samples:
            # a workload measured before: re-solve from its pairs like a rate change
            session.new_pairs = RESOLVE_NEW_PAIRS
        return _InfJob(spec, session, samples, told_rate=spec.rate_hz)

    def _resolve(self, job: _InfJob, rate: float, why: str) -> None:
        log.info(
            "job %s: arrival rate %g/s -> %g/s (%s): re-solving from the measured pairs",
            job.spec.id,
            job.session.goal.rate_hz,
            rate,
            why,
        )
        job.session.set_rate(rate)
        # no new profiling for a rate change while a measured pair fits (see the module doc)
        job.session.new_pairs = RESOLVE_NEW_PAIRS
        job.resolves += 1
        job.drift_since = None
        self.serving.pop(job.spec.id, None)

    def _watch_rate(self, job: _InfJob, now: float) -> None:
        """The arrival rate seen in the batch ends: b requests per batch interval."""
        served = self.serving.get(job.spec.id)
        if served is None or not job.batches:
            job.drift_since = None
            return
        b = served.pair.batch_size
        if not job.served_ends:
            return
        horizon = max(self.settings.rate_drift_s / 2, 8 * b / job.session.goal.rate_hz)
        last = job.served_ends[-1][1]
        recent = [(s, e) for s, e in job.served_ends if e >= last - horizon]
        ends = [e for _, e in recent]
        if len(ends) < 5 or ends[-1] <= ends[0]:
            return
        busy = sum(e - s for s, e in recent[1:])
        if busy > 0.8 * (ends[-1] - ends[0]):
            # batches back to back: their ends show the GPU's pace, not the arrivals'
            job.drift_since = None
            return
        obs = b * (len(ends) - 1) / (ends[-1] - ends[0])
        job.observed_rate = obs
        goal = job.session.goal.rate_hz
        if abs(obs / goal - 1.0) <= self.settings.rate_drift:
            job.drift_since = None
            return
        if job.drift_since is None:
            job.drift_since = now
        elif now - job.drift_since >= self.settings.rate_drift_s:
            job.served_ends.clear()
            self._resolve(job, obs, f"observed for {self.settings.rate_drift_s:g} s")

    def _set(self, job: _InfJob, pair: Pair) -> None:
        if pair.mode != self.mode:
            self.mode = None  # unknown until the switch succeeded
            self.hooks.apply_mode(pair.mode)
            self.mode = pair.mode
        self.batch_size[job.spec.id] = pair.batch_size

    def _driver(self) -> _InfJob | None:
        live = [j for i, j in self.jobs.items() if i not in self.released]
        return min(live, key=lambda j: j.spec.registered) if live else None


def _p99(batches: Sequence[tuple[float, float]]) -> float | None:
    if len(batches) < P99_MIN_BATCHES:
        return None
    return float(np.percentile([(e - s) * 1000.0 for s, e in batches], 99))


def _p99_latency(job: _InfJob, goal: InferenceGoal) -> float | None:
    """Worst-case request latency from the measured p99 batch time: (b-1)/r + p99."""
    p99 = _p99(job.batches)
    served = [b for b in job.batches]
    if p99 is None or not served:
        return None
    b = job.session.served.pair.batch_size if job.session.served else None
    if b is None:
        return None
    return float(worst_latency_ms(b, goal.rate_hz, p99))
