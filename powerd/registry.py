"""The job registry: the state the request path answers from, shared with the control path.

The request thread adds, re-budgets and removes jobs and queues their step timestamps; the
control thread drains the steps, expires silent jobs, and publishes what the planners
decided (each job's view, the mode in force, the planner's status). Every access holds
`lock`, and nothing slow happens while it is held (no sysfs, no store, no fit).

Binding: a job belongs to the ZeroMQ connection that registered it (the ROUTER identity
on the socket it came in on). Messages naming the job from any other connection get
`unknown_job`, as if the job did not exist, so job ids reveal nothing. Why the identity
and not a secret token: it needs no protocol change and gives the client nothing to leak.
libzmq refuses a peer that asks for an identity already connected (checked: the spoofed
messages are dropped), so no one can speak as the owner while it is connected. The
identities libzmq assigns are a zero byte and a 32-bit counter from a random start; the
daemon never reveals them, and once the owner disconnects its job lives only until the
heartbeat timeout, so taking it over means guessing 32 bits within seconds, one new
connection per guess. (A client that sets its own routing id must make it unguessable.)
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Any

from powerd.modes import PowerMode
from powerd.planner import JobSpec, JobView

MAX_PENDING_BATCHES = 2000  # per job, while the control path is busy: older batches go


Owner = tuple[int, bytes]  # (socket index, ZeroMQ routing identity)


@dataclass
class JobRecord:
    id: str
    kind: str
    workload: str
    persistent: bool
    budget_w: float
    owner: Owner
    pid: int | None
    last_seen: float
    registered: float
    latency_ms: float | None = None
    rate_hz: float | None = None
    batch_sizes: tuple[int, ...] | None = None
    gate_token: str = ""  # authenticates Gate messages (they come on another socket)
    step_time_ms: float | None = None  # the step-time objective's target (None: budget)
    expected_steps: int | None = None  # training: the job's expected length (None: unknown)
    steps: int = 0
    pending: collections.deque[tuple[list[float], list[float], list[int]]] = field(
        default_factory=lambda: collections.deque(maxlen=MAX_PENDING_BATCHES)
    )

    def spec(self) -> JobSpec:
        return JobSpec(
            id=self.id,
            kind=self.kind,
            workload=self.workload,
            persistent=self.persistent,
            budget_w=self.budget_w,
            registered=self.registered,
            latency_ms=self.latency_ms,
            rate_hz=self.rate_hz,
            batch_sizes=self.batch_sizes,
            step_time_ms=self.step_time_ms,
            expected_steps=self.expected_steps,
            steps=self.steps,
        )


@dataclass
class ReplyTo:
    """Where a deferred reply goes (the control path answers predict/pareto/restore)."""

    sock: int
    identity: bytes
    msg_id: int


@dataclass
class Registry:
    default_budget_w: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    # published by the control path
    views: dict[str, JobView] = field(default_factory=dict)
    board_mode: PowerMode | None = None
    control: dict[str, Any] = field(default_factory=dict)
    # requests for the control path (restore, predict, pareto)
    requests: collections.deque[tuple[str, ReplyTo, Any]] = field(default_factory=collections.deque)
    wake: threading.Event = field(default_factory=threading.Event)
    # managed interleaving: set by the control path when a planner orders the GPU work;
    # the gate itself (powerd.gate.GpuGate) runs on the request path under `lock`
    gate_managed: bool = False
    # registers and set_budgets so far: a board powerd yielded to another tool is taken
    # again on the next one ([device] on_external_change = "yield")
    claims: int = 0

    _per_owner: collections.Counter = field(default_factory=collections.Counter)
    _effective: float | None = None  # cached lowest budget (None: recompute)

    # every change to the job set goes through these (with the lock held), so the
    # answers below stay O(1) with hundreds of jobs
    def add(self, job: JobRecord) -> None:
        self.jobs[job.id] = job
        self._per_owner[job.owner] += 1
        if self._effective is not None:
            self._effective = min(self._effective, job.budget_w)

    def remove(self, job_id: str) -> JobRecord | None:
        job = self.jobs.pop(job_id, None)
        if job is not None:
            self._per_owner[job.owner] -= 1
            if self._per_owner[job.owner] <= 0:
                del self._per_owner[job.owner]
            self._effective = None
        return job

    def set_budget(self, job: JobRecord, budget_w: float) -> None:
        job.budget_w = budget_w
        self._effective = None

    def effective_budget(self) -> float:
        """The board follows the lowest budget among the jobs (call with the lock held)."""
        if not self.jobs:
            return self.default_budget_w
        if self._effective is None:
            self._effective = min(j.budget_w for j in self.jobs.values())
        return self._effective

    def jobs_of(self, owner: Owner) -> int:
        return self._per_owner.get(owner, 0)


class RateLimiter:
    """A token bucket per connection: `rate` messages/s on average, bursts of `2 * rate`."""

    MAX_TRACKED = 10_000

    def __init__(self, rate_per_s: float):
        self.rate = rate_per_s
        self.burst = 2.0 * rate_per_s
        self._buckets: collections.OrderedDict[Owner, tuple[float, float]] = (
            collections.OrderedDict()
        )

    def allow(self, owner: Owner, now: float) -> bool:
        tokens, last = self._buckets.pop(owner, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        ok = tokens >= 1.0
        self._buckets[owner] = (tokens - 1.0 if ok else tokens, now)
        while len(self._buckets) > self.MAX_TRACKED:  # connections come and go: bound it
            self._buckets.popitem(last=False)
        return ok
