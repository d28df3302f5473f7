"""The interleaving planner: one power mode and batch size for a training job and an
inference job sharing the GPU under managed interleaving. Pure, like the other planners.

The GPU runs one thing at a time. Per cycle of b/r s (one batch's fill time) it runs one
inference batch; training steps fill the rest, and a batch that falls due while a step is in
flight waits for that step. So, with t_tr the training step time and t_inf the batch time at
the chosen mode (both measured alone on the GPU):

    worst-case latency   = (b-1)/r + t_tr + t_inf          <= L
    power                = max(P_tr, P_inf)                 <= B
    steps per cycle      k = floor((b/r - t_inf) / t_tr)    (a strict cycle schedule)
    work-conserving rate = (1 - r*t_inf/b) / t_tr           (the bound)

The queue must drain: t_inf <= 0.9 * b/r, and t_inf + t_tr <= b/r (a batch delayed by a
step must finish before the next falls due). The objective is the most training steps per
second; the scheduler the daemon runs is work-conserving (a step starts whenever the GPU is
free and no batch is due), so the planner maximises the bound, and reports the strict-cycle
k too. As everywhere, only a pair whose *measured* times and powers fit is served.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement, Predictor
from powerd.optimize.inference import (
    DRAIN_FRACTION,
    InferenceGoal,
    Pair,
    PairMeasurement,
    PairPredictor,
    least_mode_index,
    least_pair_row,
    pair_grid,
    power_brackets,
    with_margin,
)

# The pair's goal is the inference job's: its rate, the board's budget, its latency target.
InterleaveGoal = InferenceGoal


def interleaved_latency_ms(b, rate_hz: float, t_inf_ms, t_tr_ms):
    """(b-1)/r + t_tr + t_inf, in ms."""
    return (np.asarray(b) - 1) * 1000.0 / rate_hz + np.asarray(t_tr_ms) + np.asarray(t_inf_ms)


def throughput_bound_hz(b, rate_hz: float, t_inf_ms, t_tr_ms):
    """(1 - r*t_inf/b) / t_tr: training steps per second of a perfect work-conserving
    scheduler (0 when the batches alone fill the GPU)."""
    busy = rate_hz * np.asarray(t_inf_ms) / 1000.0 / np.asarray(b)
    return np.maximum(0.0, 1.0 - busy) / (np.asarray(t_tr_ms) / 1000.0)


def served_hz(b: int, latency_ms: float, rate_hz: float) -> float:
    """Requests per second a queue that never drains gets: one batch of b per batch and
    step, t_inf + t_tr = latency_ms - (b-1)/r (the interleaved worst case without the
    fill)."""
    busy_ms = latency_ms - (b - 1) * 1000.0 / rate_hz
    return b * 1000.0 / busy_ms if busy_ms > 0 else math.inf


def cycle_steps(b: int, rate_hz: float, t_inf_ms: float, t_tr_ms: float) -> int:
    """k = floor((b/r - t_inf) / t_tr): training steps per cycle of a strict schedule."""
    return max(0, math.floor((b * 1000.0 / rate_hz - t_inf_ms) / t_tr_ms))


def _fits_arrays(goal: InterleaveGoal, b, t_inf, t_tr, p_inf, p_tr, latency: bool = True):
    cyc = np.asarray(b) * 1000.0 / goal.rate_hz
    ok = (np.maximum(p_inf, p_tr) <= goal.budget_w) & (t_inf <= DRAIN_FRACTION * cyc)
    ok &= np.asarray(t_inf) + np.asarray(t_tr) <= cyc
    if latency and goal.latency_ms is not None:
        ok &= interleaved_latency_ms(b, goal.rate_hz, t_inf, t_tr) <= goal.latency_ms
    return ok


@dataclass(frozen=True)
class MeasureJoint:
    """Run both jobs interleaved at this mode with batches of this size; measure the
    training steps (time, power) and the inference batches (time, power) apart."""

    pair: Pair


@dataclass(frozen=True)
class ServeJoint:
    """Pin this mode and batch size. Measured values fit, unless `feasible` is False: then
    the lowest measured interleaved latency within the budget (`best_latency_ms`)."""

    pair: Pair
    feasible: bool
    latency_ms: float
    power_w: float  # max(P_tr, P_inf), measured
    throughput_hz: float  # predicted work-conserving training steps/s (from measurements)
    cycle_steps: int
    # the inference queue keeps up (a batch delayed by a step ends before the next is due);
    # False: no pair measured within the budget does, and this one serves the most
    # requests per second (latency_ms then bounds nothing: the queue grows)
    drains: bool = True

    @property
    def best_latency_ms(self) -> float | None:
        return None if self.feasible or not self.drains else self.latency_ms

    def served_hz(self, rate_hz: float) -> float:
        """Requests per second served at one batch per step: b / (t_inf + t_tr)."""
        return served_hz(self.pair.batch_size, self.latency_ms, rate_hz)


InterleaveAction = MeasureJoint | ServeJoint


# (pair, batch tail ms, batch power W, training step ms, training power W)
Reading = tuple[Pair, float, float, float, float]

# Slack over the budget for the one probe at the training job's own mode (see
# InterleavePlanner._anchor_probe): its measurement decides, and a pair that reads over the
# budget is never served.
ANCHOR_SLACK_W = 0.5


class InterleavePlanner:
    """Joint (mode, b) for one training and one inference workload.

    `train_fitter(samples)` / `pair_fitter(samples)` return the fitted training predictor
    (modes -> time, power) and inference pair predictor; training samples are keyed by mode
    (:class:`powerd.optimize.base.Measurement`, e.g. the training tuner's), inference
    samples by pair. A joint candidate counts as measured when both are. The predictions
    are refitted only when the samples change (see :meth:`predictions`); `train_fitter` may
    read the inference samples too (the daemon's scales the pair model).
    """

    def __init__(
        self,
        modes: np.ndarray | Sequence[PowerMode],
        batch_sizes: Sequence[int],
        train_fitter: Callable[[Mapping[PowerMode, Measurement]], Predictor],
        pair_fitter: Callable[[Mapping[Pair, PairMeasurement]], PairPredictor],
        *,
        max_probes: int = 30,
        time_margin: float = 0.03,
        power_margin_w: float = 0.3,
        min_gain: float = 0.02,
        explore: float = 0.15,
    ):
        (self.modes, self.batch_sizes, self.grid_modes, self.grid_b, self._pairs, self._index) = (
            pair_grid(modes, batch_sizes)
        )
        self._mode_of = np.repeat(np.arange(len(self.modes)), len(self.batch_sizes))
        self.train_fitter = train_fitter
        self.pair_fitter = pair_fitter
        self.max_probes = max_probes
        self.time_margin = time_margin
        self.power_margin_w = power_margin_w
        self.min_gain = min_gain
        self.explore = explore
        # the last predictions over the grid, keyed by the samples they were fitted to
        self._pair_cache: tuple[Any, tuple[np.ndarray, ...]] | None = None
        self._train_cache: tuple[Any, tuple[np.ndarray, ...]] | None = None

    def predictions(
        self,
        train: Mapping[PowerMode, Measurement],
        infer: Mapping[Pair, PairMeasurement],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(t_inf, p_inf, t_tr, p_tr) over the grid (read-only arrays, cached)."""
        # Refitting and predicting over the grid costs ~0.6 s (1323 pairs and the stored
        # samples; ~1.4 s cold), and the daemon asks on every tick of its one thread, which
        # must answer its clients at once: refit only when the samples changed. The keys
        # are the samples' contents (measurements are frozen and compare by value), so a
        # new or replaced measurement refits; the training side keys on both maps, as its
        # fitter may read the inference samples.
        ikey = frozenset(infer.items())
        if self._pair_cache is None or self._pair_cache[0] != ikey:
            t_i, p_i = self.pair_fitter(infer).predict(self.grid_modes, self.grid_b)
            self._pair_cache = (ikey, (_readonly(t_i), _readonly(p_i)))
        tkey = (frozenset(train.items()), ikey)
        if self._train_cache is None or self._train_cache[0] != tkey:
            t_m, p_m = self.train_fitter(train).predict(self.modes)
            t_tr = np.asarray(t_m, float)[self._mode_of]
            p_tr = np.asarray(p_m, float)[self._mode_of]
            self._train_cache = (tkey, (_readonly(t_tr), _readonly(p_tr)))
        return (*self._pair_cache[1], *self._train_cache[1])

    def _readings(
        self,
        budget_w: float,
        train: Mapping[PowerMode, Measurement],
        infer: Mapping[Pair, PairMeasurement],
    ) -> tuple[list[Reading], list[Reading]]:
        """(pair, t_inf tail, p_inf, t_tr, p_tr) of every jointly measured pair, and of every
        pair a probe read over this budget without a full joint measurement (a window
        stopped over it: NaN where nothing finished; a higher budget may try it again)."""
        joint, stopped = [], []
        for pair, m in infer.items():
            tr = train.get(pair.mode)
            if tr is None or pair not in self._index:
                continue
            values = (pair, m.tail_ms, m.power_w, tr.time_ms, tr.power_w)
            usable = math.isfinite(m.tail_ms) and math.isfinite(tr.time_ms)
            if usable and not tr.aborted_over_budget:
                joint.append(values)
            elif max(m.power_w, tr.power_w) > budget_w:
                stopped.append(values)
        return joint, stopped

    def next_action(
        self,
        goal: InterleaveGoal,
        train: Mapping[PowerMode, Measurement],
        infer: Mapping[Pair, PairMeasurement],
        probes_used: int = 0,
        anchor: PowerMode | None = None,
    ) -> InterleaveAction:
        """`probes_used`: joint measurements already spent for this pair of workloads.
        `anchor`: the training job's own mode under the budget (measured to fit, often
        within a hair of the budget, where the power margins rule out every pair)."""
        t_i, p_i, t_tr, p_tr = self.predictions(train, infer)
        # measured, or read over this budget by a probe: not proposed again (a model that
        # does not bend to a stopped reading would propose the same pair until the probes
        # ran out, each one holding the board over the budget)
        joint, stopped = self._readings(goal.budget_w, train, infer)
        measured = np.zeros(len(self._pairs), dtype=bool)
        for pair, *_ in (*joint, *stopped):
            measured[self._index[pair]] = True
        can_measure = probes_used < self.max_probes
        b = self.grid_b
        # Predicted, with margins: a candidate's measurement should fit too.
        ti_m, tt_m = t_i * (1 + self.time_margin), t_tr * (1 + self.time_margin)
        # the margins cover the models' errors; a measured bracket bounds the inference
        # power whatever they are (see power_brackets)
        top = power_brackets(self.grid_modes, b, infer)[1]
        pm_i, pm_t = with_margin(p_i, self.power_margin_w, top), p_tr + self.power_margin_w
        thr = throughput_bound_hz(b, goal.rate_hz, t_i, t_tr)
        lat = interleaved_latency_ms(b, goal.rate_hz, t_i, t_tr)
        viol = self._violation(goal, b, ti_m, tt_m, pm_i, pm_t)
        good = [
            j for j in joint if bool(_fits_arrays(goal, j[0].batch_size, j[1], j[3], j[2], j[4]))
        ]
        if anchor is not None and can_measure:
            nxt = self._anchor_probe(goal, anchor, train, good, measured, t_i, p_i, t_tr, p_tr)
            if nxt is not None:
                return MeasureJoint(self._pairs[nxt])
        if good or (can_measure and self._explorable(viol, measured)):
            if good:
                best = max(good, key=lambda j: self._thr(goal, j))
                if can_measure:
                    bound = self._thr(goal, best) * (1 + self.min_gain)
                    nxt = _best((viol == 0) & ~measured & (thr > bound), -thr, lat)
                    if nxt is not None:
                        return MeasureJoint(self._pairs[nxt])
                return self._serve(goal, best, True)
            nxt = _best((viol == 0) & ~measured, -thr, lat)
            if nxt is None:
                nxt = _best(~measured, viol, -thr)
            assert nxt is not None
            return MeasureJoint(self._pairs[nxt])
        # The latency target cannot be met: the lowest interleaved latency within budget.
        relaxed = InterleaveGoal(goal.rate_hz, goal.budget_w, None)
        ok = [
            j for j in joint if bool(_fits_arrays(relaxed, j[0].batch_size, j[1], j[3], j[2], j[4]))
        ]
        rviol = self._violation(relaxed, b, ti_m, tt_m, pm_i, pm_t)
        if ok:
            best = min(ok, key=lambda j: self._lat(goal, j))
            if can_measure:
                bound = self._lat(goal, best) * (1 - self.min_gain)
                nxt = _best((rviol == 0) & ~measured & (lat < bound), lat, -thr)
                if nxt is not None:
                    return MeasureJoint(self._pairs[nxt])
            return self._serve(goal, best, goal.latency_ms is None)
        if can_measure and self._explorable(rviol, measured):
            nxt = _best((rviol == 0) & ~measured, lat, -thr)
            if nxt is None:
                nxt = _best(~measured, rviol, lat)
            assert nxt is not None
            return MeasureJoint(self._pairs[nxt])
        # Nothing drains within the budget. While nothing measured is even within it (one
        # glitched reading can throw the refit's powers off), measure the pair predicted to
        # draw least; then serve the lowest measured max power, flagged.
        low = min(joint, key=lambda j: max(j[2], j[4])) if joint else None
        pmax = np.where(measured, np.inf, np.maximum(p_i, p_tr))
        i = int(np.argmin(pmax))
        if low is None:
            if not stopped:
                return MeasureJoint(self._pairs[i])
            # a probe stopped over the budget and none measured: the least pair once (the
            # model that proposed the first is off), then hold the pair read lowest,
            # flagged, its unknown times as predicted
            least = least_pair_row(self.modes, self.batch_sizes)
            if can_measure and not measured[least]:
                return MeasureJoint(self._pairs[least])
            q, ti, pi, tt, pt = min(stopped, key=lambda j: max(j[2], j[4]))
            k = self._index[q]
            ti = ti if math.isfinite(ti) else float(t_i[k])
            tt = tt if math.isfinite(tt) else float(t_tr[k])
            return self._serve(goal, (q, ti, pi, tt, pt), False, drains=False)
        low_w = max(low[2], low[4])
        if can_measure and low_w > goal.budget_w and np.isfinite(pmax[i]) and pmax[i] < low_w:
            return MeasureJoint(self._pairs[i])
        if can_measure and low_w > goal.budget_w:
            # the least mode at the smallest batch size, once, before holding a pair over
            # the budget: a refit on pairs that drew more can put the floor too high
            # (tried once: a training step there stopped over the budget settles it too)
            least = self._pairs[least_pair_row(self.modes, self.batch_sizes)]
            if least not in infer or least.mode not in train:
                return MeasureJoint(least)
        within = [j for j in joint if max(j[2], j[4]) <= goal.budget_w]
        if not within:
            return self._serve(goal, low, False, drains=False)
        # The queue grows whatever runs (a batch waits for a training step, and a step is
        # longer than a batch takes to fill): serve the most requests per second, one
        # batch per step, b / (t_inf + t_tr); a larger batch size predicted within the
        # budget that would serve more is measured first.
        most = max(within, key=lambda j: j[0].batch_size / (j[1] + j[3]))
        if can_measure:
            rate = b / (ti_m + tt_m)
            bound = most[0].batch_size / (most[1] + most[3]) * (1 + self.min_gain)
            nxt = _best(
                ~measured & (np.maximum(pm_i, pm_t) <= goal.budget_w) & (rate > bound), -rate, lat
            )
            if nxt is not None:
                return MeasureJoint(self._pairs[nxt])
        return self._serve(goal, most, False, drains=False)

    # -- helpers ---------------------------------------------------------------------------
    def _anchor_probe(self, goal, anchor, train, good, measured, t_i, p_i, t_tr, p_tr):
        """Once: the best pair at the training job's own mode, judged without margins and
        with ANCHOR_SLACK_W of slack (the training step as measured there, alone or here),
        if it promises more than every measured pair that fits. The margins that keep
        other guesses safe would exclude the one mode known to fit the training job,
        often within a hair of the budget."""
        rows = [self._index.get(Pair(anchor, b)) for b in self.batch_sizes]
        rows = [i for i in rows if i is not None]
        if not rows or measured[rows].any():
            return None
        m = train.get(anchor)
        if m is not None and not m.aborted_over_budget and math.isfinite(m.time_ms):
            t_tr, p_tr = t_tr.copy(), p_tr.copy()
            t_tr[rows], p_tr[rows] = m.time_ms, m.power_w
        at = np.zeros(len(self._pairs), dtype=bool)
        at[rows] = True
        slack = InterleaveGoal(goal.rate_hz, goal.budget_w + ANCHOR_SLACK_W, goal.latency_ms)
        viol = self._violation(slack, self.grid_b, t_i, t_tr, p_i, p_tr)
        thr = throughput_bound_hz(self.grid_b, goal.rate_hz, t_i, t_tr)
        lat = interleaved_latency_ms(self.grid_b, goal.rate_hz, t_i, t_tr)
        best = max((self._thr(goal, j) for j in good), default=0.0)
        return _best(at & (viol == 0) & (thr > best * (1 + self.min_gain)), -thr, lat)

    def _violation(self, goal, b, t_i, t_tr, p_i, p_tr) -> np.ndarray:
        cyc = b * 1000.0 / goal.rate_hz
        v = np.maximum(0.0, (np.maximum(p_i, p_tr) - goal.budget_w) / goal.budget_w)
        v = np.maximum(v, (t_i - DRAIN_FRACTION * cyc) / (DRAIN_FRACTION * cyc))
        v = np.maximum(v, (t_i + t_tr - cyc) / cyc)
        if goal.latency_ms is not None:
            lat = interleaved_latency_ms(b, goal.rate_hz, t_i, t_tr)
            v = np.maximum(v, (lat - goal.latency_ms) / goal.latency_ms)
        return np.where(np.isfinite(v), v, np.inf)

    def _explorable(self, viol: np.ndarray, measured: np.ndarray) -> bool:
        v = viol[~measured]
        return bool(v.size) and float(v.min()) <= self.explore

    @staticmethod
    def _thr(goal: InterleaveGoal, j) -> float:
        pair, ti, _pi, tt, _pt = j
        return float(throughput_bound_hz(pair.batch_size, goal.rate_hz, ti, tt))

    @staticmethod
    def _lat(goal: InterleaveGoal, j) -> float:
        pair, ti, _pi, tt, _pt = j
        return float(interleaved_latency_ms(pair.batch_size, goal.rate_hz, ti, tt))

    def _serve(self, goal: InterleaveGoal, j, feasible: bool, drains: bool = True) -> ServeJoint:
        pair, ti, pi, tt, pt = j
        return ServeJoint(
            pair,
            feasible,
            self._lat(goal, j),
            max(pi, pt),
            self._thr(goal, j),
            cycle_steps(pair.batch_size, goal.rate_hz, ti, tt),
            drains,
        )


def _readonly(x) -> np.ndarray:
    """A float copy that cannot be written: cached predictions are shared between calls."""
    a = np.array(x, dtype=float)
    a.flags.writeable = False
    return a


def _best(mask: np.ndarray, score: np.ndarray, tie: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return None
    return int(idx[np.lexsort((idx, tie[idx], score[idx]))[0]])


# ---- several inference jobs (and at most one training job) on one GPU ----------------------
#
# The general case of the above: N inference jobs with their own rate r_i, latency target L_i
# and batch sizes, optionally one training job, one mode for all. The GPU runs one thing at a
# time in arrival order (the daemon's gate makes it so), so a batch of job i that falls due
# may wait for one batch of every other job and one training step:
#
#     worst-case latency_i = (b_i-1)/r_i + t_i(b_i) + sum_{j != i} t_j(b_j) + t_tr   <= L_i
#     GPU share            U = sum_j r_j t_j(b_j) / b_j                            <= 0.9
#     a delayed batch ends before the next falls due: sum_j t_j + t_tr              <= b_i/r_i
#     power                = max(max_j P_j(b_j), P_tr)                              <= B
#
# Objective: with a training job, the most training steps/s, (1 - U) / t_tr (the work-
# conserving bound); inference only, the least power. With N = 1 these are the rules of
# InferencePlanner and InterleavePlanner. As everywhere, only a combination whose every part
# was *measured* (each job's pair at the mode, and the training step there) is served.


@dataclass(frozen=True)
class JointJob:
    """One inference job as the joint planner sees it: its goal (rate, the board's budget,
    its latency target), its workload's planner (the pair grid and fitted model) and
    measured pairs, and whether a new pair may be measured for it (its pair budget)."""

    goal: InferenceGoal
    planner: object  # powerd.optimize.inference.InferencePlanner
    samples: Mapping[Pair, PairMeasurement]
    can_measure: bool = True


@dataclass(frozen=True)
class JointTraining:
    """The training job: predicted step time and power per mode of the grid, and what was
    measured (keyed by mode)."""

    time_ms: np.ndarray
    power_w: np.ndarray
    measured: Mapping[PowerMode, Measurement]
    can_measure: bool = True


@dataclass(frozen=True)
class MeasureSet:
    """Run every job at this mode, job i with batches of sizes[i]; measure them all."""

    mode: PowerMode
    sizes: tuple[int, ...]


# Two power readings this close are alike: about the standard error of a window's mean at
# ~15 W (1 % sensor noise, tens of samples).
POWER_TIE_W = 0.1


@dataclass(frozen=True)
class ServeSet:
    """Serve every job at this mode with these batch sizes. Per job: its measured worst-case
    latency and whether it meets its target (`feasible`). `within_budget` False: nothing
    measured stays within the budget (the lowest power measured, flagged)."""

    mode: PowerMode
    sizes: tuple[int, ...]
    latency_ms: tuple[float, ...]
    feasible: tuple[bool, ...]
    # per job: its queue keeps up (a cycle through one batch of every job, and a training
    # step, within its own batch's fill time)
    drains: tuple[bool, ...]
    power_w: float
    gpu_share: float
    throughput_hz: float | None = None
    within_budget: bool = True


JointAction = MeasureSet | ServeSet


class JointPlanner:
    """One mode and a batch size per inference job (plus an optional training job).

    Each candidate (mode, b_1..b_N) is scored on the values known for it: measured where
    measured, else predicted with the margins (a candidate must be likely to fit when
    measured). Serves the best fully measured candidate, unless a candidate with unmeasured
    parts is predicted better by more than `min_gain` and those parts may be measured.
    Without any fit candidate it serves (and measures towards) the lowest worst latency
    relative to each target within the budget and the GPU share."""

    def __init__(
        self,
        *,
        time_margin: float = 0.03,
        power_margin_w: float = 0.3,
        min_gain: float = 0.02,
        max_share: float = DRAIN_FRACTION,
    ):
        self.time_margin = time_margin
        self.power_margin_w = power_margin_w
        self.min_gain = min_gain
        self.max_share = max_share

    def next_action(
        self, jobs: Sequence[JointJob], training: JointTraining | None = None
    ) -> JointAction:
        if not jobs:
            raise ValueError("no inference job")
        modes = jobs[0].planner.modes
        per_job = [self._values(j) for j in jobs]  # (t, p, measured, sizes), each (M, S_j)
        tvals = None if training is None else self._train_values(training, modes)
        # the best candidate of each kind so far: ((score, tie), combo, mode index)
        best: dict[str, tuple[tuple[float, float], tuple[int, ...], int]] = {}
        measured_all: list[tuple[float, float, float, tuple[int, ...], int]] = []
        # the candidates within the budget whose queues come closest to keeping up (the
        # largest of GPU share / max_share and cycle / fill time), measured and measurable
        close: dict[bool, tuple[tuple[float, float], tuple[int, ...], int]] = {}
        m_idx = np.arange(len(modes))
        for combo in itertools.product(*[range(len(v[3])) for v in per_job]):
            e = self._eval(jobs, per_job, training, tvals, combo)
            ok, fit, meas = e["ok"], e["fit"], e["measured"]
            for mask, score, tie, slot in (
                (fit & meas, e["primary"], e["worst"], "fit_measured"),
                (fit & ~meas & e["measurable"], e["primary"], e["worst"], "fit_predicted"),
                (ok & meas, e["worst"], e["primary"], "relaxed_measured"),
                (ok & ~meas & e["measurable"], e["worst"], e["primary"], "relaxed_predicted"),
            ):
                idx = m_idx[mask]
                if idx.size == 0:
                    continue
                k = idx[np.lexsort((idx, tie[idx], score[idx]))[0]]
                cand = ((float(score[k]), float(tie[k])), combo, int(k))
                if slot not in best or cand[0] < best[slot][0]:
                    best[slot] = cand
            for k in m_idx[meas & np.isfinite(e["power"])]:
                row = (float(e["power"][k]), float(e["excess"][k]), float(e["worst"][k]))
                measured_all.append((*row, combo, int(k)))
            for measured_, mask in ((True, meas), (False, ~meas & e["measurable"])):
                idx = m_idx[mask & e["within"]]
                if idx.size:
                    k = idx[np.lexsort((idx, e["power"][idx], e["excess"][idx]))[0]]
                    cand = ((float(e["excess"][k]), float(e["power"][k])), combo, int(k))
                    if measured_ not in close or cand[0] < close[measured_][0]:
                        close[measured_] = cand

        def gain(pred, cur) -> bool:
            a, b = pred[0][0], cur[0][0]
            return a < b - self.min_gain * abs(b)

        # First every target met; then (none can be) the lowest worst latency / target.
        for kind in ("fit", "relaxed"):
            meas_c, pred_c = best.get(f"{kind}_measured"), best.get(f"{kind}_predicted")
            if meas_c is not None:
                if pred_c is not None and gain(pred_c, meas_c):
                    return self._measure(per_job, pred_c, modes)
                if kind == "fit" and training is None:
                    k = self._step_down(jobs, per_job, tvals, meas_c, modes)
                    if k is not None:
                        return self._measure(per_job, (meas_c[0], meas_c[1], k), modes)
                return self._serve(jobs, per_job, training, meas_c, modes)
            if pred_c is not None:
                return self._measure(per_job, pred_c, modes)
        # No plan keeps up: only measured plans are served, so measure the one predicted to
        # come closest within the budget while it beats every measured one; then serve
        # the measured plan that comes closest (flagged), else the lowest power measured.
        near, near_meas = close.get(False), close.get(True)
        if near is not None and (near_meas is None or gain(near, near_meas)):
            return self._measure(per_job, near, modes)
        if near_meas is not None:
            return self._serve(jobs, per_job, training, near_meas, modes)
        if measured_all:
            # over the budget whatever runs: the least power measured; readings within
            # POWER_TIE_W of it are alike, and of those the one that keeps up best and has
            # the lowest latency (not b=64 over b=4 for 2.5 mW)
            least = min(r[0] for r in measured_all)
            alike = [r for r in measured_all if r[0] <= least + POWER_TIE_W]
            pw, excess, worst, combo, k = min(alike, key=lambda r: (r[1] > 1.0, r[2], r[0]))
            return self._serve(jobs, per_job, training, ((pw, 0.0), combo, k), modes)
        # Nothing measured, nothing that can be: the least mode (every knob at its lowest,
        # the least power whatever the model says: a fresh workload's predictions put it
        # at 36 W once), flagged, at the smallest batch sizes.
        sizes0 = tuple(0 for _ in jobs)
        k = least_mode_index(modes)
        return self._serve(jobs, per_job, training, ((0.0, 0.0), sizes0, k), modes)

    def _eval(self, jobs, per_job, training, tvals, combo) -> dict[str, np.ndarray]:
        """One batch size per job (`combo`, indices) at every mode: the arrays to judge by."""
        n = len(per_job[0][0])
        t = [v[0][:, c] for v, c in zip(per_job, combo, strict=True)]
        pw = [v[1][:, c] for v, c in zip(per_job, combo, strict=True)]
        meas = np.logical_and.reduce([v[2][:, c] for v, c in zip(per_job, combo, strict=True)])
        sizes = [v[3][c] for v, c in zip(per_job, combo, strict=True)]
        share = np.sum(
            [j.goal.rate_hz * ti / (b * 1000.0) for j, ti, b in zip(jobs, t, sizes, strict=True)],
            axis=0,
        )
        power = np.max(pw, axis=0)
        wait = np.sum(t, axis=0)
        measurable = np.ones(n, dtype=bool)
        for v, c, j in zip(per_job, combo, jobs, strict=True):
            if not j.can_measure:
                measurable &= v[2][:, c]
        if tvals is not None:
            tt, pt, tmeas = tvals
            power = np.maximum(power, pt)
            wait = wait + tt
            meas = meas & tmeas
            if not training.can_measure:
                measurable &= tmeas
        within = power <= min(j.goal.budget_w for j in jobs)
        ok = within & (share <= self.max_share)
        excess = share / self.max_share
        worst = np.zeros(n)  # the largest latency / target over the jobs with one
        nolat = np.zeros(n)  # the summed latency of the jobs without a target
        for j, b in zip(jobs, sizes, strict=True):
            fill_ms = b * 1000.0 / j.goal.rate_hz
            ok &= wait <= fill_ms
            excess = np.maximum(excess, wait / fill_ms)
            lat = (b - 1) * 1000.0 / j.goal.rate_hz + wait
            if j.goal.latency_ms is None:
                nolat = nolat + lat
            else:
                worst = np.maximum(worst, lat / j.goal.latency_ms)
        ok &= np.isfinite(power) & np.isfinite(wait)
        if tvals is not None:
            primary = -np.maximum(0.0, 1.0 - share) / (tvals[0] / 1000.0)
        else:
            primary = nolat * 1e3 + power  # no target: least latency first, then power
        finite = np.isfinite(power) & np.isfinite(wait)
        return {
            "ok": ok,
            "fit": ok & (worst <= 1.0),
            "measured": meas,
            "measurable": measurable,
            "primary": primary,
            "worst": worst,
            "power": power,
            "within": within & finite,
            "excess": np.where(finite, excess, np.inf),
        }

    def _step_down(self, jobs, per_job, tvals, cand, modes) -> int | None:
        """Model-free refinement of the least-power pick (as InferencePlanner does): the same
        batch sizes one step lower on one knob, if predicted to still fit and measurable."""
        _, combo, k = cand
        e = self._eval(jobs, per_job, None, tvals, combo)
        here = modes[k]
        found = []
        for axis in range(4):
            values = np.unique(modes[:, axis])
            i = int(np.searchsorted(values, here[axis]))
            if i == 0:
                continue
            down = here.copy()
            down[axis] = values[i - 1]
            hit = np.flatnonzero((modes == down).all(axis=1))
            if hit.size and e["fit"][hit[0]] and not e["measured"][hit[0]]:
                if e["measurable"][hit[0]]:
                    found.append(int(hit[0]))
        if not found:
            return None
        return min(found, key=lambda i: (float(e["primary"][i]), i))

    # -- helpers ---------------------------------------------------------------------------
    def _values(self, job: JointJob):
        """(t, p, measured, sizes): (modes, sizes) arrays of the values to judge each pair by:
        measured where measured (tail batch time, power while batches ran), else predicted
        with the margins."""
        pl = job.planner
        t, p = pl.predictions(job.samples)
        n_s = len(pl.batch_sizes)
        t = np.asarray(t, float).reshape(-1, n_s) * (1 + self.time_margin)
        p = with_margin(p, self.power_margin_w, pl.bracket_top(job.samples)).reshape(-1, n_s)
        measured = np.zeros_like(t, dtype=bool)
        col = {b: i for i, b in enumerate(pl.batch_sizes)}
        row = {tuple(m): i for i, m in enumerate(pl.modes.tolist())}
        for pair, m in job.samples.items():
            i, c = row.get(pair.mode.as_tuple()), col.get(pair.batch_size)
            if i is None or c is None:
                continue
            if not (math.isfinite(m.tail_ms) and math.isfinite(m.power_w)):
                continue
            t[i, c], p[i, c], measured[i, c] = m.tail_ms, m.power_w, True
        return t, p, measured, list(pl.batch_sizes)

    def _train_values(self, tr: JointTraining, modes: np.ndarray):
        t = np.asarray(tr.time_ms, float) * (1 + self.time_margin)
        p = np.asarray(tr.power_w, float) + self.power_margin_w
        measured = np.zeros(len(modes), dtype=bool)
        row = {tuple(m): i for i, m in enumerate(modes.tolist())}
        for mode, m in tr.measured.items():
            i = row.get(mode.as_tuple())
            if i is None or m.aborted_over_budget:
                continue
            if math.isfinite(m.time_ms) and math.isfinite(m.power_w):
                t[i], p[i], measured[i] = m.time_ms, m.power_w, True
        return t, p, measured

    @staticmethod
    def _measure(per_job, cand, modes) -> MeasureSet:
        _, combo, k = cand
        sizes = tuple(int(v[3][c]) for v, c in zip(per_job, combo, strict=True))
        return MeasureSet(PowerMode(*map(int, modes[k])), sizes)

    def _serve(self, jobs, per_job, training, cand, modes) -> ServeSet:
        _, combo, k = cand
        sizes = tuple(int(v[3][c]) for v, c in zip(per_job, combo, strict=True))
        t = [float(v[0][k, c]) for v, c in zip(per_job, combo, strict=True)]
        p = [float(v[1][k, c]) for v, c in zip(per_job, combo, strict=True)]
        wait = sum(t)
        power = max(p)
        thr = None
        share = sum(
            j.goal.rate_hz * ti / (b * 1000.0) for j, ti, b in zip(jobs, t, sizes, strict=True)
        )
        if training is not None:
            tt, pt, _ = self._train_values(training, modes)
            wait += float(tt[k])
            power = max(power, float(pt[k]))
            thr = max(0.0, 1.0 - share) / (float(tt[k]) / 1000.0)
        lats = tuple(
            (b - 1) * 1000.0 / j.goal.rate_hz + wait for j, b in zip(jobs, sizes, strict=True)
        )
        # a job's batch waits for at most one batch of each other job (the gate serves in
        # arrival order): its queue keeps up while that cycle fits in its fill time
        drains = tuple(
            wait <= b * 1000.0 / j.goal.rate_hz for j, b in zip(jobs, sizes, strict=True)
        )
        feasible = tuple(
            d and (j.goal.latency_ms is None or lat <= j.goal.latency_ms)
            for j, lat, d in zip(jobs, lats, drains, strict=True)
        )
        budget = min(j.goal.budget_w for j in jobs)
        return ServeSet(
            PowerMode(*map(int, modes[k])),
            sizes,
            lats,
            feasible,
            drains,
            power,
            share,
            thr,
            within_budget=power <= budget,
        )
