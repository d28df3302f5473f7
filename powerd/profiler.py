"""Measuring one power mode on a job's own steps.

After a switch the board needs time to settle (power rails, clocks, the step in flight),
so nothing counts for `settle_s`. Then a window collects step times and power samples
until it has both `min_steps` steps and `window_s` seconds (fast modes get more steps).
A pause in stepping cancels the window and starts a new one (Zeus-style: a window is
discarded, never corrupted). Power clearly above the budget ends the window early, since
profiling must not hold the board over budget for a whole window: more than
`abort_margin_w` over it, at once (the step time stays unknown); over it beyond the
readings' noise, as soon as `min_steps` steps time it to within OVER_TIME_SE. Such a mode
cannot be pinned under this budget, so more steps would only refine its time while the
board runs over the budget (a later, higher budget may pin it on that time).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement

PowerSamples = Callable[[float, float], Sequence[tuple[float, float]]]
PRE_SWITCH_S = 1.0  # how far back to look for the previous mode's power
# A window whose mean power is over the budget by more than this many standard errors (of
# its readings' mean) ends once it has min_steps steps: the mode is over the budget, not
# a mode just under it read high.
OVER_Z = 3.0
# ... once its median step time is known to this relative standard error: steady steps
# end it at min_steps, jittery ones (a busy host, data loading) run on towards window_s.
OVER_TIME_SE = 0.02


@dataclass(frozen=True)
class WindowSpec:
    settle_s: float
    window_s: float
    min_steps: int
    abort_margin_w: float = 1.0  # over budget by more than this: stop measuring early
    min_abort_samples: int = 3
    pause_factor: float = 8.0  # a gap this many median steps long is a pause
    min_pause_s: float = 1.0
    # share of a job's expected steps it may spend measuring after its first commit
    refine_share: float = 0.0


@dataclass
class ModeWindow:
    mode: PowerMode
    spec: WindowSpec
    budget_w: float
    t_switch: float
    training: bool = True
    state: str = "settling"  # settling -> measuring -> done
    window_start: float = math.nan
    cancelled: int = 0
    _anchor: float | None = (
        None  # last step before the window (its end starts the window's first step)
    )
    _intervals: list[float] = field(default_factory=list)
    _last_step: float | None = None
    _no_tail: bool | None = None  # was the board within the abort limit before the switch?
    _settled_at: float = math.nan  # end of the settle: power counts from here

    def add_steps(self, ends: Sequence[float], durations: Sequence[float] = ()) -> None:
        if self.state == "done":
            return
        for i, t in enumerate(ends):
            if t < self.t_switch:
                continue  # the step in flight during the switch belongs to the old mode
            if self.state == "settling" or t < self.window_start:
                self._anchor = t
                self._last_step = t
                continue
            if math.isnan(self.window_start):
                # first step after a pause: the window restarts here, timing from this step
                self.window_start = t
                self._anchor = t
                self._last_step = t
                continue
            if durations:
                self._intervals.append(durations[i] * 1000.0)
            elif self._anchor is not None:
                self._intervals.append((t - self._anchor) * 1000.0)
            self._anchor = t
            self._last_step = t

    def poll(self, now: float, power: PowerSamples) -> Measurement | None:
        """Advance the window; the finished Measurement once there is one."""
        if self.state == "done":
            return None
        if self.state == "settling":
            if now - self.t_switch < self.spec.settle_s:
                return self._over_while_settling(now, power)
            self._start_window(now)
            return None
        paused = math.isnan(self.window_start)
        # power over the budget ends the probe whether or not the job steps: a pause
        # (evaluation, a checkpoint) must not hold an over-budget mode unchecked
        t0 = (
            max(self._settled_at, now - max(self.spec.window_s, self.spec.min_pause_s))
            if paused
            else self.window_start
        )
        watts = [w for _, w in power(t0, now)]
        if len(watts) >= self.spec.min_abort_samples:
            mean_w = statistics.fmean(watts)
            if mean_w > self.budget_w + self.spec.abort_margin_w:
                return self._finish(mean_w, aborted=True)
        if paused:
            return None  # wait for the job to step again
        if self._paused(now):
            self.cancelled += 1
            self.window_start = math.nan
            self._intervals = []
            self._anchor = None
            return None
        if len(self._intervals) >= self.spec.min_steps and (
            now - self.window_start >= self.spec.window_s or self._clearly_over(watts)
        ):
            if not watts:
                return None  # the sampler is behind; wait for a reading
            return self._finish(statistics.fmean(watts), aborted=False, se_w=mean_se(watts))
        return None

    def _clearly_over(self, watts: Sequence[float]) -> bool:
        """Is the window's mean power over the budget beyond its readings' noise, with the
        step time already known to OVER_TIME_SE?"""
        if len(watts) < max(2, self.spec.min_abort_samples):
            return False
        se = mean_se(watts) or 0.0  # (two readings at least: never None here)
        return over_and_timed(statistics.fmean(watts), se, self.budget_w, self._intervals)

    def _over_while_settling(self, now: float, power: PowerSamples) -> Measurement | None:
        """Stop before the window if power is already clearly over the budget: a mode that
        overshoots should not hold the board over budget while it settles."""
        k = self.spec.min_abort_samples
        limit = self.budget_w + self.spec.abort_margin_w
        if self._no_tail is None:
            self._no_tail = no_tail(power, self.t_switch, limit, k)
        over = overshoot([w for _, w in power(self.t_switch, now)], limit, k, self._no_tail)
        return None if over is None else self._finish(over, aborted=True)

    def _start_window(self, now: float) -> None:
        self.state = "measuring"
        self._settled_at = now
        self.window_start = now
        self._intervals = []
        # steps that end after `now` are timed from the last step before it
        self._anchor = self._last_step if self._last_step is not None and self.training else None
        if self._anchor is not None and self._anchor < self.t_switch:
            self._anchor = None

    def _paused(self, now: float) -> bool:
        last = self._last_step if self._last_step is not None else self.window_start
        last = max(last, self.window_start)
        typical = statistics.median(self._intervals) / 1000.0 if self._intervals else 0.0
        limit = max(self.spec.min_pause_s, self.spec.pause_factor * typical)
        return now - last > limit

    def _finish(self, power_w: float, aborted: bool, se_w: float | None = None) -> Measurement:
        self.state = "done"
        t = statistics.median(self._intervals) if self._intervals else math.nan
        return Measurement(self.mode, t, power_w, len(self._intervals), aborted, se_w)


def mean_se(watts: Sequence[float]) -> float | None:
    """Standard error of the readings' mean (None: fewer than two readings): what decides
    that a window is clearly over the budget, and rides with its measurement."""
    return statistics.stdev(watts) / math.sqrt(len(watts)) if len(watts) > 1 else None


def over_and_timed(
    power_w: float, se_w: float, budget_w: float, durations: Sequence[float]
) -> bool:
    """Is `power_w` over the budget by more than OVER_Z standard errors, with the median of
    `durations` (steps or batches) known to OVER_TIME_SE? Then a window may end early: the
    mode cannot serve this budget, and its time is what is still wanted of it."""
    if len(durations) < 2 or power_w - OVER_Z * se_w <= budget_w:
        return False
    # the standard error of a median is ~1.25 that of a mean
    spread = statistics.stdev(durations) / statistics.fmean(durations)
    return 1.25 * spread / math.sqrt(len(durations)) <= OVER_TIME_SE


def no_tail(power: PowerSamples, t_switch: float, limit_w: float, k: int) -> bool:
    """Was the board within `limit_w` for the last `k` readings before a switch? Then what
    follows the switch has no previous mode's tail in it."""
    before = [w for _, w in power(t_switch - PRE_SWITCH_S, t_switch)][-k:]
    return len(before) == k and max(before) <= limit_w


