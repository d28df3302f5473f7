"""The inference planner: which (power mode, batch size) pair to measure next, and which to serve.

Pure, like the training strategies of :mod:`powerd.optimize.base`: given the goal (arrival
rate r, latency target L or none, power budget B) and every pair measured so far for the
workload, it answers at once; it never touches hardware and never waits.

A batch of b requests fills in b/r s, so the first request of a batch waits (b-1)/r s for
the batch to fill, then t_inf(mode, b) for the batch to run:

    worst-case latency = (b-1)/r + t_inf(mode, b)

A pair is *fit* for a goal when its measured worst-case latency (from the p99 batch time)
<= L, its measured median batch time <= 0.9 * b/r (the queue drains despite jitter: a
throughput condition, judged on the typical batch, while the tail is for latency) and its
measured power while batches run <= B. Objective: the fit pair of least power; without L,
the pair of least latency under B. Only pairs whose *measured* latency and power fit are
ever served; predictions only decide what to measure. When no pair can fit, the planner
serves the lowest worst-case latency under the budget and says so (``feasible=False``,
``best_latency_ms``).

Because the plan is re-derived from the samples, a rate change re-solves from what is
measured and fitted. `max_pairs` bounds the first goal's search; a re-solve (a later goal)
has a budget of its own, even past `max_pairs` (like training's few more per budget change).
A rate change measures nothing (the session's `rate_search_pairs`, RATE_CHANGE_PAIRS by
default): it serves the least-power measured pair that fits the new rate, or, when none
does, the best measured latency within the budget, flagged infeasible. A budget or latency
change measures at most RESOLVE_NEW_PAIRS pairs while a measured pair fits, to verify a
better predicted pick; with none fitting, up to RESOLVE_MAX_PAIRS, first probing the pair
predicted to drain best when no measured pair drains. An admin may let a rate change
measure too (`[inference] rate_change_pairs`: that many new pairs when no measured pair
fits, halved for every goal at least as easy that the job was already served infeasible).
Those probes go to the least-power pair whose chance to fit, from the model's stated
spread at each pair (``spread``), is at least FIT_PROB, else to the likeliest pair: the
pairs a point prediction puts just inside the goal are mostly just outside it, so
least-power-predicted-fit probes were spent at the edge. The chance ranks pairs; it is not
calibrated (at the pairs chosen it runs optimistic, as any maximum over noisy estimates
does).

Rate changes can be served from measured pairs because the measured pairs *cover the rate
axis* (see rate_cover): at the goal's latency target and budget each pair fits an interval
of arrival rates, and a new workload (once its seeds are measured), a new budget and a new
registration of a known workload measure the pairs expected to add the most rates that no
measured pair fits yet, while any is expected to add enough: at most one per batch size
plus COVER_EXTRA_PAIRS, an allowance of its own. A new workload covers once its seeds are
measured, or at once when its first goal has none (no pair is predicted to drain it).

The budget is never exceeded to serve a goal: when nothing measured is within the budget,
a re-solve whose cap is spent measures past it the pair predicted to draw least power
rather than serve a pair measured over the budget; and before it holds one over the
budget, the least pair (every knob at its lowest, the smallest batch size), once: a model
refitted on the pairs of a higher budget can put the floor too high.

At one mode, a batch size's power lies between the powers of the measured batch sizes on
either side of it (power_brackets), so the power margin that covers the model's error
never lifts a prediction over such a measured bound (with_margin).

A power reading is the mean of ~1 %-noisy sensor readings, so a pair that truly draws just
under the budget can read just over it, and on a hard goal it may be the only pair that
fits. A measured pair that fits but for a power reading within BORDER_Z standard errors
over the budget is measured again, its readings pooled with the first window's, up to
MAX_WINDOWS windows in all, when nothing measured fits (or, without a latency target,
when it would be faster). That window counts as a measurement of the goal, not as a new
pair.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize import rate_cover
from powerd.optimize.base import floor_in_doubt
from powerd.optimize.normal import norm_cdf

DRAIN_FRACTION = 0.9  # t_inf <= 0.9 * b/r: the queue drains despite jitter
# Pairs a re-solve may measure while a measured pair fits its goal: the model's pick, and one
# more if that pick fails. A rate change serves the measured fit pair as it is.
RESOLVE_NEW_PAIRS = 2
RATE_NEW_PAIRS = 0
# New pairs a rate change may measure when no measured pair fits it (the default of
# `[inference] rate_change_pairs`): none, the rate axis is covered beforehand.
RATE_CHANGE_PAIRS = 0
# Pairs a re-solve may measure when no measured pair fits its goal (past max_pairs too).
RESOLVE_MAX_PAIRS = 8
# A pair measured over the budget by less than BORDER_Z standard errors of its power
# reading, that fits otherwise, is measured again (pooled), up to MAX_WINDOWS windows.
BORDER_Z = 2.5
MAX_WINDOWS = 2
# A re-solve with no measured pair fitting measures the least-power pair whose chance to
# fit (from the model's spread) is at least FIT_PROB, else the likeliest one.
FIT_PROB = 0.5
MIN_FIT_PROB = 0.02
# Measurements a new workload or a new budget may spend covering the rate axis: one per
# batch size plus this many.
COVER_EXTRA_PAIRS = 5
# The spread (sd of the log error) assumed for a predictor that states none.
DEFAULT_SPREAD = (0.10, 0.05)
# Below this many in-batch readings a pair's power is their mean plus its standard error,
# the readings' sd taken as at least SENSOR_SD_FLOOR of their mean
# (powerd.inference_planner.in_batch_power says why).
MEAN_READINGS = 8
SENSOR_SD_FLOOR = 0.005


def readings_se(mean: float, sd: float | None, n: int) -> float:
    """Standard error of the mean of `n` power readings, their sd (None: one reading) taken
    as at least SENSOR_SD_FLOOR of the mean: a spread from few readings can read far below
    the sensor's ~1 % noise."""
    return max(sd or 0.0, SENSOR_SD_FLOOR * mean) / math.sqrt(n)


