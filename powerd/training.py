"""The training planner: one Tuner at a time drives the board for the training jobs on it.

The board follows the lowest budget among the jobs (the effective budget). Each workload on
the board is tuned for that budget in turn (profiling only what its samples lack; a budget
it was tuned for before goes straight to the remembered mode). A plan is re-made only when
the effective budget or the set of workloads changes; a measurement in flight survives a
budget change (the mode's power and speed do not depend on the budget).

What a job reads is what is true (DESIGN "tuned"):
- the job whose workload is being tuned: `profiling` / `fitting`, then `tuned` once the mode
  in force is committed for the current effective budget with measured power within it;
- a job waiting while another workload is profiled: `queued`, naming that job;
- a committed mode that does not fit (no measured mode does): `idle`, `feasible=False`;
- a job released after a fault or after the daemon gave up: `idle` with the reason.

The step-time objective (a job registered with `step_time_ms`): its workload is tuned by a
`StepTimeSearch` over the workload's own strategy, capped by the effective budget. So a
step-time job on its own (its budget is the admin's ceiling unless it gave one) gets the
lowest-power mode whose measured step time meets its target; mixed with budget jobs, the
lowest budget still caps the board, and each workload's turn uses its own job's objective
(the oldest job of a workload decides its objective). An unreachable target is not a
budget miss: the job reads `tuned` holding the fastest measured mode within the cap, with
`feasible=False` and `fastest_ms` (the phase semantics stay those of the budget objective).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement
from powerd.optimize.time_target import StepTimeSearch
from powerd.planner import BoardHooks, JobSpec, JobView
from powerd.profiler import WindowSpec
from powerd.tuner import Tuner, TunerHooks, WorkloadState

log = logging.getLogger("powerd.training")

# A job whose workload is being profiled and that reports no step yet, or none for this
# long (a long evaluation, a checkpoint, a data loader warming up), gives its turn to a job
# that steps: without steps nothing can be measured, and the others would wait as long.
STALL_S = 10.0


@dataclass
class _Job:
    spec: JobSpec
    workload: WorkloadState


class TrainingPlanner:
    kinds = frozenset({"training"})

    def __init__(self, hooks: BoardHooks, spec: WindowSpec):
        self.hooks = hooks
        self.spec = spec
        self.jobs: dict[str, _Job] = {}
        self.budget_w: float | None = None
        self.tuner: Tuner | None = None
        self.tuner_job: str | None = None
        # (workload name, step-time target) -> the effective budget it was tuned for in
        # the current plan
        self.done: dict[tuple[str, float | None], float] = {}
        self.released: dict[str, str] = {}  # job id -> why it reads idle
        # job id -> (steps reported, when that count last grew): who is stalled
        self._stepped: dict[str, tuple[int, float]] = {}
        self._now = 0.0

    # ---- Planner interface ------------------------------------------------------------
    def sync(self, jobs: Sequence[JobSpec], budget_w: float, now: float) -> None:
        self._now = now
        ids = {j.id for j in jobs}
        for gone in [i for i in self.jobs if i not in ids]:
            self._remove(gone)
        for gone in [i for i in self._stepped if i not in ids]:
            del self._stepped[gone]
        for spec in jobs:
            seen = self._stepped.get(spec.id)
            if seen is None or seen[0] != spec.steps:
                self._stepped[spec.id] = (spec.steps, now)
        for gone in [i for i in self.released if i not in ids]:
            del self.released[gone]
        for spec in jobs:
            known = self.jobs.get(spec.id)
            if known is not None:
                known.spec = spec
            elif spec.id not in self.released:
                try:
                    w = self.hooks.workload(spec.kind, spec.workload, spec.persistent)
                except Exception as exc:  # noqa: BLE001 - one job's bad state stays its own
                    log.exception("job %s: cannot load workload %s", spec.id, spec.workload)
                    self.released[spec.id] = (
                        f"powerd could not load what it knows of workload {spec.workload!r}: "
                        f"{type(exc).__name__}: {exc}"
                    )
                    continue
                self.jobs[spec.id] = _Job(spec, w)
        if budget_w != self.budget_w:
            if self.budget_w is not None:
                log.info("effective budget %g W -> %g W: re-planning", self.budget_w, budget_w)
            self.budget_w = budget_w
            self.done.clear()
            if self.tuner is not None:
                self.tuner.set_budget(budget_w)
        live = {_key(j) for i, j in self.jobs.items() if i not in self.released}
        for key in [k for k in self.done if k not in live]:
            del self.done[key]
        self._arbitrate()

    def feed(
        self,
        job_id: str,
        ends: Sequence[float],
        durations: Sequence[float],
        sizes: Sequence[int] = (),
    ) -> None:
        if self.tuner is not None and job_id == self.tuner_job:
            # a training job alone is timed by its step intervals (its reported durations
            # only matter when it shares the GPU)
            self.tuner.feed_steps(list(ends), [])

    def tick(self, now: float) -> None:
        self._now = now
        self._arbitrate()
        if self.tuner is None:
            return
        job = self.jobs.get(self.tuner_job or "")
        if job is not None:  # how long the job runs sizes its measuring after the commit
            self.tuner.expected_steps = job.spec.expected_steps
            self.tuner.steps_run = job.spec.steps
        # TunerFailed (switches refused) and anything else reach the control loop, which
        # releases `culprit()` and gives the board back
        self.tuner.tick(now)
        self._note_done()
        self._arbitrate()

    def phase_of(self, job_id: str) -> JobView:
        view = self._phase_of(job_id)
        job = self.jobs.get(job_id)
        b = self.budget_w
        if view.phase == "tuned" and job is not None and b is not None and job.spec.budget_w > b:
            # the board follows the lowest budget: a job held under its own says why
            held = (
                f"held at {b:g} W, the lowest budget of the jobs on this board "
                f"(its own: {job.spec.budget_w:g} W)"
            )
            view = dataclasses.replace(
                view, message="; ".join(m for m in (view.message, held) if m)
            )
        return view

    def _phase_of(self, job_id: str) -> JobView:
        b = self.budget_w
        if job_id in self.released:
            return JobView("idle", self.released[job_id], None, b)
        job = self.jobs.get(job_id)
        if job is None:
            return JobView("queued", "registered: waiting for the control loop", None, b)
        t = self.tuner
        if t is not None and t.workload is job.workload and _target(t) == job.spec.step_time_ms:
            if t.ticks == 0:
                return JobView("queued", "about to decide", None, b)
            if t.refining:  # measuring after its commit: that commit's verdict stands
                return JobView(t.phase, t.message, t.feasible, b)
            if t.state != "tuned":
                return JobView(t.phase, t.message, None, b)
            if t.budget_w != b:
                return JobView("profiling", f"re-planning for {b:g} W", None, b)
            return _committed_view(t, b, t.message)
        if t is not None and t.state != "tuned" and not t.refining:
            other = self.jobs.get(self.tuner_job or "")
            name = other.workload.name if other else t.workload.name
            return JobView(
                "queued",
                f"waiting for job {self.tuner_job} ({name}) to finish {t.phase}",
                None,
                b,
            )
        if self._stalled(job_id) and self.done.get(_key(job)) != b:
            steps, since = self._stepped[job_id]
            quiet = (
                "no steps yet: its profiling waits until it steps"
                if steps == 0
                else f"no steps for {self._now - since:.0f} s: its profiling waits until it "
                "steps again"
            )
            return JobView("queued", quiet, None, b)
        if self.done.get(_key(job)) == b and t is not None and (t.state == "tuned" or t.refining):
            # another workload measuring after its commit keeps no one waiting (README
            # "queued": a workload being profiled), but it moves the board for a while
            said = (
                f"job {self.tuner_job} ({t.workload.name}) is measuring a candidate mode "
                "after its commit"
                if t.refining
                else ""
            )
            if t.feasible:
                return JobView("tuned", said, True, b)
            if _target(t) is not None:  # another job's unmet target: its budget is met
                return JobView("tuned", said, True, b)
            return JobView("idle", t.message, False, b)  # the board holds an infeasible mode
        return JobView("queued", "waiting for its turn to be tuned", None, b)

    def culprit(self) -> tuple[str | None, PowerMode | None]:
        if self.tuner is None:
            return None, None
        return self.tuner_job, self.tuner.current_mode

    def release(self, job_ids: Sequence[str] | None, message: str) -> None:
        ids = list(self.jobs) if job_ids is None else list(job_ids)
        for i in ids:
            if i in self.jobs:
                self.released[i] = message
        if self.tuner_job in self.released or job_ids is None:
            self.tuner = None
            self.tuner_job = None
        # the control loop gives the board back: every remaining workload commits again
        self.done.clear()

    def resume(self, job_ids: Sequence[str] | None = None) -> None:
        for i in list(self.released) if job_ids is None else job_ids:
            self.released.pop(i, None)
        self._arbitrate()

    def describe(self) -> dict[str, Any] | None:
        t = self.tuner
        if t is None:
            return None
        return {
            "planner": "training",
            "job": self.tuner_job,
            "workload": t.workload.name,
            "budget_w": t.budget_w,
            "step_time_ms": _target(t),
            "state": t.state,
            "measuring": None if t.window is None else t.window.mode.as_dict(),
            "committed": None if t.committed is None else t.committed.mode.as_dict(),
            "feasible": t.feasible,
            "decided_after_s": t.decided_after_s,
            "profiling": t.workload.cost.as_dict(),
        }

    # ---- arbitration --------------------------------------------------------------------
    def _remove(self, job_id: str) -> None:
        job = self.jobs.pop(job_id)
        self.released.pop(job_id, None)
        if job_id != self.tuner_job:
            return
        # another job of the same workload keeps the tuner (and its window) going
        heir = next(
            (
                i
                for i, j in sorted(self.jobs.items(), key=lambda kv: kv[1].spec.registered)
                if j.workload is job.workload
                and i not in self.released
                and self.tuner is not None
                and j.spec.step_time_ms == _target(self.tuner)
            ),
            None,
        )
        if heir is not None:
            self.tuner_job = heir
            return
        # the board holds (or probes) the leaving workload's mode: the others commit again
        self.tuner = None
        self.tuner_job = None
        self.done.clear()

    def _note_done(self) -> None:
        t = self.tuner
        if t is not None and t.state == "tuned" and t.budget_w == self.budget_w:
            self.done[(t.workload.name, _target(t))] = t.budget_w

    def _arbitrate(self) -> None:
        """One workload tunes at a time; the others wait their turn (queued)."""
        if self.budget_w is None:
            return
        waiting = [
            (i, j)
            for i, j in self.jobs.items()
            if i not in self.released and self.done.get(_key(j)) != self.budget_w
        ]
        # jobs that step go before jobs that do not (nothing can be measured without steps)
        stepping = [(i, j) for i, j in waiting if not self._stalled(i)]
        if self.tuner is not None and self.tuner.state != "tuned":
            others = [(i, j) for i, j in stepping if j.workload is not self.tuner.workload]
            if not (self._stalled(self.tuner_job or "") and others):
                return
            steps, since = self._stepped[self.tuner_job or ""]
            log.info(
                "job %s reports no steps %s: profiling %s waits; job %s goes first",
                self.tuner_job,
                "yet" if steps == 0 else f"for {self._now - since:.0f} s",
                self.tuner.workload.name,
                others[0][0],
            )
            self.tuner, self.tuner_job = None, None
        self._note_done()
        # a job that does not step does not start its turn either: its probes would measure
        # nothing, and move the board away from the modes the others were tuned to
        waiting = stepping if self.tuner is not None else (stepping or waiting)
        if not waiting:
            return
        job_id, job = min(waiting, key=lambda kv: kv[1].spec.registered)
        target = job.spec.step_time_ms
        t = self.tuner
        if t is not None and t.workload is job.workload and _target(t) == target:
            t.set_budget(self.budget_w)
        else:
            # a step-time job: the search bisects the budget of the workload's strategy
            search = None if target is None else StepTimeSearch(job.workload.strategy, target)
            self.tuner = Tuner(
                job.workload, self.budget_w, self.spec, self._tuner_hooks(target), strategy=search
            )
        self.tuner_job = job_id

    def _stalled(self, job_id: str) -> bool:
        """Not stepping: no step yet since it registered, or none for STALL_S."""
        seen = self._stepped.get(job_id)
        return seen is not None and (seen[0] == 0 or self._now - seen[1] > STALL_S)

    def _tuner_hooks(self, target_ms: float | None) -> TunerHooks:
        def on_commit(mode: PowerMode, m: Measurement) -> None:
            self.hooks.on_commit(mode, m, self.budget_w or 0.0, target_ms)

        return TunerHooks(
            apply_mode=self.hooks.apply_mode,
            power=self.hooks.power,
            submit_fit=self.hooks.submit_fit,
            on_sample=self.hooks.persist,
            on_commit=on_commit,
        )


def _target(t: Tuner) -> float | None:
    """The step-time target the tuner searches for (None: the budget objective)."""
    return getattr(t.strategy, "step_time_ms", None)


def _key(job: _Job) -> tuple[str, float | None]:
    return (job.workload.name, job.spec.step_time_ms)


def _committed_view(t: Tuner, b: float, message: str) -> JobView:
    """What the job whose workload `t` tuned reads once it committed for budget `b`."""
    if _target(t) is None:
        if not t.feasible:
            return JobView("idle", message, False, b)
        return JobView("tuned", message, True, b)
    # the step-time objective: the pinned mode is within the cap either way; an unmet
    # target says so with the fastest time measured within the cap
    fastest = None if t.feasible else getattr(t.strategy, "fastest_ms", None)
    return JobView("tuned", message, bool(t.feasible), b, fastest_ms=fastest)
