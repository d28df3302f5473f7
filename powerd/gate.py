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

Each hold that ends is logged as (job, start, end) for the planner: the daemon's own
measure of how long each step or batch held the GPU.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from powerd import protocol as p
from powerd.registry import ReplyTo

log = logging.getLogger("powerd.gate")

MAX_HOLDS = 4096
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


class GpuGate:
    def __init__(self, post: Callable[[ReplyTo, p.BaseModel], None], timeout_s: float):
        self.post = post
        self.timeout_s = timeout_s
        self.managed = False
        self.holder: str | None = None
        self.holder_kind = ""
        self.since = 0.0
        self.waiting: collections.deque[_Waiter] = collections.deque()
        self.holds: collections.deque[tuple[str, str, float, float]] = collections.deque(
            maxlen=MAX_HOLDS
        )
        self.timeouts = 0
        self.preempted = 0  # holds cut short because another job waited
        self._recent: dict[str, collections.deque[float]] = {}
        self._limit_of: dict[str, float] = {}

    def enter(self, job: str, kind: str, reply_to: ReplyTo, now: float) -> p.BaseModel | None:
        """GateOpen now, or None: answered later through `post`."""
        if self.holder == job:
            self._end(now)  # a client that entered again without leaving: its hold ended
        self.waiting = collections.deque(w for w in self.waiting if w.job != job)
        if not self.managed:
            return p.GateOpen(id=reply_to.msg_id, job=job)
        if self.holder is None and (kind == "inference" or not self._inference_waits()):
            self._grant(job, kind, now)
            return p.GateOpen(id=reply_to.msg_id, job=job)
        self.waiting.append(_Waiter(job, kind, reply_to, now))
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
                self.holder = None
                while self.waiting:  # nothing to wait for any more
                    w = self.waiting.popleft()
                    self.post(w.reply_to, p.GateOpen(id=w.reply_to.msg_id, job=w.job))
                return
        if len(self.waiting) and any(w.job not in live for w in self.waiting):
            self.waiting = collections.deque(w for w in self.waiting if w.job in live)
        for gone in [j for j in self._recent if j not in live]:
            del self._recent[gone]
            self._limit_of.pop(gone, None)
        if self.holder is not None:
            held = now - self.since
            if self.holder not in live or held > self.timeout_s:
                if self.holder in live:
                    self.timeouts += 1
                    log.warning("gate: job %s held the GPU past the timeout", self.holder)
                self.holder = None
            elif self.waiting and held > self.hold_limit(self.holder):
                self.preempted += 1  # a pause: the waiting job goes; this one queues later
                log.info(
                    "gate: job %s held the GPU %.0f ms (its bound %.0f ms) while %s waited: "
                    "handed over",
                    self.holder,
                    held * 1000.0,
                    self.hold_limit(self.holder) * 1000.0,
                    self.waiting[0].job,
                )
                self.holder = None
        if self.holder is None and self.waiting:
            self._next(now)

    def hold_limit(self, job: str) -> float:
        """How long `job` may hold the GPU while another waits (see the module doc)."""
        return self._limit_of.get(job, self.timeout_s)

    def busy_until(self) -> float | None:
        """When `check` must run next to cut a hold short (None: nothing held)."""
        if self.holder is None:
            return None
        if self.waiting:
            return self.since + min(self.hold_limit(self.holder), self.timeout_s)
        return self.since + self.timeout_s

    # ---- internals ---------------------------------------------------------------------
    def _inference_waits(self) -> bool:
        return any(w.kind == "inference" for w in self.waiting)

    def _grant(self, job: str, kind: str, now: float) -> None:
        self.holder, self.holder_kind, self.since = job, kind, now

    def _end(self, now: float) -> None:
        if self.holder is not None:
            self.holds.append((self.holder, self.holder_kind, self.since, now))
            recent = self._recent.get(self.holder)
            if recent is None:
                recent = self._recent[self.holder] = collections.deque(maxlen=HOLD_HISTORY)
            recent.append(now - self.since)
            if len(recent) >= HOLD_MIN_SEEN:
                med = sorted(recent)[len(recent) // 2]
                self._limit_of[self.holder] = min(
                    self.timeout_s, max(HOLD_FLOOR_S, HOLD_FACTOR * med)
                )
        self.holder = None

    def _next(self, now: float) -> None:
        if self.holder is not None or not self.waiting:
            return
        pick = next((w for w in self.waiting if w.kind == "inference"), self.waiting[0])
        self.waiting.remove(pick)
        self._grant(pick.job, pick.kind, now)
        self.post(pick.reply_to, p.GateOpen(id=pick.reply_to.msg_id, job=pick.job))


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
