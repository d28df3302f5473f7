"""The emulated GPU: one engine that runs one piece of work at a time, first come first served
across processes (Jetson GPUs have no hardware partitioning: two processes' kernels queue),
and tells the emulator what runs so that board power follows it.

Work is described by two functions of the power mode the board runs when the work starts:
its duration (trace ms) and its board power. Between pieces of work the board draws the
idle power of the mode (see :func:`idle_power`).

Idle model (documented choice; the traces only hold busy power): with clocks pinned and
nothing running, the board draws IDLE_SHARE of the power it draws running the smallest
inference batch in the same mode. Batch-1 inference barely loads the GPU, so this keeps idle
below every busy level of the mode while tracking its clocks (static power and pinned-clock
leakage scale with the mode, not with the load).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from powerd.modes import PowerMode
from powerd.sim.emulator import Emulator
from powerd.sim.trace import Trace

IDLE_SHARE = 0.8

PowerOf = Callable[[PowerMode], float]


def idle_power(smallest_batch: Trace, share: float = IDLE_SHARE) -> PowerOf:
    """Idle board power per mode: `share` x the mode's smallest-batch inference power."""
    return lambda mode: share * smallest_batch.lookup(mode).power_w


def trace_power(trace: Trace) -> PowerOf:
    return lambda mode: trace.lookup(mode).power_w


def trace_time_ms(trace: Trace) -> Callable[[PowerMode], float]:
    return lambda mode: trace.lookup(mode).time_ms


@dataclass
class Slice:
    """One piece of work the GPU ran (times: time.monotonic())."""

    kind: str
    queued: float
    start: float
    end: float
    mode: PowerMode


@dataclass
class Gpu:
    """FIFO single engine over an emulator. `time_scale` turns trace ms into wall seconds
    (the emulator's scale, so a whole run is faster than the real board)."""

    emulator: Emulator
    idle: PowerOf
    time_scale: float = 1.0
    log: list[Slice] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._cv = threading.Condition()
        self._next = 0  # next ticket to hand out
        self._serving = 0  # ticket whose turn it is
        self.emulator.set_load(self.idle)

    def run(
        self,
        kind: str,
        duration_ms: Callable[[PowerMode], float],
        power: PowerOf,
        jitter: float = 1.0,
    ) -> Slice:
        """Queue a piece of work, wait for its turn, run it (board power = `power(mode)`
        for `duration_ms(mode) * jitter` trace ms), and return when it is done."""
        queued = time.monotonic()
        with self._cv:
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                self._cv.wait()
        try:
            mode = self.emulator.effective_mode()
            self.emulator.set_load(power)
            start = time.monotonic()
            end = start + duration_ms(mode) * jitter / 1000.0 * self.time_scale
            # Sleep to a deadline: the emulated kernel takes exactly its traced time.
            while (left := end - time.monotonic()) > 0:
                time.sleep(left)
            self.emulator.set_load(self.idle)
            done = Slice(kind, queued, start, time.monotonic(), mode)
        finally:
            with self._cv:
                self._serving += 1
                self._cv.notify_all()
        self.log.append(done)
        return done

    def busy_s(self, kind: str | None = None, since: float = 0.0) -> float:
        return sum(s.end - s.start for s in self.log if s.start >= since and kind in (None, s.kind))
