#!/usr/bin/env python3
"""Offline evaluation of transfer to new workloads/boards on the validation traces.

    python tools/eval_transfer.py                      # default table
    python tools/eval_transfer.py --variants ridge,ridge-logP,torch-last --seeds 10

For every (trace, profiling policy, k, fit variant, seed): choose k modes to "profile"
(their true time/power come from the trace), fit, predict every mode of the trace, then
report
  * MAPE of time and power over every mode of the trace;
  * decisions of a pure-prediction Pareto lookup over the trace's budgets: median time
    penalty of the chosen mode vs the trace's best mode within budget, and % of budgets
    whose chosen mode's true power exceeds the budget by > 0.5 W;
  * the same with a closed-loop guard (what the daemon does): measure the pick; while its
    true power is over the budget, step to the next lower-power member of the predicted
    front. "steps" is the mean number of extra measurements that took.
Numbers are means over seeds. No daemon involved; torch only for the torch-* variants.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from powerd.optimize.pareto import fastest_under, next_lower_on_front, pareto_front  # noqa: E402
from powerd.predictor.reference import ReferenceModel  # noqa: E402
from powerd.predictor.sampling import select_modes  # noqa: E402
from powerd.predictor.transfer import (  # noqa: E402
    FitStats,
    FittedPredictor,
    RidgeOptions,
    Samples,
    fit_ridge,
)
from powerd.sim.trace import Trace  # noqa: E402

TRACE_DIR = REPO / "powerd" / "sim" / "traces"
# (file, budgets): the budget ranges of the task brief, 1 W steps.
TRACES = {
    "agx-mobilenet": ("orin_agx_mobilenetv3_gld23k_train.csv", np.arange(17, 51, 1.0)),
    "nano-resnet18": ("orin_nano_resnet18_imagenet_train.csv", np.arange(8, 21, 1.0)),
}
OVER_W = 0.5

RIDGE_VARIANTS = {
    "ridge": RidgeOptions(),
    "ridge-gcv": RidgeOptions(select="gcv"),
    "ridge-logP": RidgeOptions(power_log=True),
    "ridge-noref": RidgeOptions(time_ref=False, power_ref=False),
    "ridge-affine": RidgeOptions(select="fixed", lam=float("inf")),
    "ridge-lam1": RidgeOptions(select="fixed", lam=1.0),
}
TORCH_VARIANTS = {
    "torch-last": {"layers": 1},
    "torch-last2": {"layers": 2},
    "torch-all": {"layers": 4},
}


@dataclass
class Result:
    time_mape: float
    power_mape: float
    penalty: float  # median over budgets, %
    over: float  # % of budgets over by > 0.5 W
    g_penalty: float
    g_over: float
    g_steps: float
    fit_s: float


def decide(pt, pp, tt, tp, budgets, profiled=()) -> tuple[float, float, float, float, float]:
    """(median penalty %, % over budget) of the pure-prediction lookup, then the same with
    the closed-loop guard, and the guard's mean extra measurements per budget.

    Guard: measure the predicted pick; while its true power is over the budget, measure the
    next lower-power member of the predicted front; then commit to the fastest *measured*
    mode within budget (profiled modes included), as powerd.optimize.base.best_within does.
    """
    front = pareto_front(pt, pp)
    prof = np.asarray(profiled, dtype=np.int64)
    pen, over, gpen, gover, steps = [], [], [], [], []
    for b in budgets:
        ok = tp <= b
        if not ok.any():
            continue
        best = tt[ok].min()
        i = fastest_under(pt, pp, b)
        if i is None:
            i = int(front[0])  # nothing predicted to fit: the lowest predicted power
        pen.append(tt[i] / best - 1)
        over.append(tp[i] > b + OVER_W)
        g, n = i, 1
        seen = [g]
        while tp[g] > b:
            nxt = next_lower_on_front(pt, pp, g, front)
            if nxt is None:
                break
            g, n = nxt, n + 1
            seen.append(g)
        meas = np.concatenate([prof, np.asarray(seen, dtype=np.int64)])
        fit = meas[tp[meas] <= b]
        if fit.size:
            g = int(fit[np.argmin(tt[fit])])
        gpen.append(tt[g] / best - 1)
        gover.append(tp[g] > b + OVER_W)
        steps.append(n)
    return (
        float(np.median(pen) * 100),
        float(np.mean(over) * 100),
        float(np.median(gpen) * 100),
        float(np.mean(gover) * 100),
        float(np.mean(steps)),
    )


def fit_variant(variant: str, s: Samples, ref: ReferenceModel) -> FittedPredictor | None:
    if variant == "ref":
        return None
    if variant in RIDGE_VARIANTS:
        return fit_ridge(s, ref, RIDGE_VARIANTS[variant])
    if variant in TORCH_VARIANTS:
        # In-process (the daemon runs the same code in a subprocess): the tool may import
        # torch, and spawning an interpreter per fit would dominate the run time.
        from powerd.predictor.finetune_worker import finetune

        t0 = time.perf_counter()
        model, wstats = finetune(ref.model_dir, s.modes, s.time_ms, s.power_w,
                                 TORCH_VARIANTS[variant])
        stats = FitStats(seconds=time.perf_counter() - t0, extra=wstats)
        return FittedPredictor(model.SerializeToString(), "torch-finetune", stats, s)
    raise SystemExit(f"unknown variant {variant!r}")


def evaluate(trace: Trace, budgets, ref: ReferenceModel, policy: str, k: int, variant: str,
             seed: int, ref_pred) -> Result:
    modes = trace.modes_array
    idx = select_modes(policy, modes, k, predicted=ref_pred, seed=seed)
    s = Samples(modes[idx], trace.time_ms[idx], trace.power_w[idx])
    t0 = time.perf_counter()
    fp = fit_variant(variant, s, ref)
    pt, pp = ref_pred if fp is None else fp.predict(modes)
    fit_s = time.perf_counter() - t0
    tt, tp = trace.time_ms, trace.power_w
    tm = float(np.mean(np.abs(pt - tt) / tt) * 100)
    pm = float(np.mean(np.abs(pp - tp) / tp) * 100)
    return Result(tm, pm, *decide(pt, pp, tt, tp, budgets, idx), fit_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--policies", default="random,grid,front")
    ap.add_argument("--k", default="10,20,30,50")
    ap.add_argument("--variants", default="ref,ridge,ridge-gcv,ridge-logP,ridge-noref,ridge-affine")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--json", type=Path, help="also write every result here")
    args = ap.parse_args()

    ref = ReferenceModel.load(args.model_dir)
    ks = [int(k) for k in args.k.split(",")]
    variants = args.variants.split(",")
    rows = []
    print(f"reference {ref.model_id} from {ref.model_dir}; means over {args.seeds} seeds")
    hdr = (f"{'trace':14} {'policy':6} {'k':>3} {'variant':13} {'tMAPE':>6} {'pMAPE':>6} "
           f"{'pen%':>6} {'over%':>6} | {'gPen%':>6} {'gOver%':>6} {'steps':>5} {'fit s':>6}")
    print(hdr)
    print("-" * len(hdr))
    for tname in args.traces.split(","):
        fname, budgets = TRACES[tname]
        trace = Trace.load(TRACE_DIR / fname)
        ref_pred = ref.predict(trace.modes_array)
        for policy in args.policies.split(","):
            for k in ks:
                for variant in variants:
                    seeds = [0] if variant == "ref" else range(args.seeds)
                    rs = [evaluate(trace, budgets, ref, policy, k, variant, sd, ref_pred)
                          for sd in seeds]
                    mean = Result(*np.mean([list(vars(r).values()) for r in rs], axis=0))
                    rows.append({"trace": tname, "policy": policy, "k": k, "variant": variant,
                                 **vars(mean)})
                    print(f"{tname:14} {policy:6} {k:3d} {variant:13} {mean.time_mape:6.1f} "
                          f"{mean.power_mape:6.1f} {mean.penalty:6.1f} {mean.over:6.1f} | "
                          f"{mean.g_penalty:6.1f} {mean.g_over:6.1f} {mean.g_steps:5.1f} "
                          f"{mean.fit_s:6.3f}", flush=True)
                if variants == ["ref"]:
                    break
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
