"""The interface between the daemon's control path and the planners that drive the board.

A planner owns the decisions for the jobs registered on the board: which mode to probe,
when to fit, what to pin, and what phase each job is in. Job kinds are planners behind
this one interface (training tuner now; an inference planner and an interleaving
scheduler later), chosen by which kinds are registered; the server never branches on a
job's kind. Planners run only on the control thread: they may touch the board through
their `BoardHooks` and never talk to clients; the control loop publishes what they say.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

from powerd.modes import PowerMode


@dataclass(frozen=True)
class JobSpec:
    """What a planner knows of one registered job (a copy taken from the registry)."""

    id: str
    kind: str
    workload: str
    persistent: bool  # False: an anonymous workload, nothing is stored
    budget_w: float
    registered: float
    latency_ms: float | None = None
    rate_hz: float | None = None
    batch_sizes: tuple[int, ...] | None = None  # inference: the sizes the job can run
    step_time_ms: float | None = None  # the step-time objective's target (None: budget)
    expected_steps: int | None = None  # training: the job's expected length (None: unknown)
    steps: int = 0  # steps (inference: batches) reported so far


@dataclass(frozen=True)
class JobView:
    """What a job is told: its phase, why, and whether its budget can be met.

    `budget_w` is the board's effective budget the view was computed for; the request path
    never reports `tuned` from a view computed for another budget."""

    phase: str  # "queued" | "profiling" | "fitting" | "tuned" | "idle"
    message: str = ""
    feasible: bool | None = None
    budget_w: float | None = None
    # the rest by keyword only: planners of different kinds fill different ones, and a
    # positional fifth argument once landed in the wrong field
    _: KW_ONLY
    # inference: the batch size to run, and when infeasible the latency powerd serves with
    batch_size: int | None = None
    best_latency_ms: float | None = None
    # "managed": the job enters each batch/step through the daemon's GPU gate
    gate: str = "open"
    fastest_ms: float | None = None  # step-time objective, target unmet: fastest measured


class Planner(Protocol):
    """One planner drives the board for the jobs of the kinds it serves."""

    kinds: frozenset[str]

    def sync(self, jobs: Sequence[JobSpec], budget_w: float, now: float) -> None:
        """The registered jobs of this planner's kinds and the board's effective budget."""

    def feed(
        self,
        job_id: str,
        ends: Sequence[float],
        durations: Sequence[float],
        sizes: Sequence[int] = (),
    ) -> None:
        """Step timestamps the job reported (CLOCK_MONOTONIC s), with durations if any, and
        an inference job's batch sizes if its client reports them."""

    def tick(self, now: float) -> None:
        """Advance: at most one mode switch. May raise; the control loop then releases
        `culprit()` and restores the board."""

    def phase_of(self, job_id: str) -> JobView: ...

    def culprit(self) -> tuple[str | None, PowerMode | None]:
        """The job and mode the planner was working on (named when a tick fails)."""

    def release(self, job_ids: Sequence[str] | None, message: str) -> None:
        """Stop driving the board for these jobs (None: all): they read `idle` with the
        message until `resume`. The control loop restores the board afterwards."""

    def resume(self, job_ids: Sequence[str] | None = None) -> None: ...

    def describe(self) -> dict[str, Any] | None:
        """The planner's state for `powerctl status` (JSON-serialisable)."""


@dataclass
class BoardHooks:
    """How a planner reaches the board and the store (supplied by the control loop)."""

    apply_mode: Callable[[PowerMode], None]  # raises on a failed switch (board left known)
    power: Callable[[float, float], Sequence[tuple[float, float]]]
    submit_fit: Callable[[Any], Any]  # WorkloadState -> Future of a Predictor
    persist: Callable[[Any], None]  # WorkloadState -> None
    # mode, Measurement, budget (a step-time job's power cap), step-time target or None
    on_commit: Callable[[PowerMode, Any, float, float | None], None]
    workload: Callable[[str, str, bool], Any]  # (kind, name, persistent) -> WorkloadState


PlannerFactory = Callable[[BoardHooks], Planner]


class PlannerRegistry:
    """Which planner serves which set of registered kinds: the first entry whose kinds
    cover every registered kind wins (so a combined scheduler listed first takes over
    when both kinds are on the board)."""

    def __init__(self) -> None:
        self._entries: list[tuple[frozenset[str], str, PlannerFactory]] = []

    def add(self, kinds: frozenset[str], name: str, factory: PlannerFactory) -> None:
        self._entries.append((kinds, name, factory))

    def supports(self, kind: str) -> bool:
        return any(kind in kinds for kinds, _, _ in self._entries)

    def select(self, kinds: frozenset[str]) -> tuple[str, PlannerFactory] | None:
        for covered, name, factory in self._entries:
            if kinds <= covered:
                return name, factory
        return None