def overshoot(since: Sequence[float], limit_w: float, k: int, no_tail: bool) -> float | None:
    """The power (mean of the last `k` readings since a switch) when they are all over
    `limit_w`, else None. A falling reading may be the previous mode's tail, so it does not
    count, unless there was no such tail (then `k` readings suffice, else 2k)."""
    if len(since) < (k if no_tail else 2 * k):
        return None
    recent = since[-k:]
    if min(recent) <= limit_w:
        return None
    if not no_tail and statistics.fmean(recent) < statistics.fmean(since[-2 * k : -k]):
        return None
    return statistics.fmean(recent)


@dataclass
class ProfilingCost:
    """What profiling a workload cost: reported in status and by the benchmarks."""

    modes_measured: int = 0
    seconds: float = 0.0
    seconds_above_budget: float = 0.0  # power samples above the budget
    seconds_above_budget_1w: float = 0.0  # ... above the budget + 1 W

    def account(self, samples: Sequence[tuple[float, float]], budget_w: float) -> None:
        for (t0, w), (t1, _) in zip(samples, samples[1:], strict=False):
            dt = t1 - t0
            self.seconds += dt
            if w > budget_w:
                self.seconds_above_budget += dt
            if w > budget_w + 1.0:
                self.seconds_above_budget_1w += dt

    def as_dict(self) -> dict[str, float]:
        share = self.seconds_above_budget / self.seconds if self.seconds else 0.0
        share1 = self.seconds_above_budget_1w / self.seconds if self.seconds else 0.0
        return {
            "modes_measured": self.modes_measured,
            "seconds": round(self.seconds, 3),
            "share_above_budget": round(share, 4),
            "share_above_budget_1w": round(share1, 4),
        }
