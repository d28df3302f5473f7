"""The control path: the one thread that owns the board.

It is the only writer of sysfs (mode switches with their read-back waits, restores), it
samples power through the device, runs the planner chosen by the kinds of the registered
jobs, and publishes into the registry what the request path answers from. Its progress
feeds the systemd watchdog, so a hung control path (a stuck sysfs write, a fit that never
returns) gets the daemon killed and restarted instead of holding the board silently.

Faults stay local: any exception in a tick is logged with the job and mode involved, that
job is released (`idle` with the reason), the board is given back, and the loop goes on.
A power sensor that stops changing while modes change is a fault of the same kind.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import shlex
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from powerd import protocol as p
from powerd.config import Config
from powerd.device.coexist import running_writers
from powerd.device.controller import ExternalChange
from powerd.fitting import Fitting
from powerd.hardware import Hardware
from powerd.inference_planner import InferenceJobsPlanner, InferenceSamples, InferenceSettings
from powerd.interleave_planner import InterleaveJobsPlanner
from powerd.modes import PowerMode
from powerd.optimize import make_strategy
from powerd.optimize.base import Measurement
from powerd.optimize.pareto import pareto_front
from powerd.planner import BoardHooks, JobSpec, JobView, Planner, PlannerRegistry
from powerd.profiler import WindowSpec
from powerd.registry import Registry, ReplyTo
from powerd.store import Store
from powerd.training import TrainingPlanner
from powerd.tuner import WorkloadState
from powerd.watchdog import SystemdNotifier

log = logging.getLogger("powerd.control")

LOOP_PERIOD_S = 0.02
FROZEN_S = 2.0  # identical power readings this long across a mode switch: a frozen sensor
SWITCH_SETTLE_S = 0.3  # a switch younger than this may not show in the power yet
MAX_FAULTS_KEPT = 20
CATALOGUE_PERIOD_S = 2.0  # how often the stored workload names are listed for status
EXTERNAL_CHECK_S = 0.5  # how often pinned values are read back for external rewrites
# "reapply" against a tool that keeps rewriting: each round doubles the check period up to
# this, so powerd neither spins nor floods the log; a quiet spell this long ends the fight.
REAPPLY_BACKOFF_MAX_S = 30.0
REAPPLY_QUIET_S = 30.0


class ControlLoop:
    def __init__(
        self,
        cfg: Config,
        device: Hardware,
        store: Store,
        registry: Registry,
        post_reply: Callable[[ReplyTo, p.BaseModel], None],
        notifier: SystemdNotifier,
        fitting: Fitting | None = None,
    ):
        self.cfg = cfg
        self.device = device
        self.store = store
        self.registry = registry
        self.post_reply = post_reply
        self.notifier = notifier
        self.fitting = fitting
        self.spec = WindowSpec(
            settle_s=cfg.profiling.settle_ms / 1000.0,
            window_s=cfg.profiling.window_ms / 1000.0,
            min_steps=cfg.profiling.min_steps,
            refine_share=cfg.profiling.refine_share,
        )
        self.heartbeat_timeout_s = cfg.server.heartbeat_timeout_ms / 1000.0
        self.fit_executor = ThreadPoolExecutor(1, thread_name_prefix="powerd-fit")
        self.planners = PlannerRegistry()
        self.planners.add(
            frozenset({"training"}), "training", lambda h: TrainingPlanner(h, self.spec)
        )
        self.inference_settings = InferenceSettings.from_config(cfg, device.sensor_lag_s)
        # measured (mode, batch size) pairs outlive any one planner (no re-profiling when
        # the board moves between inference alone and interleaving)
        self.inference_samples = InferenceSamples(self._load_inference, self._save_inference)
        self._pair_fitter: Any = None
        self.planners.add(
            frozenset({"inference"}),
            "inference",
            lambda h: InferenceJobsPlanner(
                h,
                self.spec,
                self.device.space.as_array(),
                self.inference_samples,
                self.pair_fitter,
                self.inference_settings,
            ),
        )
        # training measured under interleaving, per workload (kept apart from its own
        # tuning samples: a step that takes turns is not a step alone)
        self.joint_train: dict[str, dict[PowerMode, Measurement]] = {}
        # both kinds: listed last, as the single-kind entries do not cover both
        self.planners.add(
            frozenset({"training", "inference"}),
            "interleave",
            lambda h: InterleaveJobsPlanner(
                h,
                self.spec,
                self.device.space.as_array(),
                self.inference_samples,
                self.pair_fitter,
                self.inference_settings,
                self.joint_train,
            ),
        )
        self.planner: Planner | None = None
        self.planner_name = ""
        # workload state, least recently used first; live jobs' workloads are never evicted
        self.workloads: collections.OrderedDict[tuple[str, str], WorkloadState] = (
            collections.OrderedDict()
        )
        self.faults: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_FAULTS_KEPT)
        self.sensor_fault: dict[str, Any] | None = None
        self._sensor_released: list[str] = []
        self._last_mode: PowerMode | None = None
        self._switches: collections.deque[float] = collections.deque(maxlen=64)
        self._catalogue: list[str] = []
        # stored inference workloads: name -> (inference.json mtime, pairs, batch sizes)
        self._inference_catalogue: dict[str, tuple[float, int, list[int]]] = {}
        self._catalogue_t = -math.inf
        self._status_line = ""
        self._started = time.monotonic()
        self._board_dirty = True  # restore once at start: nothing may be left pinned
        self._external_t = -math.inf
        self._external_every = EXTERNAL_CHECK_S
        self._fight: dict[str, Any] | None = None  # the fault entry of an ongoing reapply fight
        self._fight_t = -math.inf
        # on_external_change = "yield": the fault entry and the jobs released, until the
        # next register or set_budget (registry.claims moves past `_yield_claims`)
        self._yielded: dict[str, Any] | None = None
        self._yield_claims = 0
        self.thread: threading.Thread | None = None

    # ---- thread ---------------------------------------------------------------------------
    def start(self, stop: threading.Event) -> None:
        self.thread = threading.Thread(
            target=self.run, args=(stop,), name="powerd-control", daemon=True
        )
        self.thread.start()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step(time.monotonic())
            except Exception:  # noqa: BLE001 - a bug outside the tick: no ping this round
                log.exception("control step failed")
            else:
                # progress: only a control loop that completes its steps keeps systemd happy
                self.notifier.watchdog()
            self._report_status()
            self.registry.wake.wait(LOOP_PERIOD_S)
            self.registry.wake.clear()

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    # ---- one step -------------------------------------------------------------------------
    def step(self, now: float) -> None:
        reg = self.registry
        with reg.lock:
            expired = []
            for job in list(reg.jobs.values()):
                if now - job.last_seen > self.heartbeat_timeout_s:
                    reg.remove(job.id)
                    expired.append((job, now - job.last_seen))
            specs = [j.spec() for j in reg.jobs.values()]
            batches = {j.id: list(j.pending) for j in reg.jobs.values() if j.pending}
            for j in reg.jobs.values():
                j.pending.clear()
            requests = list(reg.requests)
            reg.requests.clear()
            budget = reg.effective_budget()
            claims = reg.claims
        for job, silent_s in expired:
            log.info("job %s (%s) ended: no heartbeat for %.1f s", job.id, job.workload, silent_s)
        try:
            self._reacquire(specs, claims)
            self._plan(specs, budget, batches, now)
            self._check_external(now, specs, claims)
        except Exception as exc:  # noqa: BLE001 - a fault must not stop the control path
            self._tick_failed(exc)
        # while jobs hold the board, a reading over the line that stops a probe wakes the
        # loop at once: the probe ends on that reading, not up to a loop period later
        watch = budget + self.spec.abort_margin_w if specs else None
        self.device.sampler.watch(watch, self.registry.wake)
        if specs:
            self._board_dirty = True
        elif self._board_dirty:
            self._board_dirty = False
            self._give_board_back()
        if not specs or self.device.current_mode is None:
            # one retry mechanism for a restore that could not finish: the device's, with
            # its back-off (2 s doubling to 60 s), while no job holds the board: none is
            # registered, or those that are were released (no mode pinned for them)
            try:
                self.device.retry_restore(now)
            except Exception as exc:  # noqa: BLE001 - logged; retried after the back-off
                log.error("retrying the restore failed: %s", exc)
        self._publish(specs)
        for kind, reply_to, payload in requests:
            self._answer(kind, reply_to, payload)
        self._evict_workloads({(s.kind, s.workload) for s in specs})

    def _plan(
        self,
        specs: list[JobSpec],
        budget: float,
        batches: dict[str, list[tuple[list[float], list[float], list[int]]]],
        now: float,
    ) -> None:
        kinds = frozenset(s.kind for s in specs)
        chosen = self.planners.select(kinds) if kinds else None
        if chosen is None:
            self.planner, self.planner_name = None, ""
            self._check_sensor(now, specs)
            return
        name, factory = chosen
        if self.planner is None or name != self.planner_name:
            self.planner, self.planner_name = factory(self._hooks()), name
        planner = self.planner
        planner.sync(specs, budget, now)
        self._publish(specs)  # before any switch: no job reads a stale `tuned` under a probe
        for job_id, items in batches.items():
            for ends, durations, sizes in items:
                planner.feed(job_id, ends, durations, sizes)
        self._watch_mode(now)
        self._check_sensor(now, specs)
        if self.sensor_fault is None:
            planner.tick(now)
        self._watch_mode(time.monotonic())

    def _tick_failed(self, exc: Exception) -> None:
        job, mode = None, None
        if self.planner is not None:
            try:
                job, mode = self.planner.culprit()
            except Exception:  # noqa: BLE001
                pass
        log.exception(
            "control tick failed (job %s, mode %s): %s: %s",
            job,
            mode,
            type(exc).__name__,
            exc,
        )
        where = "" if mode is None else f" in mode {mode}"
        cause = f"powerd released this job after an error{where}: {type(exc).__name__}: {exc}"
        if self.planner is not None:
            try:
                self.planner.release([job] if job else None, cause)
            except Exception:  # noqa: BLE001 - a planner that cannot even release: start over
                log.exception("planner could not release job %s: dropping it", job)
                self.planner, self.planner_name = None, ""
        problem = self._give_board_back()
        # what happened after the error, in order: never that the board is back when not
        why = cause + (
            "; powerd then restored the board to its baseline"
            if problem is None
            else f"; restoring the baseline failed too: {problem} (powerd retries while no "
            "job holds the board)"
        )
        self._fault("control_tick", why, job=job, mode=mode)
        if self.planner is not None:
            self.planner.release([job] if job else None, why)

    def _give_board_back(self) -> str | None:
        """Restore the baseline; what went wrong (naming the files) or None when it worked.
        A failure is retried on idle ticks (Hardware.retry_restore)."""
        problem = None
        try:
            report = self.device.restore()
            if report is not None and not report.ok:
                problem = str(report)
        except Exception as exc:  # noqa: BLE001 - logged; retried on idle ticks
            log.error("restoring the baseline failed: %s", exc)
            problem = f"{type(exc).__name__}: {exc}"
        self._watch_mode(time.monotonic())
        return problem

    # ---- values another tool rewrote ------------------------------------------------------
    def _check_external(self, now: float, specs: list[JobSpec], claims: int) -> None:
        """Read the pinned values back (one read per file) at most every EXTERNAL_CHECK_S,
        only while powerd holds a verified mode. Runs between planner ticks on this
        thread, the only one that switches, so never during a switch in flight."""
        if not specs or self.device.current_mode is None:
            return
        if now - self._external_t < self._external_every:
            return
        self._external_t = now
        changes = self.device.external_changes()
        if not changes:
            if self._fight is not None and now - self._fight_t > REAPPLY_QUIET_S:
                log.info(
                    "no external rewrite for %g s: checking every %g s again",
                    REAPPLY_QUIET_S,
                    EXTERNAL_CHECK_S,
                )
                self._fight, self._external_every = None, EXTERNAL_CHECK_S
            return
        writers = running_writers(self.device.board.root)
        who = (
            "written by an unknown process (sysfs does not record the writer); running now: "
            + ", ".join(writers)
            if writers
            else "written by an unknown process (sysfs does not record the writer; no "
            "nvpmodel, jetson_clocks or jtop process is running now)"
        )
        what = "; ".join(str(c) for c in changes)
        policy = self.cfg.device.on_external_change
        job = self.planner.culprit()[0] if self.planner is not None else None
        mode = self.device.current_mode
        if policy == "reapply":
            self._reapply(now, changes, f"{what} ({who})", mode)
            return
        why = (
            f"another tool changed values powerd had pinned ({what}; {who}): powerd gave "
            'the board up ([device] on_external_change = "yield") and takes it again '
            "on the next register or set_budget"
        )
        log.warning("%s", why)
        entry = self._fault("external_change", why, job=job, mode=mode)
        found = [dataclasses.asdict(c) for c in changes]
        entry.update(action="yielded", active=True, changes=found)
        ids = [s.id for s in specs]
        if self.planner is not None:
            self.planner.release(ids, why)
        report = self.device.yield_board(changes)
        if not report.ok:
            log.error("yielding the board: %s", report)
        self._watch_mode(time.monotonic())
        self._yielded = {"entry": entry, "jobs": ids}
        self._yield_claims = claims

    def _reapply(
        self, now: float, changes: list[ExternalChange], what: str, mode: PowerMode | None
    ) -> None:
        """Write the pinned mode again. The first round of a fight is a fault entry and a
        warning; later rounds extend that entry, back the checks off, and log only at
        rounds 2, 4, 8, ... (a tool rewriting every second would otherwise spin both)."""
        found = [dataclasses.asdict(c) for c in changes]
        fight = self._fight
        if fight is None:
            log.warning("%s: writing mode %s again", what, mode)
            fight = self._fault("external_change", f"{what}; powerd wrote {mode} again")
            fight.update(action="reapplied", rounds=1, changes=found)
            self._fight = fight
        else:
            fight["rounds"] += 1
            known = {c["file"] for c in fight["changes"]}
            fight["changes"] += [c for c in found if c["file"] not in known]
            self._external_every = min(REAPPLY_BACKOFF_MAX_S, 2 * self._external_every)
            rounds = fight["rounds"]
            if rounds & (rounds - 1) == 0:
                log.warning(
                    "another tool keeps rewriting pinned values (round %d; now %s): powerd "
                    "writes mode %s again and checks every %g s; stop the other tool or set "
                    '[device] on_external_change = "yield"',
                    rounds,
                    what,
                    mode,
                    self._external_every,
                )
        self._fight_t = now
        self.device.reapply()
        self._watch_mode(time.monotonic())

    def _reacquire(self, specs: list[JobSpec], claims: int) -> None:
        """After a yield: a new register or set_budget takes the board again (when the last
        job left meanwhile, there is nothing to take back)."""
        y = self._yielded
        if y is None or (specs and claims == self._yield_claims):
            return
        if specs:
            log.info("a new request after yielding the board: powerd drives it again")
        y["entry"]["active"] = False
        self._yielded = None
        if self.planner is not None:
            self.planner.resume(y["jobs"])

    def _fault(
        self, kind: str, message: str, job: str | None = None, mode: PowerMode | None = None
    ) -> dict[str, Any]:
        entry = {
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "kind": kind,
            "message": message,
            "job": job,
            "mode": None if mode is None else mode.as_dict(),
        }
        self.faults.append(entry)
        return entry

    # ---- frozen power sensor --------------------------------------------------------------
    def _watch_mode(self, now: float) -> None:
        mode = self.device.current_mode
        if mode != self._last_mode:
            self._last_mode = mode
            self._switches.append(now)

    def _check_sensor(self, now: float, specs: list[JobSpec]) -> None:
        if self.sensor_fault is not None:
            recent = [w for _, w in self.device.power_between(now - 1.0, now)]
            latest = self.device.sampler.latest()
            if len(set(recent)) > 1 and latest is not None and now - latest[0] < FROZEN_S:
                log.warning("power readings move again: resuming the jobs")
                self.sensor_fault["active"] = False
                self.sensor_fault = None
                if self.planner is not None:
                    self.planner.resume(self._sensor_released)
                self._sensor_released = []
                return
            joined = [s.id for s in specs if s.id not in self._sensor_released]
            if joined and self.planner is not None:
                self._sensor_released += joined
                self.planner.release(joined, self.sensor_fault["message"])
            return
        if self.planner is None:
            return
        why = self._frozen_reason(now)
        if why is None:
            return
        log.error("%s: giving the board back", why)
        job, mode = self.planner.culprit()
        entry = self._fault("power_sensor_frozen", why, job=job, mode=mode)
        entry["active"] = True
        self.sensor_fault = entry
        self._sensor_released = [s.id for s in specs]
        problem = self._give_board_back()
        where = (
            "the board is back at its baseline"
            if problem is None
            else f"giving the board back failed ({problem}; retried while idle)"
        )
        self.planner.release(self._sensor_released, f"{why}; {where} until the sensor recovers")

    def _frozen_reason(self, now: float) -> str | None:
        latest = self.device.sampler.latest()
        if latest is None:
            if now - self._started > FROZEN_S:
                return f"no power samples for {FROZEN_S:g} s"
            return None
        if now - latest[0] > FROZEN_S:
            return f"no new power samples for {now - latest[0]:.1f} s"
        t0 = now - FROZEN_S
        switched = any(t0 <= t <= now - SWITCH_SETTLE_S for t in self._switches)
        if not switched:
            return None
        samples = self.device.power_between(t0 - 0.2, now)
        if len(samples) < 5 or samples[0][0] > t0:
            return None  # not enough history to tell
        if len({w for _, w in samples}) == 1:
            return (
                f"power sensor frozen: readings stuck at {samples[0][1]:.3f} W for "
                f"{FROZEN_S:g} s across mode switches"
            )
        return None

    # ---- publishing -----------------------------------------------------------------------
    def _publish(self, specs: list[JobSpec]) -> None:
        views: dict[str, JobView] = {}
        extra: dict[str, dict[str, Any]] = {}
        for s in specs:
            view = JobView("queued", "registered: waiting for the control loop")
            if self.planner is not None:
                try:
                    view = self.planner.phase_of(s.id)
                except Exception as exc:  # noqa: BLE001
                    log.exception("phase of job %s", s.id)
                    view = JobView("idle", f"powerd internal error: {exc}")
            views[s.id] = view
            w = self.workloads.get((s.kind, s.workload))
            extra[s.id] = {
                "profiled_modes": 0 if w is None else w.profiled_modes(),
                "fit_method": None if w is None else (w.fit_method or None),
            }
            job_extra = getattr(self.planner, "job_extra", None)
            if job_extra is not None:
                try:
                    extra[s.id].update(job_extra(s.id))
                except Exception:  # noqa: BLE001 - status only
                    log.exception("status of job %s", s.id)
        now = time.monotonic()
        if now - self._catalogue_t > CATALOGUE_PERIOD_S:
            self._catalogue_t = now
            try:
                self._catalogue = list(self.store.workloads(self.device.board.key))
                self._inference_catalogue = self._stored_inference()
            except OSError as exc:
                log.error("listing stored workloads: %s", exc)
        describe = None
        if self.planner is not None:
            try:
                describe = self.planner.describe()
            except Exception:  # noqa: BLE001
                log.exception("planner status")
        control = {
            "tuner": describe,
            "planner": self.planner_name or None,
            "job_extra": extra,
            "profiling": {
                w.name: w.cost.as_dict() for w in self.workloads.values() if w.cost.seconds
            },
            "inference_profiling": {
                name: c.as_dict() for name, c in self.inference_samples.costs.items() if c.seconds
            },
            "workloads": sorted(
                {w.name for w in self.workloads.values() if w.persistent}
                | set(self._catalogue)
                | set(self._inference_catalogue)
            ),
            "workload_state": self._workload_state(),
            "workloads_in_memory": [w.name for w in self.workloads.values()],
            "faults": list(self.faults),
            "power_sensor": "frozen" if self.sensor_fault is not None else "ok",
        }
        with self.registry.lock:
            self.registry.views = views
            self.registry.board_mode = self.device.current_mode
            self.registry.control = control
            self.registry.gate_managed = bool(getattr(self.planner, "manages_gate", False))

    def _stored_inference(self) -> dict[str, tuple[float, int, list[int]]]:
        """Stored inference workloads and their measured pairs (re-read only when changed)."""
        out = {}
        # by the names the files record, not by their directories' names
        for name, path in self.store.named_files(self.device.board.key, "inference.json").items():
            try:
                mtime = path.stat().st_mtime
            except OSError:
                continue
            known = self._inference_catalogue.get(name)
            if known is not None and known[0] == mtime:
                out[name] = known
                continue
            rows = (self.store.load_json(path) or {}).get("pairs") or []
            sizes = sorted({int(r.get("batch_size", 0)) for r in rows if isinstance(r, dict)})
            out[name] = (mtime, len(rows), sizes)
        return out

    def _workload_state(self) -> dict[str, dict[str, Any]]:
        """Per workload name, what is known of it as a training and as an inference workload:
        modes profiled and the fitted predictor; (mode, batch size) pairs measured (the pair
        model is refitted from them at each solve, so measured pairs mean fitted)."""
        out: dict[str, dict[str, Any]] = {}
        for name in self._catalogue:
            out.setdefault(name, {})["training"] = {"stored": True}
        for (kind, name), w in self.workloads.items():
            if kind != "training" or not (w.persistent or w.samples):
                continue
            out.setdefault(name, {})["training"] = {
                "stored": w.persistent and name in self._catalogue,
                "profiled_modes": w.profiled_modes(),
                "fitted": w.predictor is not None,
                "fit_method": w.fit_method or None,
            }
        for name, (_, n, sizes) in self._inference_catalogue.items():
            out.setdefault(name, {})["inference"] = {
                "stored": True,
                "pairs_profiled": n,
                "batch_sizes": sizes,
                "fitted": n > 0,
            }
        for name, pairs in self.inference_samples.in_memory().items():
            n = sum(1 for m in pairs.values() if math.isfinite(m.power_w))
            out.setdefault(name, {})["inference"] = {
                "stored": name in self._inference_catalogue,
                "pairs_profiled": n,
                "batch_sizes": sorted({q.batch_size for q in pairs}),
                "fitted": n > 0,
            }
        return dict(sorted(out.items()))

    def _report_status(self) -> None:
        with self.registry.lock:
            n = len(self.registry.jobs)
            budget = self.registry.effective_budget()
            phases = [v.phase for v in self.registry.views.values()]
        if not n:
            line = "idle: baseline mode"
        else:
            phase = phases[0] if phases else "queued"
            line = f"{n} job(s), {phase}, budget {budget:g} W, mode {self.device.current_mode}"
        if line != self._status_line:
            self._status_line = line
            self.notifier.status(line)

    # ---- deferred requests ----------------------------------------------------------------
    def _answer(self, kind: str, reply_to: ReplyTo, payload: Any) -> None:
        try:
            reply = getattr(self, f"_answer_{kind}")(reply_to.msg_id, payload)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the daemon
            log.exception("internal error answering %s", kind)
            reply = p.Error(
                id=reply_to.msg_id, code="internal", message=f"{type(exc).__name__}: {exc}"
            )
        self.post_reply(reply_to, reply)

    def _answer_restore(self, msg_id: int, released: int) -> p.BaseModel:
        self.planner, self.planner_name = None, ""
        if self._yielded is not None:
            self._yielded["entry"]["active"] = False
            self._yielded = None
        problem = self._give_board_back()
        self._board_dirty = False  # a failure is retried on idle ticks (with back-off)
        if problem is not None:
            return p.Error(
                id=msg_id,
                code="restore_failed",
                message=f"{released} job(s) released, but {problem}; powerd retries "
                "while idle (`powerctl status` shows restore_problem)",
                details={"released_jobs": released, "restore_problem": problem},
            )
        return p.Ok(id=msg_id, message=f"baseline restored; {released} job(s) released")

    def _answer_predict(self, msg_id: int, req: p.Predict) -> p.BaseModel:
        found = self._predictions(req.workload, msg_id)
        if isinstance(found, p.Error):
            return found
        modes, t, pw, w = found
        bounds = None
        interval = getattr(w.predictor, "predict_interval", None)  # fitted predictors only
        if interval is not None:
            try:
                _, t_lo, t_hi, _, p_lo, p_hi = interval(modes, overall=True)
                bounds = (t_lo, t_hi, p_lo, p_hi)
            except Exception as exc:  # noqa: BLE001 - the predictions stand without bounds
                log.warning("no prediction intervals for %s: %s", req.workload, exc)
        return p.Predictions(id=msg_id, workload=req.workload, rows=rows(modes, t, pw, bounds))

    def _answer_pareto(self, msg_id: int, req: p.Pareto) -> p.BaseModel:
        if req.kind == "inference":
            return self._inference_front(msg_id, req)
        found = self._predictions(req.workload, msg_id)
        if isinstance(found, p.Error):
            return found
        modes, t, pw, w = found
        front = pareto_front(t, pw)
        measured = [
            m for m in w.samples.values() if math.isfinite(m.power_w) and math.isfinite(m.time_ms)
        ]
        extra: dict[str, Any] = {
            "profiled": [
                {**m.mode.as_dict(), "time_ms": m.time_ms, "power_w": m.power_w} for m in measured
            ],
            "fit_method": w.fit_method or None,
        }
        d = self.planner.describe() if self.planner is not None else None
        if d and d.get("workload") == w.name:
            extra["budget_w"] = d.get("budget_w")
            c = d.get("committed")
            mode = None if c is None else PowerMode(**c)
            if mode is not None and mode in w.samples:
                m = w.samples[mode]
                extra["chosen"] = {**mode.as_dict(), "time_ms": m.time_ms, "power_w": m.power_w}
        return p.Predictions(
            id=msg_id,
            workload=req.workload,
            rows=rows(modes[front], t[front], pw[front]),
            extra=extra,
        )

    def _inference_front(self, msg_id: int, req: p.Pareto) -> p.BaseModel:
        """The predicted latency/power front per batch size at rate R, from the workload's
        pair model fitted to its measured pairs (the bundled prior when none)."""
        from powerd.optimize.inference import latency_power_front

        if req.rate_hz is None:
            return p.Error(id=msg_id, code="bad_request", message="--kind inference needs --rate R")
        samples = self.inference_samples.of(req.workload, True)
        sizes = (
            req.batch_sizes
            or sorted({m.batch_size for m in samples})
            or list(self.inference_settings.batch_sizes)
        )
        model = self.pair_fitter()(samples)
        front = latency_power_front(model, self.device.space.as_array(), sizes, req.rate_hz)
        measured = [
            {
                **m.pair.mode.as_dict(),
                "batch_size": m.pair.batch_size,
                "batch_ms": m.batch_ms,
                "batch_p99_ms": m.batch_p99_ms,
                "power_w": m.power_w,
            }
            for m in samples.values()
        ]
        return p.Predictions(
            id=msg_id,
            workload=req.workload,
            rows=front,
            extra={"kind": "inference", "rate_hz": req.rate_hz, "profiled": measured},
        )

    def _predictions(self, name: str, msg_id: int):  # noqa: ANN202
        """(modes, time_ms, power_w, workload) from the workload's fitted predictor."""
        w = self.workloads.get(("training", name))
        stored = self.store.workloads(self.device.board.key)
        # the store lists the names its files record (x@bs1, stored in a directory named
        # after its slug and a hash)
        if w is None and name in stored:
            w = self.workload("training", name, True)
        predictor = None if w is None else w.predictor
        if predictor is None:
            known = ", ".join(stored) or "none yet"
            # an inference workload asked without --kind inference: its pairs answer that
            pairs = self.inference_samples.in_memory().get(name)
            key = self.device.board.key
            if pairs is None and self.store.find(key, name, "inference.json") is not None:
                pairs = self.inference_samples.of(name, True)
            n = sum(1 for m in (pairs or {}).values() if math.isfinite(m.power_w))
            hint = (
                f"{name!r} has {n} measured inference pairs: ask for its front with "
                f"`powerctl pareto --workload {shlex.quote(name)} --kind inference --rate R`"
                if n
                else "a job with strategy powertrain fits one"
            )
            return p.Error(
                id=msg_id,
                code="not_found",
                message=f"no fitted predictor for workload {name!r} on this board "
                f"(workloads with samples: {known}); {hint}",
            )
        modes = self.device.space.as_array()
        # what users read: a fit's overall power head where it has one (decisions use the
        # other, see RidgeOptions.overall_blend)
        t, pw = getattr(predictor, "predict_overall", predictor.predict)(modes)
        return modes, t, pw, w

    # ---- workloads --------------------------------------------------------------------------
    def workload(self, kind: str, name: str, persistent: bool) -> WorkloadState:
        key = (kind, name)
        w = self.workloads.get(key)
        if w is not None:
            self.workloads.move_to_end(key)
            return w
        strategy = make_strategy(
            self.cfg.strategy.name,
            self.device.space,
            predictor_factory=self.fitting.reference if self.fitting else None,
            max_modes=self.cfg.profiling.modes,
        )
        samples = self.store.load_samples(self.device.board.key, name) if persistent else {}
        w = WorkloadState(name, kind, strategy, samples, persistent=persistent)
        if samples:
            w.decisions = self.store.load_decisions(self.device.board.key, name)
            log.info("workload %s: %d stored samples", name, len(samples))
            fitted = self.fitting.load_fitted(name) if self.fitting else None
            if fitted is not None:
                w.predictor = fitted
                w.fit_method = getattr(fitted, "method", "")
                strategy.on_fitted(fitted)
        self.workloads[key] = w
        return w

    def _evict_workloads(self, live: set[tuple[str, str]]) -> None:
        cap = self.cfg.state.workloads_in_memory
        for key in list(self.workloads):
            w = self.workloads[key]
            if key in live:
                continue
            if not w.persistent:
                del self.workloads[key]  # nothing stored to come back to
            elif len(self.workloads) > cap:
                log.info("workload %s: evicted from memory (reloaded from the store)", w.name)
                del self.workloads[key]

    def _hooks(self) -> BoardHooks:
        return BoardHooks(
            apply_mode=self.device.apply,
            power=self.device.power_between,
            submit_fit=self._submit_fit,
            persist=self._persist,
            on_commit=self._on_commit,
            workload=self.workload,
        )

    def _submit_fit(self, workload: WorkloadState) -> Future:
        if self.fitting is None:
            fut: Future = Future()
            fut.set_exception(RuntimeError("no predictor available"))
            return fut
        # a copy: the control path keeps owning the live samples while the fit runs
        return self.fit_executor.submit(
            self.fitting.fit,
            workload.name,
            dict(workload.samples),
            workload.persistent,
            self.device.space.as_array(),
        )

    def _persist(self, workload: WorkloadState) -> None:
        if workload.persistent:
            try:
                self.store.save_samples(self.device.board.key, workload.name, workload.samples)
                self.store.save_decisions(self.device.board.key, workload.name, workload.decisions)
            except OSError as exc:
                log.error("could not save samples of %s: %s", workload.name, exc)

    # ---- inference: the pair model and the measured pairs ---------------------------------
    def pair_fitter(self) -> Any:
        """The transfer of the bundled inference reference (batch size as a feature)."""
        if self._pair_fitter is None:
            from powerd.predictor.batch import load_prior, make_fitter

            self._pair_fitter = make_fitter(load_prior("infer-ref"), "infer-ref")
        return self._pair_fitter

    def _load_inference(self, name: str) -> dict | None:
        return self.store.load_workload_json(self.device.board.key, name, "inference.json")

    def _save_inference(self, name: str, obj: dict) -> None:
        self.store.save_workload_json(self.device.board.key, name, "inference.json", obj)

    def _on_commit(
        self, mode: PowerMode, m: Measurement, budget_w: float, step_time_ms: float | None = None
    ) -> None:
        speed = f"{m.time_ms:.1f} ms/step" if math.isfinite(m.time_ms) else "no step time"
        goal = (
            f"budget {budget_w:g} W"
            if step_time_ms is None
            else f"step-time target {step_time_ms:g} ms, power cap {budget_w:g} W"
        )
        why = ""
        if step_time_ms is not None and math.isfinite(m.time_ms) and m.time_ms > step_time_ms:
            why = ", the target is not met: the fastest measured within the cap"
        if m.power_w > budget_w:
            # an infeasible budget: the least power measured is held, over the budget
            why = ", over the budget: no measured mode meets it, this one draws least"
            if m.aborted_over_budget:
                speed += " (its window stopped early, over the budget)"
        log.info(
            "pinned %s: measured %s at %.2f W (%s%s)",
            mode,
            speed,
            m.power_w,
            goal,
            why,
        )

    def shutdown(self) -> None:
        self.fit_executor.shutdown(wait=False, cancel_futures=True)
        self.planner = None


def rows(modes: Any, t: Any, pw: Any, bounds: Any = None) -> list[dict[str, Any]]:
    """One dict per mode; with `bounds` (time lo, hi, power lo, hi arrays) also the model's
    uncertainty interval, time_ms_lo/hi and power_w_lo/hi (null where it has none)."""
    out = [
        {
            "cores": int(m[0]),
            "cpu_khz": int(m[1]),
            "gpu_hz": int(m[2]),
            "emc_hz": int(m[3]),
            # full precision: rounding made near-equal front points tie (a front that
            # seemed to hold a slower mode at a higher power)
            "time_ms": float(a),
            "power_w": float(b),
        }
        for m, a, b in zip(modes, t, pw, strict=True)
    ]
    if bounds is not None:
        keys = ("time_ms_lo", "time_ms_hi", "power_w_lo", "power_w_hi")
        for key, values in zip(keys, bounds, strict=True):
            for row, v in zip(out, values, strict=True):
                row[key] = float(v) if math.isfinite(v) else None
    return out
