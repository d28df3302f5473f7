"""The interface every search strategy implements, and the values it trades in.

A strategy is a pure planner: given the budget and every measurement taken so far
for this workload, it says what to do next. It never touches hardware and never
waits. Because it re-derives its path from the samples, re-solving for a new budget
reuses every earlier measurement, and a restarted daemon resumes from the store.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from powerd.modes import PowerMode


@dataclass(frozen=True)
class Measurement:
    """What the profiler measured for one mode on the job's own steps."""

    mode: PowerMode
    time_ms: float  # median wall-clock ms per step; nan if aborted before enough steps
    power_w: float  # mean board power over the measuring window
    steps: int = 0
    aborted_over_budget: bool = False  # stopped early: power was clearly above the budget
    # standard error of power_w over the window's readings (None: unknown, e.g. restored)
    power_se_w: float | None = None


@dataclass(frozen=True)
class Measure:
    """Profile this mode on the job's steps, then ask again. With `pool`, the window is
    pooled with the mode's earlier one (pooled_measurement: a second look at a reading
    near the budget) instead of replacing it (a re-check of a reading that was selected
    for being good keeps only the fresh one)."""

    mode: PowerMode
    pool: bool = False
    # what the measurement is for, for the logs ("": a pick for the budget in force); a
    # mode measured after the commit can be slower than the pinned one, and says why
    why: str = ""
    # run the whole window even over the budget (no early stop): a second look at the
    # lowest mode, where stopping early saves nothing (no mode draws less) and a window
    # cut short just after the switch may read the previous mode's power again
    full_window: bool = False


@dataclass(frozen=True)
class Commit:
    """Pin this mode. Its *measured* power is within the budget, unless `feasible` is False
    (no measured mode fits; this is the lowest-power mode measured)."""

    mode: PowerMode
    feasible: bool = True


@dataclass(frozen=True)
class Fit:
    """Fit the predictor to the samples (slow: the server runs it off its loop), then ask again."""


Action = Measure | Commit | Fit


class Strategy(ABC):
    name: str = "abstract"

    @abstractmethod
    def next_action(self, budget_w: float, samples: Mapping[PowerMode, Measurement]) -> Action:
        """The next step towards the fastest mode whose measured power is <= budget_w."""

    def on_fitted(self, predictor: Predictor) -> None:  # noqa: B027 - optional hook
        """Called by the server after it ran a Fit action off its loop."""

    def refine(
        self, budget_w: float, samples: Mapping[PowerMode, Measurement], room: int
    ) -> Measure | None:
        """After a Commit for `budget_w`, while the job trains on it: a mode worth measuring
        (likely within the budget, promising to beat the pinned one), or None. `room`
        is how many more modes the job can afford. After its window, `next_action` is asked
        again and commits the fastest measured mode that fits (a better one replaces the
        pin). Default: nothing to refine."""
        return None

    def cheapest_meeting(
        self,
        step_time_ms: float,
        cap_w: float,
        samples: Mapping[PowerMode, Measurement],
        below_w: float,
    ) -> Measure | Fit | None:
        """For the step-time objective (powerd.optimize.time_target): an unmeasured mode
        the strategy's model expects to meet `step_time_ms` at less power than `below_w`
        (and within `cap_w`), a Fit it needs first, or None. Default: no model to ask."""
        return None


def pooled_measurement(old: Measurement | None, new: Measurement) -> Measurement:
    """A mode measured again (Measure.pool): both windows' readings pooled (step-weighted
    means) when both ran to the end, so a second look narrows the noise instead of trading
    one draw for another; otherwise the new window alone (an abort, or one after it)."""
    usable = (
        old is not None
        and not old.aborted_over_budget
        and not new.aborted_over_budget
        and math.isfinite(old.time_ms)
        and math.isfinite(new.time_ms)
        and math.isfinite(old.power_w)
        and math.isfinite(new.power_w)
        and old.steps > 0
        and new.steps > 0
    )
    if not usable:
        return new
    assert old is not None
    n = old.steps + new.steps
    se = None
    if old.power_se_w is not None and new.power_se_w is not None:
        se = math.hypot(old.steps * old.power_se_w, new.steps * new.power_se_w) / n
    return Measurement(
        new.mode,
        (old.time_ms * old.steps + new.time_ms * new.steps) / n,
        (old.power_w * old.steps + new.power_w * new.steps) / n,
        n,
        False,
        se,
    )


