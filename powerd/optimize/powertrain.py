"""`powertrain`: predictor-guided search (PowerTrain, FGCS 2024) that commits only measured modes.

A reference time/power predictor (ResNet-18 training on Orin AGX) is transferred to the job's
workload from profiled modes; its predictions then propose modes, and every proposal is
*measured* before it can be committed. One instance serves one workload (all its budgets):
the samples are shared, so a new budget re-uses everything measured for earlier ones.

    seeding   Measure seeds: members of the reference's predicted Pareto front spread in
              power, interleaved with modes that cover the grid evenly. Only seeds the best
              model at hand predicts under budget - margin (budget-safe); if none is, the
              min mode first. Fit after every batch; stop seeding once the refit predicts
              the next batch within a few %.
    fitting   Fit() whenever the samples changed since the last fit, so each refit learns
              from the model's own misses (the over-budget picks).
    exploring Before the picks, if every measured mode holds a knob at one level (a low
              budget's seeds at the least core count), measure the least-power mode at
              another level of it that may fit: the model has no evidence of that knob.
    floor     In a budget change, when the fastest measured modes that fit (within
              `floor_tol`) all hold one knob at one level while two other knobs vary,
              that knob is what holds them back (a floor, e.g. the memory clock): measure
              one of them with that knob a level up, the one most likely to fit, if its
              chance is at least `floor_fit_prob` (`floor_probes` per change); if none
              has it, the mode predicted fastest with that knob a level up and the
              others at or under a floor mode's (`floor_reach_prob`).
    picking   Score every unmeasured mode by its expected gain over the fastest measured
              mode that fits, times its chance to fit the budget, from the predictions
              corrected by the residuals of nearby measured modes and from the model's
              measured out-of-sample misses. Measure the best if it promises enough, else
              Commit the fastest measured mode that fits.
    refining  After the commit, while the job trains (`refine`, when the job's length
              affords it: request(expected_steps=N)): the same score, restricted to modes
              whose corrected prediction is within the budget and whose chance to fit is
              at least 1/2, with a low bar on the gain (a measurement of a near-optimal
              mode is training, not overhead). Each is measured (aborted over budget as
              any), then the fastest measured mode that fits is committed again. First,
              a faster mode that read just over the budget (`remeasure_w`) is measured
              again (up to `remeasure_looks` times): its readings are pooled, and noise
              alone may have put it over.
              When no mode passes the rule, a few long shots (`longshot_modes`): the
              best expected gain among modes the model's own power interval gives a
              chance to fit of at least 1/10.
    rehearsing A first budget whose own refine picks ran out spends what is left of its
              room on lower budgets a set_budget may bring (`rehearse_modes`): the mode
              refine would pick under each, 1 W apart below the budget, in a spread order.

Why these pieces (chosen by replaying the visible traces with the bundled reference and the
ridge transfer, tools/strategy_replay.py; the figures behind each are in docs/experiments.md,
"The powertrain strategy's knobs"):
* the transferred model misses by ~3-5 % in time and ~0.5 W in power near the front: a
  mode picked on predictions alone is often over budget or not the fastest, hence the
  measured commit, the refit after every pick, and a score that weighs gain by the chance
  to fit;
* a refit does not learn from aborted (over-budget) windows the way a measurement does: the
  residual correction here uses their power, and a mode at or above (in every knob) one
  measured over the budget is not proposed again, so a sweep cannot spend its room on
  over-budget picks;
* a low budget's seeds can all hold a knob at one level (Orin Nano at 10 W: 2 cores); the
  refit then has no evidence of that knob, and the reference's effect, from another board,
  decides whether any pick tries another level: one measured mode there settles it;
* in-sample residuals are far smaller than a fit's misses on new modes: the doubt that sets
  the chance to fit comes from the model's recorded out-of-sample misses;
* the first budget has `max_modes` of room, a pick must promise more as it empties; each
  budget change gets exactly `change_modes` modes of its own, spent on picks, not seeds, so
  a set_budget can always measure and verify its pick however many budgets came before;
  until the workload has `seed_share * max_modes` samples (a first budget low in the
  range stops after a few), its budgets are all its first: they share the `max_modes`;
* most jobs keep the budget they asked for: the first budget may spend all its room on
  picks (`first_room_share`), with a low bar on the chance to fit;
* measuring after the commit (refine) is training on a near-optimal mode, not overhead;
  it is bounded by the room of the budget it serves;
* the fitted model's time intervals set a per-mode floor on the time doubt in budget
  changes and refine (`interval_doubt_time`): a region the samples never reached is
  measured instead of trusted; the power intervals (`interval_doubt_power`) stay off,
  they raised the modes used and, in one regime, the budgets over.

Caps: at most `max_modes` distinct modes profiled for the workload's first budget (with
the budgets that follow it before it has its seeds), at most `change_modes` more per budget
change after it, and at most `picks_per_budget` picks per
budget after the first (see above). If nothing measured fits,
the min mode is measured (even past the cap: it is the safe mode) and, if it is over too,
the lowest-power mode measured is committed with feasible=False.

The predictor is used only through `Predictor.predict` and the `Fit` action, so the daemon's
transfer-learned model and the replay's stand-ins are interchangeable. Without a loadable
reference model the strategy runs `binary-search` instead and logs why, once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize.base import (
    Action,
    Fit,
    Measure,
    Measurement,
    Predictor,
    Strategy,
    best_within,
    conclude,
    fits,
    needs_remeasure,
)
from powerd.optimize.binary_search import BinarySearch, ModeSpaceLike, axes_of
from powerd.optimize.normal import norm_cdf, norm_pdf
from powerd.optimize.pareto import pareto_front

log = logging.getLogger("powerd.optimize.powertrain")

PredictorFactory = Callable[[], Predictor]
# _corrected's (time, power, time doubt, power doubt) over the mode space
Corrected = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


SWAP_WHY = "a swap neighbour of the pinned mode"


def load_reference_predictor() -> Predictor:
    """The bundled reference model (imported here: onnxruntime is only needed by this)."""
    from powerd.predictor.reference import ReferenceModel

    return ReferenceModel.load()


@dataclass(frozen=True)
class Tuning:
    """PowerTrain's knobs; the defaults are the ones chosen by replay (see module doc)."""

    seed_share: float = 0.3  # seeds: this share of max_modes
    front_share: float = 0.5  # of which on the reference's predicted front
    batch: int = 5  # seeds measured between fits
    seed_margin_w: float = 1.0  # seeds predicted under budget - max(this, rel * budget)
    seed_margin_rel: float = 0.05  # (halved once a fitted model makes the prediction)
    converged_time: float = 0.05  # seeding stops when a refit predicts new seeds this well
    converged_power: float = 0.03  # (median relative error, time and power)
    # A pick must promise an expected relative gain (times its chance to fit) of at least
    # min_gain * sqrt(max_modes / room left) * (1 + escalate * picks already made for this
    # budget): the room is shared by every budget, and later picks for one budget pay less.
    min_gain: float = 0.01
    escalate: float = 1.0
    min_fit_prob: float = 0.3  # and at least this chance to fit the budget
    pick_margin_w: float = 0.0  # aim picks this far under the budget
    picks_per_budget: int = 4
    # Every budget change after the first may profile this many new modes even when the
    # workload has used its max_modes: a set_budget always gets room to verify its pick.
    change_modes: int = 4
    room_bar: float = 1.0  # 1: the bar rises as sqrt(max_modes / room left); 0: flat
    # The workload's first budget (most jobs keep theirs) may spend this share of the room
    # left on picks, with these knobs; later budget changes use the ones above.
    first_room_share: float = 1.0
    first_escalate: float = 0.0
    first_min_fit_prob: float = 0.15
    local_width: float = 0.12  # residual correction kernel width, in rank space (0..1)
    local_shrink: float = 0.5  # ... and its shrinkage towards no correction
    global_shrink: float = 2.0  # shrinkage of the mean residual (a bias) towards none
    noise_time: float = 0.02  # measurement noise: relative time, W
    noise_power_w: float = 0.2
    time_doubt0: float = 0.08  # the model's miss before any is recorded: relative time, W
    power_doubt0: float = 1.0
    miss_window: int = 12  # recent out-of-sample misses that set the doubt
    # After a commit, while the job trains (Strategy.refine): measure modes whose chance to
    # fit the budget is at least refine_fit_prob, predicted at least refine_margin_w under
    # it, and whose expected gain (times that chance) is at least refine_gain.
    refine_fit_prob: float = 0.5
    refine_margin_w: float = 0.0
    refine_gain: float = 0.001
    # Per-mode doubt from the fitted model's own intervals (predict_interval, when it has
    # one): each mode's doubt is at least these times the sd its interval implies. The
    # out-of-sample misses above are uniform and learnt where the picks went; the
    # intervals grow with a mode's distance to the fitted samples, so a region the
    # samples never reached (e.g. every sample at one EMC clock) is doubted, and may be
    # measured, instead of trusted. 0: off. Time on at 2: after a low first budget the
    # Orin Nano's samples hold the memory clock at 665 MHz but one, at the slowest corner
    # (where it hardly matters), and the refit reads 2133 MHz ~40 % slow where it is the
    # best mode under 13-15 W; replayed, the mean penalty fell in each of the 10
    # mixed-order and raised-budget cells (docs/experiments.md, session 25). Power stays
    # off: its intervals are far wider than its misses, and widening the power doubt
    # lets over-budget picks through.
    interval_doubt_time: float = 2.0
    interval_doubt_power: float = 0.0
    # ... scaled by how many interval sds the recorded out-of-sample misses were (1: on)
    interval_calibrate: int = 1
    # ... where: 0 every pick; 1 not in the first budget's picks before its commit (only in
    # budget changes and after a commit); 2 only after a commit (refine), where a measurement
    # is training anyway and the commit stays the fastest measured mode that fits
    interval_scope: int = 1
    # The step-time objective's last stage (cheapest_meeting): measure a mode predicted to
    # meet the target at less power with at least this chance.
    step_time_fit_prob: float = 0.5
    # A knob every measured mode holds at one level (a low budget's seeds, all at 2 cores):
    # before picking on the model, measure the least-power open mode at another level of it
    # whose chance to fit is at least this (0: off). The fitted model cannot know the
    # knob's effect from such samples; it has the reference's, from another board (Orin
    # Nano 10 W: 4c/268/306/665 predicted 11.3 W, 9.88 W true, chance to fit 0.05).
    explore_fit_prob: float = 0.05
    # After a commit (refine): a measured mode faster than the pin that read over the
    # budget by at most this much (twice the power noise) is measured once more, before any
    # new mode, and its two windows pooled (base.pooled_measurement; the inference planner
    # does the same for its pairs, optimize.inference.BORDER_Z). Noise alone can put a
    # mode that fits just over; a second look adds no mode to the budget's room. Replayed
    # (docs/experiments.md, session 41), mean penalty: Orin Nano, seeds 0-7, new workload
    # 5.0 -> 4.6 %, mixed order 2.8 -> 2.0 %, raised 8.5 -> 7.8 %; ResNet-18 inference bs 1
    # new workload 1.4 -> 0.6 % (seeds 0-1), mixed 1.3 -> 1.1 % (seeds 0-5); bs 4 and 16
    # within 0.3 points; no budget over by > 0.5 W. 0: off.
    remeasure_w: float = 0.4
    # ... and by at most this many standard errors of its readings' mean, where the
    # measurement has one: a window read this far over is over (the profiler's OVER_Z
    # ends such a window early), however close to the budget
    remeasure_z: float = 3.0
    # ... at most this many more windows per mode, each pooled with the ones before while
    # the pooled reading stays a near miss: two windows pooled can land a hair over (ResNet-18
    # inference bs 16 at 18 W: 18.30 then 17.73 W, 18.02 pooled, 17.81 W true, 15 % faster
    # than the pin), and a third narrows the noise again. A mode over the budget stays
    # over: with the noise averaged down its pooled reading moves away from the budget.
    remeasure_looks: int = 2
    # After the first budget's own refine picks run out (refine), while its room lasts:
    # rehearse the lower budgets a set_budget may bring. For budgets 1 W apart below this
    # one (down to the least predicted power), taken in a spread order, measure the mode
    # refine would pick under that budget (the same chance-to-fit and gain rules), at most
    # this many. A change gets only change_modes; a model fitted on a high first budget's
    # samples can be watts off at the bottom of the range, where those few cannot find the
    # front. Each is under this budget: the job trains through it. Replayed with 30
    # modes of refine room (docs/experiments.md, session 42), budgets changing in a mixed
    # order, mean penalty: Orin Nano seeds 0-7 2.0 -> 1.5 %; ResNet-18 inference seeds 0-3
    # bs 1 1.5 -> 1.1 %, bs 4 5.3 -> 2.6 %, bs 16 3.0 -> 3.3 %; MobileNet v3 training seed 0
    # 9.3 -> 9.7 %; a new workload per budget (Orin Nano) 4.4 -> 4.2 %, with ~10 more modes
    # measured after its commit; budgets raised from the bottom: unchanged. 0: off.
    rehearse_modes: int = 12
    # After a commit (refine), once no mode passes refine's chance-to-fit rule: measure up
    # to this many long shots per budget, modes the fitted model puts over the budget but
    # with a chance to fit of at least longshot_fit_prob under its own power interval
    # (longshot_power_doubt x the sd it implies, where it is wider than the doubt refine
    # uses), for an expected gain of at least longshot_gain. Where the samples never
    # combined two knobs' levels, the model's power there is a guess: ResNet-18 inference
    # bs 16 at 19-20 W read 8c/422/522/2133 at 21.4 W (18.5 W true, 34 % faster than the
    # pin), and no later rule measured it. A long shot over the budget is cut short like
    # any window, and prunes every mode at or above it. Replayed with 30 modes of refine
    # room (docs/experiments.md, session 44). 0: off.
    longshot_modes: int = 4
    longshot_fit_prob: float = 0.1
    longshot_gain: float = 0.02
    longshot_power_doubt: float = 1.0
    # After a commit (refine), once refine's picks and the long shots have nothing: measure
    # up to this many swap neighbours of the pinned mode per budget (one knob a level up,
    # another a level down) that the model predicts faster than the pin by swap_gain,
    # whatever power it reads there. Where the samples never combined the two levels the
    # fit guesses that power: ResNet-18 inference bs 16 at 19 W pinned 4c/422/726/2133
    # (171.3 ms) and read its swap 8c/422/522/2133 (112.7 ms, 18.47 W true) at 22.0 W; the
    # long shot's interval left it no chance. A swap over the budget is cut short like any
    # window and prunes every mode at or above it. Replayed with 30 modes of refine room
    # (docs/experiments.md, session 59): that budget alone, a new workload, seeds 0-3,
    # 47-52 % -> 0 % in 4 of 4; whole sweeps, mean penalty, bs 16 2.2 -> 1.1 % (new
    # workload, seed 0), every other in-sample sweep within noise. 0: off.
    swap_modes: int = 4
    swap_gain: float = 0.0
    # 1: in a budget change, a swap comes before refine's own picks and the long shots; its
    # change_modes can run out before a swap comes up (ResNet-18 inference bs 16, a change
    # to 20 W through the daemon, session 59: four picks, then a pin 52 % slow). Replayed
    # with 30 modes of refine room (docs/experiments.md, session 60), mean penalty of the
    # five in-sample sweeps (MobileNet v3 training, Orin Nano, ResNet-18 inference bs 1, 4,
    # 16), summed: a mixed order, seed 0 18.2 -> 16.0 points, seed 1 18.1 -> 16.7; raised
    # 1 W at a time 24.3 -> 24.3; no budget over by > 0.5 W. 0: swaps come last.
    change_swap_first: int = 1
    # A budget change, before its picks: when the measured modes that fit and run within
    # floor_tol of the fastest all hold one knob at one level while at least two other
    # knobs vary among them, the step waits on that knob (a floor), whatever the others
    # do. Measure one of them with that knob a level up, the one with the best chance to
    # fit (at least floor_fit_prob), at most floor_probes per change. The fitted model
    # learnt the knob from modes that did not wait on it and reads it as worth little:
    # ResNet-18 inference bs 1, raised to 18 W, had six modes at 665 MHz of memory clock
    # within 22.5-26.0 ms over 4-12 cores and every CPU and GPU clock measured, its 2133
    # MHz samples all CPU- or GPU-bound, and the fit read 2133 MHz as 7 % faster at
    # 8c/1958/522 (the trace: 18 %). Replayed with 30 modes of refine room
    # (docs/experiments.md, session 46), mean penalty, off -> 1: budgets raised 1 W at a
    # time, Orin Nano seeds 0-7 7.8 -> 7.5 %, ResNet-18 inference seeds 0-3 bs 1 3.3 ->
    # 2.7 %, seeds 0-1 bs 4 11.7 -> 8.1 %, bs 16 4.7 -> 4.5 %; budgets in a mixed order,
    # Orin Nano 1.1 -> 1.2 %, bs 1 1.0 -> 0.5 %, bs 4 4.2 -> 4.1 %, bs 16 1.2 -> 1.3 %; a
    # new workload per budget has no change. A probe comes out of the change's modes. 0:
    # off.
    floor_probes: int = 1
    floor_tol: float = 0.06
    floor_fit_prob: float = 0.1
    # When no floor mode a level up has that chance (the reference reads the memory clock
    # at up to 7 W a level, so near the budget none does), the probe reaches below the
    # floor: of the modes with the knob a level up and every other knob at or under a
    # floor mode's, the one predicted fastest with a chance to fit of at least
    # floor_reach_prob. Replayed, raised 1 W at a time (docs/experiments.md, session 47),
    # mean penalty 0 -> 0.3: ResNet-18 inference bs 1 seeds 0-7 2.3 -> 1.7 %, bs 16 seeds
    # 0-3 4.7 -> 4.7 %, bs 4 seeds 0-3 8.8 -> 8.6 %, Orin Nano seeds 0-7 7.5 -> 7.7 %; in
    # a mixed order within 0.2 points but bs 16 (1.3 -> 2.2 %, against regular rows -0.6
    # -> 0.1 %). 0: off.
    floor_reach_prob: float = 0.3


