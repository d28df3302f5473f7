"""A pass-through strategy that records what powertrain does after a commit (refine), and
the replay that drives it: shared by the refine, near-miss and rehearsal tests."""

from __future__ import annotations

from collections.abc import Mapping

from powerd.modes import FIELDS, PowerMode
from powerd.optimize.base import Action, Commit, Measure, Measurement, Predictor, Strategy
from powerd.optimize.powertrain import PowerTrain
from powerd.sim.trace import Trace
from powerd_replay.training import GridSpace, NoiseModel, NoisyOracle, RidgeFitter, replay_sweep


class Watch(Strategy):
    """Passes through; records each refine pick with the model's power prediction then (and
    apart, those that rehearse a lower budget, the long shots and the swaps), each near miss
    measured again, the measured time of every commit, and the modes measured per budget."""

    def __init__(self, inner: PowerTrain):
        self.inner = inner
        self.name = inner.name
        self.refines: list[tuple[float, PowerMode, float]] = []  # budget, mode, predicted W
        self.rehearsed: list[tuple[float, PowerMode, float]] = []  # the same, rehearsals
        self.longshots: list[tuple[float, PowerMode, float]] = []  # ... and long shots
        self.swaps: list[tuple[float, PowerMode, float]] = []  # ... and swap neighbours
        self.again: list[tuple[float, Measurement]] = []  # budget, the near miss re-measured
        self.commits: list[tuple[float, PowerMode, float]] = []  # budget, mode, measured ms
        self.new: dict[float, set[PowerMode]] = {}
        self.why: list[tuple[PowerMode, str]] = []  # every refine Measure and its note

    def next_action(self, budget_w: float, samples: Mapping[PowerMode, Measurement]) -> Action:
        action = self.inner.next_action(budget_w, samples)
        if isinstance(action, Measure):
            self.new.setdefault(budget_w, set()).add(action.mode)
        if isinstance(action, Commit) and action.feasible:
            self.commits.append((budget_w, action.mode, samples[action.mode].time_ms))
        return action

    def refine(self, budget_w, samples, room):
        own = {k: v for k, v in samples.items() if k in self.inner.index}
        _, p, _, _ = self.inner._corrected(own)
        rehearsed, longshots, swaps = (
            self.inner._rehearsed,
            self.inner._longshots,
            self.inner._swaps,
        )
        action = self.inner.refine(budget_w, samples, room)
        if action is not None:
            self.why.append((action.mode, action.why))
        if action is not None and action.mode in samples:
            self.again.append((budget_w, samples[action.mode]))
        elif action is not None:
            pick = (budget_w, action.mode, float(p[self.inner.index[action.mode]]))
            self.refines.append(pick)
            if self.inner._rehearsed > rehearsed:
                self.rehearsed.append(pick)
            if self.inner._longshots > longshots:
                self.longshots.append(pick)
            if self.inner._swaps > swaps:
                self.swaps.append(pick)
            self.new.setdefault(budget_w, set()).add(action.mode)
        return action

    def on_fitted(self, predictor: Predictor) -> None:
        self.inner.on_fitted(predictor)


def sweep(trace: Trace, budgets, refine_room: int, seed: int = 0, **tuning):
    """Replay `budgets` as one workload with the stand-in predictors (a noisy oracle and its
    ridge refit), `refine_room` modes after each commit; PowerTrain gets `tuning`."""
    oracle = NoisyOracle(trace, time_err=0.10, power_err=0.05, jitter=0.02, seed=seed)
    fitter = RidgeFitter(oracle, [trace.axis(f) for f in FIELDS])
    watch = Watch(PowerTrain(GridSpace.from_trace(trace), lambda: oracle, **tuning))
    res = replay_sweep(
        watch, trace, budgets, fitter=fitter, noise=NoiseModel(seed=seed), refine_room=refine_room
    )
    return watch, res
