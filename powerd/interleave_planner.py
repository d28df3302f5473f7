"""The daemon's interleaving planner: a training and an inference job on one board.

It takes over when both kinds are registered (listed before the single-kind planners) and
manages the GPU gate (`powerd.gate`): the jobs take turns, one step or batch at a time, a
formed inference batch first. Mode and batch size are chosen jointly by
`powerd.optimize.interleave.InterleavePlanner` from what is measured: the training
workload's samples (its own tuning, and what was measured here), the inference workload's
pairs. A joint probe runs both at one (mode, b) and measures each apart: batches from the
windows the inference client reports, training steps from the step durations the training
client reports (each from the step's start, after any wait at the gate, to its step()).
Power of each: the INA3221 samples inside its windows.

While the inference job runs no batches (none yet, or none for `rate_drift_s`), the
training job has the GPU to itself: a `TrainingPlanner` inside this one tunes it (or holds
its remembered mode) as if it were alone, with the gate still managed so that the next
batch waits only for the step in flight, and the joint solve resumes from what was
measured. A serving process that waits for requests costs training nothing.

When a job leaves, the control loop hands the board back to the single-kind planner, which
re-solves from the samples already measured (no re-profiling).
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

from powerd.inference_planner import (
    InferenceJobsPlanner,
    InferenceSamples,
    InferenceSettings,
    PairWindow,
    TrainingSide,
    power_source,
)
from powerd.modes import PowerMode
from powerd.optimize.base import Measurement
from powerd.optimize.inference import Pair, pooled, worst_latency_ms
from powerd.optimize.interleave import (
    InterleaveGoal,
    InterleavePlanner,
    MeasureJoint,
    ServeJoint,
    throughput_bound_hz,
)
from powerd.planner import BoardHooks, JobSpec, JobView
from powerd.profiler import WindowSpec
from powerd.training import TrainingPlanner

log = logging.getLogger("powerd.interleave")


def served_note(action: ServeJoint, budget_w: float | None, rate_hz: float) -> str:
    """Why an interleaved pair is served, for the log: a pair held over the budget (no
    measured pair stays within it) is that, whether or not its queue keeps up."""
    if budget_w is not None and action.power_w > budget_w:
        return (
            f"over the budget: no measured pair stays within {budget_w:g} W, "
            "this one read the least power"
        )
    if action.feasible:
        return "feasible"
    if action.drains:
        return "latency target cannot be met"
    return (
        f"the queue grows: {action.served_hz(rate_hz):.1f} of {rate_hz:g} requests/s served, "
        "one batch per training step"
    )


class _RatioTrainPredictor:
    """Training time/power over modes when the training workload has no fitted predictor
    yet: the inference model at the largest batch size, scaled by what was measured of
    training (median time ratio, median power offset; 1 and 0 before any)."""

    def __init__(self, pair_model: Any, b: int, train: Mapping[PowerMode, Measurement]):
        self.pair_model, self.b = pair_model, b
        ok = [m for m in train.values() if math.isfinite(m.time_ms) and math.isfinite(m.power_w)]
        self.ratio, self.offset = 1.0, 0.0
        if ok:
            modes = np.array([m.mode.as_tuple() for m in ok], dtype=np.int64)
            t, p = pair_model.predict(modes, np.full(len(ok), b))
            self.ratio = float(np.median([m.time_ms for m in ok] / np.asarray(t)))
            self.offset = float(np.median([m.power_w for m in ok] - np.asarray(p)))

    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t, p = self.pair_model.predict(modes, np.full(len(modes), self.b))
        return np.asarray(t) * self.ratio, np.asarray(p) + self.offset


@dataclass
class _Probe:
    pair: Pair
    infer: PairWindow
    holds: list[tuple[float, float]] = field(default_factory=list)


class InterleaveJobsPlanner:
    kinds = frozenset({"training", "inference"})
    manages_gate = True

    def __init__(
        self,
        hooks: BoardHooks,
        spec: WindowSpec,
        modes: np.ndarray,
        samples: InferenceSamples,
        fitter_factory: Callable[[], Any],
        settings: InferenceSettings,
        joint_train: dict[str, dict[PowerMode, Measurement]],
    ):
        self.hooks = hooks
        self.spec = spec
        self.modes = modes
        self.settings = settings
        self.fitter_factory = fitter_factory
        self.joint_train = joint_train
        # inference bookkeeping (sessions, reported batches, status) without its decisions
        self.inf = InferenceJobsPlanner(hooks, spec, modes, samples, fitter_factory, settings)
        self.train: dict[str, tuple[JobSpec, Any]] = {}
        self.released: dict[str, str] = {}
        self.budget_w: float | None = None
        self.probe: _Probe | None = None
        self.probes = 0
        self.served: ServeJoint | None = None
        self.mode: PowerMode | None = None
        self.batch_size: int | None = None
        self.holds: collections.deque[tuple[float, float]] = collections.deque(maxlen=512)
        self._planners: dict[tuple[int, ...], tuple[Any, InterleavePlanner]] = {}
        self._goal: InterleaveGoal | None = None
        # several inference jobs with the training job: the shared solve of self.inf
        self.shared = False
        self._side: TrainingSide | None = None
        self._side_key: Any = None
        # the training job alone on the GPU while the inference job has run no batch yet
        self.alone: TrainingPlanner | None = None

    # ---- Planner interface ------------------------------------------------------------
    def sync(self, jobs: Sequence[JobSpec], budget_w: float, now: float) -> None:
        self.inf.sync([j for j in jobs if j.kind == "inference"], budget_w, now)
        ids = {j.id for j in jobs}
        for gone in [i for i in self.train if i not in ids]:
            del self.train[gone]
        for gone in [i for i in self.released if i not in ids]:
            del self.released[gone]
        for s in jobs:
            if s.kind != "training" or s.id in self.released:
                continue
            known = self.train.get(s.id)
            if known is None:
                self.train[s.id] = (s, self.hooks.workload("training", s.workload, s.persistent))
            else:
                self.train[s.id] = (s, known[1])  # its steps so far, a changed budget
        self.budget_w = budget_w
        goal = self._current_goal()
        if goal != self._goal:
            self._goal = goal
            self.served = None  # re-solve (from what is measured)

    def feed(
        self,
        job_id: str,
        ends: Sequence[float],
        durations: Sequence[float],
        sizes: Sequence[int] = (),
    ) -> None:
        if job_id == self._train_id():
            if self.alone is not None:
                self.alone.feed(job_id, ends, durations)
            # the training client times each step from its start (after any wait at the
            # gate) to its step(): the span it held the GPU
            self._feed_holds([(t - d, t) for t, d in zip(ends, durations, strict=False) if d > 0])
            return
        self.inf.feed(job_id, ends, durations, sizes)
        if self.probe is not None and job_id == self._inf_id():
            for k, (t, d) in enumerate(zip(ends, durations, strict=False)):
                self.probe.infer.add(t - d, t, sizes[k] if k < len(sizes) else None)

    def _feed_holds(self, holds: Sequence[tuple[float, float]]) -> None:
        for start, end in holds:
            self.holds.append((start, end))
            if self._side is not None and self.inf.joint_windows is not None:
                self._side.holds.append((start, end))
            if self.probe is not None and start >= self.probe.infer.opens:
                self.probe.holds.append((start, end))

    def tick(self, now: float) -> None:
        self.inf.mark_quiet(now)
        tr, ij = self._train_job(), self.inf._driver()
        if tr is None or ij is None or self._goal is None:
            return
        active = self.inf._active()
        if len(active) >= 2:
            # several inference jobs and the training job: one shared solve
            self.shared = True
            self.probe, self.served = None, None
            self.inf.mode = self.mode
            try:
                self.inf.tick_joint(active, now, self._training_side(tr, active))
            finally:
                self.mode = self.inf.mode
            return
        if self.shared:
            self.shared = False
            self.inf._leave_joint()
            self._side, self._side_key = None, None
        if self._no_batches(ij, now):
            self._train_alone(tr, ij, now)
            return
        if self.alone is not None:
            log.info("job %s ran a batch: interleaving it with %s", ij.spec.id, tr[0].id)
            self.alone = None
            self.mode = None  # the training planner moved the board
            self.served = None  # re-solve from what is measured together
        name = tr[0].workload
        joint = self.joint_train.setdefault(name, {})
        if self.probe is not None:
            enough = len(self.probe.holds) >= self.spec.min_steps
            # training that gets no turn at all (batches fill the GPU) must not stall a probe
            late = now - self.probe.infer.opens > 4 * self.spec.window_s + 1.0
            over = self.probe.infer.over_budget(
                self.hooks.power, self.budget_w, now, self.settings.sensor_lag_s
            )
            if over is None and not (self.probe.infer.ready(now) and (enough or late)):
                return
            self._finish_probe(ij, joint, now, over)
        planner = self._planner(ij.session.planner.batch_sizes)
        train = {**tr[1].samples, **joint}
        anchor = tr[1].remembered(self.budget_w) if self.budget_w is not None else None
        action = planner.next_action(self._goal, train, ij.samples, self.probes, anchor=anchor)
        if isinstance(action, MeasureJoint):
            self._set(action.pair)
            self.probe = _Probe(action.pair, PairWindow(action.pair, time.monotonic(), self.spec))
            self.served = None
            return
        if self.served is None or self.served.pair != action.pair:
            log.info(
                "interleaving %s with %s: %s b=%d, worst-case %.1f ms, max power %.2f W, "
                "%.2f training steps/s predicted (%s)",
                tr[0].id,
                ij.spec.id,
                action.pair.mode,
                action.pair.batch_size,
                action.latency_ms,
                action.power_w,
                action.throughput_hz,
                served_note(action, self.budget_w, self._goal.rate_hz),
            )
        self._set(action.pair)
        self.served = action

    def phase_of(self, job_id: str) -> JobView:
        b = self.budget_w
        if job_id in self.released:
            return JobView("idle", self.released[job_id], None, b)
        if self.alone is not None and not self.shared:
            if job_id == self._train_id():
                return dataclasses.replace(self.alone.phase_of(job_id), gate="managed")
            # training has the GPU alone: every inference job on the board is quiet
            ij = self.inf.jobs.get(job_id)
            if ij is not None and job_id not in self.inf.released:
                quiet = (
                    f"no batch for {time.monotonic() - ij.batches[-1][1]:.0f} s"
                    if ij.batches
                    else "no batches reported yet (enter job.batch() for each batch)"
                )
                size = (
                    self.batch_size
                    if job_id == self._inf_id()
                    else self.inf.batch_size.get(job_id, min(ij.session.planner.batch_sizes))
                )
                return JobView(
                    "profiling",
                    f"{quiet}; the training job runs in its own mode until one comes",
                    None,
                    b,
                    batch_size=size,
                    gate="managed",
                )
        if self.shared and job_id in self.inf.jobs:
            return dataclasses.replace(self.inf.phase_of(job_id), gate="managed")
        if self.shared and job_id == self._train_id():
            js = self.inf.joint_served
            if js is None:
                return JobView(
                    "profiling",
                    "interleaved with several inference jobs: measuring a mode",
                    None,
                    b,
                    gate="managed",
                )
            return JobView("tuned", "", True, b, gate="managed")
        if job_id not in self.train and job_id not in self.inf.jobs:
            return JobView("queued", "registered: waiting for the control loop", None, b)
        size = self.batch_size if job_id == self._inf_id() else None
        if job_id in self.train and job_id != self._train_id():
            # it still runs: its steps take turns at the gate, or its kernels would run
            # into the inference batches the plan gives the GPU to
            return JobView("queued", "another training job interleaves", None, b, gate="managed")
        if job_id in self.inf.jobs and job_id != self._inf_id():
            return JobView("queued", "another inference job interleaves", None, b)
        s = self.served
        if s is None:
            return JobView(
                "profiling",
                "interleaved: measuring a (mode, batch size)",
                None,
                b,
                batch_size=size,
                gate="managed",
            )
        if b is not None and s.power_w > b:
            # over the budget whatever runs: the board holds the least power measured
            return JobView(
                "idle",
                "interleaved: no measured (mode, batch size) pair stays within the budget",
                False,
                b,
                batch_size=size,
                gate="managed",
            )
        if s.feasible:
            msg = ""
        elif not s.drains:
            rate = self._goal.rate_hz if self._goal is not None else math.nan
            step = self._median_step_ms()
            msg = (
                "interleaved: the queue grows: a batch waits for the training step in "
                "flight"
                + ("" if step is None else f" ({step:.0f} ms)")
                + f", and no batch size within {b:g} W keeps up with {rate:g} requests/s; "
                f"serving b={s.pair.batch_size}, about {s.served_hz(rate):.1f} requests/s"
            )
        else:
            msg = (
                f"interleaved: the latency target cannot be met under {b:g} W; serving with "
                f"the best, {s.latency_ms:.1f} ms"
            )
        return JobView(
            "tuned",
            msg,
            s.feasible,
            b,
            batch_size=size,
            best_latency_ms=s.best_latency_ms,
            gate="managed",
        )

    def culprit(self) -> tuple[str | None, PowerMode | None]:
        if self.alone is not None:
            return self.alone.culprit()
        return self._train_id() or self._inf_id(), self.mode

    def release(self, job_ids: Sequence[str] | None, message: str) -> None:
        ids = list(self.train) + list(self.inf.jobs) if job_ids is None else list(job_ids)
        for i in ids:
            self.released[i] = message
        self.inf.release(job_ids, message)
        self.probe, self.served, self.mode = None, None, None
        self.alone = None  # the control loop gives the board back

    def resume(self, job_ids: Sequence[str] | None = None) -> None:
        for i in list(self.released) if job_ids is None else job_ids:
            self.released.pop(i, None)
        self.inf.resume(job_ids)

    def describe(self) -> dict[str, Any] | None:
        if self.shared:
            d = dict(self.inf.describe() or {})
            js = self.inf.joint_served
            d.update(
                planner="interleave",
                training_job=self._train_id(),
                throughput_bound_hz=None if js is None else js.throughput_hz,
            )
            return d
        if self.alone is not None:
            d = self.alone.describe() or {}
            return {
                **d,
                "planner": "interleave",
                # the interleaving's own state; the training tuner's is `training_state`
                "state": "waiting for batches",
                "training_state": d.get("state"),
                "training_job": self._train_id(),
                "inference_job": self._inf_id(),
                "waiting_for_batches": True,
            }
        s = self.served
        return {
            "planner": "interleave",
            "training_job": self._train_id(),
            "inference_job": self._inf_id(),
            "budget_w": self.budget_w,
            "state": "profiling" if s is None else "tuned",
            "committed": None if s is None else s.pair.mode.as_dict(),
            "batch_size": self.batch_size,
            "feasible": None if s is None else s.feasible,
            "joint_probes": self.probes,
            "throughput_bound_hz": None if s is None else s.throughput_hz,
        }

    def job_extra(self, job_id: str) -> dict[str, Any]:
        if self.shared and job_id in self.inf.jobs:
            out = {**self.inf.job_extra(job_id), "interleaved": True}
            step = self._median_step_ms()
            if out.get("p99_latency_ms") is not None and step is not None:
                out["p99_latency_ms"] += step  # and one training step
            return out
        if job_id in self.inf.jobs:
            out = self.inf.job_extra(job_id)
            out["batch_size"] = self.batch_size
            out["interleaved"] = True
            out["p99_latency_ms"] = self._p99_latency(out)
            if self.served is not None:
                out["predicted_latency_ms"] = self.served.latency_ms
                out["best_latency_ms"] = self.served.best_latency_ms
                out["queue_grows"] = not self.served.drains
            return out
        if job_id == self._train_id():
            recent = [h for h in self.holds if h[1] >= time.monotonic() - 5.0]
            rate = None
            if len(recent) >= 3:
                rate = (len(recent) - 1) / max(1e-6, recent[-1][1] - recent[0][1])
            return {
                "interleaved": True,
                "steps_per_s": rate,
                "throughput_bound_hz": self._bound(),
            }
        return {}

    # ---- internals -----------------------------------------------------------------------
    def _no_batches(self, ij: Any, now: float) -> bool:
        """The inference job runs no batches: none since it registered (steps counts the
        ones run before this planner took over), or none for a while (a server idle at
        night): `rate_drift_s`, and at least 4 batch intervals at its rate."""
        if not ij.batches:
            return not ij.active and ij.spec.steps == 0
        return self.inf.quiet_for(ij, now) is not None

    def _train_alone(self, tr: tuple[JobSpec, Any], ij: Any, now: float) -> None:
        """No batch yet: tune the training job as if it were alone (a known budget goes
        straight to its remembered mode), and offer the inference job the smallest batch
        size, the lowest latency while nothing is measured together."""
        if self.alone is None:
            log.info(
                "job %s runs no batches: %s has the GPU in its own mode until it does",
                ij.spec.id,
                tr[0].id,
            )
            self.alone = TrainingPlanner(self.hooks, self.spec)
            self.probe, self.served, self.mode = None, None, None
        self.alone.sync([tr[0]], self.budget_w or tr[0].budget_w, now)
        self.alone.tick(now)
        if self.batch_size is None:
            self.batch_size = min(ij.session.planner.batch_sizes)
            self.inf.batch_size[ij.spec.id] = self.batch_size

    def _p99_latency(self, extra: dict[str, Any]) -> float | None:
        """The inference job's worst case here, from what was measured: (b-1)/r + the p99
        batch time + a training step it may wait for (the median of the recent ones). The
        inference side alone knows no training step, and no pair it served itself."""
        p99, rate, b = extra.get("p99_batch_ms"), extra.get("rate_hz"), self.batch_size
        step = self._median_step_ms()
        if p99 is None or not rate or not b or step is None:
            return None
        return float(worst_latency_ms(b, rate, p99)) + step

    def _median_step_ms(self) -> float | None:
        """The training job's recent step time at the gate (None before any)."""
        steps = [(end - start) * 1000.0 for start, end in list(self.holds)[-64:]]
        return float(np.median(steps)) if steps else None

    def _bound(self) -> float | None:
        if self.shared:
            js = self.inf.joint_served
            return None if js is None else js.throughput_hz
        return None if self.served is None else self.served.throughput_hz

    def _training_side(self, tr: tuple[JobSpec, Any], active: list[Any]) -> TrainingSide:
        """The training job for the shared solve: predicted over the grid (its fitted
        model, else the inference model scaled by what was measured of it), and measured."""
        joint = self.joint_train.setdefault(tr[0].workload, {})
        measured = {**tr[1].samples, **joint}
        key = (tr[0].id, id(tr[1].predictor), len(measured), len(active[0].samples))
        if self._side is not None and key == self._side_key:
            return self._side
        pred = tr[1].predictor
        if pred is None:
            sizes = active[0].session.planner.batch_sizes
            pred = _RatioTrainPredictor(
                self.inf._fitter_or_new()(active[0].samples), max(sizes), measured
            )
        t, p = pred.predict(self.modes)
        holds = [] if self._side is None else self._side.holds
        self._side = TrainingSide(
            tr[0].id,
            np.asarray(t, float),
            np.asarray(p, float),
            measured,
            joint.__setitem__,
            holds,
        )
        self._side_key = key
        return self._side

    def _train_job(self) -> tuple[JobSpec, Any] | None:
        live = [v for i, v in self.train.items() if i not in self.released]
        return min(live, key=lambda v: v[0].registered) if live else None

    def _train_id(self) -> str | None:
        tr = self._train_job()
        return None if tr is None else tr[0].id

    def _inf_id(self) -> str | None:
        ij = self.inf._driver()
        return None if ij is None else ij.spec.id

    def _current_goal(self) -> InterleaveGoal | None:
        ij = self.inf._driver()
        if ij is None or self.budget_w is None:
            return None
        g = ij.session.goal
        return InterleaveGoal(g.rate_hz, self.budget_w, g.latency_ms)

    def _planner(self, sizes: tuple[int, ...]) -> InterleavePlanner:
        # the training job's fitted model as it is now: one that finishes fitting later, or
        # another training job's, makes a new planner (its predictions are cached by the
        # samples alone, which need not change when the model does)
        tr = self._train_job()
        fitted = None if tr is None else tr[1].predictor
        held = self._planners.get(sizes)
        planner = None if held is None or held[0] is not fitted else held[1]
        if planner is None:
            pair_fitter = self.fitter_factory()
            bmax = max(sizes)

            def train_fitter(samples: Mapping[PowerMode, Measurement]) -> Any:
                if fitted is not None:
                    return fitted
                return _RatioTrainPredictor(pair_fitter(self.inf._driver().samples), bmax, samples)

            planner = InterleavePlanner(
                self.modes, sizes, train_fitter, pair_fitter, max_probes=self.settings.max_pairs
            )
            self._planners[sizes] = (fitted, planner)
        return planner

    def _finish_probe(
        self,
        ij: Any,
        joint: dict[PowerMode, Measurement],
        now: float,
        over_w: float | None = None,
    ) -> None:
        """Record the probe's pair and the training steps beside it; `over_w`: the probe
        was stopped early, power over the budget (whatever ran: the mode is known not to
        fit the pair, and is not proposed again)."""
        probe = self.probe
        assert probe is not None
        if over_w is not None:
            m = probe.infer.stopped_over(over_w)
        else:
            m = pooled(
                ij.samples.get(probe.pair),
                probe.infer.measure(self.hooks.power, self.settings.sensor_lag_s),
            )
        ij.samples[m.pair] = m
        self.inf.store.save(ij.spec.workload, ij.spec.persistent)
        readings = self.hooks.power(probe.infer.applied, now)
        self.inf.store.account(ij.spec.workload, readings, self.budget_w)
        # training: the same measure over the gate's holds
        if probe.holds:
            tw = PairWindow(probe.pair, probe.infer.applied, self.spec, list(probe.holds))
            tm = tw.measure(self.hooks.power, self.settings.sensor_lag_s)
            t_tr, p_tr = tm.batch_ms, tm.power_w
        else:
            t_tr, p_tr = math.nan, math.nan
        if over_w is not None:
            p_tr = over_w if not math.isfinite(p_tr) else max(p_tr, over_w)
        joint[probe.pair.mode] = Measurement(
            probe.pair.mode, t_tr, p_tr, len(probe.holds), over_w is not None
        )
        self.probes += 1
        log.info(
            "interleaved probe %s b=%d%s: batch %s at %.2f W (%s), step %s at %.2f W",
            probe.pair.mode,
            probe.pair.batch_size,
            "" if over_w is None else " (stopped: over the budget)",
            f"p99 {m.tail_ms:.1f} ms" if math.isfinite(m.tail_ms) else "none finished",
            m.power_w,
            power_source(m, stopped=over_w is not None),
            f"{t_tr:.1f} ms" if math.isfinite(t_tr) else "none measured",
            p_tr,
        )
        self.probe = None

    def _set(self, pair: Pair) -> None:
        if pair.mode != self.mode or pair.batch_size != self.batch_size:
            for ij in self.inf.jobs.values():
                self.inf.new_pair(ij)  # the batch times status shows are this pair's
        if pair.mode != self.mode:
            self.mode = None
            self.hooks.apply_mode(pair.mode)
            self.mode = pair.mode
        self.batch_size = pair.batch_size
        ij = self.inf._driver()
        if ij is not None:
            self.inf.batch_size[ij.spec.id] = pair.batch_size


def bound_hz(b: int, rate_hz: float, t_inf_ms: float, t_tr_ms: float) -> float:
    return float(throughput_bound_hz(b, rate_hz, t_inf_ms, t_tr_ms))
