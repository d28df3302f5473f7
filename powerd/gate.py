"""The GPU gate of managed interleaving: one piece of GPU work at a time across the jobs.

Runs on the request path (answers must not wait for the control loop's period): an "enter"
is answered with GateOpen when the slot is free, else later, when the holder leaves. A
waiting inference batch goes before a training step (a batch that is formed is due; the
training step waits its turn), so a batch waits at most for the step in flight.

A holder that does not leave within `timeout_s` (the heartbeat timeout) loses the slot, and
so does a holder whose job is gone (its client died: the control path drops it after the
heartbeat timeout), so a dead client never blocks the other longer than that. Sooner, when
another job waits: a hold is bounded by what the gate measured of that job's holds,
HOLD_FACTOR x their median (never under HOLD_FLOOR_S), so a training job that pauses while
holding the GPU (evaluation, a checkpoint) or an inference client that hangs inside
`batch()` hands the GPU to the waiting job after a few of its own step times, not after
the timeout. The one that lost the slot waits its turn at its next enter. While the gate
is not managed (one job on the board), every enter is answered at once.

The fast path of a training job: a round trip per step costs ~0.3 ms, most of it waking
two processes, and is wasted while no batch waits. So when the gate grants a training job
the GPU and no batch waits, it also writes that job's id into a small shared file
(:class:`GateFlag`) that the job's client maps read-only: while the id is there, `step()`
runs the next step without asking (a memory read). The training job then holds the GPU
implicitly, step after step. A batch that enters clears the file first and waits for the
step in flight: the client sees the cleared file at its next step() and comes to the gate.
A torn read only ever yields a mismatch, i.e. the slow path. Hold bounds for training come
from the step durations the client reports (`note_steps`), not from gate round trips.
"""

from __future__ import annotations

import collections
import logging
import mmap
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from powerd import protocol as p
from powerd.registry import ReplyTo

log = logging.getLogger("powerd.gate")

HOLD_FACTOR = 4.0  # a hold longer than this many times the job's median hold is a pause
HOLD_FLOOR_S = 0.01  # ... but never cut shorter than this
HOLD_HISTORY = 32  # holds per job the median is taken over
HOLD_MIN_SEEN = 3  # holds seen before the bound applies (until then: the timeout)


@dataclass
class _Waiter:
    job: str
    kind: str
    reply_to: ReplyTo
    since: float
    size: int | None = None