def few_readings_power(mean: float, sd: float | None, n: int) -> float:
    """The power a pair reads from `n` in-batch readings of this mean and sd (None: one
    reading): the mean from MEAN_READINGS on, else the mean plus its standard error."""
    if n <= 0 or n >= MEAN_READINGS:
        return mean
    return mean + readings_se(mean, sd, n)


def readings_mean(m: PairMeasurement) -> float:
    """The plain mean of the readings behind `m.power_w` (few_readings_power undone)."""
    n, p = m.power_n, m.power_w
    if n <= 0 or n >= MEAN_READINGS or not math.isfinite(p):
        return p
    by_sd = p - (m.power_sd_w or 0.0) / math.sqrt(n)
    if (m.power_sd_w or 0.0) >= SENSOR_SD_FLOOR * by_sd:
        return by_sd
    return p / (1.0 + SENSOR_SD_FLOOR / math.sqrt(n))


@dataclass(frozen=True, order=True)
class Pair:
    mode: PowerMode
    batch_size: int


def pair_grid(
    modes: np.ndarray | Sequence[PowerMode], batch_sizes: Sequence[int]
) -> tuple[np.ndarray, tuple[int, ...], np.ndarray, np.ndarray, list[Pair], dict[Pair, int]]:
    """Every (mode, batch size) pair, mode-major: (modes (N, 4), sorted batch sizes, each
    pair's mode row, each pair's batch size, the pairs, pair -> row)."""
    arr = np.array(
        [m.as_tuple() if isinstance(m, PowerMode) else tuple(m) for m in modes], dtype=np.int64
    )
    if arr.ndim != 2 or arr.shape[1] != 4 or len(arr) == 0:
        raise ValueError("modes must be a non-empty (N, 4) array")
    sizes = tuple(sorted({int(b) for b in batch_sizes}))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be >= 1, got {list(batch_sizes)}")
    grid_modes = np.repeat(arr, len(sizes), axis=0)
    grid_b = np.tile(np.array(sizes, dtype=np.int64), len(arr))
    pairs = [Pair(PowerMode(*map(int, m)), int(b)) for m, b in zip(grid_modes, grid_b, strict=True)]
    return arr, sizes, grid_modes, grid_b, pairs, {q: i for i, q in enumerate(pairs)}


@dataclass(frozen=True)
class PairMeasurement:
    """What was measured while serving batches of one pair."""

    pair: Pair
    batch_ms: float  # median batch time (ms); nan if none finished
    power_w: float  # mean board power while batches ran (not over the gaps between them)
    batch_p99_ms: float | None = None  # tail batch time; latency checks use it when known
    batches: int = 0
    power_sd_w: float | None = None  # spread of the single power readings behind power_w
    power_n: int = 0  # how many readings
    windows: int = 1  # measuring windows pooled into this reading
    stopped: bool = False  # its window was cut short over the budget

    @property
    def tail_ms(self) -> float:
        return self.batch_p99_ms if self.batch_p99_ms is not None else self.batch_ms

    @property
    def power_se_w(self) -> float | None:
        """Standard error of power_w (None when the readings' spread is unknown)."""
        if self.power_sd_w is None or self.power_n < 2 or not math.isfinite(self.power_sd_w):
            return None
        return self.power_sd_w / math.sqrt(self.power_n)


ReadingsKey = frozenset[tuple[Pair, PairMeasurement]]  # a cache key: every reading


def readings_key(samples: Mapping[Pair, PairMeasurement]) -> ReadingsKey:
    # the readings themselves (frozen, compared by value): a pair measured again is a new
    # reading even when its window count is unchanged (a probe cut short over the budget
    # replaces a one-window reading with another)
    return frozenset(samples.items())


def pooled(old: PairMeasurement | None, new: PairMeasurement) -> PairMeasurement:
    """One reading of a pair from two windows of it: power over all the readings (their
    spread includes the windows' difference; the standard error a window of few readings
    adds is taken off each and put back only if the pooled readings are still few), batch
    times weighted by batches run."""
    if old is None or old.pair != new.pair:
        return new
    if not (math.isfinite(old.power_w) and math.isfinite(old.batch_ms)):
        return dataclasses.replace(new, windows=old.windows + new.windows)
    if not (math.isfinite(new.power_w) and math.isfinite(new.batch_ms)):
        return dataclasses.replace(old, windows=old.windows + new.windows)
    counted = bool(old.power_n and new.power_n)
    n1, n2 = (old.power_n, new.power_n) if counted else (1, 1)
    n = n1 + n2
    m1, m2 = (readings_mean(old), readings_mean(new)) if counted else (old.power_w, new.power_w)
    power = (n1 * m1 + n2 * m2) / n
    sd, s1, s2 = None, old.power_sd_w, new.power_sd_w
    if counted and (s1 is not None or n1 == 1) and (s2 is not None or n2 == 1):
        within = (n1 - 1) * (s1 or 0.0) ** 2 + (n2 - 1) * (s2 or 0.0) ** 2
        between = n1 * (m1 - power) ** 2 + n2 * (m2 - power) ** 2
        sd = math.sqrt((within + between) / (n - 1))
    if counted:
        power = few_readings_power(power, sd, n)
    w1, w2 = max(old.batches, 1), max(new.batches, 1)

    def mix(a: float, b: float) -> float:
        return (w1 * a + w2 * b) / (w1 + w2)

    p99 = None
    if old.batch_p99_ms is not None and new.batch_p99_ms is not None:
        p99 = mix(old.batch_p99_ms, new.batch_p99_ms)
    return PairMeasurement(
        new.pair,
        mix(old.batch_ms, new.batch_ms),
        power,
        p99 if p99 is not None else new.batch_p99_ms,
        old.batches + new.batches,
        sd,
        old.power_n + new.power_n if old.power_n and new.power_n else 0,
        old.windows + new.windows,
    )


