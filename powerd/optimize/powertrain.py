"""`powertrain`: predictor-guided search (PowerTrain, FGCS 2024) with measured commits.

A reference time/power predictor (ResNet-18 training on Orin AGX) is transferred to the job's
workload from a few dozen profiled modes; its predicted Pareto front then proposes modes,
and each proposal is *measured* before it is committed. One instance serves one workload
(all its budgets); like every strategy it re-derives its next step from the samples.

    seeding   measure seeds: members of the predicted front spread in power, then modes
              that cover the grid evenly; only seeds predicted (by the best model at hand)
              to draw less than budget - margin. Fit after every batch; stop early once
              the refit predicts the next batch within a few % (converged).
    fitting   Fit() whenever the samples changed since the last fit (the refit learns
              from the model's own misses: an over-budget pick moves the front).
    picking   the fastest mode predicted under the budget (measured values override
              predictions) that is predicted faster than the fastest measured fitting mode:
              Measure it. A miss (over budget, or slower) is refitted and the next pick is
              taken: this walks down the front. When no unmeasured mode promises a gain,
              Commit the fastest measured mode within the budget.

Caps: at most `max_modes` distinct modes profiled per workload (every budget counts), at
most `picks_per_budget` measurements per budget after seeding. If nothing measured fits,
the min mode is measured, then the lowest-power mode measured is committed as infeasible.

The predictor is used only through `Predictor.predict` and the `Fit` action, so the
daemon's transfer-learned model and the replay's stand-ins are interchangeable. Without a
loadable reference model the strategy runs `binary-search` instead and says so once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize.base import (
    Action,
    Commit,
    Fit,
    Measure,
    Measurement,
    Predictor,
    Strategy,
    best_within,
    fits,
)
from powerd.optimize.binary_search import BinarySearch, ModeSpaceLike, axes_of, needs_remeasure
from powerd.optimize.pareto import pareto_front

log = logging.getLogger("powerd.optimize.powertrain")

PredictorFactory = Callable[[], Predictor]


def load_reference_predictor() -> Predictor:
    """The bundled reference model (imported lazily: onnxruntime is only needed here)."""
    from powerd.predictor.reference import ReferenceModel

    return ReferenceModel.load()


# --------------------------------------------------------------------------- seed plan


def rank_grid(modes: np.ndarray, axes: Sequence[Sequence[int]]) -> np.ndarray:
    """Each mode's index along each axis, scaled to [0, 1] (every knob counts alike)."""
    out = np.zeros(modes.shape, dtype=np.float64)
    for j, ax in enumerate(axes):
        pos = np.searchsorted(np.asarray(ax), modes[:, j])
        out[:, j] = pos / max(len(ax) - 1, 1)
    return out


def spread_order(values: np.ndarray) -> list[int]:
    """Positions of `values` in an order whose every prefix is spread out (maximin in 1-D):
    the middle first, then the ends, then the middles of the gaps."""
    n = len(values)
    if n == 0:
        return []
    chosen = [int(np.argmin(np.abs(values - np.median(values))))]
    dist = np.abs(values - values[chosen[0]])
    while len(chosen) < n:
        i = int(np.argmax(dist))
        if dist[i] <= 0 and i in chosen:
            i = next(k for k in range(n) if k not in chosen)
        chosen.append(i)
        dist = np.minimum(dist, np.abs(values - values[i]))
        dist[chosen] = -1.0
    return chosen