def fits(m: Measurement, budget_w: float) -> bool:
    return (not m.aborted_over_budget) and m.power_w <= budget_w


def best_within(samples: Mapping[PowerMode, Measurement], budget_w: float) -> Measurement | None:
    """The fastest measured mode whose measured power fits the budget."""
    ok = [m for m in samples.values() if fits(m, budget_w) and m.time_ms == m.time_ms]
    return min(ok, key=lambda m: (m.time_ms, m.power_w)) if ok else None


def least_power(samples: Mapping[PowerMode, Measurement]) -> Measurement | None:
    """The measured mode that drew the least power (a failed switch, power inf, never)."""
    finite = [s for s in samples.values() if math.isfinite(s.power_w)]
    return min(finite, key=lambda s: s.power_w) if finite else None


def needs_remeasure(m: Measurement, budget_w: float) -> bool:
    """An abort under a lower budget says nothing about the time: measure again when its
    power is within this budget. (A failed switch has power inf and is never retried.)"""
    return m.aborted_over_budget and m.power_w <= budget_w


# how far the lowest mode's power may read over another mode's before it is in doubt: well
# above the noise of a window's mean power
FLOOR_DOUBT_W = 0.5


def floor_in_doubt(
    samples: Mapping[Any, Any],
    lowest: Any,
    cut_short: Callable[[Any], bool] = lambda m: m.aborted_over_budget,
) -> bool:
    """Is the lowest mode's reading worth a second window before a budget is called
    infeasible on it? Yes when its window was cut short over the budget (a few readings,
    just after the switch) or it read more than a higher mode beyond the noise: every knob
    at its floor draws least on any board, so that window may have read something else, a
    load burst at the switch or a sensor that had not caught up with it. (Also for the
    least inference pair, keyed by pair, with its own `cut_short`.)"""
    m = samples.get(lowest)
    if m is None or not math.isfinite(m.power_w):
        return False
    if cut_short(m):
        return True
    others = [s.power_w for k, s in samples.items() if k != lowest and math.isfinite(s.power_w)]
    return bool(others) and m.power_w > min(others) + FLOOR_DOUBT_W


def conclude(
    samples: Mapping[PowerMode, Measurement],
    budget_w: float,
    lowest: PowerMode,
    floor_rechecked: set[float] | None = None,
) -> Commit | Measure:
    """How a search ends: commit the fastest measured mode that fits; else make sure the
    lowest mode was measured and hold it if it fits (even without a usable time); else
    commit the lowest-power mode measured, marked infeasible.

    `floor_rechecked`: the budgets whose lowest mode got a second window because its
    reading was in doubt (floor_in_doubt), kept by the strategy: once per budget, so that
    one bad window does not call a budget infeasible, and a board that keeps reading so
    still gets an answer."""
    best = best_within(samples, budget_w)
    if best is not None:
        return Commit(best.mode)
    m = samples.get(lowest)
    if m is None or needs_remeasure(m, budget_w):
        return Measure(lowest)
    if fits(m, budget_w):
        return Commit(lowest)
    if (
        floor_rechecked is not None
        and budget_w not in floor_rechecked
        and floor_in_doubt(samples, lowest)
    ):
        floor_rechecked.add(budget_w)
        why = f"again before calling the budget infeasible on {m.power_w:.2f} W"
        return Measure(lowest, why=why, full_window=True)
    least = least_power(samples)
    return Commit(lowest if least is None else least.mode, feasible=False)


class Predictor(ABC):
    """A fitted time/power model of one workload over modes (implemented in powerd.predictor)."""

    @abstractmethod
    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """modes: int array (N, 4) of (cores, cpu_khz, gpu_hz, emc_hz) -> (time_ms, power_w)."""