@dataclass(frozen=True)
class InferenceGoal:
    rate_hz: float
    budget_w: float
    latency_ms: float | None = None

    def __post_init__(self) -> None:
        if not self.rate_hz > 0:
            raise ValueError(f"rate_hz must be > 0, got {self.rate_hz}")
        if self.latency_ms is not None and not self.latency_ms > 0:
            raise ValueError(f"latency_ms must be > 0, got {self.latency_ms}")

    def at_least_as_hard_as(self, other: InferenceGoal) -> bool:
        """Does every pair that fits this goal fit `other` too? (A rate as high or higher,
        a budget as low or lower, a latency target as tight or tighter.)"""
        if self.rate_hz < other.rate_hz or self.budget_w > other.budget_w:
            return False
        if other.latency_ms is None:
            return True
        return self.latency_ms is not None and self.latency_ms <= other.latency_ms


def worst_latency_ms(batch_size: np.ndarray | int, rate_hz: float, batch_ms: np.ndarray | float):
    """(b-1)/r + t_inf, in ms."""
    return (np.asarray(batch_size) - 1) * 1000.0 / rate_hz + np.asarray(batch_ms)


def drain_limit_ms(batch_size: np.ndarray | int, rate_hz: float):
    """The longest batch time that still lets the queue drain: 0.9 * b/r, in ms."""
    return DRAIN_FRACTION * np.asarray(batch_size) * 1000.0 / rate_hz


def fit_for(m: PairMeasurement, goal: InferenceGoal) -> bool:
    """Does this pair's *measured* latency, drain time and power meet the goal?"""
    return serves_within_budget(m, goal) and (
        goal.latency_ms is None
        or float(worst_latency_ms(m.pair.batch_size, goal.rate_hz, m.tail_ms)) <= goal.latency_ms
    )


def worth_remeasuring(m: PairMeasurement, goal: InferenceGoal) -> bool:
    """Is this pair turned away only by a power reading within noise of the budget? Then
    another window, pooled with the first, may show that it fits. A pair that truly sits
    just under the budget is often the only one that fits a hard goal, and one window's
    readings (~1 % noise each) cannot tell 14.95 W from 15.05 W."""
    se = m.power_se_w
    if se is None or m.windows >= MAX_WINDOWS:
        return False
    if not goal.budget_w < m.power_w <= goal.budget_w + BORDER_Z * se:
        return False
    return fit_for(dataclasses.replace(m, power_w=goal.budget_w), goal)


def drains(m: PairMeasurement, goal: InferenceGoal) -> bool:
    """Does the queue drain at the goal's rate? A throughput condition: judged on the
    median batch time (a noisy p99 would reject least-power pairs that sit just under the
    limit); the tail goes to the latency check."""
    return m.batch_ms <= float(drain_limit_ms(m.pair.batch_size, goal.rate_hz))


def serves_within_budget(m: PairMeasurement, goal: InferenceGoal) -> bool:
    """Measured power within B and a queue that drains (latency not considered)."""
    return (
        math.isfinite(m.tail_ms)
        and math.isfinite(m.batch_ms)
        and m.power_w <= goal.budget_w
        and drains(m, goal)
    )