class GpuGate:
    def __init__(
        self,
        post: Callable[[ReplyTo, p.BaseModel], None],
        timeout_s: float,
        on_batch: Callable[[float, float | None], None] | None = None,
    ):
        self.post = post
        # told when an inference batch gets the GPU: (when, its expected length or None),
        # so that the power sensor is read inside it (the only place that knows when a
        # batch starts before it has ended)
        self.on_batch = on_batch
        self.timeout_s = timeout_s
        self.managed = False
        self.holder: str | None = None
        self.holder_kind = ""
        self.since = 0.0
        self.waiting: collections.deque[_Waiter] = collections.deque()
        self.implicit = False  # the holder is a training job on the fast path
        self.flag: GateFlag | None = None  # set by the server when it made the file
        self.fast: str | None = None  # the job whose id the flag holds
        self.timeouts = 0
        self.preempted = 0  # holds cut short because another job waited
        self.holder_size: int | None = None  # the batch size the holder entered with
        # hold history and bound per (job, batch size): a job that moves from b=4 to b=64
        # must not have its larger batches cut at four of its small ones
        self._recent: dict[tuple[str, int | None], collections.deque[float]] = {}
        self._limit_of: dict[tuple[str, int | None], float] = {}

    def enter(
        self, job: str, kind: str, reply_to: ReplyTo, now: float, size: int | None = None
    ) -> p.BaseModel | None:
        """GateOpen now, or None: answered later through `post`. `size`: the batch size
        about to run (inference), whose own past holds bound this one."""
        if kind != "inference":
            size = None  # a training step's bound comes from its reported step times
        if self.holder == job:
            self._end(now)  # a client that entered again without leaving: its hold ended
        self.waiting = collections.deque(w for w in self.waiting if w.job != job)
        if not self.managed:
            return p.GateOpen(id=reply_to.msg_id, job=job)
        if kind == "inference" and self.implicit and self.fast is not None:
            # the training job runs steps without asking: stop it at its next step(); the
            # step in flight is bounded from now (when it started is not known here)
            self._close_fast()
            self.since = now
        if self.holder is None and (kind == "inference" or not self._inference_waits()):
            self._grant(job, kind, now, size)
            return p.GateOpen(id=reply_to.msg_id, job=job)
        self.waiting.append(_Waiter(job, kind, reply_to, now, size))
        self._next(now)  # a job entering again freed the slot: a waiting batch goes first
        return None

    def leave(self, job: str, now: float) -> None:
        if self.holder == job:
            self._end(now)
            self._next(now)
        elif any(w.job == job for w in self.waiting):
            # it stopped waiting (its client gave up and ran): a grant now would hold the
            # GPU for a batch that is already over
            self.waiting = collections.deque(w for w in self.waiting if w.job != job)

    def check(self, now: float, live: set[str], managed: bool) -> None:
        """Called on every pass of the request loop: drops gone jobs and late holders."""
        if managed != self.managed:
            self.managed = managed
            if not managed:
                self.holder, self.implicit = None, False
                self._close_fast()
                while self.waiting:  # nothing to wait for any more
                    w = self.waiting.popleft()
                    self.post(w.reply_to, p.GateOpen(id=w.reply_to.msg_id, job=w.job))
                return
        if len(self.waiting) and any(w.job not in live for w in self.waiting):
            self.waiting = collections.deque(w for w in self.waiting if w.job in live)
        for gone in [k for k in self._recent if k[0] not in live]:
            del self._recent[gone]
            self._limit_of.pop(gone, None)
        if self.holder is not None:
            held = now - self.since
            # a training job on the fast path holds the GPU for as long as nobody asks
            late = held > self.timeout_s and (self.waiting or not self.implicit)
            if self.holder not in live or late:
                if self.holder in live:
                    self.timeouts += 1
                    log.warning("gate: job %s held the GPU past the timeout", self.holder)
                self._drop_holder()
            elif self.waiting and held > self.hold_limit(self.holder, self.holder_size):
                self.preempted += 1  # a pause: the waiting job goes; this one queues later
                log.info(
                    "gate: job %s held the GPU %.0f ms (its bound %.0f ms) while %s waited: "
                    "handed over",
                    self.holder,
                    held * 1000.0,
                    self.hold_limit(self.holder, self.holder_size) * 1000.0,
                    self.waiting[0].job,
                )
                self._drop_holder()
        if self.holder is None and self.waiting:
            self._next(now)

    def hold_limit(self, job: str, size: int | None = None) -> float:
        """How long `job` may hold the GPU while another waits (see the module doc), for a
        batch of `size`. A size not seen enough yet: the bound of the job's nearest size
        seen, scaled by the ratio of the sizes when larger (a batch takes at most that
        much longer), else the timeout."""
        own = self._limit_of.get((job, size))
        if own is not None or size is None:
            return self.timeout_s if own is None else own
        seen = [(s, lim) for (j, s), lim in self._limit_of.items() if j == job and s]
        if not seen:
            return self.timeout_s
        near, lim = min(seen, key=lambda x: (abs(x[0] - size), x[0]))
        return min(self.timeout_s, lim * max(1.0, size / near))

    def median_hold(self, job: str, size: int | None) -> float | None:
        """The median of `job`'s recent holds at `size` (None: fewer than HOLD_MIN_SEEN)."""
        recent = self._recent.get((job, size))
        if recent is None or len(recent) < HOLD_MIN_SEEN:
            return None
        return sorted(recent)[len(recent) // 2]

    def note_steps(self, job: str, durations: list[float]) -> None:
        """A training job's reported step durations (gate waits excluded): its hold bound.
        On the fast path the gate sees none of its steps begin or end."""
        # only the last HOLD_HISTORY count: a long backlog costs no more than that
        self._note_holds(job, [d for d in durations[-HOLD_HISTORY:] if d > 0])

    def busy_until(self) -> float | None:
        """When `check` must run next to cut a hold short (None: nothing to cut)."""
        if self.holder is None or (self.implicit and not self.waiting):
            return None
        if self.waiting:
            limit = self.hold_limit(self.holder, self.holder_size)
            return self.since + min(limit, self.timeout_s)
        return self.since + self.timeout_s

    # ---- internals ---------------------------------------------------------------------
    def _inference_waits(self) -> bool:
        return any(w.kind == "inference" for w in self.waiting)

    def _grant(self, job: str, kind: str, now: float, size: int | None = None) -> None:
        self.holder, self.holder_kind, self.since = job, kind, now
        self.holder_size = size
        self.implicit = False
        if kind == "inference" and self.on_batch is not None:
            try:
                self.on_batch(now, self.median_hold(job, size))
            except Exception:  # a failed extra power reading must never stall the gate
                log.exception("gate: the batch-start hook failed")
        if kind == "training" and self.flag is not None and not self._inference_waits():
            self.fast = job
            self.flag.open_for(job)
            self.implicit = True

    def _close_fast(self) -> None:
        if self.fast is not None and self.flag is not None:
            self.flag.clear()
        self.fast = None

    def _drop_holder(self) -> None:
        if self.holder == self.fast:
            self._close_fast()
        self.holder, self.implicit = None, False

    def _end(self, now: float) -> None:
        if self.holder is not None and not self.implicit:
            # an implicit hold spans many steps: its length says nothing of one step
            self._note_holds(self.holder, [now - self.since], self.holder_size)
        self._drop_holder()

    def _note_holds(self, job: str, held_s: list[float], size: int | None = None) -> None:
        if not held_s:
            return
        key = (job, size)
        recent = self._recent.get(key)
        if recent is None:
            recent = self._recent[key] = collections.deque(maxlen=HOLD_HISTORY)
        recent.extend(held_s)
        med = self.median_hold(job, size)
        if med is not None:
            self._limit_of[key] = min(self.timeout_s, max(HOLD_FLOOR_S, HOLD_FACTOR * med))

    def _next(self, now: float) -> None:
        if self.holder is not None or not self.waiting:
            return
        pick = next((w for w in self.waiting if w.kind == "inference"), self.waiting[0])
        self.waiting.remove(pick)
        self._grant(pick.job, pick.kind, now, pick.size)
        self.post(pick.reply_to, p.GateOpen(id=pick.reply_to.msg_id, job=pick.job))


# ---- the fast path's flag ---------------------------------------------------------------------


class GateFlag:
    """The daemon's side of the fast path: a small file next to the gate socket, mapped
    shared, that training clients map read-only (see the module doc)."""

    def __init__(self, path: str):
        self.path = path
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, bytes(p.FLAG_BYTES))
            self.mm = mmap.mmap(fd, p.FLAG_BYTES)
        finally:
            os.close(fd)
        # a new file, not a rewrite of a stale one: a client still mapping the old one (a
        # daemon that crashed) reads the old content, never this daemon's job ids
        os.replace(tmp, path)

    def open_for(self, job: str) -> None:
        self.mm[: p.FLAG_ID_BYTES] = p.flag_key(job)

    def clear(self) -> None:
        self.mm[: p.FLAG_ID_BYTES] = bytes(p.FLAG_ID_BYTES)

    def close(self) -> None:
        self.clear()  # a client that keeps the mapping takes the slow path from now on
        self.mm.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


