"""The GPU gate of managed interleaving: one piece of GPU work at a time across the jobs.

Runs on the request path (answers must not wait for the control loop's period): an "enter"
is answered with GateOpen when the slot is free, else later, when the holder leaves. A
waiting inference batch goes before a training step (a batch that is formed is due; the
training step waits its turn), so a batch waits at most for the step in flight.

A holder that does not leave within `timeout_s` loses the slot, and so does a holder whose
job is gone (its client died: the control path drops it after the heartbeat timeout), so a
dead client never blocks the other longer than that. While the gate is not managed (one
kind on the board), every enter is answered at once.

Each hold that ends is logged as (job, start, end) for the planner: the daemon's own
measure of how long each step or batch held the GPU.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

from powerd import protocol as p
from powerd.registry import ReplyTo

MAX_HOLDS = 4096


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
        self.waiting = collections.deque(w for w in self.waiting if w.job in live)
        if self.holder is not None and (
            self.holder not in live or now - self.since > self.timeout_s
        ):
            if self.holder in live:
                self.timeouts += 1
            self.holder = None
            self._next(now)
        elif self.holder is None and self.waiting:
            self._next(now)

    def busy_until(self) -> float | None:
        return None if self.holder is None else self.since + self.timeout_s

    # ---- internals ---------------------------------------------------------------------
    def _inference_waits(self) -> bool:
        return any(w.kind == "inference" for w in self.waiting)

    def _grant(self, job: str, kind: str, now: float) -> None:
        self.holder, self.holder_kind, self.since = job, kind, now

    def _end(self, now: float) -> None:
        if self.holder is not None:
            self.holds.append((self.holder, self.holder_kind, self.since, now))
        self.holder = None

    def _next(self, now: float) -> None:
        if self.holder is not None or not self.waiting:
            return
        pick = next((w for w in self.waiting if w.kind == "inference"), self.waiting[0])
        self.waiting.remove(pick)
        self._grant(pick.job, pick.kind, now)
        self.post(pick.reply_to, p.GateOpen(id=pick.reply_to.msg_id, job=pick.job))
