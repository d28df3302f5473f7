"""The daemon: ZeroMQ endpoints, the job registry, arbitration between jobs, the main loop.

One thread owns the board: every mode switch happens on the loop thread through the
device controller. Slow work (fitting) runs in an executor and is polled, so the loop
keeps answering clients and heartbeats at all times.
"""

from __future__ import annotations

import grp
import logging
import math
import os
import signal
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from powerd import protocol as p
from powerd.client import admin_endpoint
from powerd.config import Config
from powerd.fitting import Fitting
from powerd.hardware import Hardware
from powerd.modes import PowerMode
from powerd.optimize import make_strategy
from powerd.optimize.base import Measurement
from powerd.optimize.pareto import pareto_front
from powerd.optimize.time_target import StepTimeSearch
from powerd.profiler import WindowSpec
from powerd.store import Store
from powerd.tuner import Tuner, TunerFailed, TunerHooks, WorkloadState
from powerd.watchdog import SystemdNotifier

log = logging.getLogger("powerd.server")

LOOP_PERIOD_S = 0.02


@dataclass
class JobRecord:
    id: str
    kind: str
    workload: WorkloadState
    budget_w: float
    identity: bytes
    pid: int | None
    last_seen: float
    registered: float
    needs_tuning: bool = True
    steps: int = 0
    latency_ms: float | None = None
    rate_hz: float | None = None
    message: str = ""
    step_time_ms: float | None = None  # the step-time objective's target (None: budget)

    def describe(self, phase: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "workload": self.workload.name,
            "budget_w": self.budget_w,
            "phase": phase,
            "pid": self.pid,
            "steps": self.steps,
            "profiled_modes": self.workload.profiled_modes(),
            "fit_method": self.workload.fit_method or None,
            "message": self.message,
        }