def seed_plan(
    pred_time: np.ndarray, pred_power: np.ndarray, coords: np.ndarray, k: int, front_share: float
) -> list[int]:
    """k mode indices: `front_share` of them on the predicted front (spread in power), the
    rest covering the grid (maximin in rank space, around those already chosen). The order
    interleaves the two so that any prefix is both front-heavy and spread out."""
    front = pareto_front(pred_time, pred_power)
    n_front = min(len(front), max(1, round(k * front_share))) if k > 0 else 0
    if n_front:
        targets = np.linspace(pred_power[front[0]], pred_power[front[-1]], n_front)
        picks = front[np.searchsorted(pred_power[front], targets).clip(0, len(front) - 1)]
        picks = np.array(list(dict.fromkeys(int(i) for i in picks)))
        front_sel = [int(picks[i]) for i in spread_order(pred_power[picks])]
    else:
        front_sel = []
    dist = np.full(len(coords), np.inf)
    for i in front_sel:
        dist = np.minimum(dist, np.sum((coords - coords[i]) ** 2, axis=1))
    cover: list[int] = []
    while len(front_sel) + len(cover) < min(k, len(coords)):
        if not front_sel and not cover:
            i = int(np.argmin(np.sum((coords - 0.5) ** 2, axis=1)))  # the grid's centre
        else:
            i = int(np.argmax(dist))
        cover.append(i)
        dist = np.minimum(dist, np.sum((coords - coords[i]) ** 2, axis=1))
    plan: list[int] = []
    for a, b in zip(front_sel, cover, strict=False):
        plan += [a, b]
    longer = front_sel if len(front_sel) > len(cover) else cover
    plan += longer[min(len(front_sel), len(cover)) :]
    return list(dict.fromkeys(plan))


# --------------------------------------------------------------------------- strategy


