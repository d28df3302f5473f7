"""Client side of the ZeroMQ protocol. Imports nothing of the daemon.

Each job owns one background thread with one DEALER socket (ZeroMQ sockets are not
thread-safe). `Job.step()` only appends a timestamp to a deque; the thread ships the batch,
doubles as the heartbeat, and applies the daemon's replies to the job's visible state.
"""

from __future__ import annotations

import collections
import grp
import itertools
import json
import logging
import mmap
import operator
import os
import queue
import socket
import stat
import threading
import time
import warnings
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import zmq
from pydantic import BaseModel, ValidationError

from powerd import protocol as p
from powerd.endpoints import (
    WILDCARD_HOSTS,
    endpoint_problem,
    gate_flag_path,
    gate_path,
    ipc_path,
    resolve_endpoint,
    tcp_address,
)
from powerd.errors import (
    BudgetRejected,
    DaemonUnavailable,
    InvalidArgument,
    JobClosed,
    JobReleased,
    RequestFailed,
)
from powerd.modes import PowerMode
from powerd.validation import describe_invalid, shown

log = logging.getLogger("powerd.client")
M = TypeVar("M", bound=BaseModel)

CONNECT_TIMEOUT_S = 1.5  # the contract promises DaemonUnavailable within 2 s
CALL_TIMEOUT_S = 10.0
FLUSH_INTERVAL_S = 0.05
SEND_HWM = 100  # messages queued in the socket before sends are dropped (never block)
MAX_QUEUED_STEPS = 65_536  # steps waiting for the connection thread; beyond: oldest dropped
GONE_AFTER_BEATS = 3  # heartbeats without any answer: the daemon is gone, the job a no-op
GONE_AFTER_MIN_S = 2.0
# The connection thread runs every FLUSH_INTERVAL_S: a gap this long (at least two
# heartbeats) means this process was stopped (SIGSTOP, a debugger, a suspended machine). A
# re-registration soon after such a stop is put down to it, not to a daemon restart.
PAUSED_AFTER_MIN_S = 0.5
PAUSE_EXPLAINS_S = 5.0
REREGISTER_RETRY_S = 3.0
# What a job reads while powerd does not manage it (not answering, released by an admin):
# nothing is decided for it, as for a job the daemon itself released (feasible None), not
# the verdict of a pin that no longer holds
_UNMANAGED = {"feasible": None, "fastest_ms": None, "best_latency_ms": None}


def connect_endpoint(endpoint: str) -> str:
    """The address a client connects to for an endpoint: a wildcard bind address (the
    daemon's `tcp://*:PORT`) becomes the loopback one. A malformed endpoint raises
    DaemonUnavailable naming what is wrong (ZeroMQ's "Invalid argument" names nothing)."""
    problem = endpoint_problem(endpoint)
    if problem is not None:
        raise _tagged(
            DaemonUnavailable(
                f"invalid powerd endpoint {endpoint!r}: {problem}. Set POWERD_ENDPOINT (or "
                "endpoint=) to the daemon's [server] endpoint, or pass required=False to run "
                "without power management."
            ),
            endpoint,
            problem,
            "invalid",
        )
    address = tcp_address(endpoint)
    if address is not None and address[0] in WILDCARD_HOSTS:
        return f"tcp://{WILDCARD_HOSTS[address[0]]}:{address[1]}"
    return endpoint


def _tagged(exc: DaemonUnavailable, endpoint: str, why: str, kind: str) -> DaemonUnavailable:
    # what the message says, for tools (powerctl) that give their own advice: `endpoint`,
    # `reason`, and `kind`: "unreachable", "no_access" or "invalid"
    exc.endpoint = endpoint  # type: ignore[attr-defined]
    exc.reason = why  # type: ignore[attr-defined]
    exc.kind = kind  # type: ignore[attr-defined]
    return exc


def _unavailable(endpoint: str, why: str) -> DaemonUnavailable:
    return _tagged(
        DaemonUnavailable(
            f"powerd daemon not reachable at {endpoint} ({why}). Start it with "
            "`sudo systemctl start powerd` (or `powerd serve`), point POWERD_ENDPOINT at it, "
            "or pass required=False to run without power management."
        ),
        endpoint,
        why,
        "unreachable",
    )


