#!/usr/bin/env python3
"""Cost of the GPU gate when nothing waits.

    PYTHONPATH=. .venv/bin/python tools/bench_gate.py [--n 3000] [--no-daemon]

1. `job.step()` of a training job on the real daemon (emulated Orin AGX), one step every
   2.5 ms (a busy loop stands for the step's work): alone (the gate is open: two deque
   appends), then with an inference job registered and idle (the gate is managed; nothing
   waits, so the daemon's flag lets each step through without asking: a memory read), and
   the round trip a step pays when a batch did wait (the slow path), over the gate socket
   and over the ZeroMQ endpoint (the fallback for non-ipc endpoints).
2. Entering and leaving `inf.batch()` against the stand-in daemon (powerd.sim.fake_daemon):
   the open gate and the managed gate with a free slot.

Target (issue #7): < 0.2 ms median per step() / batch when nothing waits.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import powerd  # noqa: E402
from powerd.client import _GateChannel  # noqa: E402
from powerd.sim.fake_daemon import FakeDaemon, FakeDecision  # noqa: E402


def fake_batches(gate: str, n: int) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        ep = f"ipc://{d}/powerd.sock"
        with FakeDaemon(ep, FakeDecision(batch_size=1, gate=gate)):
            with powerd.request(kind="inference", rate_hz=30, endpoint=ep) as inf:
                out = np.empty(n)
                for i in range(n):
                    t0 = time.perf_counter()
                    with inf.batch(size=1):
                        pass
                    out[i] = time.perf_counter() - t0
                return out * 1e3


STEP_EVERY_S = 0.0025  # a training step every 2.5 ms: under [server] max_messages_per_s


def _steps(job, n: int, every_s: float = STEP_EVERY_S) -> np.ndarray:
    out = np.empty(n)
    nxt = time.perf_counter()
    for i in range(n):
        nxt += every_s
        while time.perf_counter() < nxt:  # the step's own work (spin: no sleep jitter)
            pass
        t0 = time.perf_counter()
        job.step()
        out[i] = time.perf_counter() - t0
    return out * 1e3


def daemon_steps(n: int) -> dict[str, np.ndarray]:
    from powerd.sim.harness import EmulatedBoard
    from powerd.sim.trace import TRACE_DIR, Trace

    trace = Trace.load(TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv", batch_size=1)
    out = {}
    with EmulatedBoard("orin-agx", trace, time_scale=1.0) as eb:
        with powerd.request(budget_w=30, workload="bench-gate", endpoint=eb.endpoint) as job:
            _steps(job, 200)  # warm-up
            out["alone (gate open)"] = _steps(job, n)
            with powerd.request(
                kind="inference",
                budget_w=30,
                rate_hz=1,
                latency_ms=5000,
                workload="bench-gate-inf",
                endpoint=eb.endpoint,
            ):
                deadline = time.monotonic() + 20
                while job._state.gate != "managed":
                    if time.monotonic() > deadline:
                        raise RuntimeError("the gate never became managed")
                    job.step()
                    time.sleep(0.01)
                _steps(job, 200)  # warm-up
                sent = job._turns.sent
                out["inference job registered, idle (gate managed)"] = _steps(job, n)
                print(f"  steps that asked the daemon: {job._turns.sent - sent} of {n}")
                via = "unix gate socket" if job._turns._unix is not None else "ZeroMQ"
                out[f"  the slow path's round trip ({via})"] = _enters(job._turns, job._state, n)
                # the same round trip over the ZeroMQ endpoint (the fallback), for comparison
                zmq_gate = _GateChannel(eb.endpoint)
                zmq_gate._unix = None
                zmq_gate._socket = lambda: _zmq_socket(zmq_gate)  # type: ignore[method-assign]
                out["  gate enter over ZeroMQ instead (the fallback)"] = _enters(
                    zmq_gate, job._state, n
                )
                zmq_gate.close()
    return out


def _zmq_socket(ch):
    import zmq

    if ch._sock is None:
        ch._sock = zmq.Context.instance().socket(zmq.DEALER)
        ch._sock.setsockopt(zmq.LINGER, 0)
        ch._sock.connect(ch.endpoint)
    return ch._sock


def _enters(ch, state, n: int) -> np.ndarray:
    out = np.empty(n)
    nxt = time.perf_counter()
    for i in range(n):
        nxt += STEP_EVERY_S
        while time.perf_counter() < nxt:
            pass
        t0 = time.perf_counter()
        ch.enter(state, 1)
        out[i] = time.perf_counter() - t0
    return out * 1e3


def show(what: str, ms: np.ndarray) -> None:
    print(
        f"{what:50s} median {np.median(ms):.4f} ms, p99 {np.percentile(ms, 99):.4f} ms "
        f"(n={len(ms)})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--no-daemon", action="store_true", help="only the stand-in daemon part")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    if not args.no_daemon:
        print("job.step() on the real daemon:")
        for what, ms in daemon_steps(args.n).items():
            show(f"  {what}", ms)
    print("inf.batch() enter+leave on the stand-in daemon:")
    for gate in ("open", "managed"):
        show(f"  gate={gate}", fake_batches(gate, args.n)[100:])


if __name__ == "__main__":
    main()