# ---- the gate's own socket ------------------------------------------------------------------
#
# Entering the gate is on the hot path of every training step and inference batch under
# managed interleaving. Over ZeroMQ a round trip crosses four threads (each side's I/O
# thread) before the request thread sees it; a plain UNIX SOCK_SEQPACKET socket next to the
# ipc endpoint is two: the client's send wakes the request loop's poll directly, and the
# reply wakes the client's recv. Same messages (protocol.Gate / GateOpen), same token check;
# the socket answers gate messages only. Clients fall back to ZeroMQ when it is absent
# (a tcp endpoint, an older daemon).

GATE_SOCK = 2  # ReplyTo.sock of gate connections (0: the user socket, 1: the admin socket)
MAX_GATE_CONNECTIONS = 4096
MAX_GATE_MESSAGE = 4096  # a Gate message is ~150 bytes; longer ones are cut and refused


class GateListener:
    """The daemon side: accepts gate connections and hands each message to `handle`
    (identity, raw, now) -> reply or None; deferred replies go out through `send`."""

    def __init__(self, path: str):
        self.path = path
        if os.path.exists(path):
            os.unlink(path)  # the ipc endpoint was checked free first: a stale file
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ls.bind(path)
        ls.listen(64)
        ls.setblocking(False)
        self.listener = ls
        self.conns: dict[int, socket.socket] = {}  # serial -> connection
        self.by_fd: dict[int, int] = {}  # fd -> serial
        self._serial = 0

    def fds(self) -> list[int]:
        return [self.listener.fileno(), *self.by_fd]

    def on_readable(self, fd: int, now: float, handle, poller) -> None:
        if fd == self.listener.fileno():
            self._accept(poller)
            return
        serial = self.by_fd.get(fd)
        if serial is None:
            return
        conn = self.conns[serial]
        while True:
            try:
                raw = conn.recv(MAX_GATE_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                raw = b""
            if not raw:
                self._close(serial, poller)
                return
            reply = handle(b"%d" % serial, raw, now)
            if reply is not None:
                self.send(b"%d" % serial, reply, poller)

    def send(self, identity: bytes, reply: p.BaseModel, poller=None) -> None:
        conn = self.conns.get(int(identity))
        if conn is None:
            return  # the client went away: nothing to answer
        try:
            conn.send(p.encode(reply))
        except (BlockingIOError, OSError):
            # a client that does not read its answers (or is gone) loses its connection
            self._close(int(identity), poller)

    def close(self) -> None:
        for serial in list(self.conns):
            self._close(serial, None)
        self.listener.close()
        if os.path.exists(self.path):
            os.unlink(self.path)

    def _accept(self, poller) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, OSError):
                return
            if len(self.conns) >= MAX_GATE_CONNECTIONS:
                conn.close()
                continue
            conn.setblocking(False)
            self._serial += 1
            self.conns[self._serial] = conn
            self.by_fd[conn.fileno()] = self._serial
            poller.register(conn.fileno(), zmq.POLLIN)

    def _close(self, serial: int, poller) -> None:
        conn = self.conns.pop(serial, None)
        if conn is None:
            return
        fd = conn.fileno()
        self.by_fd.pop(fd, None)
        if poller is not None:
            try:
                poller.unregister(fd)
            except KeyError:
                pass
        conn.close()
