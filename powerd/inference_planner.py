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
`rate_drift_s`) re-solve from what is measured, profiling nothing: the pairs measured at
each budget cover the rate axis (powerd.optimize.rate_cover). An admin may let a rate
change that no measured pair fits measure a few (`rate_change_pairs`; fewer each time a
goal as easy was out of reach). A window whose in-batch power is clearly over the
budget ends once its batch time is known (PairWindow.clearly_over).

A job served alone whose batches run back to back (a backlog in the client's queue) is
served the fastest measured pair that fits its goal until gaps show the queue drained
(`powerd.optimize.backlog`).

Measured pairs are kept per workload in an `InferenceSamples` owned by the control loop
(so a planner change, e.g. interleaving starting and ending, keeps them) and persisted as
`inference.json` next to the workload's training samples.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from powerd.config import Config
from powerd.modes import PowerMode
from powerd.optimize.backlog import (
    BACKLOG_SHARE,
    DRAINED_SHARE,
    after_drain_s,
    backlog_span_s,
    busy_share,
    recovery_pair,
)
from powerd.optimize.base import Measurement
from powerd.optimize.inference import (
    RATE_CHANGE_PAIRS,
    SENSOR_SD_FLOOR,
    InferenceGoal,
    InferencePlanner,
    InferenceSession,
    MeasurePair,
    Pair,
    PairMeasurement,
    ServePair,
    few_readings_power,
    pooled,
    readings_se,
    worst_latency_ms,
)
from powerd.optimize.interleave import JointJob, JointPlanner, JointTraining, MeasureSet, ServeSet
from powerd.planner import BoardHooks, JobSpec, JobView
from powerd.profiler import ProfilingCost, WindowSpec, no_tail, over_and_timed, overshoot

log = logging.getLogger("powerd.inference")

MIN_POWER_SAMPLES = 3  # in-batch samples needed to use them (else the window's highest)
MIN_GAP_READINGS = 5  # readings between batches needed to know the level they show
RECENT_BATCHES = 512  # per job, for the measured p99 and the observed arrival rate
P99_MIN_BATCHES = 8
# A window ends early over the budget only on this many in-batch readings, with their
# spread taken as at least this share of the reading (see PairWindow.clearly_over).
CLEARLY_OVER_READINGS = 8
COSTS_KEPT = 64  # workloads whose profiling cost status reports


@dataclass
class InferenceSettings:
    batch_sizes: tuple[int, ...] = (1, 4, 16, 32, 64)
    max_pairs: int = 30
    rate_drift: float = 0.2
    rate_drift_s: float = 10.0
    # new pairs a rate change may measure when no measured pair fits the new rate
    rate_change_pairs: int = RATE_CHANGE_PAIRS
    # readings this soon after a batch starts may still show the gap before it: the
    # sensor's own lag where it reports one (Hardware.sensor_lag_s), else one sampling
    # period (a reading then reflects the load up to one period before it)
    sensor_lag_s: float = 0.1

    @classmethod
    def from_config(cls, cfg: Config, sensor_lag_s: float | None = None) -> InferenceSettings:
        ic = cfg.inference
        return cls(
            batch_sizes=tuple(ic.batch_sizes),
            max_pairs=ic.max_pairs,
            rate_drift=ic.rate_drift,
            rate_drift_s=ic.rate_drift_s,
            rate_change_pairs=ic.rate_change_pairs,
            sensor_lag_s=cfg.power.sample_interval_ms / 1000.0
            if sensor_lag_s is None
            else sensor_lag_s,
        )


# ---- measured pairs per workload ------------------------------------------------------------


class InferenceSamples:
    """Measured pairs per inference workload, loaded from and saved to the store."""

    def __init__(self, load: Callable[[str], dict | None], save: Callable[[str, dict], None]):
        self._load = load
        self._save = save
        self._mem: dict[str, dict[Pair, PairMeasurement]] = {}
        # what profiling each workload cost since the daemon started (status, benchmarks);
        # kept after its jobs leave, for the last COSTS_KEPT workloads
        self.costs: collections.OrderedDict[str, ProfilingCost] = collections.OrderedDict()

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
                "power_sd_w": m.power_sd_w,
                "power_n": m.power_n,
                "windows": m.windows,
                "stopped": m.stopped,
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
                p99, sd = r.get("batch_p99_ms"), r.get("power_sd_w")
                out[pair] = PairMeasurement(
                    pair,
                    float(r["batch_ms"]),
                    float(r["power_w"]),
                    None if p99 is None else float(p99),
                    int(r.get("batches", 0)),
                    None if sd is None else float(sd),
                    int(r.get("power_n", 0)),
                    max(1, int(r.get("windows", 1))),
                    bool(r.get("stopped", False)),
                )
        except (KeyError, TypeError, ValueError) as exc:
            log.error("ignoring corrupt inference samples of %s: %s", name, exc)
            return {}
        if out:
            log.info("inference workload %s: %d stored pairs", name, len(out))
        return out

    def in_memory(self) -> dict[str, dict[Pair, PairMeasurement]]:
        return dict(self._mem)

    def forget(self, live: set[str]) -> None:
        for name in [n for n in self._mem if n not in live]:
            del self._mem[name]

    def account(
        self, name: str, readings: Sequence[tuple[float, float]], budget_w: float | None
    ) -> None:
        """A finished window's power readings into the workload's profiling cost."""
        cost = self.costs.setdefault(name, ProfilingCost())
        self.costs.move_to_end(name)
        while len(self.costs) > COSTS_KEPT:
            self.costs.popitem(last=False)
        cost.modes_measured += 1
        if budget_w is not None:
            cost.account(readings, budget_w)


# ---- measuring one pair -----------------------------------------------------------------------


def in_batch_power(readings: Sequence[float], gap: Sequence[float] = ()) -> float:
    """A pair's power from its in-batch readings, without those that show no batch: their
    mean, plus its standard error when fewer than MEAN_READINGS are left.

    A reading inside a batch may still show the idle gap before it (a late sensor update,
    or a batch whose GPU work starts a few ms after the client's clock): such readings only
    ever lie low, while the sensor's noise is symmetric. Two rules drop them and leave the
    mean unbiased (a high quantile would also drop them but read every pair ~1 sigma high,
    and turn away pairs that fit the budget):
    - with `gap` (readings between the batches), those at the gaps' level: a short batch's
      2-7 readings can be half stale, where no rule that looks at them alone can tell
      which half is the batch;
    - then those more than 3 robust sigmas below the median (part-updated readings).
    A conversion that straddles a short batch's start or end reads part of the gap, 1-4 %
    low: too close to the busy level for either rule. Among the 2-7 readings a batch of
    one gets in a window, the mean landed 0.5-1.2 W low now and then, and a pair over the
    budget got served (a CI run: 20.62 W served under 20 W). A straddling reading widens
    the readings' spread, and the standard error added grows with it (of two readings it
    makes their highest); among enough readings a few straddling ones hardly move the
    mean."""
    return _busy_power(_busy_readings(readings, gap))


def _busy_power(busy: np.ndarray) -> float:
    sd = float(np.std(busy, ddof=1)) if len(busy) > 1 else None
    return few_readings_power(float(np.mean(busy)), sd, len(busy))


def _level(w: np.ndarray) -> tuple[float, float]:
    """Readings' median and robust sigma (MAD), at least the sensor's noise floor."""
    med = float(np.median(w))
    return med, max(1.4826 * float(np.median(np.abs(w - med))), SENSOR_SD_FLOOR * abs(med))


def _busy_readings(readings: Sequence[float], gap: Sequence[float] = ()) -> np.ndarray:
    """The readings in_batch_power averages."""
    w = _above_gap_level(np.asarray(readings, dtype=float), gap)
    med, sigma = _level(w)
    return w[w >= med - 3.0 * sigma]


def _above_gap_level(w: np.ndarray, gap: Sequence[float]) -> np.ndarray:
    """`w` without the readings within 3 sigmas of the gaps' median reading, when the rest
    lie clearly above it (their median 6 sigmas up); else all of `w`, as with too few gap
    readings to know their level. Batches back to back leave gaps shorter than the sensor's
    update, whose readings still show the batches: dropping the batches' readings at that
    level would keep only their noise's high tail and read the pair high."""
    if len(gap) < MIN_GAP_READINGS:
        return w
    level, sigma = _level(np.asarray(gap, dtype=float))
    above = w[w > level + 3.0 * sigma]
    if not len(above) or float(np.median(above)) < level + 6.0 * sigma:
        return w
    return above


def power_source(m: PairMeasurement, stopped: bool = False) -> str:
    """Where a pair's power came from, for the log (`stopped`: a window ended early, over
    the budget)."""
    if stopped:
        return "the readings of its last moments"
    if m.power_n:
        return f"{m.power_n} readings inside batches"
    return "too few readings inside batches: the window's highest"


@dataclass
class PairWindow:
    pair: Pair
    applied: float  # when the mode and batch size were set
    spec: WindowSpec
    batches: list[tuple[float, float]] = field(default_factory=list)  # (start, end)
    cover: bool = False  # the pair covers the rate axis (see InferencePlanner._uncovered)
    full_window: bool = False  # no early stop over the budget; replaces the pair's reading
    _no_tail: bool | None = None  # was the board within the abort limit before the switch?
    # batches of the settle: they time a pair stopped over the budget before its window
    settling: list[tuple[float, float]] = field(default_factory=list)

    @property
    def opens(self) -> float:
        return self.applied + self.spec.settle_s

    def add(self, start: float, end: float, size: int | None = None) -> None:
        """A batch that ran from `start` to `end`; of `size` if the client said (None:
        taken to be of this pair's)."""
        if size not in (None, self.pair.batch_size) or start < self.applied:
            return
        if start >= self.opens:
            self.batches.append((start, end))
        else:
            self.settling.append((start, end))

    def ready(self, now: float) -> bool:
        if len(self.batches) < self.spec.min_steps:
            return False
        return now - self.opens >= self.spec.window_s

    def over_budget(
        self,
        power: Callable[[float, float], Sequence[tuple[float, float]]],
        budget_w: float | None,
        now: float,
        lag_s: float = 0.0,
    ) -> float | None:
        """The power (W) that ends this window early, as it ends a training probe: the last
        `min_abort_samples` readings all over the budget + `abort_margin_w` (over whatever
        runs), or that many readings inside batches whose mean is; else None (and with no
        budget yet). A b=64 window at 20/s takes 16 s to see its 5 batches: that long over
        the budget is not a probe. While the pair settles, the readings since the switch
        count as a training probe's do (a previous pair's falling tail does not)."""
        if budget_w is None:
            return None
        k = max(1, self.spec.min_abort_samples)
        limit = budget_w + self.spec.abort_margin_w
        if now < self.opens:
            if self._no_tail is None:
                self._no_tail = no_tail(power, self.applied, limit, k)
            return overshoot([w for _, w in power(self.applied, now)], limit, k, self._no_tail)
        recent = [w for _, w in power(self.opens, now)][-k:]
        if len(recent) == k and min(recent) > limit:
            return float(np.mean(recent))
        if self.batches:
            m = self.measure(power, lag_s)
            if m.power_n >= k and m.power_w > limit:
                return m.power_w
        return None

    def clearly_over(
        self,
        power: Callable[[float, float], Sequence[tuple[float, float]]],
        budget_w: float | None,
        lag_s: float = 0.0,
    ) -> bool:
        """Is the pair over the budget beyond its in-batch readings' noise, with its median
        batch time known (powerd.profiler.over_and_timed, as a training window ends early)?
        Then its window may end before `window_s`: the pair cannot be served within the
        budget, and its time is what the model still needs from it."""
        if budget_w is None or len(self.batches) < max(2, self.spec.min_steps):
            return False
        m = self.measure(power, lag_s)
        if m.power_sd_w is None or m.power_n < CLEARLY_OVER_READINGS:
            return False
        se = readings_se(m.power_w, m.power_sd_w, m.power_n)
        return over_and_timed(m.power_w, se, budget_w, [e - s for s, e in self.batches])

    def stopped_over(self, power_w: float) -> PairMeasurement:
        """What a window stopped over the budget tells: its power, and its batch times so
        far, those of its settle if it was stopped then (NaN when none finished: the pair
        is known not to fit, its speed is not). The model needs the times of pairs over
        the budget as much as any."""
        d = np.array([(e - s) * 1000.0 for s, e in self.batches or self.settling])
        if not len(d):
            return PairMeasurement(self.pair, math.nan, power_w, None, 0, stopped=True)
        return PairMeasurement(
            self.pair,
            float(np.median(d)),
            power_w,
            float(np.percentile(d, 99)),
            len(d),
            stopped=True,
        )

    def measure(
        self, power: Callable[[float, float], Sequence[tuple[float, float]]], lag_s: float = 0.0
    ) -> PairMeasurement:
        d = np.array([(e - s) * 1000.0 for s, e in self.batches])
        inside: list[float] = []
        gap: list[float] = []  # between batches, past the sensor lag after one ends
        t0, t1 = self.batches[0][0], self.batches[-1][1]
        samples = list(power(t0, t1))
        k = 0
        for t, w in samples:
            while k < len(self.batches) and self.batches[k][1] < t:
                k += 1
            if k == len(self.batches):
                continue
            if self.batches[k][0] + lag_s <= t <= self.batches[k][1]:
                inside.append(w)
            elif k > 0 and self.batches[k - 1][1] + lag_s <= t < self.batches[k][0]:
                gap.append(w)
        sd, n = None, 0
        if len(inside) >= MIN_POWER_SAMPLES:
            busy = _busy_readings(inside, gap)
            pw, n = _busy_power(busy), len(busy)
            sd = float(np.std(busy, ddof=1)) if n > 1 else None
        elif samples:
            pw = float(max(w for _, w in samples))  # conservative: batches too short to see
        else:
            pw = math.nan
        return PairMeasurement(
            self.pair, float(np.median(d)), pw, float(np.percentile(d, 99)), len(d), sd, n
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
    # enough to span a backlog without a latency target: up to ~20 s of batches of 1
    served_ends: collections.deque = field(default_factory=lambda: collections.deque(maxlen=2048))
    served_since: float = 0.0
    drift_since: float | None = None
    observed_rate: float | None = None
    rate_source: str = "client"  # "client" (register/set_rate) or "observed"
    told_rate: float | None = None  # the rate the client last told us
    resolves: int = 0
    told_size: tuple[int, int] | None = None  # the last (reported, asked) size mismatch logged
    # batches of the pair the job runs now (its size and mode), for the p99 status shows:
    # a probe's b=64 batches must not read as the served b=1 pair's
    current: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=RECENT_BATCHES)
    )
    pair_since: float = 0.0  # when the job last got another pair (batch size or mode)
    # serving the fastest fit pair until the batches show the queue drained (see
    # powerd.optimize.backlog)
    draining: bool = False
    # after a drain: served batches begun before this may be working off what the switch
    # from the drain pair left queued, and show no backlog (powerd.optimize.backlog)
    quiet_until: float | None = None
    # reported a batch since registering (or since a shared window it left empty): a job
    # that runs no batches takes no part in a shared solve and must not stall its windows
    active: bool = False


