"""A tiny stand-in daemon (one ZeroMQ ROUTER) that serves fixed inference decisions.

For client and emulation tests of inference jobs: it speaks the real protocol (register,
steps, set_rate, close, and the managed-interleaving gate) but plans nothing. The gate is
a real one: one GPU slot, granted FIFO to whoever asks, "enter" answered only when the slot
is free, released by "leave" or when the holder's gate timeout passes.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from powerd import protocol as p


@dataclass
class FakeDecision:
    batch_size: int = 8
    feasible: bool | None = True
    best_latency_ms: float | None = None
    gate: str = "open"
    gate_timeout_ms: int = 2000
    phase: str = "tuned"
    message: str = ""


@dataclass
class _Holder:
    identity: bytes
    job: str
    since: float


@dataclass
class FakeDaemon:
    endpoint: str
    decision: FakeDecision = field(default_factory=FakeDecision)
    # rate -> decision served after set_rate(rate) (default: the same decision)
    on_rate: dict[float, FakeDecision] = field(default_factory=dict)
    registers: list[p.Register] = field(default_factory=list)
    gate_log: list[tuple[float, str, str, int | None]] = field(default_factory=list)
    steps: list[p.Steps] = field(default_factory=list)
    frozen: bool = False  # True: answer nothing (a daemon that hangs)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._jobs: dict[str, FakeDecision] = {}
        self._tokens: dict[str, str] = {}
        self._holder: _Holder | None = None
        self._queue: collections.deque[tuple[bytes, p.Gate]] = collections.deque()
        self._lock = threading.Lock()
        self._ready = threading.Event()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FakeDaemon:
        self._thread = threading.Thread(target=self._run, name="fake-powerd", daemon=True)
        self._thread.start()
        self._ready.wait(5)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeDaemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def hold_gate(self, job: str = "other") -> None:
        """Occupy the GPU slot as another job would (released by release_gate)."""
        with self._lock:
            self._holder = _Holder(b"", job, time.monotonic())

    def release_gate(self) -> None:
        with self._lock:
            self._holder = None

    # -- the loop ------------------------------------------------------------------------------
    def _run(self) -> None:
        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if sock.poll(5):
                    while sock.poll(0):
                        identity, raw = sock.recv_multipart()
                        if self.frozen:
                            continue
                        reply = self._handle(identity, raw)
                        if reply is not None:
                            sock.send_multipart([identity, p.encode(reply)])
                self._grant(sock)
        finally:
            sock.close()

    def _state(self, job: str, msg_id: int) -> p.JobState:
        d = self._jobs[job]
        return p.JobState(
            id=msg_id,
            job=job,
            phase=d.phase,  # type: ignore[arg-type]
            message=d.message,
            budget_w=15.0,
            batch_size=d.batch_size,
            feasible=d.feasible,
            best_latency_ms=d.best_latency_ms,
            gate=d.gate,  # type: ignore[arg-type]
            gate_token=self._tokens[job],
            gate_timeout_ms=d.gate_timeout_ms,
            heartbeat_ms=200,
        )

    def _handle(self, identity: bytes, raw: bytes) -> Any:
        obj = json.loads(raw)
        kind = obj.get("type")
        if kind == "gate":
            gate = p.Gate.model_validate(obj)
            if self._tokens.get(gate.job) != gate.token:
                return p.Error(id=gate.id, code="unknown_job", message="no such job")
            with self._lock:
                self.gate_log.append((time.monotonic(), gate.job, gate.op, gate.size))
                if gate.op == "enter":
                    self._queue.append((identity, gate))
                elif self._holder is not None and self._holder.job == gate.job:
                    self._holder = None
            return None
        req = p.decode_request(raw)
        if isinstance(req, p.Register):
            self.registers.append(req)
            job = f"job{len(self.registers)}"
            self._jobs[job] = self.decision
            self._tokens[job] = f"tok-{job}"
            return self._state(job, req.id)
        if isinstance(req, p.Steps):
            self.steps.append(req)
            return self._state(req.job, req.id) if req.job in self._jobs else None
        if isinstance(req, p.SetRate):
            self._jobs[req.job] = self.on_rate.get(req.rate_hz, self._jobs[req.job])
            return self._state(req.job, req.id)
        if isinstance(req, p.Close):
            self._jobs.pop(req.job, None)
            return p.Ok(id=req.id)
        return p.Error(id=req.id, code="bad_request", message=f"fake daemon: no {req.type}")

    def _grant(self, sock: zmq.Socket) -> None:
        with self._lock:
            h = self._holder
            if h is not None and h.identity:
                timeout = self._jobs.get(h.job, self.decision).gate_timeout_ms / 1000.0
                if time.monotonic() - h.since > timeout:
                    self._holder = None  # a holder that never left (died): take the slot back
            if self._holder is None and self._queue:
                identity, gate = self._queue.popleft()
                self._holder = _Holder(identity, gate.job, time.monotonic())
                sock.send_multipart([identity, p.encode(p.GateOpen(id=gate.id, job=gate.job))])