def _no_access(endpoint: str, why: str) -> DaemonUnavailable:
    # still DaemonUnavailable: required=False then runs the job without power management
    return _tagged(
        DaemonUnavailable(
            f"cannot talk to the powerd daemon at {endpoint}: {why}. Or pass required=False "
            "to run without power management."
        ),
        endpoint,
        why,
        "no_access",
    )


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def permission_hint(path: str) -> str:
    """Why this user cannot open the daemon's socket, naming the group that can."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot stat {path}: {exc.strerror}"
    mode = stat.S_IMODE(st.st_mode)
    group = _group_name(st.st_gid)
    if not mode & stat.S_IRWXG or group == "root":
        return (
            f"permission denied on {path} (mode {mode:04o}, group {group!r}): only root may "
            "use it; the daemon's [server] socket_group is unset or names a group that does "
            "not exist"
        )
    return (
        f"permission denied on {path}: only root and members of group {group!r} may use it; "
        f"join it with `sudo usermod -aG {group} $USER` and log in again"
    )


def _check_ipc_path(endpoint: str) -> None:
    path = ipc_path(endpoint)
    if path is not None:
        if not os.path.exists(path):
            # an unreadable directory hides the socket: that is a permission problem too
            parent = os.path.dirname(path) or "."
            if os.path.isdir(parent) and not os.access(parent, os.X_OK):
                raise _no_access(endpoint, permission_hint(parent))
            raise _unavailable(endpoint, f"no socket at {path}")
        if not os.access(path, os.R_OK | os.W_OK):
            raise _no_access(endpoint, permission_hint(path))


def _raise_for_error(reply: p.Reply) -> p.Reply:
    if isinstance(reply, p.Error):
        if reply.code == "budget_rejected":
            raise BudgetRejected(
                reply.message, reply.details.get("min_w"), reply.details.get("max_w")
            )
        if reply.code == "unknown_job" and reply.details.get("released"):
            raise JobReleased(reply.message)
        raise RequestFailed(reply.code, reply.message)
    return reply


# ---- arguments: the protocol's models hold the rules (powerd.validation says which one
# an argument broke)


# arguments that are numbers: pydantic would take True as 1 and "20" or b"20" as 20
_NUMERIC_ARGS = ("budget_w", "latency_ms", "rate_hz", "step_time_ms", "expected_steps")


def _build(cls: type[M], **fields: Any) -> M:
    """The message to send, or InvalidArgument (a ValueError) instead of pydantic's dump."""
    for name in _NUMERIC_ARGS:
        v = fields.get(name)
        if isinstance(v, (bool, str, bytes, bytearray)):
            raise InvalidArgument(f"{name} must be a number (got {shown(v)})")
    try:
        return cls(**fields)
    except ValidationError as exc:
        raise InvalidArgument(describe_invalid(exc)) from None


def _positive_int(v: object) -> bool:
    try:
        return not isinstance(v, bool) and operator.index(v) >= 1  # type: ignore[arg-type]
    except TypeError:
        return False


def _check_size(size: object) -> None:
    # any positive size may run (not only batch_size); the gate message carries it
    if size is not None and not _positive_int(size):
        raise InvalidArgument(f"size must be a positive int (got {shown(size)})")


def _batch_sizes(sizes: object) -> list[int] | None:
    """batch_sizes as a list of distinct ints (the protocol checks their range): a string
    would iterate into digits, and int() would round 1.5 down."""
    if sizes is None:
        return None
    if isinstance(sizes, (str, bytes, dict)) or not isinstance(sizes, Iterable):
        raise InvalidArgument(f"batch_sizes must be a sequence of ints (got {shown(sizes)})")
    out = []
    for b in sizes:
        # ints and numpy ints, and 4.0; not 1.5, "4", None or True
        n = int(b) if isinstance(b, float) and b.is_integer() else b
        if not isinstance(n, bool):
            try:
                out.append(operator.index(n))
                continue
            except TypeError:
                pass
        raise InvalidArgument(
            f"batch_sizes must be a sequence of ints ({shown(b)} in {shown(sizes)} is not one)"
        )
    if not out:
        raise InvalidArgument("batch_sizes must not be empty")
    return list(dict.fromkeys(out))  # duplicates add nothing


STALE_SOCKET = "a stale socket"  # in the reason when nothing listens on the ipc path


def _probe(endpoint: str) -> None:
    """Fail at once when nothing listens at the endpoint (a dead daemon's ipc socket file
    refuses connections, as does a tcp port nobody bound): ZeroMQ would wait out the whole
    timeout. Anything else (a live daemon, a timeout) is left to the request itself."""
    try:
        knock(endpoint)
    except ConnectionRefusedError:
        path = ipc_path(endpoint)
        if path is not None:
            why = f"nothing listens on {path}: {STALE_SOCKET} of a daemon that is not running"
        else:
            why = "connection refused: nothing listens on that port"
        raise _unavailable(endpoint, why) from None
    except OSError:
        pass  # not ours to judge here: the request says what happens


def knock(endpoint: str, timeout_s: float = 1.0) -> None:
    """Connect to the endpoint's socket (ipc path or tcp port) and hang up; raises what
    the connect raises (ConnectionRefusedError: nothing listens there)."""
    path = ipc_path(endpoint)
    if path is not None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
        return
    host, port = tcp_address(endpoint) or ("", "")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
        pass


