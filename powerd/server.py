"""The daemon's request path: ZeroMQ endpoints and the job registry.

Two paths (DESIGN "Two paths inside the daemon"): this module answers every message at
once from the registry (register, steps, set_budget, status, close never wait on the
hardware or a fit); `powerd.control.ControlLoop` owns the board on its own thread, runs the
planners and publishes their decisions into the registry. Requests that need the control
path's data or the board (predict, pareto, restore) are handed over and answered from there.

A job is bound to the connection that registered it (see `powerd.registry`): messages that
name it from another connection are answered `unknown_job` and change nothing. Per
connection, jobs and message rate are capped (`[server] max_jobs_per_client`,
`max_messages_per_s`), and so is the total (`max_jobs`), so that one client cannot starve
the others.
"""

from __future__ import annotations

import collections
import grp
import hmac
import logging
import os
import secrets
import signal
import stat
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from powerd import protocol as p
from powerd.config import Config
from powerd.control import ControlLoop
from powerd.device.coexist import jtop_state
from powerd.endpoints import (
    DEFAULT_ENDPOINT,
    admin_endpoint,
    gate_flag_path,
    gate_path,
    ipc_path,
    tcp_address,
)
from powerd.fitting import Fitting
from powerd.gate import GATE_SOCK, GateFlag, GateListener, GpuGate
from powerd.hardware import Hardware
from powerd.planner import JobView
from powerd.registry import JobRecord, Owner, RateLimiter, Registry, ReplyTo
from powerd.store import Store
from powerd.watchdog import SystemdNotifier

log = logging.getLogger("powerd.server")

REQUEST_POLL_MS = 200  # the request thread wakes on messages; this only bounds a stop
MAX_RELEASED_KEPT = 4096  # job ids an admin restore ended, remembered for their clients
JTOP_PERIOD_S = 2.0  # how long status reuses what it found of jetson-stats
MAX_BATCH = 256  # messages per socket per pass: the other socket and the outbox get a turn


