"""Client side of the ZeroMQ protocol. Imports nothing of the daemon.

Each job owns one background thread with one DEALER socket (ZeroMQ sockets are not
thread-safe). `Job.step()` only appends a timestamp to a deque; the thread ships the batch,
doubles as the heartbeat, and applies the daemon's replies to the job's visible state.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import zmq
from pydantic import BaseModel, ValidationError

from powerd import protocol as p
from powerd.errors import BudgetRejected, DaemonUnavailable, RequestFailed
from powerd.modes import PowerMode

log = logging.getLogger("powerd.client")

DEFAULT_ENDPOINT = (
    "ipc:///run/powerd/powerd.sock"  # also in powerd.config (the client imports no daemon code)
)
CONNECT_TIMEOUT_S = 1.5  # the contract promises DaemonUnavailable within 2 s
CALL_TIMEOUT_S = 10.0
FLUSH_INTERVAL_S = 0.05


def resolve_endpoint(endpoint: str | None = None) -> str:
    return endpoint or os.environ.get("POWERD_ENDPOINT") or DEFAULT_ENDPOINT


def admin_endpoint(endpoint: str) -> str:
    """Admin commands go to a sibling socket that only the admin group can open."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        stem, dot, ext = path.rpartition(".")
        return f"ipc://{stem}-admin.{ext}" if dot and "/" not in ext else f"ipc://{path}-admin"
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        return f"tcp://{host}:{int(port) + 1}"
    raise ValueError(f"unsupported endpoint {endpoint!r}")


def _unavailable(endpoint: str, why: str) -> DaemonUnavailable:
    return DaemonUnavailable(
        f"powerd daemon not reachable at {endpoint} ({why}). Start it with "
        "`sudo systemctl start powerd` (or `powerd serve`), point POWERD_ENDPOINT at it, "
        "or pass required=False to run without power management."
    )


def _check_ipc_path(endpoint: str) -> None:
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if not os.path.exists(path):
            raise _unavailable(endpoint, f"no socket at {path}")
        if not os.access(path, os.R_OK | os.W_OK):
            raise _unavailable(
                endpoint, f"permission denied on {path}: join the daemon's socket group"
            )


def _raise_for_error(reply: p.Reply) -> p.Reply:
    if isinstance(reply, p.Error):
        if reply.code == "budget_rejected":
            raise BudgetRejected(
                reply.message, reply.details.get("min_w"), reply.details.get("max_w")
            )
        raise RequestFailed(reply.code, reply.message)
    return reply


def call_once(endpoint: str, msg: BaseModel, timeout_s: float = CALL_TIMEOUT_S) -> p.Reply:
    """One request, one reply, on a fresh socket (powerctl). Raises on error replies."""
    _check_ipc_path(endpoint)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send(p.encode(msg))
        if not sock.poll(int(timeout_s * 1000)):
            raise _unavailable(endpoint, f"no answer within {timeout_s:g} s")
        return _raise_for_error(p.decode_reply(sock.recv()))
    finally:
        sock.close()


