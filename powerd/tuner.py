"""The per-workload tuning loop: the state a client sees as its phase.

One Tuner drives the board for one workload and budget. It asks the strategy what to do
(measure a mode, fit the predictor, commit), executes that without ever blocking the
server loop, and once committed keeps guarding the pinned mode's measured power.

    deciding --Measure--> measuring --window done--> deciding
    deciding --Fit------> fitting   --fit done----> deciding   (parked: see _park)
    deciding --Commit---> tuned     --power over budget--> deciding
                          tuned     --refine (a long job)--> measuring

Refining: a training job keeps measuring the strategy's promising modes after the commit
(Strategy.refine), each after holding the committed mode for one settle + window, within
`refine_share` of its length; after each window the strategy commits again, so a faster
measured mode replaces the pin. The job reads `profiling` from the switch to a candidate
until the strategy commits again (the window, and the fit and choice after it), with one
message throughout, `tuned` in between: `tuned` says the mode in force is the committed one
(README), and a candidate is not. The other jobs on the board are not waiting for it
(`refining`): they keep reading `tuned`. Its length is what it said (`expected_steps`),
else the steps it has run so far: a job that has run N steps is taken to run at least N
more, so a job of unknown length earns measurements as it keeps training, and a short one
spends almost none.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from powerd.modes import PowerMode
from powerd.optimize.base import (
    Commit,
    Fit,
    Measure,
    Measurement,
    Predictor,
    Strategy,
    best_within,
    fits,
    least_power,
    pooled_measurement,
)
from powerd.profiler import ModeWindow, PowerSamples, ProfilingCost, WindowSpec, mean_se

log = logging.getLogger("powerd.tuner")

GUARD_MARGIN_W = 0.5  # measured power this far over the budget in the tuned state: re-decide
# Measuring after the commit needs the job's steps: none for this long (at least 4 steps of
# the committed mode), and a refinement does not start, or gives the committed mode back.
REFINE_IDLE_S = 2.0
MAX_SWITCH_FAILURES = 3


class TunerFailed(Exception):
    """The board refused several mode switches in a row: give the board back."""


@dataclass
class WorkloadState:
    """Everything learned about one workload on this board."""

    name: str
    kind: str
    strategy: Strategy
    samples: dict[PowerMode, Measurement] = field(default_factory=dict)
    predictor: Predictor | None = None
    fit_method: str = ""
    cost: ProfilingCost = field(default_factory=ProfilingCost)
    persistent: bool = True
    # budget -> the mode committed for it: a later job with this budget starts from it
    decisions: dict[float, PowerMode] = field(default_factory=dict)

    def remembered(self, budget_w: float) -> PowerMode | None:
        """The mode committed earlier for this budget, if its measurement still fits."""
        mode = self.decisions.get(budget_w)
        m = None if mode is None else self.samples.get(mode)
        if m is None or not fits(m, budget_w):
            return None
        return mode

    def profiled_modes(self) -> int:
        return sum(1 for m in self.samples.values() if math.isfinite(m.power_w))


@dataclass
class TunerHooks:
    apply_mode: Callable[[PowerMode], None]  # raises on a failed switch (board left known)
    power: PowerSamples
    submit_fit: Callable[[WorkloadState], Future]
    on_sample: Callable[[WorkloadState], None]  # persist
    on_commit: Callable[[PowerMode, Measurement], None]


class Tuner:
    def __init__(
        self,
        workload: WorkloadState,
        budget_w: float,
        spec: WindowSpec,
        hooks: TunerHooks,
        strategy: Strategy | None = None,
    ):
        self.workload = workload
        self.budget_w = budget_w
        # another objective's search over the workload's strategy (StepTimeSearch); its
        # commits are not the budget's decisions, so none are remembered or reused
        self.strategy = strategy
        self.spec = spec
        self.hooks = hooks
        self.state = "deciding"
        self.window: ModeWindow | None = None
        self._pool = False  # pool the window in flight with the mode's earlier one (Measure.pool)
        self.fit_future: Future | None = None
        self._fit_since = 0.0  # CLOCK_MONOTONIC when the fit in flight was submitted
        self._applied: PowerMode | None = None  # the mode last switched to
        self.committed: Commit | None = None
        self.message = ""
        self.started = time.monotonic()
        self.decided_after_s: float | None = None
        self._guard_start = self._held_since = 0.0
        self._switch_failures = 0
        self.expected_steps: int | None = None  # the job's expected length (refining room)
        self.steps_run = 0  # the job's steps so far: its length when it did not say one
        self.refined = 0  # modes measured after the first commit for this budget
        self._refining = False  # the window in flight is a refinement
        self._refine_done = False  # the strategy had nothing more to refine
        self._last_step = 0.0  # CLOCK_MONOTONIC of the last step reported
        self.ticks = 0  # 0: nothing decided yet (a remembered mode may still skip profiling)

    @property
    def phase(self) -> str:
        if self.refining:  # one phase for the whole candidate, not profiling/fitting flips
            return "profiling"
        return {"deciding": "profiling", "measuring": "profiling", "fitting": "fitting"}.get(
            self.state, "tuned"
        )

    @property
    def refining(self) -> bool:
        """Measuring after the commit: a candidate's window, or the fit and choice after it.
        The commit for this budget stands meanwhile (a budget change or a power overrun
        clears it, and the choosing starts over)."""
        return self.state != "tuned" and self.committed is not None

    def set_budget(self, budget_w: float) -> None:
        """Re-solve from the samples and the fitted model; measure only what is new.

        A window in flight is kept: what a mode draws and how fast it steps does not
        depend on the budget (only its abort limit does, and that follows the new budget).
        """
        if budget_w == self.budget_w:
            return
        self.budget_w = budget_w
        self.committed = None
        # the old budget's verdict ("no measured mode fits ...") is not this budget's
        self.message = f"re-planning for {budget_w:g} W"
        self.decided_after_s = None
        self.refined, self._refine_done = 0, False
        self.started = time.monotonic()
        if self.window is not None:
            self.window.budget_w = budget_w
        if self.state == "tuned":
            self.state = "deciding"

    @property
    def goal(self) -> str:
        """What this tuner is after, for the log: the budget, or a step-time target and
        the power cap it is searched under."""
        target = getattr(self.strategy, "step_time_ms", None)
        if target is None:
            return f"at {self.budget_w:g} W"
        return f"for {target:g} ms/step within {self.budget_w:g} W"

    @property
    def feasible(self) -> bool | None:
        """Whether the committed mode's measured power fits the budget (None: not decided)."""
        return None if self.committed is None else self.committed.feasible

    @property
    def current_mode(self) -> PowerMode | None:
        """The mode this tuner is measuring or holding."""
        if self.window is not None:
            return self.window.mode
        return None if self.committed is None else self.committed.mode

    def feed_steps(self, ends: list[float], durations: list[float]) -> None:
        if ends:
            self._last_step = max(self._last_step, max(ends))
        if self.window is not None:
            self.window.add_steps(ends, durations)

    def _idle(self, now: float) -> bool:
        """No step for REFINE_IDLE_S (and 4 of the committed mode's steps): the job paused."""
        m = None if self.committed is None else self.workload.samples.get(self.committed.mode)
        step_s = m.time_ms / 1e3 if m is not None and math.isfinite(m.time_ms) else 0.0
        return now - self._last_step > max(REFINE_IDLE_S, 4 * step_s)

    def tick(self, now: float) -> None:
        # one tick may run several cheap decisions, but at most one mode switch
        self.ticks += 1
        for _ in range(8):
            if self.state == "deciding":
                if self._decide(now):
                    return
            elif self.state == "measuring":
                self._poll_window(now)
                return
            elif self.state == "fitting":
                if not self._poll_fit():
                    return
            else:
                if not self._refine(now):
                    self._guard(now)
                return

    # -- states ------------------------------------------------------------------------
    def _decide(self, now: float) -> bool:
        """Run one strategy step; True if it started something that takes time."""
        w = self.workload
        # a budget this workload was already tuned for: no profiling, straight to its mode
        # (not after measuring past the commit: the strategy commits what that found)
        known = w.remembered(self.budget_w) if self.strategy is None and not self.refined else None
        strategy = self.strategy or w.strategy
        action = (
            Commit(known) if known is not None else strategy.next_action(self.budget_w, w.samples)
        )
        if isinstance(action, Measure):
            if not self._switch(action.mode):
                return False
            if action.why:  # a pick with a reason of its own (a floor probe), not a plain one
                log.info("%s %s: measuring %s, %s", w.name, self.goal, action.mode, action.why)
            spec = replace(self.spec, abort_margin_w=math.inf) if action.full_window else self.spec
            self.window = ModeWindow(
                action.mode, spec, self.budget_w, time.monotonic(), w.kind == "training"
            )
            self._pool = action.pool
            self.state = "measuring"
            return True
        if isinstance(action, Fit):
            self._park()
            self.fit_future = self.hooks.submit_fit(w)
            self._fit_since = time.monotonic()
            self.state = "fitting"
            return True
        assert isinstance(action, Commit)
        if not self._switch(action.mode):
            return False
        self.committed = action
        self.state = "tuned"
        self._guard_start = self._held_since = now
        if self.decided_after_s is None:
            self.decided_after_s = now - self.started
        m = w.samples.get(action.mode)
        if (
            self.strategy is None
            and action.feasible
            and w.decisions.get(self.budget_w) != action.mode
        ):
            w.decisions[self.budget_w] = action.mode
            self.hooks.on_sample(w)
        self.message = (
            ""
            if action.feasible
            else f"no measured mode fits {self.budget_w:g} W: "
            "holding the lowest-power mode measured"
        )
        target = getattr(self.strategy, "step_time_ms", None)
        if target is not None and not action.feasible:
            self.message = (
                f"no measured mode meets {target:g} ms per step within {self.budget_w:g} W: "
                "holding the fastest measured"
            )
        if target is not None:  # the pin's own log line names only the power cap
            log.info(
                "%s %s: %s",
                w.name,
                self.goal,
                "target met" if action.feasible else "target not met, holding the fastest measured",
            )
        if m is not None:
            self.hooks.on_commit(action.mode, m)
        return True

    def _switch(self, mode: PowerMode) -> bool:
        try:
            self.hooks.apply_mode(mode)
        except Exception as exc:  # noqa: BLE001 - any failed switch is reported the same way
            self._switch_failures += 1
            # a device error names the switch itself; anything else gets it said here
            said = getattr(exc, "mode", None) == mode
            self.message = str(exc) if said else f"switch to {mode} failed: {exc}"
            log.error("%s", self.message)
            # never retry this mode for this workload in this run
            self.workload.samples[mode] = Measurement(mode, math.nan, math.inf, 0, True)
            if self._switch_failures >= MAX_SWITCH_FAILURES:
                raise TunerFailed(self.message) from exc
            return False
        self._switch_failures = 0
        self._applied = mode
        return True

    def _park(self) -> None:
        """Before a fit: leave a mode measured over the budget (a window stopped over it, or
        a pin a lowered budget no longer fits) for the fastest measured mode within it
        (else the one measured at the least power). A fit takes 0.1 s to seconds (a
        fine-tune in its worker), all of it over the budget otherwise; the job trains on
        at the parked mode."""
        samples = self.workload.samples
        m = samples.get(self._applied) if self._applied is not None else None
        if m is None or fits(m, self.budget_w):
            return
        safe = best_within(samples, self.budget_w) or least_power(samples)
        if safe is not None and safe.power_w < m.power_w:
            log.info(
                "%s: holding %s while fitting (%s drew %.2f W)",
                self.workload.name,
                safe.mode,
                m.mode,
                m.power_w,
            )
            self._switch(safe.mode)

    def _poll_window(self, now: float) -> None:
        assert self.window is not None
        if self._refining and self._idle(now):
            self._abandon_refine(now)
            return
        result = self.window.poll(now, self.hooks.power)
        if result is None:
            return
        w = self.workload
        samples = self.hooks.power(self.window.t_switch, now)
        w.cost.account(samples, self.budget_w)
        w.cost.modes_measured += 1
        old = w.samples.get(result.mode)
        w.samples[result.mode] = pooled_measurement(old, result) if self._pool else result
        log.info(
            "measured %s: %.1f ms/step, %.2f W%s",
            result.mode,
            result.time_ms,
            result.power_w,
            " (stopped early: over budget)"
            if result.aborted_over_budget
            else f" (over budget: timed on {result.steps} steps)"
            if result.power_w > self.budget_w
            else "",
        )
        self.hooks.on_sample(w)
        self.window = None
        self.state = "deciding"
        # a candidate's message stays until the strategy commits again (_decide says then)
        self._refining = False

    def refine_room(self) -> int:
        """Modes this job may still measure after its commit: `refine_share` of its
        length (expected steps, else the steps run so far), each measurement costing a
        settle + window of steps (at least min_steps) at the committed mode's measured
        speed."""
        length = self.expected_steps or self.steps_run
        if not length or self.spec.refine_share <= 0 or self.committed is None:
            return 0
        m = self.workload.samples.get(self.committed.mode)
        if m is None or not math.isfinite(m.time_ms) or m.time_ms <= 0:
            return 0
        per_probe = max(
            self.spec.min_steps, (self.spec.settle_s + self.spec.window_s) / (m.time_ms / 1e3)
        )
        return int(self.spec.refine_share * length / per_probe) - self.refined

    def _refine(self, now: float) -> bool:
        """Tuned, after holding the committed mode for one settle + window: measure the
        strategy's next promising mode if the job affords it. True if a window started."""
        c = self.committed
        if self._refine_done or c is None or not c.feasible:
            return False
        if now - self._held_since < self.spec.settle_s + self.spec.window_s:
            return False
        if self._idle(now):  # a paused job: a probe would measure nothing, and hold the board
            return False
        room = self.refine_room()
        if room <= 0:  # its share used up (a job of unknown length earns more as it runs)
            self._refine_done = bool(self.expected_steps)
            return False
        strategy = self.strategy or self.workload.strategy
        action = strategy.refine(self.budget_w, self.workload.samples, room)
        if action is None:
            self._refine_done = True
            log.info(
                "%s %s: nothing more to measure after the commit (%d measured, room %d)",
                self.workload.name,
                self.goal,
                self.refined,
                room,
            )
            return False
        if not self._switch(action.mode):
            self.state = "deciding"  # put the pinned mode back
            return True
        self.refined += 1
        self._refining = True
        note = f", {action.why}" if action.why else ""
        log.info(
            "%s %s: measuring %s after the commit%s (%d so far, room %d)",
            self.workload.name,
            self.goal,
            action.mode,
            note,
            self.refined,
            room - 1,
        )
        self.message = f"measuring a candidate mode after the commit ({self.refined} so far{note})"
        training = self.workload.kind == "training"
        self.window = ModeWindow(action.mode, self.spec, self.budget_w, time.monotonic(), training)
        self._pool = action.pool
        self.state = "measuring"
        return True

    def _abandon_refine(self, now: float) -> None:
        """The job stopped stepping during a measurement after the commit: back to the
        committed mode (the candidate stays unmeasured, to be tried when it steps again)."""
        c = self.committed
        assert c is not None and self.window is not None
        log.info(
            "%s: no steps for %.1f s while measuring %s after the commit: back to %s",
            self.workload.name,
            now - self._last_step,
            self.window.mode,
            c.mode,
        )
        self.window = None
        self._refining = False
        self.refined -= 1
        self.message = ""
        if self._switch(c.mode):
            self.state = "tuned"
            self._guard_start = self._held_since = now
        else:
            self.state = "deciding"

    def _poll_fit(self) -> bool:
        assert self.fit_future is not None
        if not self.fit_future.done():
            return False
        # the board ran the job meanwhile: part of what profiling cost
        self.workload.cost.account(
            self.hooks.power(self._fit_since, time.monotonic()), self.budget_w
        )
        try:
            predictor = self.fit_future.result()
        except Exception as exc:  # noqa: BLE001
            log.error("fitting %s failed: %s", self.workload.name, exc)
            self.message = f"fit failed: {exc}"
            predictor = None
        if predictor is not None:
            self.workload.predictor = predictor
            self.workload.fit_method = getattr(predictor, "method", "")
            self.workload.strategy.on_fitted(predictor)
        self.fit_future = None
        self.state = "deciding"
        return True

    def _guard(self, now: float) -> None:
        """Closed loop on the committed mode: re-decide if its power drifts over budget."""
        period = max(self.spec.window_s, 1.0) * 2
        if now - self._guard_start < period:
            return
        samples = self.hooks.power(self._guard_start, now)
        self._guard_start = now
        if len(samples) < 3 or self.committed is None:
            return
        watts = [w for _, w in samples]
        mean_w = statistics.fmean(watts)
        if mean_w <= self.budget_w + GUARD_MARGIN_W or not self.committed.feasible:
            return
        mode = self.committed.mode
        old = self.workload.samples.get(mode)
        t = old.time_ms if old is not None else math.nan
        log.warning(
            "%s draws %.2f W, over the %g W budget: choosing again", mode, mean_w, self.budget_w
        )
        # with its standard error, as a profiled window has: the refine's second look at a
        # near miss (PowerTrain._near_miss) weighs a reading by it
        steps = old.steps if old else 0
        self.workload.samples[mode] = Measurement(mode, t, mean_w, steps, False, mean_se(watts))
        self.hooks.on_sample(self.workload)
        self.committed = None
        self.state = "deciding"