def power_brackets(
    modes: np.ndarray, batch_sizes: np.ndarray, samples: Mapping[Pair, PairMeasurement]
) -> tuple[np.ndarray, np.ndarray]:
    """Per (mode, batch size) asked: the lower and the higher of the powers measured at the
    same mode at the nearest smaller and the nearest larger measured batch size (NaN where
    the pair is measured itself or has no measured size on both sides).

    Why: at one mode a batch size's power lies between its neighbours' (both inference
    traces: 86-90 % of cases within 0.3 W; b=4 between b=1 and b=64 at 97-99 % of modes),
    so two measured pairs bound the sizes between them better than a model fitted
    elsewhere (it put b=4 at 13.3 W between b=1 and b=64 measured at ~12 W)."""
    m = np.asarray(modes, dtype=np.int64).reshape(-1, 4)
    b = np.asarray(batch_sizes, dtype=np.int64).reshape(-1)
    lo, hi = np.full(len(b), np.nan), np.full(len(b), np.nan)
    if len(b) == 0:
        return lo, hi
    uniq, inv = np.unique(m, axis=0, return_inverse=True)
    ids = {tuple(map(int, u)): i for i, u in enumerate(uniq)}
    rows = [
        (ids[q.mode.as_tuple()], q.batch_size, s.power_w)
        for q, s in samples.items()
        if q.mode.as_tuple() in ids and math.isfinite(s.power_w) and s.power_w > 0
    ]
    if len(rows) < 2:
        return lo, hi
    # one sorted key per (mode, batch size): a pair's measured neighbours sit either side
    span = int(max(b.max(), max(r[1] for r in rows))) + 1
    key = np.array([i * span + bb for i, bb, _ in rows], dtype=np.int64)
    order = np.argsort(key)
    key, pw = key[order], np.array([r[2] for r in rows])[order]
    q = inv.reshape(-1) * span + b
    k = np.searchsorted(key, q)  # the first measured key >= the pair's
    ok = (k > 0) & (k < len(key))
    kk = np.clip(k, 1, len(key) - 1)
    ok &= (key[kk - 1] // span == q // span) & (key[kk] // span == q // span)
    ok &= key[kk] != q  # measured itself
    lo[ok] = np.minimum(pw[kk - 1], pw[kk])[ok]
    hi[ok] = np.maximum(pw[kk - 1], pw[kk])[ok]
    return lo, hi


def with_margin(p: np.ndarray, margin_w: float, top: np.ndarray) -> np.ndarray:
    """Predicted power plus the margin that covers the model's error, but not above `top`
    (power_brackets' higher bound, NaN: none), which holds whatever the model's error."""
    p = np.asarray(p, dtype=float)
    capped = np.minimum(p + margin_w, np.maximum(p, top))
    return np.where(np.isfinite(top), capped, p + margin_w)


def least_mode_index(modes: np.ndarray) -> int:
    """The row of the least mode: every knob at its lowest (the fewest cores, then the
    lowest clocks when no mode has all of them). It draws the least power whatever a
    model says, for any batch size."""
    m = np.asarray(modes).reshape(-1, 4)
    return int(np.lexsort(m.T[::-1])[0])


def least_pair_in_doubt(samples: Mapping[Pair, PairMeasurement], least: Pair) -> bool:
    """Is the least pair's reading worth a second, full window before a budget is called
    out of reach on it? As the lowest mode's for training (base.floor_in_doubt): its window
    was cut short over the budget, or it read more than another pair beyond the noise."""
    return floor_in_doubt(samples, least, cut_short=lambda m: m.stopped)


def least_pair_row(modes: np.ndarray, batch_sizes: Sequence[int]) -> int:
    """The row, in pair_grid's mode-major order, of the least pair: the least mode at the
    smallest batch size (at a mode, b=1 draws least at 98-100 % of the modes of both
    inference traces, whatever a refit says)."""
    return least_mode_index(modes) * len(batch_sizes)


# ---- actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasurePair:
    """Serve batches of this size in this mode and measure them, then ask again. `cover`:
    the pair is measured to cover the rate axis at the budget (see _uncovered), not to
    search the current goal."""

    pair: Pair
    cover: bool = False
    # run the whole window, with no early stop over the budget, and let it replace the
    # pair's reading (the least pair's second look before a budget is called out of reach)
    full_window: bool = False


@dataclass(frozen=True)
class ServePair:
    """Serve with this pair. Its measured latency and power fit the goal, unless
    `feasible` is False: then it is the lowest worst-case latency measured under the
    budget (`best_latency_ms`); if no measured pair under the budget drains the queue, the
    one serving the most requests per second (`drains` False); if no measured pair is
    within the budget at all, the lowest-power pair measured (`within_budget` False)."""

    pair: Pair
    feasible: bool
    latency_ms: float  # measured worst-case latency of the pair at the goal's rate
    power_w: float  # measured power while its batches run
    within_budget: bool = True
    # its median batch time keeps up with the rate (False: the queue grows without bound,
    # and the pair is the one serving the most requests per second)
    drains: bool = True
    batch_ms: float = math.nan  # measured median batch time

    @property
    def best_latency_ms(self) -> float | None:
        """The contract's worst case, (b-1)/r + t_inf, when infeasible (None when feasible).
        With `drains` False it holds for a request that finds the queue empty only."""
        return None if self.feasible else self.latency_ms

    @property
    def requests_per_s(self) -> float:
        """What the pair serves at most: b over its measured median batch time."""
        return 0.0 if self.batch_ms <= 0 else self.pair.batch_size * 1000.0 / self.batch_ms


InferenceAction = MeasurePair | ServePair


class PairPredictor(Protocol):
    """A fitted model of one workload's batch time and power over (mode, batch size)."""

    def predict(self, modes: np.ndarray, batch_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """modes (N, 4) ints, batch_sizes (N,) ints -> (batch_ms, power_w), each (N,)."""


PairFitter = Callable[[Mapping[Pair, PairMeasurement]], PairPredictor]


# ---- the planner --------------------------------------------------------------------------


class InferencePlanner:
    """Plans one inference workload's profiling and serving over a grid of pairs.

    `modes`: (N, 4) array of the mode space; `batch_sizes`: the sizes the job can run;
    `fitter(samples)` returns a :class:`PairPredictor` (with no samples: the prior, e.g.
    a reference model). Knobs:

    - `max_pairs`: distinct pairs measured for the workload over all its goals;
    - `seeds`: pairs measured before trusting the fitted model's pick (a few spread
      pairs predicted within the budget give the refit scale in both batch size and mode);
    - `time_margin`, `power_margin_w`: a predicted pair counts as a candidate only with
      this headroom, so that its measurement is likely to fit;
    - `explore`: with no measured pair fitting, keep measuring the pair predicted to miss
      the goal by the least, while that miss is below this fraction (the model may be off);
    - `min_gain`: stop measuring when no unmeasured candidate is predicted better than
      the best fit pair by more than this fraction (power, or latency without L);
    - `refine`: then step the least-power pick down one knob at a time while the step is
      predicted to keep the latency (see `_step_down`).
    """

    def __init__(
        self,
        modes: np.ndarray | Sequence[PowerMode],
        batch_sizes: Sequence[int],
        fitter: PairFitter,
        *,
        max_pairs: int = 30,
        seeds: int = 2,
        time_margin: float = 0.03,
        power_margin_w: float = 0.3,
        min_gain: float = 0.02,
        explore: float = 0.15,
        refine: bool = True,
    ):
        (self.modes, self.batch_sizes, self.grid_modes, self.grid_b, self._pairs, self._index) = (
            pair_grid(modes, batch_sizes)
        )
        self.fitter = fitter
        self.max_pairs = max_pairs
        self.seeds = seeds
        self.time_margin = time_margin
        self.power_margin_w = power_margin_w
        self.min_gain = min_gain
        self.explore = explore
        self.refine = refine
        self._axes = [np.unique(self.modes[:, j]) for j in range(4)]
        self._cache: tuple[ReadingsKey, tuple[np.ndarray, ...]] | None = None
        # the last covering answer: a job being served asks for its next action every
        # control tick, and the answer changes only with the goal or the readings
        self._cover_cache: tuple[tuple[InferenceGoal, ReadingsKey], int | None] | None = None

    def pair(self, i: int) -> Pair:
        return self._pairs[i]

    def predictions(self, samples: Mapping[Pair, PairMeasurement]) -> tuple[np.ndarray, np.ndarray]:
        """(batch_ms, power_w) over the grid from the model fitted to `samples` (cached)."""
        return self._predicted(samples)[:2]

    def _predicted(self, samples: Mapping[Pair, PairMeasurement]) -> tuple[np.ndarray, ...]:
        key = readings_key(samples)
        if self._cache is None or self._cache[0] != key:
            model = self.fitter(samples)
            t, p = model.predict(self.grid_modes, self.grid_b)
            spread = getattr(model, "spread", None)
            if spread is not None:
                st, sp = spread(self.grid_modes, self.grid_b)
            else:
                st, sp = (np.full(len(self.grid_b), x) for x in DEFAULT_SPREAD)
            _, top = power_brackets(self.grid_modes, self.grid_b, samples)
            self._cache = (key, tuple(np.asarray(x, float) for x in (t, p, st, sp, top)))
        return self._cache[1]

    def bracket_top(self, samples: Mapping[Pair, PairMeasurement]) -> np.ndarray:
        """Per pair of the grid, the higher measured power of the batch sizes measured on
        both sides of it at its mode (NaN: none; see power_brackets)."""
        return self._predicted(samples)[4]

    def fit_probability(
        self, goal: InferenceGoal, samples: Mapping[Pair, PairMeasurement]
    ) -> np.ndarray:
        """Each pair's chance that its measurement fits `goal` (drain, latency, budget),
        from the predictions and their spread (time and power errors taken independent)."""
        t, p, st, sp, _ = self._predicted(samples)
        limit = drain_limit_ms(self.grid_b, goal.rate_hz).astype(float)
        if goal.latency_ms is not None:
            limit = np.minimum(
                limit, goal.latency_ms - worst_latency_ms(self.grid_b, goal.rate_hz, 0.0)
            )
        tail = t * (1 + self.time_margin)
        with np.errstate(divide="ignore", invalid="ignore"):
            z_t = np.where(limit > 0, np.log(np.maximum(limit, 1e-9) / tail) / st, -np.inf)
            z_p = np.log(goal.budget_w / p) / sp
        prob = norm_cdf(z_t) * norm_cdf(z_p)
        return np.where(np.isfinite(prob), prob, 0.0)

    # -- the decision --------------------------------------------------------------------
    def next_action(
        self,
        goal: InferenceGoal,
        samples: Mapping[Pair, PairMeasurement],
        new_pairs: int = 0,
        new_pairs_limit: int | None = None,
        cover_left: int = 0,
        search_pairs: int = RESOLVE_MAX_PAIRS,
    ) -> InferenceAction:
        """The next step towards the best pair whose measured latency and power fit `goal`.

        A re-solve (a rate or budget change of a profiled workload) passes the pairs it
        measured since the change as `new_pairs` and a small `new_pairs_limit` (e.g.
        RESOLVE_NEW_PAIRS): it then serves from the fitted model, measuring only to verify
        its pick, unless no measured pair fits the new goal (then it searches as for a new
        goal, at most `search_pairs` new pairs; 0: it serves the best measured pair, flagged
        infeasible)."""
        t, p = self.predictions(samples)
        # the predicted power with the margin a candidate needs, capped by measured brackets
        pm = with_margin(p, self.power_margin_w, self.bracket_top(samples))
        measured = np.zeros(len(self._pairs), dtype=bool)
        for pair in samples:
            i = self._index.get(pair)
            if i is not None:
                measured[i] = True
        # A re-solve stops looking for better once it has a measured fit pair and spent its
        # verification pairs; without any fit pair it searches on, at most `search_pairs`.
        # Its budget is its own, past max_pairs: the first goal's search may have spent it.
        resolving = new_pairs_limit is not None
        fit = [m for m in samples.values() if fit_for(m, goal)]
        cap = self.max_pairs
        if resolving:
            cap = new_pairs_limit if fit else max(new_pairs_limit, search_pairs)
            can_measure = new_pairs < cap
        else:
            can_measure = len(samples) < self.max_pairs
        lat = worst_latency_ms(self.grid_b, goal.rate_hz, t)
        viol = self._violation(goal, t, pm, lat)
        # another window of a pair read just over the budget; a first search may spend it
        # past max_pairs (it measures no new pair), a re-solve within its own cap
        again = self._remeasure(goal, samples) if can_measure or not resolving else None
        if again is not None:
            return MeasurePair(again)
        # the next seed while fewer than `seeds` pairs are measured (None: none to be had)
        seed = None
        if len(samples) < self.seeds:
            seed = self._seed(lat, t, self._violation(goal, t, pm, lat, latency=False), measured)
        # a new workload covers once its seeds are measured, or at once when no seed is to
        # be had (a goal no pair is predicted to drain has none, and is served after one
        # pair: it would never cover)
        if cover_left > 0 and (resolving or len(samples) < self.max_pairs):
            if resolving or len(samples) >= self.seeds or seed is None:
                c = self._uncovered(goal, samples, measured)
                if c is not None:
                    return MeasurePair(self._pairs[c], cover=True)
        if resolving and can_measure and not fit:
            likely = self._likely_fit(goal, samples, p, measured)
            if likely is not None:
                return MeasurePair(self._pairs[likely])
        if (
            resolving
            and can_measure
            and not any(serves_within_budget(m, goal) for m in samples.values())
        ):
            # No measured pair drains at the new goal: probe the model's best-predicted
            # draining pair first (within the budget, then nearest the latency target),
            # rather than a search from scratch or a queue that does not drain. Only pairs
            # predicted within the budget: one predicted over it could not be served.
            drain_v = self._violation(goal, t, pm, lat, latency=False)
            cand = ~measured & np.isfinite(drain_v) & (p <= goal.budget_w)
            if cand.any():
                idx = np.flatnonzero(cand)
                order = np.lexsort((idx, p[idx], viol[idx], drain_v[idx]))
                return MeasurePair(self._pairs[int(idx[order[0]])])
        if can_measure and seed is not None:
            return MeasurePair(self._pairs[seed])
        if goal.latency_ms is not None:
            if fit or self._worth_exploring(viol, measured, can_measure):
                return self._search(goal, fit, p, lat, viol, measured, can_measure)
        # No latency target, or none can be met: the lowest latency within the budget.
        relaxed = InferenceGoal(goal.rate_hz, goal.budget_w, None)
        viol = self._violation(relaxed, t, pm, lat)
        ok = [m for m in samples.values() if serves_within_budget(m, goal)]
        if ok or self._worth_exploring(viol, measured, can_measure):
            action = self._search(relaxed, ok, lat, p, viol, measured, can_measure)
            if isinstance(action, ServePair):
                feasible = goal.latency_ms is None or action.latency_ms <= goal.latency_ms
                action = self._serve(samples[action.pair], goal, feasible)
            return action
        # No queue drains within the budget: the budget wins over latency. Serve the most
        # requests per second among pairs whose measured power fits: a throughput, judged
        # on the median batch time as the drain check is (and as the model predicts).
        under = [
            m
            for m in samples.values()
            if m.power_w <= goal.budget_w
            and math.isfinite(m.tail_ms)
            and math.isfinite(m.batch_ms)
            and m.batch_ms > 0
        ]
        if can_measure:
            # the pair predicted to serve the most requests per second within the budget,
            # if it would beat every measured one by more than min_gain
            most = max((m.pair.batch_size / m.batch_ms for m in under), default=0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                thr = np.where(np.isfinite(t) & (t > 0), self.grid_b / t, 0.0)
            cand = ~measured & (pm <= goal.budget_w)
            cand &= thr > most * (1 + self.min_gain)
            if cand.any():
                return MeasurePair(self._pairs[int(np.argmax(np.where(cand, thr, -1.0)))])
        if under:
            best = max(under, key=lambda m: (m.pair.batch_size / m.batch_ms, -m.power_w))
            return self._serve(best, goal, feasible=False)
        # Nothing measured stays within the budget: a pair that does comes before any cap
        # on measuring (a few more), since serving one over the budget is no option.
        cap_left = new_pairs < cap + RESOLVE_MAX_PAIRS
        if can_measure or cap_left:
            over = np.where(measured | ~np.isfinite(p), np.inf, p)
            i = int(np.argmin(over))
            # ... and only one predicted to draw less than every pair measured (else it
            # runs the board further over the budget for nothing)
            least = min((m.power_w for m in samples.values()), default=math.inf)
            if over[i] <= goal.budget_w * (1 + self.explore) and over[i] < least:
                return MeasurePair(self._pairs[i])
            # ... else the least pair, once, before holding one over the budget: a model
            # fitted on the pairs of a higher budget can put the floor too high (ResNet-18
            # after 20 W -> 14 W: nothing predicted under 14.3 W, 13.0 W there)
            floor = self._least_pair(measured)
            if floor is not None:
                return MeasurePair(self._pairs[floor])
        # Nothing measured is within the budget, and nothing left worth trying: the lowest
        # power measured, flagged (the caller must not keep it: it is over the budget).
        finite = [m for m in samples.values() if math.isfinite(m.power_w)]
        if finite:
            return self._serve(min(finite, key=lambda m: m.power_w), goal, feasible=False)
        return MeasurePair(self._pairs[int(np.argmin(np.where(np.isfinite(p), p, np.inf)))])

    def _least_pair(self, measured: np.ndarray) -> int | None:
        """The least mode at the smallest batch size, unless measured already. Model-free:
        the smallest batch draws the least at a mode (both inference traces: b=1 at 98-100 %
        of the modes), whatever a refit says (one put b=64 lowest at the least mode)."""
        i = least_pair_row(self.modes, self.batch_sizes)
        return None if measured[i] else i

    def _remeasure(
        self, goal: InferenceGoal, samples: Mapping[Pair, PairMeasurement]
    ) -> Pair | None:
        """The measured pair worth another window (see worth_remeasuring) that is likeliest
        to fit, if it would beat every pair that fits: with a latency target a pair at the
        budget never does (least power wins); without one, if its latency is better by
        more than min_gain."""
        cands = [m for m in samples.values() if worth_remeasuring(m, goal)]
        if not cands:
            return None
        fit = [m for m in samples.values() if fit_for(m, goal)]
        if fit:
            if goal.latency_ms is not None:
                return None
            best = min(self._objective(m, goal)[0] for m in fit)
            cands = [m for m in cands if self._objective(m, goal)[0] < (1 - self.min_gain) * best]
        if not cands:
            return None
        return min(
            cands, key=lambda m: ((m.power_w - goal.budget_w) / (m.power_se_w or 1.0), m.pair)
        ).pair

    def _likely_fit(
        self,
        goal: InferenceGoal,
        samples: Mapping[Pair, PairMeasurement],
        p: np.ndarray,
        measured: np.ndarray,
    ) -> int | None:
        """The least-power unmeasured pair likely to fit (chance >= FIT_PROB), else the
        likeliest one; None when no pair has a real chance."""
        prob = np.where(measured, 0.0, self.fit_probability(goal, samples))
        likely = prob >= FIT_PROB
        if likely.any():
            i = self._best_index(likely, p, -prob)
        else:
            i = int(np.argmax(prob))
            if prob[i] < MIN_FIT_PROB:
                return None
        return i

    def _uncovered(
        self, goal: InferenceGoal, samples: Mapping[Pair, PairMeasurement], measured: np.ndarray
    ) -> int | None:
        """The unmeasured pair expected to cover the most rates of the ladder that no
        measured pair fits at the goal's latency target and budget (see rate_cover); None
        when none is expected to cover enough."""
        key = (goal, readings_key(samples))
        if self._cover_cache is not None and self._cover_cache[0] == key:
            return self._cover_cache[1]
        t, p, st, sp, _ = self._predicted(samples)
        ms = [m for m in samples.values() if math.isfinite(m.batch_ms) and m.batch_ms > 0]
        mb = np.array([m.pair.batch_size for m in ms], float)
        mt = np.array([m.batch_ms for m in ms], float)
        mp = np.array([m.power_w for m in ms], float)
        # the ladder's top: the fastest drain rate predicted or measured within the budget
        with np.errstate(divide="ignore", invalid="ignore"):
            ok = (p <= goal.budget_w) & np.isfinite(t) & (t > 0)
            top_pred = np.where(ok, self.grid_b * 1000.0 / t, 0.0)
        top_meas = np.where(mp <= goal.budget_w, mb * 1000.0 / mt, 0.0)
        top = DRAIN_FRACTION * max(
            float(np.max(top_pred, initial=0.0)), float(np.max(top_meas, initial=0.0))
        )
        rates = rate_cover.rate_ladder(top)
        tail = np.array([m.tail_ms for m in ms], float)
        args = (goal.budget_w, goal.latency_ms, DRAIN_FRACTION)
        done = rate_cover.covered(mb, mt, tail, mp, rates, *args)
        i, _ = rate_cover.best_cover(
            self.grid_b, t, st, p, sp, ~measured, rates[~done], *args, self.time_margin
        )
        self._cover_cache = (key, i)
        return i

    def _worth_exploring(self, viol: np.ndarray, measured: np.ndarray, can_measure: bool) -> bool:
        """Is an unmeasured pair predicted to fit, or to miss by less than the model's error?"""
        if not can_measure:
            return False
        v = viol[~measured]
        return bool(v.size) and float(v.min()) <= self.explore

    def _search(
        self,
        goal: InferenceGoal,
        fit: list[PairMeasurement],
        score: np.ndarray,
        tie: np.ndarray,
        viol: np.ndarray,
        measured: np.ndarray,
        can_measure: bool,
    ) -> InferenceAction:
        """Best measured fit pair, unless an unmeasured pair is predicted better by more
        than min_gain (then measure it). With no fit pair yet: the unmeasured pair predicted
        best among those predicted to fit, else the one predicted to miss by the least."""
        if fit:
            best = min(fit, key=lambda m: self._objective(m, goal))
            if can_measure:
                bound = (1 - self.min_gain) * self._objective(best, goal)[0]
                nxt = self._best_index((viol == 0) & ~measured & (score < bound), score, tie)
                if nxt is None and self.refine and goal.latency_ms is not None:
                    nxt = self._step_down(best.pair, viol, measured, score)
                if nxt is not None:
                    return MeasurePair(self._pairs[nxt])
            return self._serve(best, goal, feasible=True)
        nxt = self._best_index((viol == 0) & ~measured, score, tie)
        if nxt is None:
            nxt = self._best_index(~measured, viol, score)
        assert nxt is not None  # callers checked _worth_exploring
        return MeasurePair(self._pairs[nxt])

    def _step_down(
        self, pair: Pair, viol: np.ndarray, measured: np.ndarray, score: np.ndarray
    ) -> int | None:
        """Model-free refinement of the least-power pick: the same batch size one step lower
        on one knob (a lower clock or fewer cores draws less power whatever the model says),
        if predicted to still meet latency and drain. The power model's ranking of nearby
        modes is the weakest part of a fresh fit (e.g. the memory clock's share)."""
        here = np.array(pair.mode.as_tuple())
        cands = []
        for axis, values in enumerate(self._axes):
            k = int(np.searchsorted(values, here[axis]))
            if k == 0:
                continue
            down = here.copy()
            down[axis] = values[k - 1]
            i = self._index.get(Pair(PowerMode(*map(int, down)), pair.batch_size))
            if i is not None and not measured[i] and viol[i] == 0:
                cands.append(i)
        if not cands:
            return None
        return min(cands, key=lambda i: (score[i], i))

    def _violation(
        self,
        goal: InferenceGoal,
        t: np.ndarray,
        pm: np.ndarray,
        lat: np.ndarray,
        latency: bool = True,
    ) -> np.ndarray:
        """How far each pair is predicted to miss the goal, as the largest relative excess
        over the power budget, the drain limit and the latency target (0: predicted fit,
        with the margins; `pm`: power with its margin, see with_margin)."""
        drain = drain_limit_ms(self.grid_b, goal.rate_hz)
        v = np.maximum(0.0, (pm - goal.budget_w) / goal.budget_w)
        v = np.maximum(v, (t * (1 + self.time_margin) - drain) / drain)
        if latency and goal.latency_ms is not None:
            lat_m = lat + t * self.time_margin
            v = np.maximum(v, (lat_m - goal.latency_ms) / goal.latency_ms)
        v = np.maximum(v, 0.0)
        return np.where(np.isfinite(v), v, np.inf)

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _objective(m: PairMeasurement, goal: InferenceGoal) -> tuple[float, float]:
        lat = float(worst_latency_ms(m.pair.batch_size, goal.rate_hz, m.tail_ms))
        return (m.power_w, lat) if goal.latency_ms is not None else (lat, m.power_w)

    @staticmethod
    def _best_index(mask: np.ndarray, score: np.ndarray, tie: np.ndarray) -> int | None:
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return None
        return int(idx[np.lexsort((idx, tie[idx], score[idx]))[0]])

    def _size_order(self) -> list[int]:
        """The batch sizes in the order seeds and covering visit them: the smallest, the
        largest, then the middle ones (the ends pin the model's batch-size scale)."""
        sizes = list(self.batch_sizes)
        return list(dict.fromkeys([sizes[0], sizes[-1]] + sizes[1:-1]))

    def _seed(
        self, lat: np.ndarray, t: np.ndarray, viol: np.ndarray, measured: np.ndarray
    ) -> int | None:
        """Spread seeds: the predicted lowest-latency pair within the budget (and drain
        limit) at the smallest, then the largest batch size, then the middle ones."""
        for b in self._size_order():
            on_b = self.grid_b == b
            if (measured & on_b).any():
                continue
            ok = on_b & (viol == 0)
            if not ok.any():
                continue
            return self._best_index(ok, lat, t)
        return None

    def _serve(self, m: PairMeasurement, goal: InferenceGoal, feasible: bool) -> ServePair:
        lat = float(worst_latency_ms(m.pair.batch_size, goal.rate_hz, m.tail_ms))
        return ServePair(
            m.pair,
            feasible,
            lat,
            m.power_w,
            m.power_w <= goal.budget_w,
            drains(m, goal),
            m.batch_ms,
        )


class InferenceSession:
    """One inference job's goal over time, on top of the workload's planner: what the
    daemon's inference planner keeps per job. It counts the pairs measured since the goal
    last changed, so that a later goal is a *re-solve* with its own small budget of pairs
    (see the module docstring) and the first goal is a full search.

        session = InferenceSession(planner, InferenceGoal(30, 15, 100))
        action = session.next_action(samples)      # MeasurePair | ServePair
        session.measured(pair)                     # after the profiler stored its sample
        session.set_rate(45); session.set_budget(12)
    """

    def __init__(
        self,
        planner: InferencePlanner,
        goal: InferenceGoal,
        profiled: bool = False,
        rate_search_pairs: int = RATE_CHANGE_PAIRS,
    ):
        self.planner = planner
        self.goal = goal
        self.new_pairs = 0
        # A workload with samples from earlier jobs re-solves from them like a budget change.
        self._limit: int | None = RESOLVE_NEW_PAIRS if profiled else None
        # New pairs a rate change may measure when no measured pair fits its goal (an
        # admin's `[inference] rate_change_pairs`; 0: a rate change never measures).
        self.rate_search_pairs = rate_search_pairs
        self._search = RESOLVE_MAX_PAIRS
        self.cover_left = self._cover_pairs()
        self._covering: Pair | None = None
        self.served: ServePair | None = None
        # the goals this job was served infeasible (its search over), once per goal change:
        # a rate change to a goal at least as hard as k of them may measure only
        # rate_search_pairs / 2**k pairs (a rate swinging in and out of reach would otherwise
        # measure new pairs at every swing; a little more search may still find a thin pair)
        self.unreachable: collections.deque[InferenceGoal] = collections.deque(maxlen=64)
        self._found_unreachable = False
        # budgets whose least pair got its second look (least_pair_in_doubt): once each, so
        # that a board that keeps reading high still gets an answer
        self._floor_rechecked: set[float] = set()

    def _cover_pairs(self) -> int:
        return len(self.planner.batch_sizes) + COVER_EXTRA_PAIRS

    def next_action(self, samples: Mapping[Pair, PairMeasurement]) -> InferenceAction:
        action = self.planner.next_action(
            self.goal, samples, self.new_pairs, self._limit, self.cover_left, self._search
        )
        if isinstance(action, ServePair) and not action.within_budget:
            again = self._recheck_floor(samples)
            if again is not None:
                action = again
        self._covering = action.pair if isinstance(action, MeasurePair) and action.cover else None
        if isinstance(action, ServePair):
            self.served = action
            if not action.feasible and not self._found_unreachable:
                self._found_unreachable = True
                self.unreachable.append(self.goal)
        return action

    def _recheck_floor(self, samples: Mapping[Pair, PairMeasurement]) -> MeasurePair | None:
        """Nothing measured fits the budget: the least pair once more, a full window, if
        its reading is in doubt and this budget has not had that second look."""
        planner = self.planner
        least = planner.pair(least_pair_row(planner.modes, planner.batch_sizes))
        budget = self.goal.budget_w
        if budget in self._floor_rechecked or not least_pair_in_doubt(samples, least):
            return None
        self._floor_rechecked.add(budget)
        return MeasurePair(least, full_window=True)

    def times_unreachable(self, goal: InferenceGoal) -> int:
        """How many goals this job was served infeasible that `goal` is at least as hard as."""
        return sum(goal.at_least_as_hard_as(g) for g in self.unreachable)

    def measured(self, pair: Pair) -> None:
        if pair == self._covering:
            self.cover_left -= 1  # its own allowance: not one of the goal's new pairs
            self._covering = None
        else:
            self.new_pairs += 1

    def _change(self, goal: InferenceGoal, limit: int, cover: bool, search: int) -> None:
        self.goal = goal
        self.new_pairs = 0
        self._limit = limit
        self._search = search
        self.cover_left = self._cover_pairs() if cover else 0
        self._covering = None
        self.served = None
        self._found_unreachable = False

    @property
    def measured_only(self) -> bool:
        """Did the goal come from a rate change that may measure no new pair? Then what it
        serves is the best of the pairs already measured, not a search's answer."""
        return self._search == 0

    def set_rate(self, rate_hz: float) -> int:
        """Serve the new rate from the measured pairs; measure (at most
        `rate_search_pairs`, halved for each goal as easy that was out of reach) only if
        none fits it. Returns how many such goals there were."""
        goal = InferenceGoal(rate_hz, self.goal.budget_w, self.goal.latency_ms)
        out_of_reach = self.times_unreachable(goal)
        self._change(
            goal, RATE_NEW_PAIRS, cover=False, search=self.rate_search_pairs >> out_of_reach
        )
        return out_of_reach

    def set_budget(self, budget_w: float) -> None:
        """A new budget: may measure RESOLVE_NEW_PAIRS pairs to verify a better pick, and
        cover the rate axis at the new budget."""
        goal = InferenceGoal(self.goal.rate_hz, budget_w, self.goal.latency_ms)
        self._change(goal, RESOLVE_NEW_PAIRS, cover=True, search=RESOLVE_MAX_PAIRS)


def latency_power_front(
    predictor: PairPredictor,
    modes: np.ndarray,
    batch_sizes: Sequence[int],
    rate_hz: float,
) -> list[dict[str, float | int | bool]]:
    """The predicted (worst-case latency, power) Pareto front per batch size at `rate_hz`,
    for `powerctl pareto --kind inference --rate R`: rows sorted by batch size, then power."""
    from powerd.optimize.pareto import pareto_front

    arr = np.asarray(modes, dtype=np.int64).reshape(-1, 4)
    rows: list[dict[str, float | int | bool]] = []
    for b in sorted({int(x) for x in batch_sizes}):
        bs = np.full(len(arr), b, dtype=np.int64)
        t, p = predictor.predict(arr, bs)
        t, p = np.asarray(t, float), np.asarray(p, float)
        lat = worst_latency_ms(bs, rate_hz, t)
        drain = drain_limit_ms(b, rate_hz)
        for i in pareto_front(lat, p):
            c, cpu, gpu, emc = (int(x) for x in arr[i])
            rows.append(
                {
                    "batch_size": b,
                    "cores": c,
                    "cpu_khz": cpu,
                    "gpu_hz": gpu,
                    "emc_hz": emc,
                    "batch_ms": float(t[i]),
                    "latency_ms": float(lat[i]),
                    "power_w": float(p[i]),
                    "drains": bool(t[i] <= drain),
                }
            )
    return rows
