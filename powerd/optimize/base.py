"""The interface every search strategy implements, and the values it trades in.

A strategy is a pure planner: given the budget and every measurement taken so far
for this workload, it says what to do next. It never touches hardware and never
waits. Because it re-derives its path from the samples, re-solving for a new budget
reuses every earlier measurement, and a restarted daemon resumes from the store.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Measure:
    """Profile this mode on the job's steps, then ask again."""

    mode: PowerMode


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


def fits(m: Measurement, budget_w: float) -> bool:
    return (not m.aborted_over_budget) and m.power_w <= budget_w


def best_within(samples: Mapping[PowerMode, Measurement], budget_w: float) -> Measurement | None:
    """The fastest measured mode whose measured power fits the budget."""
    ok = [m for m in samples.values() if fits(m, budget_w) and m.time_ms == m.time_ms]
    return min(ok, key=lambda m: (m.time_ms, m.power_w)) if ok else None


def fallback_commit(samples: Mapping[PowerMode, Measurement], budget_w: float) -> Commit:
    best = best_within(samples, budget_w)
    if best is not None:
        return Commit(best.mode)
    lowest = min(samples.values(), key=lambda m: m.power_w)
    return Commit(lowest.mode, feasible=False)


class Predictor(ABC):
    """A fitted time/power model of one workload over modes (implemented in powerd.predictor)."""

    @abstractmethod
    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """modes: int array (N, 4) of (cores, cpu_khz, gpu_hz, emc_hz) -> (time_ms, power_w)."""