class PowerTrain(Strategy):
    name = "powertrain"

    def __init__(
        self,
        space: ModeSpaceLike,
        predictor_factory: PredictorFactory | None = None,
        max_modes: int = 50,
        *,
        seed_share: float = 0.4,
        front_share: float = 0.5,
        batch: int = 5,
        seed_margin_w: float = 1.0,
        seed_margin_rel: float = 0.05,
        pick_margin_w: float = 0.0,
        min_gain: float = 0.01,
        picks_per_budget: int = 8,
        converged_time: float = 0.05,
        converged_power: float = 0.03,
        local_width: float = 0.12,
        local_shrink: float = 0.5,
        room_share: float = 1.0,
        noise_time: float = 0.02,
        noise_power_w: float = 0.2,
        time_doubt0: float = 0.08,
        power_doubt0: float = 1.0,
        miss_window: int = 12,
        min_fit_prob: float = 0.5,
        ration: float = 0.0,
    ):
        self.space = space
        self.axes = axes_of(space)
        self.modes_array = np.asarray(space.as_array(), dtype=np.int64).reshape(-1, 4)
        self.mode_list = [PowerMode(*map(int, r)) for r in self.modes_array]
        self.index = {m: i for i, m in enumerate(self.mode_list)}
        self.coords = rank_grid(self.modes_array, self.axes)
        self.rank_idx = np.stack(
            [np.searchsorted(np.asarray(ax), self.modes_array[:, j]) for j, ax in enumerate(self.axes)],
            axis=1,
        )
        self.factory = predictor_factory or load_reference_predictor
        self.max_modes = max(1, int(max_modes))
        self.n_seeds = max(1, min(self.max_modes - 1, round(seed_share * self.max_modes)))
        self.front_share = front_share
        self.batch = max(1, batch)
        self.seed_margin_w = seed_margin_w
        self.seed_margin_rel = seed_margin_rel
        self.pick_margin_w = pick_margin_w
        self.min_gain = min_gain
        self.picks_per_budget = picks_per_budget
        self.converged_time = converged_time
        self.converged_power = converged_power
        self.local_width = local_width
        self.local_shrink = local_shrink
        self.room_share = room_share
        self.noise_time = noise_time
        self.noise_power_w = noise_power_w
        self.time_doubt0 = time_doubt0
        self.miss_window = miss_window
        self.power_doubt0 = power_doubt0
        self.min_fit_prob = min_fit_prob
        self.ration = ration

        self._reference: Predictor | None = None
        self._ref_pred: tuple[np.ndarray, np.ndarray] | None = None
        self._plan: list[int] | None = None
        self._fallback: BinarySearch | None = None
        self._fitted: Predictor | None = None
        self._fit_pred: tuple[np.ndarray, np.ndarray] | None = None
        self._fitted_on: frozenset[PowerMode] | None = None
        self._fit_asked_on: frozenset[PowerMode] | None = None
        self._fit_failed_on: frozenset[PowerMode] | None = None
        self._converged = False
        self._budget: float | None = None
        self._picks = 0  # picks measured for the current budget
        self._scored: set[PowerMode] = set()
        self._misses_t: list[float] = []  # log(measured / predicted) before it was measured
        self._misses_p: list[float] = []  # W

    # -- predictor plumbing ---------------------------------------------------------------
    def on_fitted(self, predictor: Predictor) -> None:
        self._fitted = predictor
        self._fit_pred = None
        # The fit covers the samples of the Fit we asked for; a predictor handed over
        # without one (loaded from the store) is taken to cover what we have next call.
        self._fitted_on = self._fit_asked_on
        self._fit_asked_on = None

    def _reference_ready(self) -> bool:
        if self._ref_pred is not None:
            return True
        if self._fallback is not None:
            return False
        try:
            self._reference = self.factory()
            self._ref_pred = self._predict(self._reference)
        except Exception as exc:  # noqa: BLE001 - any failure: degrade, never stop the job
            log.warning("no reference predictor (%s): using binary-search instead", exc)
            self._fallback = BinarySearch(self.space)
            return False
        return True

    def _predict(self, predictor: Predictor) -> tuple[np.ndarray, np.ndarray]:
        t, p = predictor.predict(self.modes_array)
        t = np.asarray(t, dtype=np.float64).reshape(-1)
        p = np.asarray(p, dtype=np.float64).reshape(-1)
        if t.shape != (len(self.modes_array),) or p.shape != t.shape:
            raise ValueError(f"predictor returned {t.shape}/{p.shape} for {len(t)} modes")
        return t, p

    def _predictions(self) -> tuple[np.ndarray, np.ndarray]:
        """The fitted model's predictions if there is one, else the reference's."""
        if self._fitted is not None:
            if self._fit_pred is None:
                self._fit_pred = self._predict(self._fitted)
            return self._fit_pred
        assert self._ref_pred is not None
        return self._ref_pred

    # -- the Strategy interface ------------------------------------------------------------
    def next_action(self, budget_w: float, samples: Mapping[PowerMode, Measurement]) -> Action:
        if not self._reference_ready():
            assert self._fallback is not None
            return self._fallback.next_action(budget_w, samples)
        if budget_w != self._budget:
            self._budget, self._picks = budget_w, 0
        own = {k: v for k, v in samples.items() if k in self.index}
        if self._fitted is not None and self._fitted_on is None:
            self._fitted_on = frozenset(own)
        self._score_misses(own)
        return self._decide(budget_w, own)

    def _score_misses(self, own: Mapping[PowerMode, Measurement]) -> None:
        """Record how far the model at hand was off on measurements it had not seen: the
        honest error that sets how much a prediction is doubted (in-sample residuals of a
        fit are far smaller than its misses)."""
        fresh = [m for k, m in own.items() if k not in self._scored]
        if not fresh:
            return
        if self._scored:
            known = {k: v for k, v in own.items() if k in self._scored}
            t, p, _, _ = self._corrected(known)
            for m in fresh:
                if m.aborted_over_budget or not math.isfinite(m.power_w):
                    continue
                i = self.index[m.mode]
                self._misses_p.append(m.power_w - p[i])
                if math.isfinite(m.time_ms) and m.time_ms > 0 and t[i] > 0:
                    self._misses_t.append(math.log(m.time_ms / t[i]))
        self._scored.update(m.mode for m in fresh)

    def _miss(self, misses: list[float], prior: float, floor: float) -> float:
        """RMS of the recent misses, shrunk towards `prior` while there are few."""
        recent = misses[-self.miss_window :]
        k = len(recent)
        ms = (sum(x * x for x in recent) + prior * prior * 2) / (k + 2)
        return max(floor, math.sqrt(ms))

    def _decide(self, budget_w: float, own: dict[PowerMode, Measurement]) -> Action:
        room = self.max_modes - len(own)

        # 1. seeding (budget-safe), in batches with a fit after each
        if room > 0 and not self._seeding_done(own):
            unfitted = len(own) - (len(self._fitted_on) if self._fitted_on is not None else 0)
            if unfitted < self.batch:
                seed = self._next_seed(budget_w, own)
                if seed is not None:
                    return Measure(self.mode_list[seed])

        # 2. refit when the samples changed since the last fit
        if self._fit_stale(own):
            self._fit_asked_on = frozenset(own)
            return Fit()

        # 3. pick: measure the predicted best if it promises a gain, else commit
        allowance = min(self.picks_per_budget, max(1, math.ceil(room * self.room_share)))
        if room > 0 and self._picks < allowance:
            pick = self._pick(budget_w, own)
            if pick is not None:
                self._picks += 1
                return Measure(self.mode_list[pick])
        return self._conclude(budget_w, own)

    # -- seeding ------------------------------------------------------------------------
    def _seed_plan(self) -> list[int]:
        if self._plan is None:
            assert self._ref_pred is not None
            self._plan = seed_plan(
                self._ref_pred[0], self._ref_pred[1], self.coords, self.n_seeds, self.front_share
            )
        return self._plan

    def _seeding_done(self, own: Mapping[PowerMode, Measurement]) -> bool:
        if self._converged:
            return True
        plan = self._seed_plan()
        measured = sum(1 for i in plan if self.mode_list[i] in own)
        if measured >= len(plan):
            return True
        if self._fitted is not None and self._fitted_on is not None:
            fresh = [m for k, m in own.items() if k not in self._fitted_on]
            if len(fresh) >= min(3, self.batch) and self._fit_matches(fresh):
                self._converged = True
                log.info("predictor converged after %d profiled modes", len(own))
                return True
        return False

    def _fit_matches(self, fresh: Sequence[Measurement]) -> bool:
        """Did the current fit predict these out-of-sample measurements within a few %?"""
        t_hat, p_hat = self._predictions()
        te, pe = [], []
        for m in fresh:
            if m.aborted_over_budget:
                continue
            i = self.index[m.mode]
            if math.isfinite(m.time_ms):
                te.append(abs(t_hat[i] / m.time_ms - 1.0))
            if math.isfinite(m.power_w):
                pe.append(abs(p_hat[i] / m.power_w - 1.0))
        if len(te) < 3 or len(pe) < 3:
            return False
        return bool(np.median(te) <= self.converged_time and np.median(pe) <= self.converged_power)

    def _seed_margin(self, budget_w: float) -> float:
        margin = max(self.seed_margin_w, self.seed_margin_rel * budget_w)
        return margin if self._fitted is None else margin / 2

    def _next_seed(self, budget_w: float, own: Mapping[PowerMode, Measurement]) -> int | None:
        """The next unmeasured seed predicted (by the best model at hand) to stay under the
        budget by a margin. With no sample at all and no such seed (the reference reads
        high on this board), the seed predicted to draw least: a first anchor for the fit."""
        _, p_hat = self._predictions()
        limit = budget_w - self._seed_margin(budget_w)
        plan = self._seed_plan()
        for i in plan:
            if self.mode_list[i] not in own and p_hat[i] <= limit:
                return i
        if not own:
            return min(plan, key=lambda i: p_hat[i])
        return None

    # -- fitting ------------------------------------------------------------------------
    def _fit_stale(self, own: Mapping[PowerMode, Measurement]) -> bool:
        current = frozenset(own)
        if not current or current == self._fitted_on:
            return False
        if self._fit_asked_on == current or self._fit_failed_on == current:
            # We asked for exactly this fit and got no predictor back: it failed. Go on
            # with the model at hand rather than asking forever.
            self._fit_failed_on, self._fit_asked_on = current, None
            return False
        return True

    # -- local correction ---------------------------------------------------------------
    def _corrected(
        self, own: Mapping[PowerMode, Measurement]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(time, power, time doubt, power doubt) over the mode space.

        The model's predictions nudged by the residuals of nearby measured modes (a kernel
        average in rank space, shrunk towards no correction): the local misses a global
        refit cannot bend to. The doubts are the model's typical miss on the measured modes
        (relative for time, W for power), fading out next to a measured mode."""
        t_hat, p_hat = self._predictions()
        n = len(t_hat)
        # Power residuals include aborted windows: their mean power is the model's miss
        # that matters most (an over-budget pick), even if a refit leaves them out.
        ip, rp, it, rt = [], [], [], []
        for mode, m in own.items():
            if not math.isfinite(m.power_w):
                continue
            i = self.index[mode]
            ip.append(i)
            rp.append(m.power_w - p_hat[i])
            if not m.aborted_over_budget and math.isfinite(m.time_ms) and m.time_ms > 0 < t_hat[i]:
                it.append(i)
                rt.append(math.log(m.time_ms / t_hat[i]))
        if not ip:
            return t_hat, p_hat, np.full(n, self.time_doubt0), np.full(n, self.power_doubt0)
        wp = self._kernel(ip)
        p = p_hat + wp @ np.array(rp) / (wp.sum(axis=1) + self.local_shrink)
        t = t_hat
        wt = wp[:, [ip.index(i) for i in it]]
        if it:
            t = t_hat * np.exp(wt @ np.array(rt) / (wt.sum(axis=1) + self.local_shrink))
        far = np.sqrt(np.clip(1.0 - wp.max(axis=1), 0.0, 1.0))
        far_t = np.sqrt(np.clip(1.0 - wt.max(axis=1), 0.0, 1.0)) if it else np.ones(n)
        miss_t = self._miss(self._misses_t, self.time_doubt0, self.noise_time)
        miss_p = self._miss(self._misses_p, self.power_doubt0, self.noise_power_w)
        doubt_t = self.noise_time + miss_t * far_t
        doubt_p = self.noise_power_w + miss_p * far
        return t, p, doubt_t, doubt_p

    def _kernel(self, rows: Sequence[int]) -> np.ndarray:
        """(N, k) similarity of every mode to the modes `rows`, in rank space."""
        d2 = ((self.coords[:, None, :] - self.coords[None, list(rows), :]) ** 2).sum(axis=2)
        return np.exp(-d2 / (2.0 * self.local_width**2))

    # -- picking ------------------------------------------------------------------------
    def _pick(self, budget_w: float, own: Mapping[PowerMode, Measurement]) -> int | None:
        """The open mode with the best expected gain over the fastest measured fitting mode,
        weighted by its chance to fit the budget; None when no mode promises `min_gain`."""
        t, p, dt, dp = self._corrected(own)
        open_ = np.ones(len(t), dtype=bool)
        for mode, m in own.items():
            i = self.index[mode]
            if needs_remeasure(m, budget_w):
                continue
            open_[i] = False
            # Power and time are monotone enough in every knob to prune by dominance: a mode
            # at or above (every knob) one measured over the budget is over too; one at or
            # below a measured mode that fits is no faster than it.
            if m.power_w > budget_w:
                open_ &= ~np.all(self.rank_idx >= self.rank_idx[i], axis=1)
            elif fits(m, budget_w) and math.isfinite(m.time_ms):
                open_ &= ~np.all(self.rank_idx <= self.rank_idx[i], axis=1)
        cand = np.flatnonzero(open_ & np.isfinite(t) & (t > 0) & (p <= budget_w + 2 * dp))
        if cand.size == 0:
            return None
        fit_p = _norm_cdf((budget_w - self.pick_margin_w - p[cand]) / dp[cand])
        keep = fit_p >= self.min_fit_prob
        cand, fit_p = cand[keep], fit_p[keep]
        if cand.size == 0:
            return None
        best = best_within(own, budget_w)
        if best is None:
            # nothing fits yet: the fastest mode more likely in than out
            ok = cand[fit_p >= 0.5]
            if ok.size == 0:
                return None
            return int(ok[np.lexsort((ok, p[ok], t[ok]))[0]])
        z = (math.log(best.time_ms) - np.log(t[cand])) / dt[cand]
        gain = dt[cand] * (z * _norm_cdf(z) + _norm_pdf(z))  # expected log-time improvement
        score = gain * fit_p
        k = int(np.argmax(score))
        # Ration the workload's remaining profiling room: the emptier it gets, the larger
        # the gain a new measurement must promise.
        room = max(1, self.max_modes - len(own))
        if score[k] < self.min_gain * max(1.0, self.ration * self.max_modes / room):
            return None
        return int(cand[k])

    def _conclude(self, budget_w: float, own: Mapping[PowerMode, Measurement]) -> Action:
        best = best_within(own, budget_w)
        if best is not None:
            return Commit(best.mode)
        lowest = PowerMode(*(a[0] for a in self.axes))
        m = own.get(lowest)
        if m is None or needs_remeasure(m, budget_w):
            return Measure(lowest)
        if fits(m, budget_w):  # fits, but its time is unknown: still the one to hold
            return Commit(lowest)
        finite = [s for s in own.values() if math.isfinite(s.power_w)]
        if not finite:
            return Commit(lowest, feasible=False)
        return Commit(min(finite, key=lambda s: s.power_w).mode, feasible=False)


def _norm_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + _erf(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)))


def _norm_pdf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf, scipy is not a dep."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))