class Connection:
    """The background thread and socket that carry one job's traffic."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._ids = itertools.count(1)
        self._outbox: queue.SimpleQueue[tuple[BaseModel, Future | None]] = queue.SimpleQueue()
        self._waiting: dict[int, Future] = {}
        self._stop = threading.Event()
        self.on_state: collections.abc.Callable[[p.JobState], None] | None = None
        self.on_error: collections.abc.Callable[[p.Error], None] | None = None
        self.flush: collections.abc.Callable[[], BaseModel | None] | None = None
        self._thread = threading.Thread(target=self._run, name="powerd-client", daemon=True)
        self._thread.start()

    def send(self, msg: BaseModel) -> None:
        """Fire and forget (the reply, if a JobState, still updates the job)."""
        msg.id = next(self._ids)
        self._outbox.put((msg, None))

    def call(self, msg: BaseModel, timeout_s: float = CALL_TIMEOUT_S) -> p.Reply:
        msg.id = next(self._ids)
        fut: Future = Future()
        self._outbox.put((msg, fut))
        try:
            reply = fut.result(timeout=timeout_s)
        except FutureTimeout:
            raise _unavailable(self.endpoint, f"no answer within {timeout_s:g} s") from None
        return _raise_for_error(reply)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 500)  # let a final close message leave
        sock.connect(self.endpoint)
        next_flush = 0.0
        try:
            while True:
                stopping = self._stop.is_set()
                while True:
                    try:
                        msg, fut = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    if fut is not None:
                        self._waiting[msg.id] = fut
                    sock.send(p.encode(msg))
                now = time.monotonic()
                if self.flush is not None and (now >= next_flush or stopping):
                    batch = self.flush()
                    if batch is not None:
                        batch.id = next(self._ids)
                        sock.send(p.encode(batch))
                    next_flush = now + FLUSH_INTERVAL_S
                if stopping:
                    return
                if sock.poll(int(FLUSH_INTERVAL_S * 1000)):
                    while sock.poll(0):
                        self._dispatch(sock.recv())
        finally:
            sock.close()

    def _dispatch(self, raw: bytes) -> None:
        try:
            reply = p.decode_reply(raw)
        except ValidationError as exc:
            log.warning("ignoring a malformed reply from powerd: %s", exc)
            return
        fut = self._waiting.pop(reply.id, None)
        if isinstance(reply, p.JobState) and self.on_state is not None:
            self.on_state(reply)
        elif isinstance(reply, p.Error) and fut is None and self.on_error is not None:
            self.on_error(reply)
        if fut is not None:
            fut.set_result(reply)


class Job:
    """A training job's lease on the board's power mode. Create with `powerd.request()`."""

    kind = "training"

    def __init__(self, conn: Connection, state: p.JobState):
        self._conn = conn
        self._state = state
        self._lock = threading.Lock()
        self._steps: collections.deque[float] = collections.deque()
        self._durations: collections.deque[float] = collections.deque()
        self._last_heartbeat = 0.0
        self._closed = False
        self._warned: set[str] = set()
        conn.on_state = self._apply_state
        conn.on_error = self._apply_error
        conn.flush = self._take_batch

    # -- the hot path ---------------------------------------------------------------------
    def step(self) -> None:
        """Record one finished minibatch. Costs a deque append; never waits on the daemon."""
        self._steps.append(time.monotonic())

    # -- state ----------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._state.job

    @property
    def phase(self) -> str:
        return self._state.phase

    @property
    def mode(self) -> PowerMode | None:
        m = self._state.mode
        return None if m is None else PowerMode(m.cores, m.cpu_khz, m.gpu_hz, m.emc_hz)

    @property
    def budget_w(self) -> float:
        return self._state.budget_w

    @property
    def objective(self) -> str:
        """"power_budget" (the fastest mode within the budget) or "step_time" (the
        lowest-power mode meeting `step_time_ms`)."""
        return self._state.objective

    @property
    def step_time_ms(self) -> float | None:
        return self._state.step_time_ms

    @property
    def fastest_ms(self) -> float | None:
        """Under the step-time objective, when the target cannot be met: the fastest
        measured step time (the mode pinned instead)."""
        return self._state.fastest_ms

    @property
    def message(self) -> str:
        return self._state.message

    def set_budget(self, budget_w: float) -> None:
        """Re-solve for a new budget (no re-profiling). Returns once the daemon accepted it."""
        reply = self._conn.call(p.SetBudget(job=self.id, budget_w=budget_w))
        assert isinstance(reply, p.JobState)
        with self._lock:
            self._state = reply

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._conn.flush = None
        try:
            # flush what is left so the daemon's last window is not lost, then release the board
            batch = self._take_batch(force=True)
            if batch is not None:
                self._conn.send(batch)
            self._conn.call(p.Close(job=self.id), timeout_s=2.0)
        except Exception as exc:  # noqa: BLE001 - closing must not raise into user code
            log.debug("close: %s", exc)
        finally:
            self._conn.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self._closed:
                self._conn.close()
        except Exception:  # noqa: BLE001
            pass

    # -- called on the connection thread ----------------------------------------------------
    def _take_batch(self, force: bool = False) -> p.Steps | None:
        steps = []
        while self._steps:
            steps.append(self._steps.popleft())
        durations = []
        while self._durations:
            durations.append(self._durations.popleft())
        now = time.monotonic()
        beat_due = now - self._last_heartbeat >= self._state.heartbeat_ms / 1000.0
        if not steps and not durations and not beat_due and not force:
            return None
        self._last_heartbeat = now
        return p.Steps(job=self.id, t=steps, d=durations)

    def _apply_state(self, state: p.JobState) -> None:
        with self._lock:
            self._state = state
            msg = state.message
        if msg and msg not in self._warned:
            self._warned.add(msg)
            log.warning("powerd: %s", msg)

    def _apply_error(self, err: p.Error) -> None:
        key = f"{err.code}:{err.message}"
        if key not in self._warned:
            self._warned.add(key)
            log.warning("powerd: %s: %s", err.code, err.message)
        if err.code == "unknown_job":
            with self._lock:
                self._state = self._state.model_copy(update={"phase": "idle", "mode": None})


class InferenceJob(Job):
    kind = "inference"

    @property
    def batch_size(self) -> int:
        return self._state.batch_size or 1

    def batch(self, size: int | None = None) -> _Batch:
        """Context manager around one inference batch; leaving it reports the batch."""
        return _Batch(self)

    def set_rate(self, rate_hz: float) -> None:
        reply = self._conn.call(p.SetRate(job=self.id, rate_hz=rate_hz))
        assert isinstance(reply, p.JobState)
        with self._lock:
            self._state = reply


class _Batch:
    def __init__(self, job: InferenceJob):
        self._job = job
        self._t0 = 0.0

    def __enter__(self) -> _Batch:
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        t1 = time.monotonic()
        self._job._durations.append(t1 - self._t0)
        self._job._steps.append(t1)


class NoopJob:
    """What `request(required=False)` returns when no daemon is reachable: does nothing."""

    phase = "idle"
    mode = None
    batch_size = 1
    message = "no powerd daemon: running without power management"
    objective = "power_budget"  # no daemon: nothing is pinned either way

    def __init__(self, kind: str, budget_w: float | None):
        self.kind = kind
        self.budget_w = budget_w

    def step(self) -> None:
        pass

    def set_budget(self, budget_w: float) -> None:
        self.budget_w = budget_w

    def set_rate(self, rate_hz: float) -> None:
        pass

    def batch(self, size: int | None = None) -> _NoopBatch:
        return _NoopBatch()

    def close(self) -> None:
        pass

    def __enter__(self) -> NoopJob:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class _NoopBatch:
    def __enter__(self) -> _NoopBatch:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_warned_noop = False


def request(
    budget_w: float | None = None,
    workload: str | None = None,
    kind: str = "training",
    latency_ms: float | None = None,
    rate_hz: float | None = None,
    required: bool = True,
    endpoint: str | None = None,
    step_time_ms: float | None = None,
) -> Job | InferenceJob | NoopJob:
    """Ask powerd for a power budget (None = the admin's default) and register this job.

    step_time_ms: a training job's step-time target instead (e.g. a round's deadline
    divided by its steps): powerd pins the lowest-power mode whose measured step time
    meets it, within `budget_w` if given; `job.objective` is then "step_time"."""
    global _warned_noop
    ep = resolve_endpoint(endpoint)
    msg = p.Register(
        kind=kind,  # type: ignore[arg-type]
        budget_w=budget_w,
        workload=workload,
        latency_ms=latency_ms,
        rate_hz=rate_hz,
        pid=os.getpid(),
        step_time_ms=step_time_ms,
    )
    try:
        _check_ipc_path(ep)
        conn = Connection(ep)
        try:
            reply = conn.call(msg, timeout_s=CONNECT_TIMEOUT_S)
        except BaseException:
            conn.close()
            raise
    except DaemonUnavailable as exc:
        if required:
            raise
        if not _warned_noop:
            _warned_noop = True
            import warnings

            warnings.warn(str(exc), RuntimeWarning, stacklevel=2)
        return NoopJob(kind, budget_w)
    assert isinstance(reply, p.JobState)
    cls = InferenceJob if kind == "inference" else Job
    return cls(conn, reply)