# --------------------------------------------------------------------------- seed plan


def seed_count(max_modes: int, tuning: Tuning) -> int:
    """Seeds a workload's first budget measures (`seed_share` of its room); until it has
    that many samples, its later budgets share the first's room."""
    return max(1, min(max_modes - 1, round(tuning.seed_share * max_modes)))


def rank_grid(modes: np.ndarray, axes: Sequence[Sequence[int]]) -> np.ndarray:
    """Each mode's index along each axis, scaled to [0, 1] (every knob counts alike)."""
    return rank_index(modes, axes) / np.maximum(np.array([len(a) for a in axes]) - 1, 1)


def rank_index(modes: np.ndarray, axes: Sequence[Sequence[int]]) -> np.ndarray:
    """Each mode's index along each axis (N, 4)."""
    return np.stack(
        [np.searchsorted(np.asarray(ax), modes[:, j]) for j, ax in enumerate(axes)], axis=1
    )


def spread_order(values: np.ndarray) -> list[int]:
    """Positions of `values` in an order whose every prefix is spread out (maximin in 1-D):
    the middle first, then the ends, then the middles of the gaps."""
    n = len(values)
    if n == 0:
        return []
    chosen = [int(np.argmin(np.abs(values - np.median(values))))]
    dist = np.abs(values - values[chosen[0]]).astype(np.float64)
    dist[chosen[0]] = -1.0
    while len(chosen) < n:
        i = int(np.argmax(dist))
        chosen.append(i)
        dist = np.minimum(dist, np.abs(values - values[i]))
        dist[chosen] = -1.0
    return chosen


