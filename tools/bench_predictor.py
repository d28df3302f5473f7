#!/usr/bin/env python3
"""Predictor speed: what the daemon pays to predict every mode, and to fit then predict.

    .venv/bin/python tools/bench_predictor.py            # ridge, and torch-finetune if torch
    .venv/bin/python tools/bench_predictor.py --repeat 50 --samples 30

Mode space: a full Orin AGX 32GB grid (JETSON.md: 12 core counts x 29 CPU x 13 GPU x 4 EMC =
18,096 modes), the CPU table being the board's 76.8 MHz ladder from 115.2 MHz to 2.2016 GHz
and the GPU/EMC tables those of the traced board. Samples for the fits: `--samples` modes of
the MobileNet v3 Orin AGX trace (a workload the reference was not trained on), spread over
the grid as the profiler's coverage seeds are. Each fit is given the mode space as its
domain, as the daemon gives its board's (the power heads are checked over it); the
reference keeps that space's embedding between fits (`ReferenceModel.embed_domain`), so the
first fit pays for embedding it and the later ones do not: both are printed. Prints the
median and worst wall time over `--repeat` runs, single-threaded onnxruntime as in the
daemon, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from powerd.device.modespace import ModeSpace  # noqa: E402
from powerd.modes import PowerMode  # noqa: E402
from powerd.optimize.base import Measurement  # noqa: E402
from powerd.predictor import ReferenceModel, fit_workload  # noqa: E402
from powerd.predictor.sampling import farthest_point, rank_coords  # noqa: E402
from powerd.sim.trace import TRACE_DIR, Trace  # noqa: E402

AGX_CPU_KHZ = [115200 + 76800 * i for i in range(28)] + [2201600]


def agx_space(trace: Trace) -> np.ndarray:
    gpu, emc = trace.axis("gpu_hz"), trace.axis("emc_hz")
    return ModeSpace(range(1, 13), AGX_CPU_KHZ, gpu, emc).as_array()


def timed(fn, repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs), max(runs)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeat", type=int, default=20, help="runs per figure (default 20)")
    ap.add_argument("--samples", type=int, default=50, help="profiled modes per fit")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch-finetune fit")
    args = ap.parse_args()

    trace = Trace.load(TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv")
    space = agx_space(trace)
    t0 = time.perf_counter()
    ref = ReferenceModel.load()
    print(f"reference load:            {1000 * (time.perf_counter() - t0):7.1f} ms")
    print(f"mode space:                {len(space)} modes (Orin AGX, full grid)")
    med, worst = timed(lambda: ref.predict(space), args.repeat)
    print(f"predict every mode:        median {1000 * med:6.1f} ms, worst {1000 * worst:6.1f} ms")
    med, worst = timed(lambda: ref.embed(space), max(1, args.repeat // 4))
    print(f"embed every mode:          median {1000 * med:6.1f} ms, worst {1000 * worst:6.1f} ms")

    traced = np.array([r.mode.as_tuple() for r in trace.rows], dtype=np.int64)
    picks = farthest_point(rank_coords(traced), args.samples)
    samples = {}
    for i in picks:
        row = trace.lookup(PowerMode(*map(int, traced[i])))
        samples[row.mode] = Measurement(row.mode, row.time_ms, row.power_w, steps=10)

    methods = ["ridge"] if args.no_torch else ["ridge", "torch-finetune"]
    for method in methods:
        repeat = args.repeat if method == "ridge" else max(1, min(3, args.repeat))
        ran: list[str] = []

        def fit_and_predict(method: str = method, ran: list[str] = ran) -> None:
            fp = fit_workload(samples, ref, method=method, domain=space)
            fp.predict(space)
            ran.append(fp.method)

        if method == "ridge":
            first, _ = timed(fit_and_predict, 1)  # embeds the mode space, kept from then on
            print(f"fit ridge + predict, first: {1000 * first:6.0f} ms (embeds the mode space)")
        med, worst = timed(fit_and_predict, repeat)
        note = "" if set(ran) == {method} else f" (ran {', '.join(sorted(set(ran)))})"
        print(
            f"fit {method + ' + predict:':21s} median {1000 * med:6.0f} ms, "
            f"worst {1000 * worst:6.0f} ms over {repeat} run(s){note}"
        )
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS (this process):   {rss_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
