#!/usr/bin/env python3
"""Offline evaluation of transfer to new workloads/boards on the validation traces.

    python tools/eval_transfer.py                      # ridge vs the default (torch-all)
    python tools/eval_transfer.py --variants ridge,ridge-notrim,ridge-logP,ridge-noref,\
        ridge-affine,ridge-gcv,torch-last,torch-last2,torch-all --seeds 8 --loop

For every (trace, profiling policy, k, fit variant, seed): choose k modes to "profile"
(policies of powerd.predictor.sampling: random; grid = maximin coverage; front = half on
the reference's predicted Pareto front, half coverage), take their true time/power from
the trace, fit, predict every mode of the trace, and report (means over seeds):
  tMAPE, pMAPE  MAPE of time and power over every mode of the trace;
  pen%, over%   a pure-prediction Pareto lookup per budget (Orin AGX MobileNet 17..50 W,
                Orin Nano ResNet-18 8..20 W, 1 W steps): median time penalty of the
                chosen mode vs the trace's best mode within the budget, and % of budgets
                whose chosen mode's true power exceeds the budget by > 0.5 W;
  gPen%, gOvr%, gMeas  with the daemon's closed-loop guard: measure the pick, step down
                the predicted front while the measured power is over, then commit to the
                fastest measured mode within budget (profiled modes included); gMeas =
                measurements per budget after profiling;
  lPen%, lOvr%, lMeas  (--loop, ridge variants) the refit loop: measure the refit
                model's pick, refit, repeat (at most 4), commit the fastest measured fit.
Variants: ref (no refit), ridge* (RidgeOptions variants), torch-* (the worker's
fine-tuning, in-process here, after the ridge's outlier screen as fit_workload does it).
No daemon involved; torch only for the torch-* variants.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from powerd.optimize.pareto import fastest_under, next_lower_on_front, pareto_front  # noqa: E402
from powerd.predictor.reference import Embedding, ReferenceModel  # noqa: E402
from powerd.predictor.sampling import select_modes  # noqa: E402
from powerd.predictor.transfer import (  # noqa: E402
    FitStats,
    FittedPredictor,
    RidgeOptions,
    Samples,
    fit_heads,
    fit_ridge,
    fit_workload,
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
    "ridge-notrim": RidgeOptions(outlier_z=0),
    "ridge-gcv": RidgeOptions(select="gcv"),
    "ridge-logP": RidgeOptions(power_log=True),
    "ridge-noref": RidgeOptions(time_ref=False, power_ref=False),
    "ridge-affine": RidgeOptions(select="fixed", lam=float("inf")),
    "ridge-refhead": RidgeOptions(time_model="reference"),  # the head before the physical one
    "ridge-lam1": RidgeOptions(select="fixed", lam=1.0),
}
TORCH_VARIANTS = {
    "torch-last": {"layers": 1},  # the published method: retrain the last dense layer
    "torch-last2": {"layers": 2},
    "torch-all": {"layers": "all"},  # the worker's default
    "torch-all-250": {"layers": "all", "steps": 250},
    "torch-all-1000": {"layers": "all", "steps": 1000},
}


@dataclass
class Result:
    time_mape: float
    power_mape: float
    penalty: float  # pure prediction: median over budgets, %
    over: float  # pure prediction: % of budgets over by > 0.5 W
    g_penalty: float  # walk-down guard
    g_over: float
    g_meas: float  # mean measurements per budget after profiling
    l_penalty: float  # refit loop
    l_over: float
    l_meas: float


def _best_measured(meas: np.ndarray, tt, tp, b: float, fallback: int) -> int:
    fit = meas[tp[meas] <= b]
    return int(fit[np.argmin(tt[fit])]) if fit.size else fallback


def decide(pt, pp, tt, tp, budgets, profiled=()) -> tuple[float, float, float, float, float]:
    """(median penalty %, % over budget) of the pure-prediction lookup, then the same with
    the closed-loop guard, and the guard's mean measurements per budget.

    Guard: measure the predicted pick; while its true power is over the budget, measure the
    next lower-power member of the predicted front; then commit to the fastest *measured*
    mode within budget (profiled modes included), as powerd.optimize.base.best_within does.
    """
    front = pareto_front(pt, pp)
    prof = np.asarray(profiled, dtype=np.int64)
    pen, over, gpen, gover, meas_n = [], [], [], [], []
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
        seen = [i]
        while tp[seen[-1]] > b:
            nxt = next_lower_on_front(pt, pp, seen[-1], front)
            if nxt is None:
                break
            seen.append(nxt)
        g = _best_measured(np.concatenate([prof, seen]).astype(np.int64), tt, tp, b, seen[-1])
        gpen.append(tt[g] / best - 1)
        gover.append(tp[g] > b + OVER_W)
        meas_n.append(len(set(seen) - set(prof.tolist())))
    return (
        float(np.median(pen) * 100),
        float(np.mean(over) * 100),
        float(np.median(gpen) * 100),
        float(np.mean(gover) * 100),
        float(np.mean(meas_n)),
    )


def _rows(e: Embedding, idx: np.ndarray) -> Embedding:
    return Embedding(e.time_y[idx], e.time_h[idx], e.power_y[idx], e.power_h[idx])


def loop_decide(
    e: Embedding,
    meta: dict,
    opts: RidgeOptions,
    tt,
    tp,
    budgets,
    profiled,
    modes,
    max_measure: int = 4,
) -> tuple[float, float, float]:
    """The refit loop (DESIGN: measure the refit model's pick for the budget, refit): from
    the profiled samples, up to `max_measure` times: fit, pick the fastest predicted mode
    under the budget among modes not measured over it; stop if the pick is already measured,
    else measure it. Commit to the fastest measured mode within budget.
    Returns (median penalty %, % over budget, mean measurements per budget)."""
    pen, over, meas_n = [], [], []
    for b in budgets:
        ok = tp <= b
        if not ok.any():
            continue
        best = tt[ok].min()
        sel = [int(i) for i in profiled]
        for _ in range(max_measure):
            ix = np.asarray(sel, dtype=np.int64)
            th, ph, *_ = fit_heads(_rows(e, ix), Samples(modes[ix], tt[ix], tp[ix]), meta, opts)
            pt, pp = th.apply(e.time_y, e.time_h, modes), ph.apply(e.power_y, e.power_h)
            excl = ix[tp[ix] > b]
            i = fastest_under(pt, pp, b, exclude=excl)
            if i is None:
                cand = np.setdiff1d(np.arange(len(tt)), excl)
                i = int(cand[np.argmin(pp[cand])])
            if i in sel:
                break
            sel.append(i)
        ix = np.asarray(sel, dtype=np.int64)
        g = _best_measured(ix, tt, tp, b, int(ix[np.argmin(tp[ix])]))
        pen.append(tt[g] / best - 1)
        over.append(tp[g] > b + OVER_W)
        meas_n.append(len(sel) - len(profiled))
    return float(np.median(pen) * 100), float(np.mean(over) * 100), float(np.mean(meas_n))


def fit_predict(
    variant: str,
    s: Samples,
    ref: ReferenceModel,
    e_all: Embedding,
    idx: np.ndarray,
    modes: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    if variant == "ref":
        return np.exp(e_all.time_y), e_all.power_y
    if variant in RIDGE_VARIANTS:
        # Same heads as fit_ridge() exports to ONNX (tests check they agree), applied to the
        # embedding of every mode computed once per trace.
        th, ph, *_ = fit_heads(_rows(e_all, idx), s, ref.meta, RIDGE_VARIANTS[variant])
        pt = th.apply(e_all.time_y, e_all.time_h, modes)
        return pt, ph.apply(e_all.power_y, e_all.power_h)
    if variant in TORCH_VARIANTS:
        # As fit_workload() does it: the ridge's outlier screen, then the torch fine-tuning
        # on the rest. In-process (the daemon runs the same code in a subprocess): the tool
        # may import torch, and spawning an interpreter per fit would dominate the run time.
        from powerd.predictor.finetune_worker import finetune

        _, _, st, *_ = fit_heads(_rows(e_all, idx), s, ref.meta, RidgeOptions())
        t, p = s.time_ms.copy(), s.power_w.copy()
        t[st.time_outliers] = np.nan
        p[st.power_outliers] = np.nan
        model, _ = finetune(ref.model_dir, s.modes, t, p, TORCH_VARIANTS[variant])
        fp = FittedPredictor(model.SerializeToString(), "torch-finetune", FitStats(), s)
        return fp.predict(modes)
    raise SystemExit(
        f"unknown variant {variant!r}; known: ref, {', '.join(RIDGE_VARIANTS)}, "
        f"{', '.join(TORCH_VARIANTS)}"
    )


def evaluate(
    trace: Trace,
    budgets,
    ref: ReferenceModel,
    e_all: Embedding,
    policy: str,
    k: int,
    variant: str,
    seed: int,
    loop: bool,
) -> Result:
    modes = trace.modes_array
    ref_pred = (np.exp(e_all.time_y), e_all.power_y)
    idx = select_modes(policy, modes, k, predicted=ref_pred, seed=seed)
    tt, tp = trace.time_ms, trace.power_w
    s = Samples(modes[idx], tt[idx], tp[idx])
    pt, pp = fit_predict(variant, s, ref, e_all, idx, modes)
    tm = float(np.mean(np.abs(pt - tt) / tt) * 100)
    pm = float(np.mean(np.abs(pp - tp) / tp) * 100)
    lp = (np.nan, np.nan, np.nan)
    if loop and variant in RIDGE_VARIANTS:
        lp = loop_decide(e_all, ref.meta, RIDGE_VARIANTS[variant], tt, tp, budgets, idx, modes)
    return Result(tm, pm, *decide(pt, pp, tt, tp, budgets, idx), *lp)


def timings(ref: ReferenceModel, torch_too: bool) -> str:
    """Wall times the daemon cares about: a fit from 50 samples (the ridge; the torch
    worker as the daemon runs it, in a subprocess) and predicting ~18k modes."""
    trace = Trace.load(TRACE_DIR / TRACES["agx-mobilenet"][0])
    modes = trace.modes_array
    idx = select_modes("grid", modes, 50, seed=0)
    s = Samples(modes[idx], trace.time_ms[idx], trace.power_w[idx])
    fit_ridge(s, ref)  # warm-up
    t0 = time.perf_counter()
    fp = fit_ridge(s, ref)
    t_fit = time.perf_counter() - t0
    big = (
        np.array(
            np.meshgrid(
                np.arange(1, 13),
                np.linspace(115200, 2201600, 15).astype(np.int64),
                np.linspace(114750000, 1300500000, 25).astype(np.int64),
                [204000000, 665600000, 2133000000, 3199000000],
            ),
        )
        .reshape(4, -1)
        .T
    )
    fp.predict(big)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        fp.predict(big)
        best = min(best, time.perf_counter() - t0)
    out = (
        f"ridge fit (k=50, incl. ONNX export): {t_fit * 1000:.0f} ms; "
        f"predict {len(big)} modes: {best * 1000:.0f} ms (best of 5, 1 thread)"
    )
    if torch_too:
        t0 = time.perf_counter()
        ft = fit_workload(s, ref, method="torch-finetune")
        ft.predict(big)
        out += (
            f"; {ft.method} fit + predict {len(big)} (worker subprocess): "
            f"{time.perf_counter() - t0:.1f} s"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--traces", default=",".join(TRACES))
    ap.add_argument("--policies", default="random,grid,front")
    ap.add_argument("--k", default="10,20,30,50")
    ap.add_argument("--variants", default="ridge,torch-all")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--loop", action="store_true", help="also simulate the refit loop (ridge variants; slow)"
    )
    ap.add_argument("--json", type=Path, help="also write every result here")
    args = ap.parse_args()

    ref = ReferenceModel.load(args.model_dir)
    ks = [int(k) for k in args.k.split(",")]
    variants = [v for v in args.variants.split(",") if v != "ref"]
    rows = []
    print(f"reference {ref.model_id} from {ref.model_dir}; means over {args.seeds} seeds")
    print(timings(ref, any(v in TORCH_VARIANTS for v in variants)))
    hdr = (
        f"{'trace':14} {'policy':6} {'k':>3} {'variant':12} {'tMAPE':>5} {'pMAPE':>5} "
        f"{'pen%':>5} {'over%':>5} | {'gPen%':>5} {'gOvr%':>5} {'gMeas':>5} | "
        f"{'lPen%':>5} {'lOvr%':>5} {'lMeas':>5}"
    )
    print(hdr)
    print("-" * len(hdr))

    def show(tname: str, policy: str, k: int, variant: str, r: Result) -> None:
        rows.append({"trace": tname, "policy": policy, "k": k, "variant": variant, **vars(r)})
        print(
            f"{tname:14} {policy:6} {k:3d} {variant:12} {r.time_mape:5.1f} {r.power_mape:5.1f} "
            f"{r.penalty:5.1f} {r.over:5.1f} | {r.g_penalty:5.1f} {r.g_over:5.1f} "
            f"{r.g_meas:5.1f} | {r.l_penalty:5.1f} {r.l_over:5.1f} {r.l_meas:5.1f}",
            flush=True,
        )

    for tname in args.traces.split(","):
        fname, budgets = TRACES[tname]
        trace = Trace.load(TRACE_DIR / fname)
        e_all = ref.embed(trace.modes_array)
        show(
            tname, "-", 0, "ref", evaluate(trace, budgets, ref, e_all, "random", 0, "ref", 0, False)
        )
        for policy in args.policies.split(","):
            for k in ks:
                for variant in variants:
                    rs = [
                        evaluate(trace, budgets, ref, e_all, policy, k, variant, sd, args.loop)
                        for sd in range(args.seeds)
                    ]
                    show(
                        tname,
                        policy,
                        k,
                        variant,
                        Result(*np.mean([list(vars(r).values()) for r in rs], axis=0)),
                    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
