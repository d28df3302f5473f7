#!/usr/bin/env python3
"""Cost of entering and leaving `inf.batch()` when nothing waits, against the stand-in daemon
(powerd.sim.fake_daemon, ipc socket): the open gate (no other job) and the managed gate with a
free GPU slot (one round trip). Target: < 0.2 ms per batch when nothing waits.

    tools/bench_gate.py [--n 2000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings

import numpy as np

import powerd
from powerd.sim.fake_daemon import FakeDaemon, FakeDecision


def run(gate: str, n: int) -> np.ndarray:
    with tempfile.TemporaryDirectory() as d:
        ep = f"ipc://{d}/powerd.sock"
        with FakeDaemon(ep, FakeDecision(batch_size=1, gate=gate)):
            with powerd.request(kind="inference", rate_hz=30, endpoint=ep) as inf:
                out = np.empty(n)
                for i in range(n):
                    t0 = time.perf_counter()
                    with inf.batch(size=1):
                        t1 = time.perf_counter()
                    out[i] = (t1 - t0) + (time.perf_counter() - t1)
                return out * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    for gate in ("open", "managed"):
        ms = run(gate, args.n)[100:]  # drop warm-up
        print(
            f"gate={gate:8s} enter+leave per batch: median {np.median(ms):.3f} ms, "
            f"p99 {np.percentile(ms, 99):.3f} ms (n={len(ms)})"
        )


if __name__ == "__main__":
    main()