@dataclass
class Daemon:
    """Request handling over the registry; owns the control loop it hands the board to."""

    cfg: Config
    device: Hardware
    fitting: Fitting | None = None  # None: no predictor (binary-search only)
    notifier: SystemdNotifier = field(default_factory=SystemdNotifier)
    store: Store = field(init=False)
    registry: Registry = field(init=False)
    control: ControlLoop = field(init=False)

    def __post_init__(self) -> None:
        self.store = Store(self.cfg.state.dir)
        if self.cfg.strategy.name == "powertrain" and self.fitting is None:
            self.fitting = Fitting(self.cfg, self.store, self.device.board.key)
        self.registry = Registry(default_budget_w=self._load_default_budget())
        self.heartbeat_timeout_s = self.cfg.server.heartbeat_timeout_ms / 1000.0
        self.rate = RateLimiter(self.cfg.server.max_messages_per_s)
        self._outbox: collections.deque[tuple[ReplyTo, p.BaseModel]] = collections.deque()
        self.on_reply: Any = None  # set by the Server: wakes the request thread
        self.gate = GpuGate(
            self._post_reply, self.heartbeat_timeout_s, on_batch=self.device.sample_during
        )
        # jobs an admin's restore ended -> their owner: told `released` (only to that owner)
        self._released: collections.OrderedDict[str, Owner] = collections.OrderedDict()
        self._jtop: tuple[float, dict[str, Any]] = (-1e9, {})
        self.control = ControlLoop(
            self.cfg,
            self.device,
            self.store,
            self.registry,
            self._post_reply,
            self.notifier,
            self.fitting,
        )

    # ---- budgets ------------------------------------------------------------------------
    def _load_default_budget(self) -> float:
        path = self.store.settings_path()
        saved = self.store.load_json(path) or {}
        b = saved.get("default_budget_w")
        lim = self.cfg.budget
        if b is None:
            return lim.default_w
        if isinstance(b, (int, float)) and not isinstance(b, bool) and lim.min_w <= b <= lim.max_w:
            # an admin's `powerctl budget` outlives restarts and wins over the config's
            log.info(
                "default budget %g W, set by `powerctl budget` (saved in %s; the config's "
                "default_w is %g W)",
                b,
                path,
                lim.default_w,
            )
            return float(b)
        log.warning(
            "the default budget saved by `powerctl budget` (%r W, in %s) is outside the "
            "limits %g-%g W: using the config's default_w, %g W",
            b,
            path,
            lim.min_w,
            lim.max_w,
            lim.default_w,
        )
        return lim.default_w

    def _check_budget(self, budget_w: float, msg_id: int) -> p.Error | None:
        lim = self.cfg.budget
        if not (lim.min_w <= budget_w <= lim.max_w):
            return p.Error(
                id=msg_id,
                code="budget_rejected",
                message=f"budget {budget_w:g} W is outside the admin's limits "
                f"[{lim.min_w:g}, {lim.max_w:g}] W ({self.cfg.source} [budget])",
                details={"min_w": lim.min_w, "max_w": lim.max_w},
            )
        return None

    def effective_budget(self) -> float:
        with self.registry.lock:
            return self.registry.effective_budget()

    # ---- requests -------------------------------------------------------------------------
    def handle(
        self, identity: bytes, raw: bytes, admin: bool, now: float, sock: int | None = None
    ) -> p.BaseModel | None:
        """The reply to one message, or None when the control path will answer it."""
        owner: Owner = (int(admin) if sock is None else sock, identity)
        if not self.rate.allow(owner, now):
            return p.Error(
                code="bad_request",
                message=f"rate limited: more than {self.cfg.server.max_messages_per_s:g} "
                "messages/s from this connection ([server] max_messages_per_s); slow down",
                details={"reason": "rate_limited"},
            )
        try:
            req = p.decode_request(raw)
        except p.ProtocolError as exc:
            log.warning("rejected a malformed message: %s", exc)
            return p.Error(id=exc.msg_id, code=exc.code, message=str(exc))
        except Exception as exc:  # noqa: BLE001 - no message may take the daemon down
            log.warning("rejected a message that could not be decoded: %s", type(exc).__name__)
            return p.Error(code="bad_request", message=f"undecodable message: {type(exc).__name__}")
        if sock == GATE_SOCK and req.type != "gate":
            return p.Error(
                id=req.id, code="forbidden", message="the gate socket answers gate messages only"
            )
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
            return handler(req, owner, now)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the daemon
            log.exception("internal error handling %s", req.type)
            return p.Error(id=req.id, code="internal", message=f"{type(exc).__name__}: {exc}")

    def _owned(self, job_id: str, owner: Owner, msg_id: int) -> JobRecord | p.Error:
        """The job if this connection registered it (call with the lock held)."""
        job = self.registry.jobs.get(job_id)
        if job is None and self._released.get(job_id) == owner:
            # the client must not register again: that would undo the admin's restore
            return p.Error(
                id=msg_id,
                code="unknown_job",
                message=f"job {job_id} was released by an admin's restore "
                "(`powerctl restore`); register again to have powerd drive the board",
                details={"released": True},
            )
        if job is None or job.owner != owner:
            return p.Error(
                id=msg_id,
                code="unknown_job",
                message=f"no job {job_id} on this connection: it ended, its heartbeats "
                f"stopped for longer than {self.heartbeat_timeout_s:g} s, or another "
                "connection registered it",
            )
        return job

    def _on_register(self, req: p.Register, owner: Owner, now: float) -> p.BaseModel:
        if not self.control.planners.supports(req.kind):
            return p.Error(
                id=req.id,
                code="bad_request",
                message=f"kind={req.kind!r} is not supported by this powerd version yet",
            )
        srv = self.cfg.server
        reg = self.registry
        with reg.lock:
            budget = reg.default_budget_w if req.budget_w is None else req.budget_w
            if req.budget_w is None and req.step_time_ms is not None:
                # a step-time target alone is capped only by the admin's ceiling
                budget = self.cfg.budget.max_w
            err = self._check_budget(budget, req.id)
            if err is not None:
                return err
            if len(reg.jobs) >= srv.max_jobs:
                return p.Error(
                    id=req.id,
                    code="bad_request",
                    message=f"powerd already manages {len(reg.jobs)} jobs, its limit "
                    "([server] max_jobs); try again when one ends",
                    details={"reason": "too_many_jobs", "limit": srv.max_jobs},
                )
            if reg.jobs_of(owner) >= srv.max_jobs_per_client:
                return p.Error(
                    id=req.id,
                    code="bad_request",
                    message=f"this connection already holds {srv.max_jobs_per_client} jobs, "
                    "the limit per client ([server] max_jobs_per_client); close one first",
                    details={
                        "reason": "too_many_jobs_per_client",
                        "limit": srv.max_jobs_per_client,
                    },
                )
            job_id = uuid.uuid4().hex[:12]
            job = JobRecord(
                id=job_id,
                kind=req.kind,
                workload=req.workload or f"anonymous-{job_id}",
                persistent=req.workload is not None,
                budget_w=budget,
                owner=owner,
                pid=req.pid,
                last_seen=now,
                registered=now,
                latency_ms=req.latency_ms,
                rate_hz=req.rate_hz,
                batch_sizes=None if not req.batch_sizes else tuple(req.batch_sizes),
                gate_token=secrets.token_hex(16),
                step_time_ms=req.step_time_ms,
                expected_steps=req.expected_steps,
            )
            reg.add(job)
            reg.claims += 1
            reply = self._job_state(job, req.id)
        # no wake-up: the control path picks the job up on its next tick (<= 20 ms), and
        # 200 jobs connecting at once must not make it run 200 times
        goal = f"budget {budget:g} W"
        if req.step_time_ms is not None:  # its budget is only the cap on the target's search
            cap = " (the admin's budget.max_w)" if req.budget_w is None else ""
            goal = f"step-time target {req.step_time_ms:g} ms, power cap {budget:g} W{cap}"
        log.info("job %s registered: workload %s, %s, pid %s", job_id, job.workload, goal, req.pid)
        return reply

    def _on_steps(self, req: p.Steps, owner: Owner, now: float) -> p.BaseModel:
        with self.registry.lock:
            job = self._owned(req.job, owner, req.id)
            if isinstance(job, p.Error):
                return job
            job.last_seen = now
            if req.t or req.d:
                job.steps += len(req.t)
                job.pending.append((list(req.t), list(req.d), list(req.b)))
                if job.kind == "training" and req.d:
                    self.gate.note_steps(job.id, req.d)
            return self._job_state(job, req.id)

    def _on_set_budget(self, req: p.SetBudget, owner: Owner, now: float) -> p.BaseModel:
        with self.registry.lock:
            job = self._owned(req.job, owner, req.id)
            if isinstance(job, p.Error):
                return job
            err = self._check_budget(req.budget_w, req.id)
            if err is not None:
                return err
            job.last_seen = now
            self.registry.claims += 1
            if req.budget_w != job.budget_w:
                self.registry.set_budget(job, req.budget_w)
                if job.step_time_ms is None:
                    log.info("job %s: budget now %g W", job.id, req.budget_w)
                else:
                    log.info(
                        "job %s: power cap now %g W (step-time target %g ms)",
                        job.id,
                        req.budget_w,
                        job.step_time_ms,
                    )
            # a view computed for another effective budget never reads `tuned` (_job_state)
            return self._job_state(job, req.id)

    def _on_set_rate(self, req: p.SetRate, owner: Owner, now: float) -> p.BaseModel:
        with self.registry.lock:
            job = self._owned(req.job, owner, req.id)
            if isinstance(job, p.Error):
                return job
            if job.rate_hz is None:
                return p.Error(
                    id=req.id,
                    code="bad_request",
                    message="set_rate applies to jobs registered with a rate (inference)",
                )
            job.last_seen = now
            job.rate_hz = req.rate_hz
            return self._job_state(job, req.id)

    def _on_gate(self, req: p.Gate, owner: Owner, now: float) -> p.BaseModel | None:
        """Managed interleaving: the token, not the connection, names the job (the gate
        has its own socket). Enter: GateOpen now or when the slot frees; leave: no reply."""
        with self.registry.lock:
            job = self.registry.jobs.get(req.job)
            if job is None or not hmac.compare_digest(job.gate_token, req.token):
                return p.Error(
                    id=req.id,
                    code="unknown_job",
                    message=f"no job {req.job} with this gate token: it ended, or its "
                    f"heartbeats stopped for longer than {self.heartbeat_timeout_s:g} s",
                )
            job.last_seen = now
            if req.op == "leave":
                self.gate.leave(job.id, now)
                return None
            reply_to = ReplyTo(owner[0], owner[1], req.id)
            return self.gate.enter(job.id, job.kind, reply_to, now, req.size)

    def poll_ms(self, now: float) -> int:
        """How long the request loop may sleep: until the gate must cut a hold short."""
        with self.registry.lock:
            due = self.gate.busy_until()
        if due is None:
            return REQUEST_POLL_MS
        return max(0, min(REQUEST_POLL_MS, int((due - now) * 1000.0) + 1))

    def check_gate(self, now: float) -> None:
        with self.registry.lock:
            self.gate.check(now, set(self.registry.jobs), self.registry.gate_managed)

    def _on_close(self, req: p.Close, owner: Owner, now: float) -> p.BaseModel:
        with self.registry.lock:
            job = self._owned(req.job, owner, req.id)
            if isinstance(job, p.Error):
                return job
            self.registry.remove(job.id)
        log.info("job %s (%s) ended: closed by its client", job.id, job.workload)
        return p.Ok(id=req.id, message="closed")

    def _on_status(self, req: p.Status, owner: Owner, now: float) -> p.BaseModel:
        return p.StatusReply(id=req.id, status=self.status())

    def _defer(self, kind: str, owner: Owner, msg_id: int, payload: Any) -> None:
        with self.registry.lock:
            self.registry.requests.append((kind, ReplyTo(owner[0], owner[1], msg_id), payload))
        self.registry.wake.set()

    def _on_predict(self, req: p.Predict, owner: Owner, now: float) -> None:
        self._defer("predict", owner, req.id, req)

    def _on_pareto(self, req: p.Pareto, owner: Owner, now: float) -> None:
        self._defer("pareto", owner, req.id, req)

    def _on_set_default_budget(
        self, req: p.SetDefaultBudget, owner: Owner, now: float
    ) -> p.BaseModel:
        err = self._check_budget(req.budget_w, req.id)
        if err is not None:
            return err
        with self.registry.lock:
            self.registry.default_budget_w = req.budget_w
        self.store.save_json(self.store.settings_path(), {"default_budget_w": req.budget_w})
        self.registry.wake.set()
        log.info("default budget now %g W", req.budget_w)
        return p.Ok(id=req.id, message=f"default budget {req.budget_w:g} W")

    def _on_restore(self, req: p.Restore, owner: Owner, now: float) -> None:
        with self.registry.lock:
            n = len(self.registry.jobs)
            for job_id in list(self.registry.jobs):
                log.info("job %s ended: an admin restored the baseline", job_id)
                job = self.registry.remove(job_id)
                if job is not None:
                    self._released[job_id] = job.owner
            while len(self._released) > MAX_RELEASED_KEPT:
                self._released.popitem(last=False)
        # the control path restores (it is the one writer of sysfs) and then answers
        self._defer("restore", owner, req.id, n)

    # ---- answers from the registry ----------------------------------------------------------
    def _view(self, job: JobRecord) -> JobView:
        """The job's published view, never a stale `tuned` (call with the lock held)."""
        reg = self.registry
        view = reg.views.get(job.id) or JobView(
            "queued", "registered: waiting for the control loop"
        )
        eff = reg.effective_budget()
        if view.budget_w != eff and (view.phase == "tuned" or view.feasible is False):
            return JobView(
                "profiling", f"re-planning for {eff:g} W", None, eff, batch_size=view.batch_size
            )
        return view

    def _job_state(self, job: JobRecord, msg_id: int) -> p.JobState:
        view = self._view(job)
        mode = self.registry.board_mode
        managed = self.registry.gate_managed and view.gate == "managed"
        return p.JobState(
            id=msg_id,
            job=job.id,
            phase=view.phase,  # type: ignore[arg-type]
            mode=None if mode is None else p.ModeModel(**mode.as_dict()),
            budget_w=job.budget_w,
            heartbeat_ms=max(100, self.cfg.server.heartbeat_timeout_ms // 5),
            message=view.message,
            feasible=view.feasible,
            batch_size=view.batch_size,
            best_latency_ms=view.best_latency_ms,
            gate="managed" if managed else "open",
            gate_token=job.gate_token if managed else None,
            gate_timeout_ms=self.cfg.server.heartbeat_timeout_ms,
            objective="power_budget" if job.step_time_ms is None else "step_time",
            step_time_ms=job.step_time_ms,
            fastest_ms=view.fastest_ms,
        )

    def status(self) -> dict[str, Any]:
        power = self.device.latest_power()
        reg = self.registry
        with reg.lock:
            mode = reg.board_mode
            control = dict(reg.control)
            extra = control.pop("job_extra", {})
            jobs = []
            for j in reg.jobs.values():
                view = self._view(j)
                e = extra.get(j.id, {})
                jobs.append(
                    {
                        "id": j.id,
                        "kind": j.kind,
                        "workload": j.workload,
                        "budget_w": j.budget_w,
                        "objective": "power_budget" if j.step_time_ms is None else "step_time",
                        "step_time_ms": j.step_time_ms,
                        "fastest_ms": view.fastest_ms,
                        "phase": view.phase,
                        "feasible": view.feasible,
                        "pid": j.pid,
                        "steps": j.steps,
                        "profiled_modes": e.get("profiled_modes", 0),
                        "fit_method": e.get("fit_method"),
                        "message": view.message,
                        **{k: v for k, v in e.items() if k not in ("profiled_modes", "fit_method")},
                    }
                )
            budget = reg.effective_budget()
            default = reg.default_budget_w
        srv = self.cfg.server
        return {
            "board": self.device.board.model,
            "board_key": self.device.board.key,
            "l4t": self.device.board.l4t,
            "mode": None if mode is None else mode.as_dict(),
            "power_w": None if power is None else round(power, 3),
            "budget_w": budget,
            "default_budget_w": default,
            "limits_w": {"min": self.cfg.budget.min_w, "max": self.cfg.budget.max_w},
            "strategy": self.cfg.strategy.name,
            "mode_space_size": self.device.space.size,
            "jobs": jobs,
            "tuner": control.get("tuner"),
            "planner": control.get("planner"),
            "profiling": control.get("profiling", {}),
            "inference_profiling": control.get("inference_profiling", {}),
            "workloads": control.get("workloads", []),
            "workloads_in_memory": control.get("workloads_in_memory", []),
            "workload_state": control.get("workload_state", {}),
            "faults": control.get("faults", []),
            "power_sensor": control.get("power_sensor", "ok"),
            "baseline": self.device.baseline_status(),
            "external_change_policy": self.cfg.device.on_external_change,
            "jetson_stats": self._jtop_state(),
            "client_limits": {
                "max_jobs": srv.max_jobs,
                "max_jobs_per_client": srv.max_jobs_per_client,
                "max_messages_per_s": srv.max_messages_per_s,
            },
        }

    def _jtop_state(self) -> dict[str, Any]:
        """jetson-stats' service (a few stats under the device root), at most every 2 s."""
        t, state = self._jtop
        now = time.monotonic()
        if now - t > JTOP_PERIOD_S:
            state = jtop_state(self.device.board.root)
            self._jtop = (now, state)
        return state

    # ---- replies from the control path ------------------------------------------------------
    def _post_reply(self, to: ReplyTo, reply: p.BaseModel) -> None:
        self._outbox.append((to, reply))
        if self.on_reply is not None:
            self.on_reply()

    def take_replies(self) -> list[tuple[ReplyTo, p.BaseModel]]:
        out = []
        while self._outbox:
            out.append(self._outbox.popleft())
        return out

    def shutdown(self) -> None:
        """After the control thread stopped: give the board back (still one writer)."""
        self.control.shutdown()
        self.device.restore()
        self.device.close()


# ---- sockets -----------------------------------------------------------------------------


def _ipc_path(endpoint: str) -> Path | None:
    path = ipc_path(endpoint)
    return None if path is None else Path(path)


# The default socket directory: systemd makes it (RuntimeDirectory=powerd); a `powerd serve`
# started by hand makes it too. Any other endpoint's directory must exist already: a typo in
# [server] endpoint must not create directories as root.
DEFAULT_RUN_DIR = Path(str(ipc_path(DEFAULT_ENDPOINT))).parent


def _prepare_ipc(endpoint: str) -> None:
    """Make an ipc endpoint's path free to bind: remove a stale socket a crashed daemon left
    (nothing answers on it). Anything else at the path is refused, never removed: the
    endpoint may name a user's file by mistake."""
    path = _ipc_path(endpoint)
    if path is None:
        return
    if path.parent == DEFAULT_RUN_DIR:
        path.parent.mkdir(mode=0o755, exist_ok=True)
    elif not path.parent.is_dir():
        raise RuntimeError(
            f"cannot listen on {endpoint}: the directory {path.parent} does not exist (powerd "
            "creates only its default run directory "
            f"{DEFAULT_RUN_DIR}); create it or fix [server] endpoint"
        )
    for one, what in ((path, "socket"), (Path(f"{path}.gate"), "gate socket")):
        try:
            st = one.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISSOCK(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a file that is not a socket"
            raise RuntimeError(
                f"cannot listen on {endpoint}: {one} is {kind}; powerd removes only a stale "
                f"{what} of its own there. Fix [server] endpoint or move the file away"
            )
    if path.exists():
        from powerd.client import STALE_SOCKET, call_once
        from powerd.errors import DaemonUnavailable

        try:
            call_once(endpoint, p.Status(), timeout_s=0.3)
        except DaemonUnavailable as exc:
            why = getattr(exc, "reason", str(exc))
            if STALE_SOCKET in why or not path.exists():
                path.unlink(missing_ok=True)  # refuses connections: a crashed daemon's
                return
            raise RuntimeError(
                f"cannot listen on {endpoint}: another program listens on {path} and does not "
                f"answer as powerd ({why}); stop it or fix [server] endpoint"
            ) from None
        except Exception:  # noqa: BLE001 - an error reply is an answer: a powerd is there
            pass
        raise RuntimeError(f"another powerd is already serving {endpoint}")


def _remove_socket(path: Path) -> None:
    """Remove a socket this daemon bound, and only a socket."""
    try:
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
    except FileNotFoundError:
        pass


def _set_socket_access(endpoint: str, group: str) -> None:
    """0660 with the configured group; a group that does not exist: warn, root-only."""
    path = _ipc_path(endpoint)
    if path is not None:
        _set_access(path, group, 0o660)


def _set_access(path: Path | str, group: str, mode: int) -> None:
    if not group:
        os.chmod(path, mode)
        return
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        log.warning("group %r does not exist: %s stays root-only", group, path)
        os.chmod(path, mode & 0o700)
        return
    os.chown(path, -1, gid)
    os.chmod(path, mode)


class Server:
    """Binds the sockets, starts the control path, and runs the request path until stopped."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon
        self.stop_event = threading.Event()
        self.notifier = daemon.notifier

    def serve(self) -> None:
        cfg = self.daemon.cfg.server
        ctx = zmq.Context.instance()
        endpoints = [
            (cfg.endpoint, cfg.socket_group, False),
            (admin_endpoint(cfg.endpoint), cfg.admin_group, True),
        ]
        socks: list[tuple[zmq.Socket, bool]] = []
        poller = zmq.Poller()
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)

        def wake() -> None:
            try:
                os.write(wake_w, b"x")
            except BlockingIOError:  # already awake with bytes pending
                pass

        control = self.daemon.control
        gate: GateListener | None = None
        flag: GateFlag | None = None
        bound: list[str] = []  # endpoints this daemon bound: the only ones it removes
        try:
            for ep, group, admin in endpoints:
                _prepare_ipc(ep)
                s = ctx.socket(zmq.ROUTER)
                s.setsockopt(zmq.LINGER, 0)
                s.setsockopt(zmq.ROUTER_MANDATORY, 0)
                # a peer sending a frame far over the protocol's limit is cut off unread
                s.setsockopt(zmq.MAXMSGSIZE, 16 * p.MAX_FRAME_BYTES)
                try:
                    s.bind(ep)
                except zmq.ZMQError as exc:
                    s.close()
                    raise RuntimeError(f"cannot listen on {ep}: {exc}") from None
                bound.append(ep)
                _set_socket_access(ep, group)
                poller.register(s, zmq.POLLIN)
                socks.append((s, admin))
                log.info("listening on %s%s", ep, " (admin)" if admin else "")
                if ep.startswith("tcp://"):
                    # file permissions guard ipc:// sockets only: say so once per socket
                    local = (tcp_address(ep) or ("", ""))[0] in _LOOPBACK
                    log.warning(
                        "%s is a TCP endpoint: no access control (socket_group and "
                        "admin_group apply to ipc:// sockets only); %s can %s",
                        ep,
                        "any local user"
                        if local
                        else "anyone who can reach it (bind 127.0.0.1 or firewall it)",
                        "restore the board and set the default budget"
                        if admin
                        else "register jobs and drive the board",
                    )
            gpath, fpath = gate_path(cfg.endpoint), gate_flag_path(cfg.endpoint)
            if gpath is not None:
                gate = GateListener(gpath)
                _set_access(gpath, cfg.socket_group, 0o660)
                poller.register(gate.listener.fileno(), zmq.POLLIN)
            if fpath is not None:
                flag = GateFlag(fpath)
                _set_access(fpath, cfg.socket_group, 0o640)  # clients only read it
                with self.daemon.registry.lock:
                    self.daemon.gate.flag = flag
            poller.register(wake_r, zmq.POLLIN)
            self.daemon.on_reply = wake
            control.start(self.stop_event)
            self.notifier.ready(f"serving {cfg.endpoint}")
            self._loop(poller, socks, wake_r, gate)
        finally:
            if gate is not None:
                gate.close()
            if flag is not None:
                with self.daemon.registry.lock:
                    self.daemon.gate.flag = None
                    self.daemon.gate.fast = None
                flag.close()
            self.stop_event.set()
            if control.thread is not None:
                # a control path stuck in the kernel cannot be waited for forever: after
                # this, restoring from here is the lesser evil (systemd would kill us anyway)
                control.thread.join(timeout=10.0)
                if control.thread.is_alive():
                    log.error("the control path did not stop within 10 s")
            self.notifier.stopping()
            for s, _ in socks:
                s.close()
            os.close(wake_r)
            os.close(wake_w)
            for ep in bound:
                path = _ipc_path(ep)
                if path is not None:
                    _remove_socket(path)
            self.daemon.shutdown()

    def _loop(
        self,
        poller: zmq.Poller,
        socks: list[tuple[zmq.Socket, bool]],
        wake: int,
        gate: GateListener | None = None,
    ) -> None:
        d = self.daemon

        def on_gate(identity: bytes, raw: bytes, now: float) -> p.BaseModel | None:
            return d.handle(identity, raw, False, now, sock=GATE_SOCK)

        while not self.stop_event.is_set():
            if not d.control.alive():
                raise RuntimeError("the control path stopped unexpectedly")
            events = dict(poller.poll(d.poll_ms(time.monotonic())))
            now = time.monotonic()
            if gate is not None:
                for fd in [e for e in events if isinstance(e, int) and e != wake]:
                    gate.on_readable(fd, now, on_gate, poller)
            for idx, (s, admin) in enumerate(socks):
                if s not in events:
                    continue
                for _ in range(MAX_BATCH):
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(frames) != 2:
                        log.warning("dropping a message with %d frames", len(frames))
                        continue
                    reply = d.handle(frames[0], frames[1], admin, now, sock=idx)
                    if reply is not None:
                        s.send_multipart([frames[0], p.encode(reply)])
            d.check_gate(now)
            if wake in events:
                try:
                    os.read(wake, 4096)
                except BlockingIOError:
                    pass
            for to, reply in d.take_replies():
                if to.sock == GATE_SOCK:
                    if gate is not None:
                        gate.send(to.identity, reply, poller)
                    continue
                socks[to.sock][0].send_multipart([to.identity, p.encode(reply)])

    def install_signal_handlers(self) -> None:
        def stop(signum: int, frame: object) -> None:
            log.info("signal %d: restoring the baseline and stopping", signum)
            self.stop_event.set()

        def hangup(signum: int, frame: object) -> None:
            # the conventional "reload" signal: powerd has no reload (and must not die of
            # SIGHUP's default action with the board pinned), so it says what to do instead
            log.warning(
                "SIGHUP: configuration is read at start; restart powerd to apply changes "
                "(systemctl restart powerd)"
            )

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, hangup)


_LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})