def call_once(endpoint: str, msg: BaseModel, timeout_s: float = CALL_TIMEOUT_S) -> p.Reply:
    """One request, one reply, on a fresh socket (powerctl). Raises on error replies."""
    endpoint = connect_endpoint(endpoint)
    _check_ipc_path(endpoint)
    _probe(endpoint)
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
    """The background thread and socket that carry one job's traffic.

    Sends never block: the socket queues at most SEND_HWM messages, a send that would
    block drops a fire-and-forget message (counted in `dropped_sends`), and a call is
    retried until its own deadline. IMMEDIATE keeps messages off a connection that is not
    up, so nothing stale reaches a restarted daemon."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._ids = itertools.count(1)
        self._outbox: queue.SimpleQueue[tuple[BaseModel, Future | None, float]] = (
            queue.SimpleQueue()
        )
        self._waiting: dict[int, Future] = {}
        self._stop = threading.Event()
        self.on_state: collections.abc.Callable[[p.JobState], None] | None = None
        self.on_error: collections.abc.Callable[[p.Error], None] | None = None
        # called on the connection thread every FLUSH_INTERVAL_S: the messages to send now
        self.flush: collections.abc.Callable[[float], list[BaseModel]] | None = None
        self.last_reply = time.monotonic()
        self.dropped_sends = 0
        # a queued message wakes the thread at once instead of at its next flush tick
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pipe_lock = threading.Lock()
        self._pipe_open = True
        self._thread = threading.Thread(target=self._run, name="powerd-client", daemon=True)
        self._thread.start()

    def next_id(self) -> int:
        return next(self._ids)

    def send(self, msg: BaseModel) -> int:
        """Fire and forget (the reply, if a JobState, still updates the job). Its id."""
        msg.id = next(self._ids)
        self._outbox.put((msg, None, 0.0))
        self._wake()
        return msg.id

    def _wake(self) -> None:
        with self._pipe_lock:  # never write to a closed (and maybe reused) descriptor
            if self._pipe_open:
                try:
                    os.write(self._wake_w, b"!")
                except BlockingIOError:
                    pass  # a wake-up is pending already

    def call(self, msg: BaseModel, timeout_s: float = CALL_TIMEOUT_S) -> p.Reply:
        msg.id = next(self._ids)
        fut: Future = Future()
        self._outbox.put((msg, fut, time.monotonic() + timeout_s))
        self._wake()
        try:
            reply = fut.result(timeout=timeout_s + 0.5)
        except FutureTimeout:
            raise _unavailable(self.endpoint, f"no answer within {timeout_s:g} s") from None
        return _raise_for_error(reply)

    def close(self) -> None:
        self._stop.set()
        self._wake()
        self._thread.join(timeout=2.0)
        if not self._thread.is_alive():
            with self._pipe_lock:
                if self._pipe_open:
                    self._pipe_open = False
                    os.close(self._wake_r)
                    os.close(self._wake_w)

    def _run(self) -> None:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 500)  # let a final close message leave
        sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.connect(self.endpoint)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_flush = 0.0
        flush_failures = 0
        calls: list[tuple[BaseModel, Future, float]] = []  # not sent yet: retried
        try:
            while True:
                stopping = self._stop.is_set()
                now = time.monotonic()
                while True:
                    try:
                        msg, fut, deadline = self._outbox.get_nowait()
                    except queue.Empty:
                        break
                    if fut is None:
                        self._send(sock, msg)
                    else:
                        calls.append((msg, fut, deadline))
                calls = [c for c in calls if not self._try_call(sock, *c, now)]
                if self.flush is not None and (now >= next_flush or stopping):
                    try:
                        batches = self.flush(now)
                    except Exception:  # noqa: BLE001 - the script goes on; so must this thread
                        # the first failure with its traceback; a repeating one must not flood
                        flush_failures += 1
                        level = logging.ERROR if flush_failures == 1 else logging.DEBUG
                        log.log(
                            level,
                            "powerd: building the step report failed (%d so far); steps dropped",
                            flush_failures,
                            exc_info=True,
                        )
                        batches = []
                    for batch in batches:
                        batch.id = next(self._ids)
                        self._send(sock, batch)
                    next_flush = now + FLUSH_INTERVAL_S
                if stopping:
                    return
                # a call waiting to be retried polls briefly; otherwise until the next flush
                wait_s = 0.005 if calls else max(0.0, next_flush - time.monotonic())
                events = dict(poller.poll(int(wait_s * 1000) + 1))
                if self._wake_r in events:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except BlockingIOError:
                        pass
                if sock in events:
                    while sock.poll(0):
                        self._dispatch(sock.recv())
        finally:
            for _, fut, _ in calls:
                fut.set_exception(_unavailable(self.endpoint, "the connection closed"))
            sock.close()

    def _send(self, sock: zmq.Socket, msg: BaseModel) -> bool:
        try:
            sock.send(p.encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:  # no daemon connected, or its queue is full: never wait
            self.dropped_sends += 1
            return False

    def _try_call(
        self, sock: zmq.Socket, msg: BaseModel, fut: Future, deadline: float, now: float
    ) -> bool:
        """True once the call is sent or has failed (and so leaves the retry list)."""
        self._waiting[msg.id] = fut
        try:
            sock.send(p.encode(msg), zmq.NOBLOCK)
            return True
        except zmq.Again:
            self._waiting.pop(msg.id, None)
            if now < deadline:
                return False  # the connection may still be coming up
            fut.set_exception(_unavailable(self.endpoint, "could not send"))
            return True

    def _dispatch(self, raw: bytes) -> None:
        try:
            reply = p.decode_reply(raw)
        except ValidationError as exc:
            log.warning("ignoring a malformed reply from powerd: %s", exc)
            return
        self.last_reply = time.monotonic()
        fut = self._waiting.pop(reply.id, None)
        if isinstance(reply, p.JobState) and self.on_state is not None:
            self.on_state(reply)
        elif isinstance(reply, p.Error) and fut is None and self.on_error is not None:
            self.on_error(reply)
        if fut is not None and not fut.done():
            fut.set_result(reply)


class Job:
    """A training job's lease on the board's power mode. Create with `powerd.request()`.

    When the daemon stops answering, the job turns into a warned no-op (phase `idle`, steps
    counted and discarded) until it answers again; when it answers that it no longer knows
    the job (it restarted), the job registers again with the same request by itself. The
    training loop notices neither: `step()` stays a deque append, and `id` may change."""

    kind = "training"

    def __init__(self, conn: Connection, state: p.JobState, register: p.Register | None = None):
        self._conn = conn
        self._state = state
        self._register = register  # what to ask for again after a daemon restart
        self._lock = threading.Lock()
        # bounded: a stalled connection thread cannot grow memory without limit
        self._steps: collections.deque[float] = collections.deque(maxlen=MAX_QUEUED_STEPS)
        self._durations: collections.deque[float] = collections.deque(maxlen=MAX_QUEUED_STEPS)
        # inference: each batch's size (appended before its duration; see _take_chunk)
        self._sizes: collections.deque[int] = collections.deque(maxlen=MAX_QUEUED_STEPS)
        self._last_heartbeat = 0.0
        self._last_flush = 0.0
        self._paused_s = 0.0  # how long this process was last stopped (0: not seen)
        self._paused_at = 0.0  # when that stop was seen
        self._closed = False
        self._warned: set[str] = set()
        self._gone_since: float | None = None
        self._rereg_id: int | None = None  # the re-registration in flight
        self._rereg_at = 0.0
        self._epoch_id = 0  # messages from this id on name the current job id
        self._n_steps = 0  # step() calls
        self._n_out = 0  # steps taken off the queue (sent or discarded)
        self._n_discarded = 0  # discarded while the daemon was gone
        self._turns: _GateChannel | None = None  # managed interleaving (training steps)
        self._holding: p.JobState | None = None  # the state under which this job holds the GPU
        self._flag: _FastPath | None = None
        self._step_start = time.monotonic()  # when the step in flight began
        conn.on_state = self._apply_state
        conn.on_error = self._apply_error
        conn.flush = self._flush

    # -- the hot path ---------------------------------------------------------------------
    def step(self) -> None:
        """Record one finished minibatch. Costs two deque appends; never waits on the
        daemon, except under managed interleaving (another job shares the GPU) when a batch
        of the other job waits or runs: then it gives the GPU back and waits for its turn
        to run the next step."""
        self._n_steps += 1
        t = time.monotonic()
        # duration first: the connection thread pairs durations with steps from the front.
        # Never negative: a script stepping from two threads may read the clock before the
        # other thread's later step start lands.
        self._durations.append(max(0.0, t - self._step_start))
        self._steps.append(t)
        self._step_start = t
        if self._holding is not None and self._flag is not None and self._flag.mine():
            return  # the fast path: nobody waits for the GPU (a memory read)
        if self._state.gate == "managed" or self._holding is not None:
            self._take_turn(t)
            self._step_start = time.monotonic()

    def _take_turn(self, t: float) -> None:
        state = self._state
        if self._turns is None:
            self._turns = _GateChannel(self._conn.endpoint)
        if state.gate == "managed" and state.gate_token:
            # one round trip: entering again also ends this job's previous hold (daemon side)
            _, refused = self._turns.enter(state, 1)
            if refused is not None:
                self._gate_refused(state)
                return
            self._holding = state
            if self._flag is None or not self._flag.current(state.job):
                self._flag = _FastPath.open(self._conn.endpoint, state.job)
        elif self._holding is not None:
            self._turns.leave(self._holding, 1, t)
            self._holding = None

    def _gate_refused(self, state: p.JobState) -> None:
        """The daemon refused this job at the gate (it no longer knows the job: released by
        an admin, or a restarted daemon): run unmanaged until a new state says otherwise,
        instead of a refused round trip (and a log line) on every step."""
        with self._lock:
            if self._state.gate_token == state.gate_token:
                self._state = self._state.model_copy(update={"gate": "open", "gate_token": None})
        self._holding = None

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
        """Either "power_budget" (the fastest mode within the budget) or "step_time" (the
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

    @property
    def feasible(self) -> bool | None:
        """False when no mode meets the budget; None while nothing is decided for the job
        (before the daemon decides, and while it does not manage the job: released, or
        not answering)."""
        return self._state.feasible

    @property
    def connected(self) -> bool:
        """False while the daemon does not answer (the job is then a no-op)."""
        return self._gone_since is None

    def set_budget(self, budget_w: float) -> None:
        """Re-solve for a new budget (no re-profiling). Returns once the daemon accepted it.
        While the daemon is gone: remembered for when the job registers again, and warned."""
        self._check_open()
        # checked here: a budget remembered while the daemon is gone is not validated later
        budget_w = _build(p.SetBudget, job=self.id, budget_w=budget_w).budget_w
        if self._gone_since is not None:
            self._remember_budget(budget_w)
            self._warn_once(
                f"budget:{budget_w}",
                f"powerd is not answering: budget {budget_w:g} W applies when it returns",
            )
            return
        for _ in range(2):
            job_id = self.id
            try:
                reply = self._conn.call(p.SetBudget(job=job_id, budget_w=budget_w))
            except RequestFailed as exc:
                if exc.code != "unknown_job" or isinstance(exc, JobReleased):
                    raise
                # the daemon restarted: the job registers again (with this budget)
                self._remember_budget(budget_w)
                self._wait_for_new_id(job_id, timeout_s=CONNECT_TIMEOUT_S * 2)
                continue
            assert isinstance(reply, p.JobState)
            self._remember_budget(budget_w)
            with self._lock:
                self._state = reply
            return
        raise _unavailable(
            self._conn.endpoint, "the daemon lost this job and it could not register again"
        )

    def _check_open(self) -> None:
        # the connection thread is gone: a call would wait for its timeout, then blame the daemon
        if self._closed:
            raise JobClosed(f"job {self.id} is closed")

    def _remember_budget(self, budget_w: float) -> None:
        if self._register is not None:
            self._register = self._register.model_copy(update={"budget_w": budget_w})
        with self._lock:  # job.budget_w says what the job asked for, daemon or not
            self._state = self._state.model_copy(update={"budget_w": budget_w})

    def _wait_for_new_id(self, old: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.id == old and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._conn.flush = None
        if self._turns is not None:
            if self._holding is not None:
                self._turns.leave(self._holding, 1, time.monotonic())
                self._holding = None
            self._turns.close()
        try:
            # flush what is left so the daemon's last window is not lost, then release the board
            if self._gone_since is None:
                for batch in self._take_batches(time.monotonic(), force=True):
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
    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("powerd: %s", text)

    def _flush(self, now: float) -> list[BaseModel]:
        beat_s = self._state.heartbeat_ms / 1000.0
        gone_after = max(GONE_AFTER_MIN_S, GONE_AFTER_BEATS * beat_s)
        # this thread runs every FLUSH_INTERVAL_S: a far longer gap means this process was
        # stopped, and the daemon's silence over it says nothing about the daemon. (Judged
        # against gone_after, a stop just past the daemon's heartbeat timeout but under
        # 2 s went unseen, and the re-registration read as a daemon restart.)
        if self._last_flush and now - self._last_flush > max(PAUSED_AFTER_MIN_S, 2 * beat_s):
            self._paused_s = now - self._last_flush
            self._paused_at = now
            self._conn.last_reply = now
        self._last_flush = now
        silent = now - self._conn.last_reply
        if self._gone_since is None and silent > gone_after:
            with self._lock:
                # the state first: a reader that sees connected False sees the idle job too
                self._state = self._state.model_copy(
                    update={
                        "phase": "idle",
                        "mode": None,
                        "message": "powerd is not answering",
                        **_UNMANAGED,
                    }
                )
                self._gone_since = now
            log.warning(
                "powerd: the daemon at %s has not answered for %.1f s: running without power "
                "management until it returns",
                self._conn.endpoint,
                silent,
            )
        if self._rereg_id is not None and now - self._rereg_at > REREGISTER_RETRY_S:
            self._rereg_id = None  # no answer: the next unknown_job tries again
        if len(self._steps) == MAX_QUEUED_STEPS:
            self._warn_once("overflow", "step queue full: the oldest steps are dropped")
        if self._gone_since is not None:
            # a no-op job: memory stays flat, and heartbeats keep knocking
            n = len(self._steps)
            for _ in range(n):
                self._steps.popleft()
            self._durations.clear()
            self._sizes.clear()
            self._n_out += n
            self._n_discarded += n
        return self._take_batches(now, force=False)

    @property
    def steps_dropped(self) -> int:
        """Steps the daemon never saw: discarded while it was gone, or pushed out of a full
        queue (the latter counted from the step counter, so give or take a step in flight)."""
        overflow = self._n_steps - self._n_out - len(self._steps)
        return self._n_discarded + max(0, overflow)

    def _take_chunk(self) -> tuple[list[float], list[float], list[int]]:
        k = min(len(self._steps), p.MAX_STEPS_PER_MSG)
        steps = [self._steps.popleft() for _ in range(k)]
        self._n_out += k
        # an inference batch appends its size, then its duration, then its step, so
        # neither is ever behind the steps: the first k line up
        m = min(k, len(self._durations))
        durations = [self._durations.popleft() for _ in range(m)]
        if m != k:
            durations = []
        n = min(k, len(self._sizes))
        sizes = [self._sizes.popleft() for _ in range(n)]
        if n != k or not durations:
            sizes = []
        if durations or any(b < a for a, b in zip(steps, steps[1:], strict=False)):
            # threads may append out of order; the daemon wants them sorted
            rows = sorted(zip(steps, durations or [0.0] * k, sizes or [0] * k, strict=True))
            steps = [r[0] for r in rows]
            durations = [r[1] for r in rows] if durations else []
            sizes = [r[2] for r in rows] if sizes else []
        return steps, durations, sizes

    def _take_batches(self, now: float, force: bool) -> list[BaseModel]:
        """The steps queued so far, in messages of at most MAX_STEPS_PER_MSG; or a heartbeat
        (an empty batch) when one is due."""
        out: list[BaseModel] = []
        beat_due = now - self._last_heartbeat >= self._state.heartbeat_ms / 1000.0
        for _ in range(MAX_QUEUED_STEPS // p.MAX_STEPS_PER_MSG + 1):
            steps, durations, sizes = self._take_chunk()
            if steps or (not out and (beat_due or force)):
                try:
                    batch = p.Steps(job=self.id, t=steps, d=durations, b=sizes)
                except ValidationError as exc:
                    # the daemon would refuse it too; the connection thread must go on
                    self._n_discarded += len(steps)
                    log.warning(
                        "powerd: dropped %d steps the daemon would refuse: %s",
                        len(steps),
                        describe_invalid(exc),
                    )
                    continue
                out.append(batch)
                self._last_heartbeat = now
            if not steps or not self._steps:
                break
        return out

    def _apply_state(self, state: p.JobState) -> None:
        if self._gone_since is not None:
            log.info("powerd: the daemon answers again")
            self._gone_since = None
        if state.id == self._rereg_id:
            self._rereg_id = None
            old = self._state.job
            self._epoch_id = self._conn.next_id()
            if self._paused_s and time.monotonic() - self._paused_at < PAUSE_EXPLAINS_S:
                log.warning(
                    "powerd: this process was stopped for %.1f s, longer than the daemon "
                    "waits for a heartbeat, so the daemon ended job %s: registered again as %s",
                    self._paused_s,
                    old,
                    state.job,
                )
            else:
                log.warning(
                    "powerd: the daemon had lost job %s (it restarted): registered again as %s",
                    old,
                    state.job,
                )
            self._paused_s = 0.0
        elif state.job != self._state.job:
            return  # a late reply about the job id before a re-registration
        with self._lock:
            self._state = state
            msg = state.message
        if not msg:
            return
        if state.phase == "idle" or state.feasible is False:
            self._warn_once(msg, msg)  # a problem the script's user should see
        elif msg not in self._warned:
            # progress ("measuring a candidate mode after the commit (3 so far)"): not a warning
            # in the user's training log, one line per probe; there when logging asks
            self._warned.add(msg)
            log.info("powerd: %s", msg)

    def _apply_error(self, err: p.Error) -> None:
        if self._gone_since is not None:
            log.info("powerd: the daemon answers again")
            self._gone_since = None
        if err.id == self._rereg_id:
            self._rereg_id = None
            self._warn_once(
                f"rereg:{err.code}:{err.message}",
                f"could not register again: {err.code}: {err.message}",
            )
            return
        if err.code == "unknown_job":
            if err.id < self._epoch_id or self._rereg_id is not None:
                return  # about the old job id, or already registering again
            # a daemon that ended the job on purpose (an admin's restore) may say so; then
            # registering again would undo what the admin asked for, and the job says why
            released = bool(err.details.get("released"))
            # the gate token died with the job: steps and batches run unmanaged meanwhile
            update: dict[str, Any] = {
                "phase": "idle",
                "mode": None,
                "gate": "open",
                "gate_token": None,
                **_UNMANAGED,
            }
            if released:
                update["message"] = err.message
            with self._lock:
                self._state = self._state.model_copy(update=update)
            if self._register is not None and not self._closed and not released:
                self._rereg_at = time.monotonic()
                self._rereg_id = self._conn.send(self._register.model_copy())
                return
            if released:  # a plain sentence for the user's log, not the protocol's code
                self._warn_once(f"{err.code}:{err.message}", err.message)
                return
        self._warn_once(f"{err.code}:{err.message}", f"{err.code}: {err.message}")


class InferenceJob(Job):
    """An inference job's lease: powerd picks the batch size and mode for its arrival rate,
    latency target and power budget. One `with job.batch(size=b):` per batch."""

    kind = "inference"

    def __init__(self, conn: Connection, state: p.JobState, register: p.Register | None = None):
        super().__init__(conn, state, register=register)
        self._gate = _GateChannel(conn.endpoint)

    @property
    def batch_size(self) -> int:
        """The batch size powerd chose: form batches of exactly this size. It changes when
        powerd re-solves (a rate, budget or job change): read it for each batch."""
        if self._state.batch_size:
            return self._state.batch_size
        # before the daemon's first answer: the smallest size the job said it can run (a
        # model that runs only 8 or 16 must not be told 1)
        sizes = self._register.batch_sizes if self._register is not None else None
        return min(sizes) if sizes else 1

    @property
    def feasible(self) -> bool:
        """False when no (mode, batch size) meets latency_ms under budget_w (then powerd
        serves with `best_latency_ms`). True until the daemon says otherwise."""
        return self._state.feasible is not False

    @property
    def best_latency_ms(self) -> float | None:
        """When infeasible: the lowest worst-case latency achievable under the budget."""
        return self._state.best_latency_ms

    def batch(self, size: int | None = None) -> _Batch:
        """Context manager around one inference batch. Entering may wait for the GPU (a
        training step in flight, under managed interleaving); leaving reports the batch."""
        self._check_open()
        _check_size(size)
        return _Batch(self, size)

    def set_rate(self, rate_hz: float) -> None:
        """The arrival rate changed: powerd re-solves from what it measured. Returns once the
        daemon accepted the rate; the re-solve runs on the daemon's next pass, so the new
        `batch_size` arrives with a later state (within ~0.2 s): read `batch_size` when
        you form each batch, not once after this call."""
        self._check_open()
        reply = self._conn.call(_build(p.SetRate, job=self.id, rate_hz=rate_hz))
        assert isinstance(reply, p.JobState)
        with self._lock:
            self._state = reply

    def close(self) -> None:
        self._gate.close()
        super().close()


class _FastPath:
    """The daemon's fast-path flag, mapped read-only: `mine()` while the daemon lets this
    job run its next step without asking (powerd.gate explains)."""

    __slots__ = ("mm", "key", "job", "inode", "path")

    def __init__(self, mm: mmap.mmap, path: str, job: str, inode: int):
        self.mm, self.path, self.job, self.inode = mm, path, job, inode
        self.key = p.flag_key(job)

    @classmethod
    def open(cls, endpoint: str, job: str) -> _FastPath | None:
        path = gate_flag_path(endpoint)
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None  # an older daemon, a tcp endpoint, no read access: round trips
        try:
            st = os.fstat(fd)
            if st.st_size < p.FLAG_BYTES:
                return None
            mm = mmap.mmap(fd, p.FLAG_BYTES, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        return cls(mm, path, job, st.st_ino)

    def mine(self) -> bool:
        return self.mm[: p.FLAG_ID_BYTES] == self.key

    def current(self, job: str) -> bool:
        """Still this job's, and the daemon's current file (a restarted daemon made anew)."""
        if job != self.job:
            return False
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False


GATE_WAIT_FACTOR = 1.25  # x the daemon's gate timeout: see _GateChannel.enter


class _GateChannel:
    """The socket a managed-interleaving gate is entered through.

    Used from the thread that runs batches or steps (hence the lock), separate from the
    connection thread so that entering is one round trip with no polling interval in the
    way: the daemon's gate socket (`gate_path`) when there is one, else a ZeroMQ DEALER on
    the endpoint. The daemon answers "enter" when the GPU is free; a wait never lasts
    longer than the JobState's gate_timeout_ms (a daemon that lost the other job, or this
    one, must not block inference)."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self._sock: zmq.Socket | None = None
        self._unix: socket.socket | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.timeouts = 0
        self.sent = 0  # enters sent

    def _socket(self) -> zmq.Socket | socket.socket:
        if self._unix is not None:
            return self._unix
        if self._sock is None:
            path = gate_path(self.endpoint)
            if path is not None and os.path.exists(path):
                unix = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    unix.connect(path)
                except OSError:
                    unix.close()  # not ours to use (permissions, a stale file): ZeroMQ
                else:
                    self._unix = unix
                    return unix
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 100)
            sock.connect(self.endpoint)
            self._sock = sock
        return self._sock

    def _message(self, state: p.JobState, op: str, size: int, t: float) -> tuple[int, bytes]:
        # built by hand (a tenth of a pydantic dump): this is every step's cost; the daemon
        # validates it as any other message
        msg_id = next(self._ids)
        job, token = json.dumps(state.job), json.dumps(state.gate_token or "")
        raw = (
            f'{{"v":{p.PROTOCOL_VERSION},"id":{msg_id},"type":"gate","job":{job},'
            f'"token":{token},"op":"{op}","size":{size},"t":{t!r}}}'
        )
        return msg_id, raw.encode()

    def enter(self, state: p.JobState, size: int) -> tuple[float, p.Error | None]:
        """Block until the daemon opens the gate; returns the seconds waited, and the
        daemon's refusal if it refused (a job it no longer knows: then run unmanaged)."""
        t0 = time.monotonic()
        # A little longer than the daemon's own bound on a hold: when the other job holds
        # the GPU past it, the daemon hands the GPU over and this wait ends with a grant,
        # not with a timeout on each side at the same moment.
        deadline = t0 + GATE_WAIT_FACTOR * state.gate_timeout_ms / 1000.0
        refused: p.Error | None = None
        with self._lock:
            sock = self._socket()
            msg_id, raw = self._message(state, "enter", size, t0)
            self.sent += 1
            try:
                sock.send(raw)
            except OSError:
                self._drop_unix()  # the daemon went away: run; the next enter reconnects
                return time.monotonic() - t0, None
            while True:
                left = deadline - time.monotonic()
                got = self._recv(sock, left) if left > 0 else None
                if got is None:
                    self.timeouts += 1
                    # the first loudly, then every 100th: each late step must not log
                    level = logging.WARNING if self.timeouts % 100 == 1 else logging.DEBUG
                    log.log(
                        level,
                        "powerd: job %s: no gate answer within %d ms; running anyway (%d so far)",
                        state.job,
                        (deadline - t0) * 1000.0,
                        self.timeouts,
                    )
                    break
                if got == b"":
                    break  # the daemon closed the gate socket: run
                try:
                    reply = p.decode_reply(got)
                except ValidationError:
                    continue
                if isinstance(reply, p.Error) and reply.id is None:
                    # refused before it was read (e.g. rate limited): the answer to this
                    # enter, as only one is in flight; run rather than wait for nothing
                    log.warning("powerd: gate: %s: %s", reply.code, reply.message)
                    break
                if reply.id != msg_id:
                    continue  # the late answer to an enter that timed out
                if isinstance(reply, p.Error):
                    # the job's own connection hears the same from the daemon and tells the
                    # user once (released by an admin, or registering again)
                    log.debug("powerd: gate: %s: %s", reply.code, reply.message)
                    refused = reply
                break
        return time.monotonic() - t0, refused

    def _recv(self, sock: zmq.Socket | socket.socket, left_s: float) -> bytes | None:
        """One message within left_s: None on a timeout, b"" when the daemon closed it."""
        if isinstance(sock, socket.socket):
            sock.settimeout(left_s)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                return None
            except OSError:
                data = b""
            if not data:
                self._drop_unix()
            return data
        if not sock.poll(max(1, int(left_s * 1000))):
            return None
        return sock.recv()

    def _drop_unix(self) -> None:
        if self._unix is not None:
            self._unix.close()
            self._unix = None

    def leave(self, state: p.JobState, size: int, t: float) -> None:
        with self._lock:
            _, raw = self._message(state, "leave", size, t)
            try:
                self._socket().send(raw)
            except OSError:
                self._drop_unix()

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._drop_unix()


class _Batch:
    """One batch: enters the gate when the daemon manages the GPU, times the batch, and
    reports it (end time and duration) on the job's connection when it leaves."""

    __slots__ = ("_job", "_size", "_t0", "_managed", "_state", "waited_s")

    def __init__(self, job: InferenceJob, size: int | None):
        self._job = job
        self._size = size
        self._t0 = 0.0
        self._managed = False
        self._state: p.JobState | None = None
        self.waited_s = 0.0

    def __enter__(self) -> _Batch:
        state = self._job._state
        # the size this batch runs: the caller's, else powerd's choice as the batch begins
        # (read once: powerd may change `batch_size` while the batch runs)
        self._size = self._size or self._job.batch_size
        self._managed = state.gate == "managed" and bool(state.gate_token)
        if self._managed:
            self._state = state
            self.waited_s, refused = self._job._gate.enter(state, self._size)
            if refused is not None:
                self._job._gate_refused(state)
                self._managed = False
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        t1 = time.monotonic()
        if self._managed and self._state is not None:
            # Give the GPU back first: the other job may be waiting on it.
            self._job._gate.leave(self._state, self._size, t1)
        # the size it ran: a batch formed before powerd changed `batch_size` is not one of
        # the new size, and must not be measured as one
        self._job._sizes.append(self._size)
        self._job._durations.append(t1 - self._t0)
        self._job._steps.append(t1)


class NoopJob:
    """What `request(required=False)` returns when no daemon is reachable: does nothing."""

    phase = "idle"
    mode = None
    batch_size = 1
    connected = False
    steps_dropped = 0
    best_latency_ms = None
    fastest_ms = None
    id = None  # no daemon, no job id
    message = "no powerd daemon: running without power management"

    def __init__(self, kind: str, budget_w: float | None, step_time_ms: float | None = None):
        self.kind = kind
        self.budget_w = budget_w
        # the Job API in full (a script written for a daemon runs without one): the
        # objective asked for, as a Job whose daemon went away keeps its own
        self.step_time_ms = step_time_ms
        self.objective = "power_budget" if step_time_ms is None else "step_time"
        # nothing decided, as for a Job whose daemon is gone (InferenceJob.feasible is a
        # bool, True until the daemon says otherwise)
        self.feasible: bool | None = True if kind == "inference" else None

    def step(self) -> None:
        pass

    # arguments are checked as with a daemon: a script tried without one fails the same way
    def set_budget(self, budget_w: float) -> None:
        self.budget_w = _build(p.SetBudget, job="", budget_w=budget_w).budget_w

    def set_rate(self, rate_hz: float) -> None:
        _build(p.SetRate, job="", rate_hz=rate_hz)

    def batch(self, size: int | None = None) -> _NoopBatch:
        _check_size(size)
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


def request(
    budget_w: float | None = None,
    workload: str | None = None,
    kind: str = "training",
    latency_ms: float | None = None,
    rate_hz: float | None = None,
    required: bool = True,
    endpoint: str | None = None,
    batch_sizes: Iterable[int] | None = None,
    step_time_ms: float | None = None,
    expected_steps: int | None = None,
) -> Job | InferenceJob | NoopJob:
    """Ask powerd for a power budget (None = the admin's default) and register this job.

    step_time_ms: a training job's step-time target instead (e.g. a round's deadline
    divided by its steps): powerd pins the lowest-power mode whose measured step time
    meets it, within `budget_w` if given; `job.objective` is then "step_time".

    expected_steps: how many steps a training job expects to run. A long job lets powerd
    keep measuring promising modes after the first commit (each within the budget), and
    switch to a faster one it finds; unknown (None), powerd takes the steps run so far as
    the length, so a job earns those measurements as it keeps training.

    An argument outside the protocol's rules raises InvalidArgument (a ValueError) naming it."""
    msg = _build(
        p.Register,
        kind=kind,
        budget_w=budget_w,
        workload=workload,
        latency_ms=latency_ms,
        rate_hz=rate_hz,
        pid=os.getpid(),
        batch_sizes=_batch_sizes(batch_sizes),
        step_time_ms=step_time_ms,
        expected_steps=expected_steps,
    )
    try:
        ep = connect_endpoint(resolve_endpoint(endpoint))
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
        # the warnings registry shows it once per call site and endpoint: no global flag
        warnings.warn(str(exc), RuntimeWarning, stacklevel=2)
        return NoopJob(kind, budget_w, step_time_ms)
    assert isinstance(reply, p.JobState)
    cls = InferenceJob if kind == "inference" else Job
    return cls(conn, reply, register=msg)