def plausible(pred_time: np.ndarray, pred_power: np.ndarray) -> np.ndarray:
    """Modes whose predictions are finite and not absurd: power within [1/2, 2] x the 1st /
    99th percentiles, time within [1/10, 10] x. Fires only on a reference extrapolating far
    past its corpus (1 core at 115 MHz on an Orin AGX, whose corpus starts at 2 cores and
    268 MHz, predicts ~1 W and ~1000x the time): such modes make poor seeds."""
    ok = np.isfinite(pred_time) & np.isfinite(pred_power) & (pred_time > 0) & (pred_power > 0)
    if ok.sum() < 10:
        return ok
    out = ok.copy()
    for v, factor in ((pred_time, 10.0), (pred_power, 2.0)):
        lo, hi = np.quantile(v[ok], [0.01, 0.99])
        out &= (v >= lo / factor) & (v <= hi * factor)
    return out if out.any() else ok


def seed_plan(
    pred_time: np.ndarray, pred_power: np.ndarray, coords: np.ndarray, k: int, front_share: float
) -> list[int]:
    """k mode indices: `front_share` of them on the predicted front (spread in power), the
    rest covering the grid (maximin in rank space, around those already chosen), all among
    the plausible modes. The two are interleaved so that any prefix is both front-heavy
    and spread out."""
    pool = np.flatnonzero(plausible(pred_time, pred_power))
    if pool.size == 0:
        pool = np.arange(len(coords))
    k = min(k, len(pool))
    front = pool[pareto_front(pred_time[pool], pred_power[pool])]
    n_front = min(len(front), max(1, round(k * front_share))) if k > 0 else 0
    front_sel: list[int] = []
    if n_front:
        targets = np.linspace(pred_power[front[0]], pred_power[front[-1]], n_front)
        at = np.searchsorted(pred_power[front], targets).clip(0, len(front) - 1)
        picks = np.array(list(dict.fromkeys(int(i) for i in front[at])))
        front_sel = [int(picks[i]) for i in spread_order(pred_power[picks])]
    cc = coords[pool]
    dist = np.full(len(pool), np.inf)
    for i in front_sel:
        dist = np.minimum(dist, np.sum((cc - coords[i]) ** 2, axis=1))
    cover: list[int] = []
    while len(front_sel) + len(cover) < k:
        if front_sel or cover:
            j = int(np.argmax(dist))
        else:  # no front at all: start at the grid's centre
            j = int(np.argmin(np.sum((cc - 0.5) ** 2, axis=1)))
        cover.append(int(pool[j]))
        dist = np.minimum(dist, np.sum((cc - cc[j]) ** 2, axis=1))
    plan: list[int] = []
    for a, b in zip(front_sel, cover, strict=False):
        plan += [a, b]
    n = min(len(front_sel), len(cover))
    plan += front_sel[n:] + cover[n:]
    return list(dict.fromkeys(plan))