@dataclass
class Daemon:
    cfg: Config
    device: Hardware
    store: Store = field(init=False)
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    workloads: dict[tuple[str, str], WorkloadState] = field(default_factory=dict)
    tuner: Tuner | None = None
    tuner_job: str | None = None
    default_budget_w: float = 0.0
    fit_executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="powerd-fit")
    )
    fitting: Fitting | None = None  # None: no predictor (binary-search only)

    def __post_init__(self) -> None:
        self.store = Store(self.cfg.state.dir)
        if self.cfg.strategy.name == "powertrain" and self.fitting is None:
            self.fitting = Fitting(self.cfg, self.store, self.device.board.key)
        self.default_budget_w = self._load_default_budget()
        self.spec = WindowSpec(
            settle_s=self.cfg.profiling.settle_ms / 1000.0,
            window_s=self.cfg.profiling.window_ms / 1000.0,
            min_steps=self.cfg.profiling.min_steps,
        )
        self.heartbeat_timeout_s = self.cfg.server.heartbeat_timeout_ms / 1000.0

    # ---- budgets ------------------------------------------------------------------------
    def _load_default_budget(self) -> float:
        saved = self.store.load_json(self.store.settings_path()) or {}
        b = saved.get("default_budget_w")
        lim = self.cfg.budget
        if isinstance(b, (int, float)) and lim.min_w <= b <= lim.max_w:
            return float(b)
        return lim.default_w

    def _check_budget(self, budget_w: float, msg_id: int) -> p.Error | None:
        lim = self.cfg.budget
        if not (lim.min_w <= budget_w <= lim.max_w):
            return p.Error(
                id=msg_id,
                code="budget_rejected",
                message=f"budget {budget_w:g} W is outside the admin's limits "
                f"[{lim.min_w:g}, {lim.max_w:g}] W (/etc/powerd.toml [budget])",
                details={"min_w": lim.min_w, "max_w": lim.max_w},
            )
        return None

    def effective_budget(self) -> float:
        """The board follows the lowest budget among the jobs."""
        if not self.jobs:
            return self.default_budget_w
        return min(j.budget_w for j in self.jobs.values())

    # ---- requests -------------------------------------------------------------------------
    def handle(self, identity: bytes, raw: bytes, admin: bool, now: float) -> p.BaseModel:
        try:
            req = p.decode_request(raw)
        except p.ProtocolError as exc:
            log.warning("rejected a malformed message: %s", exc)
            return p.Error(id=exc.msg_id, code=exc.code, message=str(exc))
        if req.type in p.ADMIN_TYPES and not admin:
            return p.Error(
                id=req.id,
                code="forbidden",
                message=f"'{req.type}' is for admins: use the admin socket "
                f"({admin_endpoint(self.cfg.server.endpoint)}), open to group "
                f"'{self.cfg.server.admin_group}'",
            )
        handler = getattr(self, f"_on_{req.type}")
        try:
            return handler(req, identity, now)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the daemon
            log.exception("internal error handling %s", req.type)
            return p.Error(id=req.id, code="internal", message=f"{type(exc).__name__}: {exc}")

    def _job_or_error(self, job_id: str, msg_id: int) -> JobRecord | p.Error:
        job = self.jobs.get(job_id)
        if job is None:
            return p.Error(
                id=msg_id,
                code="unknown_job",
                message=f"no job {job_id}: it ended, or its heartbeats stopped for longer than "
                f"{self.heartbeat_timeout_s:g} s",
            )
        return job

    def _on_register(self, req: p.Register, identity: bytes, now: float) -> p.BaseModel:
        if req.kind != "training":
            return p.Error(
                id=req.id,
                code="bad_request",
                message="kind='inference' is not supported by this powerd version yet",
            )
        budget = self.default_budget_w if req.budget_w is None else req.budget_w
        err = self._check_budget(budget, req.id)
        if err is not None:
            return err
        job_id = uuid.uuid4().hex[:12]
        name = req.workload or f"anonymous-{job_id}"
        workload = self._workload(req.kind, name, persistent=req.workload is not None)
        old_budget = self.effective_budget()
        job = JobRecord(
            id=job_id,
            kind=req.kind,
            workload=workload,
            budget_w=budget,
            identity=identity,
            pid=req.pid,
            last_seen=now,
            registered=now,
            latency_ms=req.latency_ms,
            rate_hz=req.rate_hz,
            step_time_ms=req.step_time_ms,
        )
        self.jobs[job_id] = job
        log.info(
            "job %s registered: workload %s, budget %g W, pid %s", job_id, name, budget, req.pid
        )
        if self.effective_budget() != old_budget:
            self._budget_changed()
        self._arbitrate()  # so the first reply already says whether it profiles or waits
        return self._job_state(job, req.id)

    def _on_steps(self, req: p.Steps, identity: bytes, now: float) -> p.BaseModel:
        job = self._job_or_error(req.job, req.id)
        if isinstance(job, p.Error):
            return job
        job.last_seen = now
        job.identity = identity
        job.steps += len(req.t)
        if self.tuner is not None and self.tuner_job == job.id:
            self.tuner.feed_steps(req.t, req.d)
        return self._job_state(job, req.id)

    def _on_set_budget(self, req: p.SetBudget, identity: bytes, now: float) -> p.BaseModel:
        job = self._job_or_error(req.job, req.id)
        if isinstance(job, p.Error):
            return job
        err = self._check_budget(req.budget_w, req.id)
        if err is not None:
            return err
        job.last_seen = now
        if req.budget_w != job.budget_w:
            job.budget_w = req.budget_w
            log.info("job %s: budget now %g W", job.id, req.budget_w)
            self._budget_changed()
        return self._job_state(job, req.id)

    def _on_set_rate(self, req: p.SetRate, identity: bytes, now: float) -> p.BaseModel:
        return p.Error(id=req.id, code="bad_request", message="set_rate applies to inference jobs")

    def _on_close(self, req: p.Close, identity: bytes, now: float) -> p.BaseModel:
        job = self._job_or_error(req.job, req.id)
        if isinstance(job, p.Error):
            return job
        self._drop_job(job.id, "closed by its client")
        return p.Ok(id=req.id, message="closed")

    def _on_status(self, req: p.Status, identity: bytes, now: float) -> p.BaseModel:
        return p.StatusReply(id=req.id, status=self.status())

    def _on_predict(self, req: p.Predict, identity: bytes, now: float) -> p.BaseModel:
        found = self._predictions(req.workload, req.id)
        if isinstance(found, p.Error):
            return found
        modes, t, pw, w = found
        bounds = None
        interval = getattr(w.predictor, "predict_interval", None)  # fitted predictors only
        if interval is not None:
            try:
                _, t_lo, t_hi, _, p_lo, p_hi = interval(modes)
                bounds = (t_lo, t_hi, p_lo, p_hi)
            except Exception as exc:  # noqa: BLE001 - the predictions stand without bounds
                log.warning("no prediction intervals for %s: %s", req.workload, exc)
        return p.Predictions(id=req.id, workload=req.workload, rows=_rows(modes, t, pw, bounds))

    def _on_pareto(self, req: p.Pareto, identity: bytes, now: float) -> p.BaseModel:
        found = self._predictions(req.workload, req.id)
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
        if self.tuner is not None and self.tuner.workload is w:
            extra["budget_w"] = self.tuner.budget_w
            c = self.tuner.committed
            if c is not None and c.mode in w.samples:
                m = w.samples[c.mode]
                extra["chosen"] = {**c.mode.as_dict(), "time_ms": m.time_ms, "power_w": m.power_w}
        return p.Predictions(
            id=req.id,
            workload=req.workload,
            rows=_rows(modes[front], t[front], pw[front]),
            extra=extra,
        )

    def _predictions(self, name: str, msg_id: int):  # noqa: ANN202
        """(modes, time_ms, power_w, workload) from the workload's fitted predictor."""
        w = self.workloads.get(("training", name))
        if w is None and name in self.store.workloads(self.device.board.key):
            w = self._workload("training", name, persistent=True)
        predictor = None if w is None else w.predictor
        if predictor is None:
            known = ", ".join(self.store.workloads(self.device.board.key)) or "none yet"
            return p.Error(
                id=msg_id,
                code="not_found",
                message=f"no fitted predictor for workload {name!r} on this board "
                f"(workloads with samples: {known}); a job with strategy powertrain fits one",
            )
        modes = self.device.space.as_array()
        t, pw = predictor.predict(modes)
        return modes, t, pw, w

    def _on_set_default_budget(
        self, req: p.SetDefaultBudget, identity: bytes, now: float
    ) -> p.BaseModel:
        err = self._check_budget(req.budget_w, req.id)
        if err is not None:
            return err
        self.default_budget_w = req.budget_w
        self.store.save_json(self.store.settings_path(), {"default_budget_w": req.budget_w})
        log.info("default budget now %g W", req.budget_w)
        return p.Ok(id=req.id, message=f"default budget {req.budget_w:g} W")

    def _on_restore(self, req: p.Restore, identity: bytes, now: float) -> p.BaseModel:
        n = len(self.jobs)
        for job_id in list(self.jobs):
            self._drop_job(job_id, "an admin restored the baseline", restore=False)
        self._give_board_back()
        return p.Ok(id=req.id, message=f"baseline restored; {n} job(s) released")

    # ---- job state ------------------------------------------------------------------------
    def _workload(self, kind: str, name: str, persistent: bool) -> WorkloadState:
        key = (kind, name)
        w = self.workloads.get(key)
        if w is None:
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

    def phase_of(self, job: JobRecord) -> str:
        if self.tuner is not None and self.tuner_job == job.id:
            return self.tuner.phase
        return "queued" if job.needs_tuning else "tuned"

    def _job_state(self, job: JobRecord, msg_id: int) -> p.JobState:
        mode = self.device.current_mode
        message = job.message
        if self.tuner is not None and self.tuner_job == job.id and self.tuner.message:
            message = self.tuner.message
        fastest = None
        if self.tuner is not None and self.tuner_job == job.id:
            fastest = getattr(self.tuner.strategy, "fastest_ms", None)
            c = self.tuner.committed
            fastest = fastest if c is not None and not c.feasible else None
        return p.JobState(
            id=msg_id,
            job=job.id,
            phase=self.phase_of(job),  # type: ignore[arg-type]
            mode=None if mode is None else p.ModeModel(**mode.as_dict()),
            budget_w=job.budget_w,
            heartbeat_ms=max(100, self.cfg.server.heartbeat_timeout_ms // 5),
            message=message,
            objective="power_budget" if job.step_time_ms is None else "step_time",
            step_time_ms=job.step_time_ms,
            fastest_ms=fastest,
        )

    def _budget_changed(self) -> None:
        eff = self.effective_budget()
        for job in self.jobs.values():
            job.needs_tuning = True
        if self.tuner is not None:
            self.tuner.set_budget(eff)

    def _drop_job(self, job_id: str, why: str, restore: bool = True) -> None:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        log.info("job %s (%s) ended: %s", job_id, job.workload.name, why)
        if not job.workload.persistent:
            self.workloads.pop((job.kind, job.workload.name), None)
        if self.tuner_job == job_id:
            self.tuner = None
            self.tuner_job = None
        if self.jobs:
            self._budget_changed()
        elif restore:
            self._give_board_back()

    def _give_board_back(self) -> None:
        self.tuner = None
        self.tuner_job = None
        self.device.restore()

    # ---- the loop's periodic work -----------------------------------------------------------
    def tick(self, now: float) -> None:
        for job in list(self.jobs.values()):
            if now - job.last_seen > self.heartbeat_timeout_s:
                self._drop_job(job.id, f"no heartbeat for {now - job.last_seen:.1f} s")
        if not self.jobs:
            return
        self._arbitrate()
        if self.tuner is None:
            return
        try:
            self.tuner.tick(now)
        except TunerFailed as exc:
            job = self.jobs.get(self.tuner_job or "")
            log.error("giving the board back: %s", exc)
            if job is not None:
                job.message = f"powerd gave up tuning: {exc}"
                job.needs_tuning = False
            self._give_board_back()
            return
        if self.tuner.state == "tuned" and self.tuner_job in self.jobs:
            self.jobs[self.tuner_job].needs_tuning = False

    def _arbitrate(self) -> None:
        """One job tunes at a time; the others wait their turn (queued)."""
        if self.tuner is not None and self.tuner.state != "tuned":
            return
        waiting = [j for j in self.jobs.values() if j.needs_tuning]
        if not waiting:
            return
        job = min(waiting, key=lambda j: j.registered)
        search = None
        if job.step_time_ms is not None:
            search = StepTimeSearch(job.workload.strategy, job.step_time_ms)
        self.tuner = Tuner(
            job.workload, self.effective_budget(), self.spec, self._hooks(), strategy=search
        )
        self.tuner_job = job.id
        job.message = ""

    def _hooks(self) -> TunerHooks:
        return TunerHooks(
            apply_mode=self.device.apply,
            power=self.device.power_between,
            submit_fit=self._submit_fit,
            on_sample=self._persist,
            on_commit=self._on_commit,
        )

    def _submit_fit(self, workload: WorkloadState) -> Future:
        if self.fitting is None:
            fut: Future = Future()
            fut.set_exception(RuntimeError("no predictor available"))
            return fut
        # a copy: the loop keeps owning the live samples while the fit runs
        return self.fit_executor.submit(
            self.fitting.fit, workload.name, dict(workload.samples), workload.persistent
        )

    def _persist(self, workload: WorkloadState) -> None:
        if workload.persistent:
            try:
                self.store.save_samples(self.device.board.key, workload.name, workload.samples)
                self.store.save_decisions(self.device.board.key, workload.name, workload.decisions)
            except OSError as exc:
                log.error("could not save samples of %s: %s", workload.name, exc)

    def _on_commit(self, mode: PowerMode, m: Measurement) -> None:
        log.info(
            "pinned %s: measured %.1f ms/step at %.2f W (budget %g W)",
            mode,
            m.time_ms,
            m.power_w,
            self.effective_budget(),
        )

    # ---- status -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        mode = self.device.current_mode
        power = self.device.latest_power()
        return {
            "board": self.device.board.model,
            "board_key": self.device.board.key,
            "l4t": self.device.board.l4t,
            "mode": None if mode is None else mode.as_dict(),
            "power_w": None if power is None else round(power, 3),
            "budget_w": self.effective_budget(),
            "default_budget_w": self.default_budget_w,
            "limits_w": {"min": self.cfg.budget.min_w, "max": self.cfg.budget.max_w},
            "strategy": self.cfg.strategy.name,
            "mode_space_size": self.device.space.size,
            "jobs": [j.describe(self.phase_of(j)) for j in self.jobs.values()],
            "tuner": None
            if self.tuner is None
            else {
                "job": self.tuner_job,
                "state": self.tuner.state,
                "measuring": None
                if self.tuner.window is None
                else self.tuner.window.mode.as_dict(),
                "committed": None
                if self.tuner.committed is None
                else self.tuner.committed.mode.as_dict(),
                "decided_after_s": self.tuner.decided_after_s,
                "profiling": self.tuner.workload.cost.as_dict(),
            },
            "profiling": {
                w.name: w.cost.as_dict() for w in self.workloads.values() if w.cost.seconds
            },
            "workloads": sorted(
                {w.name for w in self.workloads.values() if w.persistent}
                | set(self.store.workloads(self.device.board.key))
            ),
        }

    def shutdown(self) -> None:
        self.fit_executor.shutdown(wait=False, cancel_futures=True)
        self.tuner = None
        self.device.restore()
        self.device.close()


def _rows(modes: Any, t: Any, pw: Any, bounds: Any = None) -> list[dict[str, Any]]:
    """One dict per mode; with `bounds` (time lo, hi, power lo, hi arrays) also the model's
    uncertainty interval, time_ms_lo/hi and power_w_lo/hi (null where it has none)."""
    rows = [
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
            for row, v in zip(rows, values, strict=True):
                row[key] = float(v) if math.isfinite(v) else None
    return rows


# ---- sockets -----------------------------------------------------------------------------


def _ipc_path(endpoint: str) -> Path | None:
    return Path(endpoint[len("ipc://") :]) if endpoint.startswith("ipc://") else None


def _prepare_ipc(endpoint: str) -> None:
    path = _ipc_path(endpoint)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        from powerd.client import call_once

        try:
            call_once(endpoint, p.Status(), timeout_s=0.3)
        except Exception:  # noqa: BLE001 - nobody answered: a stale socket from a crash
            path.unlink()
        else:
            raise RuntimeError(f"another powerd is already serving {endpoint}")


def _set_socket_access(endpoint: str, group: str) -> None:
    """0660 with the configured group; a group that does not exist: warn, root-only."""
    path = _ipc_path(endpoint)
    if path is None:
        return
    if not group:
        os.chmod(path, 0o660)
        return
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        log.warning("group %r does not exist: %s stays root-only (0600)", group, path)
        os.chmod(path, 0o600)
        return
    os.chown(path, -1, gid)
    os.chmod(path, 0o660)


class Server:
    """Binds the sockets and runs the daemon's loop until stopped."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon
        self.stop_event = threading.Event()
        self.notifier = SystemdNotifier()

    def serve(self) -> None:
        cfg = self.daemon.cfg.server
        ctx = zmq.Context.instance()
        endpoints = [
            (cfg.endpoint, cfg.socket_group, False),
            (admin_endpoint(cfg.endpoint), cfg.admin_group, True),
        ]
        socks: dict[zmq.Socket, bool] = {}
        poller = zmq.Poller()
        try:
            for ep, group, admin in endpoints:
                _prepare_ipc(ep)
                s = ctx.socket(zmq.ROUTER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.ROUTER_MANDATORY, 0)
                s.bind(ep)
                _set_socket_access(ep, group)
                poller.register(s, zmq.POLLIN)
                socks[s] = admin
                log.info("listening on %s%s", ep, " (admin)" if admin else "")
            self.notifier.ready(f"serving {cfg.endpoint}")
            self._loop(poller, socks)
        finally:
            self.notifier.stopping()
            for s in socks:
                s.close()
            for ep, _, _ in endpoints:
                path = _ipc_path(ep)
                if path is not None and path.exists():
                    path.unlink(missing_ok=True)
            self.daemon.shutdown()

    def _loop(self, poller: zmq.Poller, socks: dict[zmq.Socket, bool]) -> None:
        last_status = ""
        while not self.stop_event.is_set():
            events = dict(poller.poll(int(LOOP_PERIOD_S * 1000)))
            now = time.monotonic()
            for s, admin in socks.items():
                if s not in events:
                    continue
                while True:
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) != 2:
                        log.warning("dropping a message with %d frames", len(frames))
                        continue
                    reply = self.daemon.handle(frames[0], frames[1], admin, now)
                    s.send_multipart([frames[0], p.encode(reply)])
            self.daemon.tick(time.monotonic())
            status = self._status_line()
            if status != last_status:
                self.notifier.status(status)
                last_status = status
            self.notifier.watchdog()

    def _status_line(self) -> str:
        d = self.daemon
        if not d.jobs:
            return "idle: baseline mode"
        phase = d.phase_of(next(iter(d.jobs.values()))) if d.tuner is None else d.tuner.phase
        mode = d.device.current_mode
        return f"{len(d.jobs)} job(s), {phase}, budget {d.effective_budget():g} W, mode {mode}"

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: object) -> None:
            log.info("signal %d: restoring the baseline and stopping", signum)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
