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

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement, Predictor
from powerd.optimize.inference import (
    DRAIN_FRACTION,
    InferenceGoal,
    Pair,
    PairMeasurement,
    PairPredictor,
    pair_grid,
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

    @property
    def best_latency_ms(self) -> float | None:
        return None if self.feasible else self.latency_ms


InterleaveAction = MeasureJoint | ServeJoint


class InterleavePlanner:
    """Joint (mode, b) for one training and one inference workload.

    `train_fitter(samples)` / `pair_fitter(samples)` return the fitted training predictor
    (modes -> time, power) and inference pair predictor; training samples are keyed by mode
    (:class:`powerd.optimize.base.Measurement`, e.g. the training tuner's), inference
    samples by pair. A joint candidate counts as measured when both are.
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

    def predictions(
        self,
        train: Mapping[PowerMode, Measurement],
        infer: Mapping[Pair, PairMeasurement],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(t_inf, p_inf, t_tr, p_tr) over the grid."""
        t_i, p_i = self.pair_fitter(infer).predict(self.grid_modes, self.grid_b)
        t_m, p_m = self.train_fitter(train).predict(self.modes)
        t_tr = np.asarray(t_m, float)[self._mode_of]
        p_tr = np.asarray(p_m, float)[self._mode_of]
        return np.asarray(t_i, float), np.asarray(p_i, float), t_tr, p_tr

    def _measured_values(
        self,
        train: Mapping[PowerMode, Measurement],
        infer: Mapping[Pair, PairMeasurement],
    ) -> list[tuple[Pair, float, float, float, float]]:
        """(pair, t_inf tail, p_inf, t_tr, p_tr) of every jointly measured pair."""
        out = []
        for pair, m in infer.items():
            tr = train.get(pair.mode)
            if tr is None or pair not in self._index:
                continue
            if (
                math.isfinite(m.tail_ms)
                and math.isfinite(tr.time_ms)
                and not tr.aborted_over_budget
            ):
                out.append((pair, m.tail_ms, m.power_w, tr.time_ms, tr.power_w))
        return out

    def next_action(
        self,
        goal: InterleaveGoal,
        train: Mapping[PowerMode, Measurement],
        infer: Mapping[Pair, PairMeasurement],
        probes_used: int = 0,
    ) -> InterleaveAction:
        """`probes_used`: joint measurements already spent for this pair of workloads."""
        t_i, p_i, t_tr, p_tr = self.predictions(train, infer)
        joint = self._measured_values(train, infer)
        measured = np.zeros(len(self._pairs), dtype=bool)
        for pair, *_ in joint:
            measured[self._index[pair]] = True
        can_measure = probes_used < self.max_probes
        b = self.grid_b
        # Predicted, with margins: a candidate's measurement should fit too.
        ti_m, tt_m = t_i * (1 + self.time_margin), t_tr * (1 + self.time_margin)
        pm_i, pm_t = p_i + self.power_margin_w, p_tr + self.power_margin_w
        thr = throughput_bound_hz(b, goal.rate_hz, t_i, t_tr)
        lat = interleaved_latency_ms(b, goal.rate_hz, t_i, t_tr)
        viol = self._violation(goal, b, ti_m, tt_m, pm_i, pm_t)
        good = [
            j for j in joint if bool(_fits_arrays(goal, j[0].batch_size, j[1], j[3], j[2], j[4]))
        ]
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
        # Nothing drains within the budget: the lowest measured max power, flagged.
        if joint:
            low = min(joint, key=lambda j: max(j[2], j[4]))
            return self._serve(goal, low, False)
        i = int(np.argmin(np.where(measured, np.inf, np.maximum(p_i, p_tr))))
        return MeasureJoint(self._pairs[i])

    # -- helpers ---------------------------------------------------------------------------
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

    def _serve(self, goal: InterleaveGoal, j, feasible: bool) -> ServeJoint:
        pair, ti, pi, tt, pt = j
        return ServeJoint(
            pair,
            feasible,
            self._lat(goal, j),
            max(pi, pt),
            self._thr(goal, j),
            cycle_steps(pair.batch_size, goal.rate_hz, ti, tt),
        )


def _best(mask: np.ndarray, score: np.ndarray, tie: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return None
    return int(idx[np.lexsort((idx, tie[idx], score[idx]))[0]])