# --------------------------------------------------------------------------- strategy


class PowerTrain(Strategy):
    """Predictor-guided search with measured commits (see module docstring)."""

    name = "powertrain"

    def __init__(
        self,
        space: ModeSpaceLike,
        predictor_factory: PredictorFactory | None = None,
        max_modes: int = 50,
        **tuning: float,
    ):
        self.space = space
        self.cfg = Tuning(**tuning)  # type: ignore[arg-type]
        self.axes = axes_of(space)
        self.modes_array = np.asarray(space.as_array(), dtype=np.int64).reshape(-1, 4)
        self.mode_list = [PowerMode(*map(int, r)) for r in self.modes_array]
        self.index = {m: i for i, m in enumerate(self.mode_list)}
        self.coords = rank_grid(self.modes_array, self.axes)
        self.rank_idx = rank_index(self.modes_array, self.axes)
        self.factory = predictor_factory or load_reference_predictor
        self.max_modes = max(1, int(max_modes))
        self.n_seeds = seed_count(self.max_modes, self.cfg)

        self._ref_pred: tuple[np.ndarray, np.ndarray] | None = None
        self._plan: list[int] | None = None
        self._fallback: BinarySearch | None = None
        self._fitted: Predictor | None = None
        self._fit_pred: tuple[np.ndarray, np.ndarray] | None = None
        self._fit_sd: tuple[np.ndarray, np.ndarray] | None = None  # interval sds (log t, W)
        self._fitted_on: frozenset[PowerMode] | None = None  # samples the fit saw
        self._fit_asked_on: frozenset[PowerMode] | None = None  # samples of the pending Fit
        self._fit_failed_on: frozenset[PowerMode] | None = None
        self._converged = False
        self._budget: float | None = None
        self._picks = 0  # picks measured for the current budget
        self._pick_cap = self.cfg.picks_per_budget
        self._first = True  # solving the workload's first budget
        self._refining = False  # picking after a commit (refine)
        self._limit = self.max_modes  # distinct modes the workload may have profiled by now
        self._scored: set[PowerMode] = set()
        self._remeasured: dict[PowerMode, int] = {}  # near misses: extra looks taken
        self._rehearsed = 0  # modes measured for budgets below the first (refine)
        self._rehearse_at = 0  # where the next rehearsal starts in the budgets' order
        self._longshots = 0  # long shots measured for the current budget (refine)
        self._swaps = 0  # swap neighbours measured for the current budget (refine)
        self._floor_probed = 0  # floor probes measured for the current budget change
        self._floor_rechecked: set[float] = set()  # see powerd.optimize.base.conclude
        self._misses_t: list[float] = []  # log(measured / predicted), before it was measured
        self._misses_p: list[float] = []  # measured - predicted, W
        self._z_t: list[float] = []  # the same misses in sds of the fitted model's interval
        self._z_p: list[float] = []

    @property
    def fallback(self) -> BinarySearch | None:
        """The binary search standing in when no reference predictor could be loaded."""
        return self._fallback

    # -- the Strategy interface ------------------------------------------------------------
    def next_action(self, budget_w: float, samples: Mapping[PowerMode, Measurement]) -> Action:
        if not self._reference_ready():
            assert self._fallback is not None
            return self._fallback.next_action(budget_w, samples)
        own = {k: v for k, v in samples.items() if k in self.index}
        if budget_w != self._budget:
            # A workload that arrives with samples (a restarted daemon, the store) is
            # changing budget, not starting: it gets a change's room, not the first's. A
            # first budget no measured mode could meet (an impossible 6 W) committed
            # nothing: the next budget is still the workload's first, with what is left of
            # the first's room (else four modes would have to build the model from the one
            # or two at the bottom of the range). Nor has a workload with fewer samples
            # than the seeds of a first budget a model yet: a budget low in its range, where
            # few modes fit, converges after 7-8 (Orin Nano 9 W), and a change to 15 W then
            # spent its four modes over the budget and pinned a 9.9 W mode at 2-3x the best
            # step time. Its budgets share the first's room until it has the seeds.
            unmet = (
                self._first
                and self._budget is not None
                and not any(fits(m, self._budget) for m in own.values())
            )
            self._first = len(own) < self.n_seeds or unmet
            self._budget, self._picks = budget_w, 0
            self._longshots = 0
            self._swaps = 0
            self._floor_probed = 0
            if not self._first:
                self._limit = len(own) + self.cfg.change_modes
            room = self._limit - len(own)
            share = self.cfg.first_room_share if self._first else 0.0
            self._pick_cap = max(self.cfg.picks_per_budget, int(share * room))
        if self._fitted is not None and self._fitted_on is None:
            self._fitted_on = frozenset(own)
        self._score_misses(own)
        return self._decide(budget_w, own)

    def refine(
        self, budget_w: float, samples: Mapping[PowerMode, Measurement], room: int
    ) -> Measure | None:
        """A mode to measure while the job trains on the pinned one (see Strategy.refine):
        within this budget's own room (the first budget's max_modes, a change's
        change_modes) and the job's `room`; only modes the model puts within the budget
        with margin, and only for an expected gain over the pinned mode. When none
        promises one, a first budget rehearses lower budgets (`_rehearse`)."""
        if self._ref_pred is None or budget_w != self._budget:
            return None
        own = {k: v for k, v in samples.items() if k in self.index}
        best = best_within(own, budget_w)
        if room <= 0 or best is None:
            return None
        again = self._near_miss(budget_w, own, best)
        if again is not None:
            looks = self._remeasured[again] = self._remeasured.get(again, 0) + 1
            over = own[again].power_w - budget_w
            nth = {1: "a second look", 2: "a third look"}.get(looks, f"look {looks + 1}")
            return Measure(again, pool=True, why=f"{nth}: read {over:.2f} W over")
        if self._limit - len(own) <= 0:
            return None
        self._score_misses(own)
        self._refining = True
        why = ""
        try:
            corrected = self._corrected(own)  # once: the rehearsed budgets read it too
            # a swap tried first and not found would not be found later in this call
            swap_first = self.cfg.change_swap_first and not self._first
            pick = self._swap(budget_w, own, best, corrected) if swap_first else None
            if pick is not None:
                why = SWAP_WHY
            if pick is None:
                pick = self._refine_pick(budget_w, own, corrected)
            if pick is None and self._longshots < self.cfg.longshot_modes:
                pick = self._longshot(budget_w, own, corrected)
                if pick is not None:
                    self._longshots += 1
                    why = "a long shot: predicted over the budget"
            if pick is None and not swap_first:
                pick = self._swap(budget_w, own, best, corrected)
                if pick is not None:
                    why = SWAP_WHY
            if pick is None and self._first:
                rehearsal = self._rehearse(budget_w, own, corrected)
                if rehearsal is not None:
                    pick, lower_w = rehearsal
                    why = f"rehearsing a {lower_w:g} W budget"
        finally:
            self._refining = False
        if pick is None:
            return None
        self._picks += 1
        self._pick_cap = max(self._pick_cap, self._picks)
        return Measure(self.mode_list[pick], why=why)

    def _floor_probe(
        self, budget_w: float, own: Mapping[PowerMode, Measurement], corrected: Corrected
    ) -> tuple[int, int, bool] | None:
        """(mode, knob, reached): a mode of the floor the fastest fitting measured modes
        share, with the knob they all hold a level up (see `floor_probes`); failing that
        (reached), the mode predicted fastest at that level among those at or under a
        floor mode in every other knob (`floor_reach_prob`). None without a floor or a
        candidate with the chance to fit."""
        c = self.cfg
        timed = [
            m
            for m in own.values()
            if fits(m, budget_w) and math.isfinite(m.time_ms) and m.time_ms > 0
        ]
        if len(timed) < 3:
            return None
        fastest = min(m.time_ms for m in timed)
        floor = self.rank_idx[
            [self.index[m.mode] for m in timed if m.time_ms <= fastest * (1.0 + c.floor_tol)]
        ]
        if len(floor) < 3:
            return None
        levels = [len(np.unique(floor[:, j])) for j in range(4)]
        t, p, _, dp = corrected
        usable = self._open(budget_w, own) & np.isfinite(p) & np.isfinite(t) & (t > 0)
        best, best_prob = None, -1.0
        held: list[tuple[int, np.ndarray]] = []  # (knob, usable modes with it a level up)
        for j in range(4):
            if levels[j] != 1 or sum(n > 1 for k, n in enumerate(levels) if k != j) < 2:
                continue
            up = int(floor[0, j]) + 1
            if up >= len(self.axes[j]):
                continue
            at_up = usable & (self.rank_idx[:, j] == up)
            held.append((j, at_up))
            for row in floor:
                i = self._mode_at([*row[:j], up, *row[j + 1 :]])
                if i is None or not at_up[i]:  # no such mode on this board, measured, pruned
                    continue
                prob = float(norm_cdf((budget_w - p[i]) / dp[i]))
                if prob > best_prob:
                    best, best_prob = (i, j, False), prob
        if best_prob >= c.floor_fit_prob:
            return best
        if c.floor_reach_prob <= 0:
            return None
        for j, at_up in held:
            others = [k for k in range(4) if k != j]
            under = np.any(
                np.all(self.rank_idx[:, None, others] <= floor[None, :, others], axis=2), axis=1
            )
            cand = np.flatnonzero(at_up & under)
            cand = cand[norm_cdf((budget_w - p[cand]) / dp[cand]) >= c.floor_reach_prob]
            if cand.size:
                return int(cand[np.argmin(t[cand])]), j, True
        return None

    def _mode_at(self, levels) -> int | None:
        """The index of the mode at these levels (one per knob, along its axis); None where
        the board has no such mode."""
        knobs = (int(a[k]) for a, k in zip(self.axes, levels, strict=True))
        return self.index.get(PowerMode(*knobs))

    def _refine_pick(
        self, budget_w: float, own: Mapping[PowerMode, Measurement], corrected: Corrected
    ) -> int | None:
        """`_pick` under refine's rules (chance to fit, gain bar, margin)."""
        c = self.cfg
        return self._pick(
            budget_w,
            own,
            min_fit_prob=c.refine_fit_prob,
            bar=c.refine_gain,
            margin_w=c.refine_margin_w,
            corrected=corrected,
        )

    def _longshot(
        self, budget_w: float, own: Mapping[PowerMode, Measurement], corrected: Corrected
    ) -> int | None:
        """The mode of best expected gain whose chance to fit, under the fitted model's own
        power interval, is at least `longshot_fit_prob` (see `longshot_modes`); None when
        none promises `longshot_gain`."""
        c = self.cfg
        t, p, dt, dp = corrected
        sd = self._interval_sd()
        if sd is not None and c.longshot_power_doubt > 0:
            dp = np.fmax(dp, c.longshot_power_doubt * sd[1])  # NaN (no interval): as is
        return self._pick(
            budget_w,
            own,
            min_fit_prob=c.longshot_fit_prob,
            bar=c.longshot_gain,
            corrected=(t, p, dt, dp),
        )

    def _swap(
        self,
        budget_w: float,
        own: Mapping[PowerMode, Measurement],
        best: Measurement,
        corrected: Corrected,
    ) -> int | None:
        """The open swap neighbour of the pinned mode `best` predicted fastest, counted
        against this budget's `swap_modes`; None when they are used up or none is
        predicted faster than the pin."""
        if self._swaps >= self.cfg.swap_modes:
            return None
        t, p = corrected[0], corrected[1]
        usable = self._open(budget_w, own) & np.isfinite(t) & (t > 0) & np.isfinite(p)
        at = self.rank_idx[self.index[best.mode]]
        bar = best.time_ms * (1.0 - self.cfg.swap_gain)
        cand = []
        for up in range(4):
            for down in range(4):
                row = at.copy()
                row[up] += 1
                row[down] -= 1
                if up == down or row[up] >= len(self.axes[up]) or row[down] < 0:
                    continue
                i = self._mode_at(row)
                if i is not None and usable[i] and t[i] < bar:
                    cand.append(i)
        if not cand:
            return None
        self._swaps += 1
        return min(cand, key=lambda i: (t[i], i))

    def _rehearse(
        self, budget_w: float, own: Mapping[PowerMode, Measurement], corrected: Corrected
    ) -> tuple[int, float] | None:
        """A mode refine would pick under a lower budget (see `rehearse_modes`), and that
        budget, the rehearsed budgets taken in turn in a spread order; None when none has
        one or the rehearsals are used up."""
        if self._rehearsed >= self.cfg.rehearse_modes:
            return None
        p = corrected[1]
        finite = p[np.isfinite(p)]
        if finite.size == 0:
            return None
        budgets = np.arange(budget_w - 1.0, float(finite.min()) + 0.5, -1.0)
        order = spread_order(budgets)
        n = len(order)
        for k in range(n):
            b = float(budgets[order[(self._rehearse_at + k) % n]])
            pick = self._refine_pick(b, own, corrected)
            if pick is not None:
                self._rehearse_at = (self._rehearse_at + k + 1) % n
                self._rehearsed += 1
                return pick, b
        return None

    def _near_miss(
        self, budget_w: float, own: Mapping[PowerMode, Measurement], best: Measurement
    ) -> PowerMode | None:
        """The fastest measured mode, faster than `best` by more than the time noise, whose
        reading put it over the budget by at most `remeasure_w` (over the square root of
        the windows pooled in it) and `remeasure_z` of its standard errors, measured again
        fewer than `remeasure_looks` times: a near miss another window may show fits.
        None: no such mode."""
        c = self.cfg
        if c.remeasure_w <= 0:
            return None
        cand = []
        for m in own.values():
            looks = self._remeasured.get(m.mode, 0)
            # 1 + looks windows pooled: the noise, and so the margin, shrinks as 1/sqrt of that
            margin_w = c.remeasure_w / math.sqrt(1 + looks)
            if (
                looks < c.remeasure_looks
                and not m.aborted_over_budget
                and math.isfinite(m.time_ms)
                and budget_w < m.power_w <= budget_w + margin_w
                and (m.power_se_w is None or m.power_w - budget_w <= c.remeasure_z * m.power_se_w)
                and m.time_ms < best.time_ms * (1.0 - c.noise_time)
            ):
                cand.append(m)
        if not cand:
            return None
        return min(cand, key=lambda m: m.time_ms).mode

    def cheapest_meeting(
        self,
        step_time_ms: float,
        cap_w: float,
        samples: Mapping[PowerMode, Measurement],
        below_w: float,
    ) -> Measure | Fit | None:
        """For the step-time objective: the unmeasured mode of least predicted power among
        those the model puts at or under `step_time_ms` (with a chance of at least
        `step_time_fit_prob`) and more than the power noise under `below_w` (the lowest
        power measured to meet the target) and `cap_w`. A Fit first when the samples
        changed. None when no mode promises less power."""
        if not self._reference_ready():
            return None
        own = {k: v for k, v in samples.items() if k in self.index}
        fit = self._ask_fit(own)
        if fit is not None:
            return fit
        self._score_misses(own)
        c = self.cfg
        t, p, dt, _ = self._corrected(own)
        ok = np.isfinite(t) & (t > 0) & np.isfinite(p)
        ok &= p <= min(below_w - c.noise_power_w, cap_w)
        for mode, m in own.items():
            i = self.index[mode]
            ok[i] = False
            # a mode at or below (every knob) one measured too slow is slower still; a
            # window cut short over the cap timed too few steps to say it was slow
            ok_t = not m.aborted_over_budget and math.isfinite(m.time_ms)
            if ok_t and m.time_ms > step_time_ms:
                ok &= ~np.all(self.rank_idx <= self.rank_idx[i], axis=1)
        cand = np.flatnonzero(ok)
        if cand.size == 0:
            return None
        z = (math.log(step_time_ms) - np.log(t[cand])) / dt[cand]
        cand = cand[norm_cdf(z) >= c.step_time_fit_prob]
        if cand.size == 0:
            return None
        return Measure(self.mode_list[int(cand[np.lexsort((cand, t[cand], p[cand]))[0]])])

    def on_fitted(self, predictor: Predictor) -> None:
        self._fitted = predictor
        self._fit_pred = None
        self._fit_sd = None
        # The fit covers the samples of the Fit we asked for; a predictor handed over
        # without one (loaded from the store) is taken to cover what we have next call.
        self._fitted_on = self._fit_asked_on
        self._fit_asked_on = None

    def _decide(self, budget_w: float, own: dict[PowerMode, Measurement]) -> Action:
        room = self._limit - len(own)
        # a budget change spends its few modes on picks, not on seeds for the model
        if room > 0 and self._first and not self._seeding_done(own):
            fitted = len(self._fitted_on) if self._fitted_on is not None else 0
            if len(own) - fitted < self.cfg.batch:
                seed = self._next_seed(budget_w, own)
                if seed is not None:
                    return Measure(self.mode_list[seed])
        fit = self._ask_fit(own)
        if fit is not None:
            return fit
        if room > 0 and self._picks < self._pick_cap:
            pick = self._explore(budget_w, own)
            why, corrected = "", None
            if pick is None and not self._first and self._floor_probed < self.cfg.floor_probes:
                corrected = self._corrected(own)  # once: the pick below reads it too
                probe = self._floor_probe(budget_w, own, corrected)
                if probe is not None:
                    pick, knob, reached = probe
                    self._floor_probed += 1
                    why = f"a floor probe: the {_KNOB_NAMES[knob]} a level up"
                    why += ", the other knobs lower" if reached else ""
            if pick is None:
                pick = self._pick(budget_w, own, corrected=corrected)
            if pick is not None:
                self._picks += 1
                return Measure(self.mode_list[pick], why=why)
        lowest = PowerMode(*(a[0] for a in self.axes))
        return conclude(own, budget_w, lowest, self._floor_rechecked)

    # -- predictions ----------------------------------------------------------------------
    def _reference_ready(self) -> bool:
        if self._ref_pred is not None:
            return True
        if self._fallback is not None:
            return False
        try:
            self._ref_pred = self._predict(self.factory())
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
        """The fitted model's predictions if there is a usable one, else the reference's."""
        if self._fitted is not None and self._fit_pred is None:
            try:
                self._fit_pred = self._predict(self._fitted)
            except Exception as exc:  # noqa: BLE001
                log.error("fitted predictor failed (%s): back to the reference", exc)
                self._fitted = None
        if self._fit_pred is not None and self._fitted is not None:
            return self._fit_pred
        assert self._ref_pred is not None
        return self._ref_pred

    def _corrected(self, own: Mapping[PowerMode, Measurement]) -> Corrected:
        """(time, power, time doubt, power doubt) over the mode space.

        The model's predictions nudged by the residuals of nearby measured modes (a kernel
        average in rank space, shrunk towards no correction): the local misses a global
        refit cannot bend to. Power residuals include aborted windows. The doubts are the
        model's recent out-of-sample miss (relative for time, W for power), fading to the
        measurement noise next to a measured mode."""
        c = self.cfg
        t_hat, p_hat = self._predictions()
        n = len(t_hat)
        ip, rp, it, rt = [], [], [], []
        for mode, m in own.items():
            if not math.isfinite(m.power_w):
                continue
            i = self.index[mode]
            if not math.isfinite(p_hat[i]):
                continue
            ip.append(i)
            rp.append(m.power_w - p_hat[i])
            ok_t = not m.aborted_over_budget and math.isfinite(m.time_ms) and m.time_ms > 0
            if ok_t and math.isfinite(t_hat[i]) and t_hat[i] > 0:
                it.append(len(ip) - 1)
                rt.append(math.log(m.time_ms / t_hat[i]))
        miss_t = self._miss(self._misses_t, c.time_doubt0, c.noise_time)
        miss_p = self._miss(self._misses_p, c.power_doubt0, c.noise_power_w)
        if not ip:
            return t_hat, p_hat, np.full(n, c.noise_time + miss_t), np.full(n, miss_p)
        d2 = ((self.coords[:, None, :] - self.coords[None, ip, :]) ** 2).sum(axis=2)
        w = np.exp(-d2 / (2.0 * c.local_width**2))
        p = p_hat + _smooth(np.array(rp), w, c.global_shrink, c.local_shrink)
        far_p = np.sqrt(np.clip(1.0 - w.max(axis=1), 0.0, 1.0))
        t, far_t = t_hat, np.ones(n)
        if it:
            wt = w[:, it]
            t = t_hat * np.exp(_smooth(np.array(rt), wt, c.global_shrink, c.local_shrink))
            far_t = np.sqrt(np.clip(1.0 - wt.max(axis=1), 0.0, 1.0))
        dt, dp = c.noise_time + miss_t * far_t, c.noise_power_w + miss_p * far_p
        return t, p, *self._interval_floor(dt, dp)

    def _interval_floor(self, dt: np.ndarray, dp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The doubts raised to `interval_doubt` x the sds the fitted model's intervals
        imply (unchanged without intervals: the reference, a fit with too few samples)."""
        c = self.cfg
        if not self._refining and (c.interval_scope >= 2 or (self._first and c.interval_scope)):
            return dt, dp
        if max(c.interval_doubt_time, c.interval_doubt_power) <= 0:
            return dt, dp
        sd = self._interval_sd()
        if sd is None:
            return dt, dp
        kt = c.interval_doubt_time * self._calibration(self._z_t)
        kp = c.interval_doubt_power * self._calibration(self._z_p)
        return np.fmax(dt, kt * sd[0]), np.fmax(dp, kp * sd[1])

    def _calibration(self, z: list[float]) -> float:
        """How many interval sds the model's recent out-of-sample misses were (RMS), shrunk
        towards 1 (the interval as stated) while they are few; 1 with interval_calibrate off."""
        if not self.cfg.interval_calibrate:
            return 1.0
        recent = z[-self.cfg.miss_window :]
        return math.sqrt((sum(x * x for x in recent) + 2.0) / (len(recent) + 2))

    def _interval_sd(self) -> tuple[np.ndarray, np.ndarray] | None:
        # the sds the fitted model's intervals imply; the doubt floor and the long shots
        # each check their own knobs
        if self._fitted is None or self._fit_pred is None:
            return None
        if self._fit_sd is None:
            n = len(self.modes_array)
            sd_t = sd_p = np.full(n, np.nan)  # NaN (no interval) leaves the doubt as it is
            interval = getattr(self._fitted, "predict_interval", None)
            if interval is not None:
                try:
                    _, t_lo, t_hi, _, p_lo, p_hi = interval(self.modes_array)
                    t_lo, t_hi, p_lo, p_hi = (
                        np.asarray(v, dtype=np.float64).reshape(-1)
                        for v in (t_lo, t_hi, p_lo, p_hi)
                    )
                    if t_lo.shape == (n,) and p_lo.shape == (n,):
                        sd_t = np.log(t_hi / t_lo) / (2.0 * _Z90)
                        sd_p = (p_hi - p_lo) / (2.0 * _Z90)
                except Exception as exc:  # noqa: BLE001 - intervals are advisory
                    log.warning("fitted predictor gave no usable intervals (%s)", exc)
            self._fit_sd = (sd_t, sd_p)
        return self._fit_sd

    def _score_misses(self, own: Mapping[PowerMode, Measurement]) -> None:
        """Record how far the model at hand was off on measurements it had not seen yet:
        the honest error that sets how much a prediction is doubted."""
        fresh = [m for k, m in own.items() if k not in self._scored]
        if not fresh:
            return
        if self._scored:
            known = {k: v for k, v in own.items() if k in self._scored}
            t, p, _, _ = self._corrected(known)
            sd = self._interval_sd() if self.cfg.interval_calibrate else None
            for m in fresh:
                if not math.isfinite(m.power_w):  # a failed switch
                    continue
                i = self.index[m.mode]
                if math.isfinite(p[i]):  # aborted windows too: the misses that matter most
                    self._misses_p.append(m.power_w - float(p[i]))
                    if sd is not None and sd[1][i] > 0:
                        self._z_p.append(self._misses_p[-1] / float(sd[1][i]))
                ok_t = not m.aborted_over_budget and math.isfinite(m.time_ms) and m.time_ms > 0
                if ok_t and t[i] > 0:
                    self._misses_t.append(math.log(m.time_ms / float(t[i])))
                    if sd is not None and sd[0][i] > 0:
                        self._z_t.append(self._misses_t[-1] / float(sd[0][i]))
        self._scored.update(m.mode for m in fresh)

    def _miss(self, misses: list[float], prior: float, floor: float) -> float:
        """RMS of the recent misses, shrunk towards `prior` while they are few."""
        recent = misses[-self.cfg.miss_window :]
        ms = (sum(x * x for x in recent) + 2 * prior * prior) / (len(recent) + 2)
        return max(floor, math.sqrt(ms))

    # -- seeding ------------------------------------------------------------------------
    def _seed_plan(self) -> list[int]:
        if self._plan is None:
            assert self._ref_pred is not None
            t, p = self._ref_pred
            self._plan = seed_plan(t, p, self.coords, self.n_seeds, self.cfg.front_share)
        return self._plan

    def _seeding_done(self, own: Mapping[PowerMode, Measurement]) -> bool:
        if self._converged:
            return True
        plan = self._seed_plan()
        if all(self.mode_list[i] in own for i in plan):
            return True
        if self._fitted is not None and self._fitted_on is not None:
            fresh = [m for k, m in own.items() if k not in self._fitted_on]
            if len(fresh) >= min(3, self.cfg.batch) and self._fit_matches(fresh):
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
            if math.isfinite(m.time_ms) and m.time_ms > 0:
                te.append(abs(t_hat[i] / m.time_ms - 1.0))
            if math.isfinite(m.power_w) and m.power_w > 0:
                pe.append(abs(p_hat[i] / m.power_w - 1.0))
        if len(te) < 3 or len(pe) < 3:
            return False
        c = self.cfg
        return bool(np.median(te) <= c.converged_time and np.median(pe) <= c.converged_power)

    def _next_seed(self, budget_w: float, own: Mapping[PowerMode, Measurement]) -> int | None:
        """The next unmeasured seed the model at hand predicts under the budget by a margin.
        With nothing measured and no such seed (a low budget, or a reference that reads high
        on this board), the min mode: the safest first anchor for the fit."""
        c = self.cfg
        margin = max(c.seed_margin_w, c.seed_margin_rel * budget_w)
        if self._fitted is not None:
            margin /= 2
        _, p_hat, _, _ = self._corrected(own)
        plan = self._seed_plan()
        for i in plan:
            if self.mode_list[i] not in own and p_hat[i] <= budget_w - margin:
                return i
        if not own:
            return self.index[PowerMode(*(a[0] for a in self.axes))]
        return None

    # -- fitting ------------------------------------------------------------------------
    def _ask_fit(self, own: Mapping[PowerMode, Measurement]) -> Fit | None:
        """A Fit of these samples when the model at hand was not fitted to them."""
        if not self._fit_stale(own):
            return None
        self._fit_asked_on = frozenset(own)
        return Fit()

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

    # -- picking ------------------------------------------------------------------------
    def _open(self, budget_w: float, own: Mapping[PowerMode, Measurement]) -> np.ndarray:
        """Modes worth measuring under this budget: unmeasured (or aborted under a lower
        budget), not at/above (every knob) a mode measured over the budget, and not
        at/below a mode measured within it (power and time are monotone enough in every
        knob for this pruning; it keeps a biased power model from re-proposing the region
        it just got wrong)."""
        open_ = np.ones(len(self.mode_list), dtype=bool)
        for mode, m in own.items():
            if needs_remeasure(m, budget_w):
                continue
            i = self.index[mode]
            open_[i] = False
            if m.power_w > budget_w:
                open_ &= ~np.all(self.rank_idx >= self.rank_idx[i], axis=1)
            elif fits(m, budget_w) and math.isfinite(m.time_ms):
                open_ &= ~np.all(self.rank_idx <= self.rank_idx[i], axis=1)
        return open_

    def _explore(self, budget_w: float, own: Mapping[PowerMode, Measurement]) -> int | None:
        """For the first knob every measured mode holds at one level: the least-power open
        mode at another level of it whose chance to fit reaches `explore_fit_prob`. None
        when the measured modes moved every knob or no such mode may fit."""
        c = self.cfg
        if c.explore_fit_prob <= 0:
            return None
        measured = [self.index[m] for m, v in own.items() if math.isfinite(v.power_w)]
        if not measured:
            return None
        held = self.rank_idx[measured]
        unmoved = np.flatnonzero(np.all(held == held[0], axis=0))
        if unmoved.size == 0:  # the usual case once seeded: skip the predictions
            return None
        t, p, _, dp = self._corrected(own)
        ok = self._open(budget_w, own) & np.isfinite(t) & (t > 0) & np.isfinite(p)
        ok &= norm_cdf((budget_w - p) / dp) >= c.explore_fit_prob
        for j in unmoved:
            cand = np.flatnonzero(ok & (self.rank_idx[:, j] != held[0, j]))
            if cand.size:
                return int(cand[np.lexsort((cand, t[cand], p[cand]))[0]])
        return None

    def _pick(
        self,
        budget_w: float,
        own: Mapping[PowerMode, Measurement],
        min_fit_prob: float | None = None,
        bar: float | None = None,
        margin_w: float | None = None,
        corrected: Corrected | None = None,
    ) -> int | None:
        """The open mode with the best expected gain over the fastest measured fitting mode,
        weighted by its chance to fit; None when none promises enough. `min_fit_prob`,
        `bar` and `margin_w` (predicted power this far under the budget) override the
        pre-commit rules (refine); `corrected`: `_corrected(own)` when the caller has it."""
        c = self.cfg
        t, p, dt, dp = corrected if corrected is not None else self._corrected(own)
        usable = self._open(budget_w, own) & np.isfinite(t) & (t > 0) & np.isfinite(p)
        if margin_w is not None:
            usable &= p <= budget_w - margin_w
        cand = np.flatnonzero(usable)
        if cand.size == 0:
            return None
        fit_p = norm_cdf((budget_w - c.pick_margin_w - p[cand]) / dp[cand])
        if min_fit_prob is None:
            min_fit_prob = c.first_min_fit_prob if self._first else c.min_fit_prob
        keep = fit_p >= min_fit_prob
        cand, fit_p = cand[keep], fit_p[keep]
        if cand.size == 0:
            return None
        best = best_within(own, budget_w)
        if best is None:  # nothing fits yet: the fastest mode more likely in than out
            return int(cand[np.lexsort((cand, p[cand], t[cand]))[0]])
        z = (math.log(best.time_ms) - np.log(t[cand])) / dt[cand]
        gain = dt[cand] * (z * norm_cdf(z) + norm_pdf(z))  # E[log-time improvement]
        score = gain * fit_p
        k = int(np.argmax(score))
        if bar is not None:
            return int(cand[k]) if score[k] >= bar else None
        escalate = c.first_escalate if self._first else c.escalate
        bar = c.min_gain * (1.0 + escalate * self._picks)
        if self._first:
            room = max(1, self._limit - len(own))
            bar *= math.sqrt(self.max_modes / room) ** c.room_bar
        return int(cand[k]) if score[k] >= bar else None


# --------------------------------------------------------------------------- numerics

_KNOB_NAMES = ("core count", "CPU clock", "GPU clock", "memory clock")  # PowerMode's order
_Z90 = 1.6448536  # a two-sided 90 % normal interval is +- this many sds (INTERVAL_COVERAGE)


def _smooth(resid: np.ndarray, w: np.ndarray, global_shrink: float, local_shrink: float):
    """Correction per mode from residuals at measured modes: their shrunk mean (a bias the
    model keeps, e.g. a refit that never sees aborted windows), plus a kernel average of
    what is left (local misses)."""
    bias = resid.sum() / (len(resid) + global_shrink)
    rest = resid - bias
    return bias + w @ rest / (w.sum(axis=1) + local_shrink)