@dataclass
class TrainingSide:
    """The training job in a shared solve (set by the interleaving planner): its predicted
    step time and power over the grid, what was measured of it, and the gate's holds of
    its steps while a shared window is open."""

    job_id: str
    time_ms: np.ndarray
    power_w: np.ndarray
    measured: Mapping[PowerMode, Measurement]
    record: Callable[[PowerMode, Measurement], None]
    holds: list[tuple[float, float]] = field(default_factory=list)


def inference_planner(
    modes: np.ndarray, sizes: Sequence[int], fitter, max_pairs: int
) -> InferencePlanner:
    return InferencePlanner(modes, sizes, fitter, max_pairs=max_pairs)


class InferenceJobsPlanner:
    """Drives the board for inference jobs. One job: `InferencePlanner` over its pairs.
    Several (that run batches): one mode for all and a batch size each, chosen jointly by
    `powerd.optimize.interleave.JointPlanner`, with the GPU gate managed so that batches run
    one at a time in arrival order, as the joint latency model assumes. A shared window
    measures every job's pair at the mode at once; jobs joining or leaving re-solve from
    the pairs already measured."""

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
        # several jobs at once (see the class doc)
        self.joint = JointPlanner()
        self.joint_served: ServeSet | None = None
        self.joint_ids: tuple[str, ...] = ()
        self.joint_windows: dict[str, PairWindow] | None = None
        self.joint_training: TrainingSide | None = None
        self._joint_key: Any = None

    @property
    def manages_gate(self) -> bool:
        """Several inference jobs share the GPU: their batches take turns at the gate."""
        return sum(1 for i in self.jobs if i not in self.released) >= 2

    # ---- Planner interface ------------------------------------------------------------
    def sync(self, jobs: Sequence[JobSpec], budget_w: float, now: float) -> None:
        ids = {j.id for j in jobs if j.kind == "inference"}
        for gone in [i for i in self.jobs if i not in ids]:
            del self.jobs[gone]
            self.serving.pop(gone, None)
            if gone == self.window_job:
                self.window, self.window_job = None, None
            if gone in self.joint_ids:
                # the others re-solve at the next tick (together, or the last one alone)
                self.joint_ids = tuple(i for i in self.joint_ids if i != gone)
                self.joint_served, self.joint_windows, self._joint_key = None, None, None
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
                try:
                    self.jobs[spec.id] = self._new_job(spec, budget_w)
                except Exception as exc:  # noqa: BLE001 - one job's bad setup stays its own
                    # (else every tick fails on it again: a log flood, the job never told)
                    log.exception("job %s: cannot plan for it", spec.id)
                    self.released[spec.id] = (
                        f"powerd cannot plan for this inference job: {type(exc).__name__}: {exc}"
                    )
                continue
            if spec.rate_hz is not None and spec.rate_hz != job.told_rate:
                job.told_rate = spec.rate_hz
                self._resolve(job, spec.rate_hz, "set_rate")
            job.spec = spec
            if budget_changed:
                job.session.set_budget(budget_w)
                job.draining = False
                self.serving.pop(spec.id, None)
        self.store.forget({j.spec.workload for j in self.jobs.values()})

    def feed(
        self,
        job_id: str,
        ends: Sequence[float],
        durations: Sequence[float],
        sizes: Sequence[int] = (),
    ) -> None:
        """Batches a job reported: end times, durations and (clients that report them)
        sizes. A batch of another size than the one asked for (formed before the switch,
        or a client that keeps its own size) measures no pair and no arrival rate."""
        job = self.jobs.get(job_id)
        if job is None or not durations:
            return
        served = job_id in self.serving or job_id in self.joint_ids
        job.active = True
        jw = None if self.joint_windows is None else self.joint_windows.get(job_id)
        own = self.window if self.window is not None and self.window_job == job_id else None
        asked = self.batch_size.get(job_id)
        for k, (t, d) in enumerate(zip(ends, durations, strict=False)):
            size = sizes[k] if k < len(sizes) else None
            job.batches.append((t - d, t))
            if jw is not None:
                jw.add(t - d, t, size)
            if own is not None:
                own.add(t - d, t, size)
            if size is not None and asked is not None and size != asked:
                # batches formed before the switch still come for a while; one begun well
                # after it is a client that keeps a size of its own
                if t - d > job.pair_since + self.spec.settle_s:
                    self._other_size(job, size, asked)
                continue
            if t - d >= job.pair_since:
                job.current.append((t - d, t))
            if served and t - d >= job.served_since:
                job.served_ends.append((t - d, t))

    def _other_size(self, job: _InfJob, size: int, asked: int) -> None:
        if job.told_size != (size, asked):
            job.told_size = (size, asked)
            log.info(
                "job %s: a batch of %d where powerd asked for %d: batches of another size "
                "measure nothing (form each batch with inf.batch_size)",
                job.spec.id,
                size,
                asked,
            )

    def tick(self, now: float) -> None:
        self.mark_quiet(now)
        active = self._active()
        if len(active) >= 2:
            self.tick_joint(active, now)
            return
        self._leave_joint()
        job = self._driver()
        if job is None:
            return
        self._watch_rate(job, now)
        w = self.window
        if w is not None and self.window_job == job.spec.id:
            # a full window (the least pair's second look) is never cut short: nothing
            # draws less, and a window cut short just after the switch is what misread
            over = None if w.full_window else self._over(w, now)
            if over is not None:
                self._record(job, w, now, " (stopped: over the budget)", over)
            elif w.ready(now):
                how = " (covering the rate axis)" if w.cover else ""
                if w.full_window:
                    how = " (again, a full window, before calling the budget out of reach)"
                self._record(job, w, now, how)
            elif not w.full_window and w.clearly_over(
                self.hooks.power, self.budget_w, self.settings.sensor_lag_s
            ):
                self._record(job, w, now, f" (over the budget: timed on {len(w.batches)} batches)")
            else:
                return
            self.window, self.window_job = None, None
        action = job.session.next_action(job.samples)
        if isinstance(action, MeasurePair):
            job.draining = False
            self._set(job, action.pair)
            self.window, self.window_job = (
                PairWindow(
                    action.pair,
                    time.monotonic(),
                    self.spec,
                    cover=action.cover,
                    full_window=action.full_window,
                ),
                job.spec.id,
            )
            self.serving.pop(job.spec.id, None)
            return
        before = self.serving.get(job.spec.id)
        action = self._drain_backlog(job, action, before)
        self._set(job, action.pair)
        self.serving[job.spec.id] = action
        if before is None or before.pair != action.pair:
            # the arrival rate is read from batches of this size once the client uses it
            job.served_ends.clear()
            job.served_since = time.monotonic() + self.spec.settle_s
        if job.draining:
            return  # logged by _drain_backlog
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
            elif not action.within_budget:
                log.warning(
                    "job %s: no pair measured stays within %g W: holding the least power "
                    "measured, %s b=%d at %.2f W",
                    job.spec.id,
                    g.budget_w,
                    action.pair.mode,
                    action.pair.batch_size,
                    action.power_w,
                )
            elif not action.drains:
                log.warning(
                    "job %s: no pair measured under %g W keeps up with %g requests/s: serving "
                    "the most, %s b=%d, %.0f/s at %.2f W (the queue grows)%s",
                    job.spec.id,
                    g.budget_w,
                    g.rate_hz,
                    action.pair.mode,
                    action.pair.batch_size,
                    action.requests_per_s,
                    action.power_w,
                    _measured_only_note(job.session),
                )
            else:
                log.warning(
                    "job %s: latency %s ms cannot be met under %g W at %g/s: serving the best "
                    "measured, %s b=%d, worst-case %.1f ms at %.2f W%s",
                    job.spec.id,
                    g.latency_ms,
                    g.budget_w,
                    g.rate_hz,
                    action.pair.mode,
                    action.pair.batch_size,
                    action.latency_ms,
                    action.power_w,
                    _measured_only_note(job.session),
                )

    def phase_of(self, job_id: str) -> JobView:
        view = self._phase_of(job_id)
        if self.manages_gate:
            view = dataclasses.replace(view, gate="managed")
        return view

    def _phase_of(self, job_id: str) -> JobView:
        b = self.budget_w
        if job_id in self.released:
            return JobView("idle", self.released[job_id], None, b)
        job = self.jobs.get(job_id)
        if job is None:
            return JobView("queued", "registered: waiting for the control loop", None, b)
        size = self.batch_size.get(job_id)
        if self.joint_ids:
            return self._joint_view(job, size)
        driver = self._driver()
        if driver is not job:
            if job.active:
                why = f"waiting for inference job {driver.spec.id if driver else '?'} to be served"
            elif job.batches:
                why = (
                    f"no batch for {time.monotonic() - job.batches[-1][1]:.0f} s: left out "
                    "of the plan until it runs one"
                )
            else:
                why = "not running batches yet (enter job.batch() for each batch)"
            return JobView(
                "queued",
                why,
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
        if not served.drains:
            return JobView(
                "tuned",
                f"no pair under {g.budget_w:g} W keeps up with {g.rate_hz:g} requests/s: "
                f"serving the most, {served.requests_per_s:.0f}/s (the queue grows)"
                + _measured_only_note(job.session),
                False,
                b,
                batch_size=size,
                best_latency_ms=served.latency_ms,
            )
        # without a latency target, infeasible means that no queue drains within the budget
        what = "a queue that drains" if g.latency_ms is None else f"latency {g.latency_ms:g} ms"
        return JobView(
            "tuned",
            f"{what} cannot be met under {g.budget_w:g} W at "
            f"{g.rate_hz:g}/s: serving with the best, {served.latency_ms:.1f} ms"
            + _measured_only_note(job.session),
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
        if self.joint_ids:
            s, ids = self.joint_served, self.joint_ids
            return {
                "planner": "inference",
                "jobs": list(self.joint_ids),
                "budget_w": self.budget_w,
                "state": "profiling" if s is None else "tuned",
                "measuring": None
                if self.joint_windows is None
                else {i: w.pair.batch_size for i, w in self.joint_windows.items()},
                "committed": None if s is None else s.mode.as_dict(),
                "batch_sizes": None if s is None else dict(zip(ids, s.sizes, strict=True)),
                "feasible": None if s is None else dict(zip(ids, s.feasible, strict=True)),
                "gpu_share": None if s is None else s.gpu_share,
                "pairs_profiled": {i: len(self.jobs[i].samples) for i in self.joint_ids},
            }
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
            "p99_batch_ms": _p99(job.current),
            "p99_latency_ms": _p99_latency(job, g),
            "predicted_latency_ms": None if served is None else served.latency_ms,
            "best_latency_ms": None if served is None else served.best_latency_ms,
            # served, and its queue cannot keep up with the rate (no latency is bounded)
            "queue_grows": served is not None and not served.drains,
            "pairs_profiled": len(job.samples),
            "resolves": job.resolves,
            "draining_backlog": job.draining,
            **self._joint_extra(job_id),
        }

    def _joint_extra(self, job_id: str) -> dict[str, Any]:
        s = self.joint_served
        if job_id not in self.joint_ids:
            return {}
        out: dict[str, Any] = {"shared_with": [i for i in self.joint_ids if i != job_id]}
        if s is not None:
            i = self.joint_ids.index(job_id)
            out["predicted_latency_ms"] = s.latency_ms[i]
            out["best_latency_ms"] = None if s.feasible[i] else s.latency_ms[i]
            out["queue_grows"] = not s.drains[i]
            out["gpu_share"] = s.gpu_share
            # measured worst case: the batch fills, then may wait behind one batch of every
            # other job (the p99s of all the shared jobs' batches)
            p99s = [_p99(self.jobs[j].current) for j in self.joint_ids if j in self.jobs]
            known = [x for x in p99s if x is not None]
            rate = self.jobs[job_id].session.goal.rate_hz
            out["p99_latency_ms"] = (
                float(worst_latency_ms(s.sizes[i], rate, sum(known)))
                if len(known) == len(self.joint_ids)
                else None
            )
        return out

    # ---- internals -----------------------------------------------------------------------
    def _fitter_or_new(self) -> Any:
        if self._fitter is None:
            self._fitter = self.fitter_factory()
        return self._fitter

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
        session = InferenceSession(
            planner,
            goal,
            profiled=bool(samples),
            rate_search_pairs=self.settings.rate_change_pairs,
        )
        # A workload measured before re-solves from its pairs (profiled=True): a new goal
        # may verify its predicted pick with RESOLVE_NEW_PAIRS measurements, past max_pairs.
        return _InfJob(spec, session, samples, told_rate=spec.rate_hz)

    def _resolve(self, job: _InfJob, rate: float, why: str) -> None:
        before = job.session.goal.rate_hz
        # no new pair while a measured one fits (module doc)
        out_of_reach = job.session.set_rate(rate)
        log.info(
            "job %s: arrival rate %g/s -> %g/s (%s): re-solving from the measured pairs%s",
            job.spec.id,
            before,
            rate,
            why,
            # only where rate changes may measure (an admin's rate_change_pairs)
            _reach_note(out_of_reach) if job.session.rate_search_pairs else "",
        )
        job.resolves += 1
        job.drift_since = None
        job.draining = False
        self.serving.pop(job.spec.id, None)

    def _drain_backlog(
        self, job: _InfJob, chosen: ServePair, before: ServePair | None
    ) -> ServePair:
        """`chosen` (the goal's pick), or the fastest fit pair while the client's queue
        holds a backlog: batches of `chosen` running back to back start the draining, gaps
        between the faster pair's batches end it (powerd.optimize.backlog)."""
        goal = job.session.goal
        fast = recovery_pair(job.samples, goal, chosen)
        if fast is None:
            job.draining = False
            return chosen
        if job.draining:
            share = busy_share(job.served_ends)
            if before is not None and before.pair == fast.pair and share is not None:
                if share < DRAINED_SHARE:
                    job.draining = False
                    quiet = after_drain_s(job.samples, goal, chosen.pair, fast.pair)
                    job.quiet_until = time.monotonic() + self.spec.settle_s + (quiet or 0.0)
                    log.info(
                        "job %s: backlog drained (batches %.0f %% busy)", job.spec.id, 100 * share
                    )
                    return chosen
            return fast
        span = backlog_span_s(job.samples, goal, chosen.pair, fast.pair)
        since = job.quiet_until
        share = None if span is None else busy_share(job.served_ends, span_s=span, since=since)
        if before is not None and before.pair == chosen.pair and share is not None:
            if share >= BACKLOG_SHARE:
                job.draining = True
                log.info(
                    "job %s: batches run back to back (%.0f %% busy): a backlog; serving the "
                    "fastest fit pair %s b=%d (%.2f W) until it drains",
                    job.spec.id,
                    100 * share,
                    fast.pair.mode,
                    fast.pair.batch_size,
                    fast.power_w,
                )
                return fast
        return chosen

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
        self._set_mode(pair.mode)
        self._ask_size(job, pair.batch_size)

    def _ask_size(self, job: _InfJob, b: int) -> None:
        if self.batch_size.get(job.spec.id) != b:
            self.batch_size[job.spec.id] = b
            self.new_pair(job)

    def new_pair(self, job: _InfJob) -> None:
        """The job runs another pair from now (a batch size or a mode): its recent batch
        times start afresh."""
        job.pair_since = time.monotonic()
        job.current.clear()

    def quiet_for(self, job: _InfJob, now: float) -> float | None:
        """How long a job that ran batches has run none, if that is long enough to leave it
        out of a plan (a server idle at night): `rate_drift_s`, and at least 4 intervals
        of its batches at its rate; else None."""
        if not job.batches:
            return None
        b = self.batch_size.get(job.spec.id) or 1
        quiet = now - job.batches[-1][1]
        limit = max(self.settings.rate_drift_s, 4.0 * b / job.session.goal.rate_hz)
        return quiet if quiet > limit else None

    def mark_quiet(self, now: float) -> None:
        """Leave jobs that stopped running batches out of the plan until they run one (a
        shared plan kept a stopped job's batches, and the others paid for them)."""
        for job in self._live():
            if job.active and (quiet := self.quiet_for(job, now)) is not None:
                job.active = False
                log.info(
                    "job %s: no batch for %.0f s: left out of the plan until it runs one",
                    job.spec.id,
                    quiet,
                )

    def _live(self) -> list[_InfJob]:
        live = [j for i, j in self.jobs.items() if i not in self.released]
        return sorted(live, key=lambda j: j.spec.registered)

    def _active(self) -> list[_InfJob]:
        return [j for j in self._live() if j.active]

    def _driver(self) -> _InfJob | None:
        """The job served alone: the one that runs batches (the oldest if several do not)."""
        active = self._active()
        live = active or self._live()
        return live[0] if live else None

    # ---- several jobs: one mode, a batch size each ---------------------------------------
    def tick_joint(
        self, active: list[_InfJob], now: float, training: TrainingSide | None = None
    ) -> None:
        """One step of the shared solve for `active` (>= 2 jobs, or >= 1 with a training
        job): finish a shared window, or act on the joint planner's answer."""
        ids = tuple(j.spec.id for j in active)
        if ids != self.joint_ids:
            # the set changed (a job joined, left or went quiet): re-solve from the pairs
            self.joint_ids, self.joint_served, self._joint_key = ids, None, None
            self.joint_windows = None
            self.window, self.window_job = None, None  # a one-job window is over
            for j in active:
                self.serving.pop(j.spec.id, None)
        self.joint_training = training
        if self.joint_windows is not None:
            over = next(
                (o for w in self.joint_windows.values() if (o := self._over(w, now)) is not None),
                None,
            )
            if over is None and not self._joint_window_done(now):
                return
            self._finish_joint(active, now, over)
        key = (
            tuple((j.spec.id, j.session.goal, len(j.samples)) for j in active),
            self.budget_w,
            None if training is None else (training.job_id, len(training.measured)),
        )
        if key == self._joint_key and self.joint_served is not None:
            return  # nothing new to decide from
        jobs = [
            JointJob(
                j.session.goal,
                j.session.planner,
                j.samples,
                can_measure=len(j.samples) < self.settings.max_pairs,
            )
            for j in active
        ]
        jt = None
        if training is not None:
            jt = JointTraining(
                training.time_ms,
                training.power_w,
                training.measured,
                can_measure=len(training.measured) < 2 * self.settings.max_pairs,
            )
        action = self.joint.next_action(jobs, jt)
        self._joint_key = key
        if isinstance(action, MeasureSet):
            self._set_mode(action.mode)
            t0 = time.monotonic()
            self.joint_windows = {}
            for j, b in zip(active, action.sizes, strict=True):
                pair = Pair(action.mode, b)
                self._ask_size(j, b)
                self.joint_windows[j.spec.id] = PairWindow(pair, t0, self.spec)
            if training is not None:
                training.holds.clear()
            self.joint_served = None
            return
        before = self.joint_served
        self._set_mode(action.mode)
        for j, b in zip(active, action.sizes, strict=True):
            self._ask_size(j, b)
            if before is None or before.sizes != action.sizes or before.mode != action.mode:
                j.served_ends.clear()
                j.served_since = time.monotonic() + self.spec.settle_s
        self.joint_served = action
        if before is None or (before.mode, before.sizes) != (action.mode, action.sizes):
            parts = ", ".join(
                f"{i} b={b} "
                + (
                    f"worst-case {lat:.1f} ms{'' if ok else ' (target missed)'}"
                    if action.drains[n]
                    else "does not keep up (its queue grows)"
                )
                for n, (i, b, lat, ok) in enumerate(
                    zip(ids, action.sizes, action.latency_ms, action.feasible, strict=True)
                )
            )
            log.info(
                "%d inference jobs%s share %s: %s; max power %.2f W, GPU share %.2f",
                len(ids),
                "" if training is None else f" and training job {training.job_id}",
                action.mode,
                parts,
                action.power_w,
                action.gpu_share,
            )

    def _joint_window_done(self, now: float) -> bool:
        ws = self.joint_windows or {}
        if all(w.ready(now) for w in ws.values()):
            tr = self.joint_training
            if tr is None or len(tr.holds) >= self.spec.min_steps:
                return True
        # a job that stopped running batches (or training that gets no turn) must not
        # stall the window: it ends after a few windows' time with what it has, but never
        # before a job's batches could have filled twice min_steps times (b=64 at 100/s
        # fills every 0.64 s: a short window would leave out a job that runs fine)
        opens = min((w.opens for w in ws.values()), default=now)
        fill_s = max(
            (
                w.pair.batch_size / self.jobs[i].session.goal.rate_hz
                for i, w in ws.items()
                if i in self.jobs
            ),
            default=0.0,
        )
        return now - opens > max(4 * self.spec.window_s + 1.0, 2 * self.spec.min_steps * fill_s)

    def _over(self, w: PairWindow, now: float) -> float | None:
        """The power that stops window `w` early (see PairWindow.over_budget), or None."""
        return w.over_budget(self.hooks.power, self.budget_w, now, self.settings.sensor_lag_s)

    def _record(
        self, job: _InfJob, w: PairWindow, now: float, how: str, over_w: float | None = None
    ) -> None:
        """A finished window's pair (`over_w`: stopped early at that power): into the job's
        samples and session, and the store."""
        got = (
            w.stopped_over(over_w)
            if over_w is not None
            else w.measure(self.hooks.power, self.settings.sensor_lag_s)
        )
        m = got if over_w is not None or w.full_window else pooled(job.samples.get(w.pair), got)
        job.samples[m.pair] = m
        job.session.measured(m.pair)
        self.store.save(job.spec.workload, job.spec.persistent)
        readings = self.hooks.power(w.applied, now)
        self.store.account(job.spec.workload, readings, self.budget_w)
        log.info(
            "job %s: measured %s b=%d%s: %s at %.2f W (%d batches%s; %s)",
            job.spec.id,
            m.pair.mode,
            m.pair.batch_size,
            how,
            f"p99 {m.tail_ms:.1f} ms/batch" if math.isfinite(m.tail_ms) else "no batch finished",
            m.power_w,
            m.batches,
            f", {m.windows} windows pooled" if m.windows > 1 else "",
            power_source(m, stopped=over_w is not None),
        )

    def _finish_joint(self, active: list[_InfJob], now: float, over_w: float | None = None) -> None:
        """Record a shared window; `over_w`: stopped early, power over the budget (every
        job's pair at this mode is recorded at that power: the set does not fit)."""
        ws = self.joint_windows or {}
        self.joint_windows = None
        for j in active:
            w = ws.get(j.spec.id)
            if w is None:
                continue
            if over_w is not None:
                self._record(j, w, now, " (shared; stopped: over the budget)", over_w)
                continue
            if len(w.batches) < max(1, self.spec.min_steps):
                # it ran (almost) no batches: out of the shared solve until it runs again
                j.active = False
                log.info("job %s: no batches in a shared window: left out for now", j.spec.id)
                continue
            self._record(j, w, now, " (shared)")
        tr = self.joint_training
        if tr is not None and ws:
            w0 = next(iter(ws.values()))
            mode = w0.pair.mode
            holds = [h for h in tr.holds if h[0] >= w0.opens]
            if over_w is not None:
                tr.record(mode, Measurement(mode, math.nan, over_w, len(holds), True))
            elif holds:
                tw = PairWindow(w0.pair, w0.applied, self.spec, holds)
                tm = tw.measure(self.hooks.power, self.settings.sensor_lag_s)
                tr.record(mode, Measurement(mode, tm.batch_ms, tm.power_w, len(holds), False))
                log.info(
                    "training job %s: measured %s (shared): %.1f ms/step at %.2f W",
                    tr.job_id,
                    mode,
                    tm.batch_ms,
                    tm.power_w,
                )
            else:
                tr.record(mode, Measurement(mode, math.nan, math.nan, 0, False))
            tr.holds.clear()

    def _leave_joint(self) -> None:
        """Back to one job: it re-solves from its measured pairs (no new profiling)."""
        if not self.joint_ids:
            return
        for i in self.joint_ids:
            job = self.jobs.get(i)
            if job is not None:
                job.session.set_rate(job.session.goal.rate_hz)  # a re-solve, not a search
                self.serving.pop(i, None)
        self.joint_ids, self.joint_served, self.joint_windows = (), None, None
        self._joint_key = None

    def _joint_view(self, job: _InfJob, size: int | None) -> JobView:
        b = self.budget_w
        if job.spec.id not in self.joint_ids:
            return JobView(
                "queued",
                "sharing the GPU with other inference jobs once it runs batches "
                "(enter job.batch() for each batch)",
                None,
                b,
                batch_size=size,
            )
        s = self.joint_served
        if s is None:
            n, others = len(job.samples), len(self.joint_ids) - 1
            # the others just left: it re-solves alone at the next pass
            shared = f"shared with {others} other inference job(s)" if others else "alone again"
            return JobView(
                "profiling",
                f"{shared}: measuring (mode, batch size) pairs, {n} measured",
                None,
                b,
                batch_size=size,
            )
        i = self.joint_ids.index(job.spec.id)
        if not s.within_budget:
            return JobView(
                "idle",
                "no measured (mode, batch size) pairs stay within the budget together",
                False,
                b,
                batch_size=size,
                best_latency_ms=s.latency_ms[i],
            )
        if s.feasible[i]:
            return JobView("tuned", "", True, b, batch_size=size)
        g = job.session.goal
        if not s.drains[i] or g.latency_ms is None:
            return JobView(
                "tuned",
                f"sharing the GPU, no plan measured under {b:g} W keeps up with "
                f"{g.rate_hz:g} requests/s: serving the closest (the queue grows)",
                False,
                b,
                batch_size=size,
                best_latency_ms=s.latency_ms[i],
            )
        return JobView(
            "tuned",
            f"latency {g.latency_ms:g} ms cannot be met under {b:g} W at {g.rate_hz:g}/s "
            f"while sharing the GPU: serving with the best, {s.latency_ms[i]:.1f} ms",
            False,
            b,
            batch_size=size,
            best_latency_ms=s.latency_ms[i],
        )

    def _set_mode(self, mode: PowerMode) -> None:
        if mode != self.mode:
            self.mode = None  # unknown until the switch succeeded
            self.hooks.apply_mode(mode)
            self.mode = mode
            for j in self.jobs.values():
                self.new_pair(j)


def _measured_only_note(session: InferenceSession) -> str:
    """Said of an infeasible goal set by a rate change that measured nothing: the answer
    is the best of the pairs measured so far, not a search's."""
    if not session.measured_only:
        return ""
    return (
        " (of the pairs measured so far: this rate change measured no new pair; a new job "
        "of this workload or a budget change searches again)"
    )


def _reach_note(times: int) -> str:
    """The log's note on a rate change to a goal at least as hard as `times` goals that
    were out of reach (it searches less, see InferenceSession)."""
    if not times:
        return ""
    plural = "s" if times > 1 else ""
    return f" (a goal as easy was out of reach {times} time{plural}: fewer new pairs)"


def _p99(batches: Sequence[tuple[float, float]]) -> float | None:
    if len(batches) < P99_MIN_BATCHES:
        return None
    return float(np.percentile([(e - s) * 1000.0 for s, e in batches], 99))


def _p99_latency(job: _InfJob, goal: InferenceGoal) -> float | None:
    """Worst-case request latency from the measured p99 batch time: (b-1)/r + p99."""
    p99 = _p99(job.current)
    if p99 is None or job.session.served is None:
        return None
    return float(worst_latency_ms(job.session.served.pair.batch_size, goal.rate_hz, p99))
