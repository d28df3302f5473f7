#!/usr/bin/env python3
"""Prediction accuracy and interval calibration of the transfer, daemon-free.

    .venv/bin/python tools/bench_prediction.py                      # in-sample traces
    .venv/bin/python tools/bench_prediction.py --held-out           # + the held-out trace
    .venv/bin/python tools/bench_prediction.py --time-model auto,physical,reference --designs grid

For every visible trace but the reference corpus, choose the modes to profile, take their
true time and power from the trace (with the replay's measurement noise for the strategy's
own sets), fit the ridge transfer (powerd.predictor.transfer.fit_ridge, what the daemon runs)
and predict every mode of the trace (`powerctl predict` answers the same). Designs:
  strategy  the modes `powertrain` profiles for a new workload: one fresh replay per budget
            of the trace's own power range (powerd_replay.training: 2 % time / 0.2 W power
            noise, windows aborted 1 W over budget), fitted on what it measured; the
            daemon's `--fresh` case. Low budgets see only low-power modes.
  mixed     one workload whose budget changes: a powertrain replay of the own-range budgets
            in a shuffled order (powerd_replay.training.mixed_order, the noise seed's), each
            budget measuring up to REFINE_ROOM more modes after its commit, as a job that
            keeps training does; fitted on what it had measured after each budget (the
            daemon's case without `--fresh`: many samples, most near the picks).
  grid      k modes by maximin coverage of the grid (powerd.predictor.sampling).
  front     k modes, half on the reference's predicted Pareto front, half coverage.
  low       k modes by maximin coverage of the modes in the lowest third of the trace's
            power range (a low budget's view), predictions over every mode.
  under     per budget of the trace's own power range, k modes by maximin coverage of the
            modes whose true power is within it: the most a first budget's profile could
            teach the model without measuring a mode over the budget (k = 50, the room of
            a first budget, is more than `powertrain` spends). Predictions over every mode,
            so the modes over the budget are extrapolated, as they are for a real job.
Printed per (trace, design, k, time model), over seeds (grid/front: selection seeds;
strategy: noise seeds) and budgets: time and power MAPE over every mode (mean; strategy also
the median over its budgets), the share of true values inside the 90 % intervals
(`time_ms_lo/hi`, `power_w_lo/hi`), the intervals' median relative width, the mean
number of profiled modes, and for the designs with a budget (strategy, under) the power
MAPE split at it: over the modes within the budget (pIn) and above it (pOver).

Grid, front, low and under read the trace's values without noise. `--traces` takes file
names, each optionally with a batch size (`orin_agx_resnet18_imagenet_infer.csv:4`).

Hold-out discipline: the trace in powerd_replay.training.HELD_OUT (MobileNet v3 inference, at
every batch size) is evaluated only with --held-out and printed apart; tune nothing on it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from powerd.optimize import make_strategy  # noqa: E402
from powerd.predictor import transfer  # noqa: E402
from powerd.predictor.reference import ReferenceModel  # noqa: E402
from powerd.predictor.sampling import select_modes  # noqa: E402
from powerd.predictor.transfer import RidgeOptions, Samples, fit_ridge  # noqa: E402
from powerd.sim.trace import TRACE_DIR, Trace  # noqa: E402
from powerd_replay.knobs import knob_values  # noqa: E402
from powerd_replay.training import (  # noqa: E402
    GridSpace,
    NoiseModel,
    TraceMeasurer,
    is_held_out,
    load_trace,
    mixed_order,
    own_range_budgets,
    solve_budget,
)

TRACES = (
    ("orin_agx_mobilenetv3_gld23k_train.csv", None),
    ("orin_nano_resnet18_imagenet_train.csv", None),
    ("orin_agx_resnet18_imagenet_infer.csv", 1),
    ("orin_agx_mobilenetv3_gld23k_infer.csv", 1),
)
LOW_SHARE = 0.35
# (relative sd of a step time, sd of a power reading in W) of the strategy and mixed
# designs' measurements; --noise overrides
NOISE = (NoiseModel.time_rel, NoiseModel.power_w)
REFINE_ROOM = 30  # as the strategy replays tuned with (strategy_replay.py --refine 30)
REPLAYED = ("strategy", "mixed")  # designs that replay powertrain: one set per budget, no k


def judge(fp, trace: Trace, budget_w: float | None = None) -> dict[str, float]:
    # what `powerctl predict` answers: the overall power head where the fit has one
    t, t_lo, t_hi, p, p_lo, p_hi = fp.predict_interval(trace.modes_array, overall=True)
    tt, tp = trace.time_ms, trace.power_w
    p_err = np.abs(p - tp) / tp * 100
    over = tp > budget_w if budget_w is not None else np.zeros(len(tp), dtype=bool)
    return {
        "t_mape": float(np.mean(np.abs(t - tt) / tt) * 100),
        "p_mape": float(np.mean(p_err)),
        # split at the budget the samples were taken under (NaN: no budget, or no mode there)
        "p_within": float(np.mean(p_err[~over])) if budget_w is not None else np.nan,
        "p_over": float(np.mean(p_err[over])) if over.any() else np.nan,
        # NaN: too few samples for an interval (counted apart, see "no interval")
        "t_cov": float(np.mean((tt >= t_lo) & (tt <= t_hi)) * 100)
        if np.isfinite(t_lo).all()
        else np.nan,
        "p_cov": float(np.mean((tp >= p_lo) & (tp <= p_hi)) * 100)
        if np.isfinite(p_lo).all()
        else np.nan,
        "t_width": float(np.median(t_hi / t_lo - 1) * 100),
        "p_width": float(np.median(p_hi / p_lo - 1) * 100),
        "n": float(len(fp.samples)),
    }


def _mean_or_dash(values: list[float]) -> str:
    """A column's mean over the sets that have it, or '-' (no set has a budget)."""
    v = np.asarray(values, dtype=np.float64)
    return f"{np.mean(v[np.isfinite(v)]):6.1f}" if np.isfinite(v).any() else f"{'-':>6}"


def _replay_parts(
    trace: Trace, ref: ReferenceModel, opts: RidgeOptions, seed: int, noise: tuple[float, float]
):
    """(mode space, measurer, fitter) of a powertrain replay on `trace`: the daemon's ridge
    fit over the trace's modes, measurements with `noise` (time_rel, power_w)."""

    def fitter(samples):
        return fit_ridge(samples, ref, opts, trace.modes_array)

    measurer = TraceMeasurer(trace, NoiseModel(*noise, seed=seed))
    return GridSpace.from_trace(trace), measurer, fitter


def strategy_sets(
    trace: Trace, ref: ReferenceModel, opts: RidgeOptions, seed: int, noise: tuple[float, float]
):
    """(budget, samples) of a fresh powertrain replay per own-range budget."""
    space, measurer, fitter = _replay_parts(trace, ref, opts, seed, noise)
    for b in own_range_budgets(trace):
        strategy = make_strategy("powertrain", space, predictor_factory=lambda: ref)
        samples: dict = {}
        solve_budget(strategy, b, samples, measurer, fitter)
        yield b, samples


def mixed_sets(
    trace: Trace, ref: ReferenceModel, opts: RidgeOptions, seed: int, noise: tuple[float, float]
):
    """(budget, samples after it) along one powertrain workload whose budget changes."""
    space, measurer, fitter = _replay_parts(trace, ref, opts, seed, noise)
    strategy = make_strategy("powertrain", space, predictor_factory=lambda: ref)
    samples: dict = {}
    for b in mixed_order(own_range_budgets(trace), seed):
        solve_budget(strategy, b, samples, measurer, fitter, refine_room=REFINE_ROOM)
        yield b, dict(samples)


def sample_sets(
    trace: Trace,
    ref: ReferenceModel,
    opts: RidgeOptions,
    design: str,
    k: int,
    seed: int,
    noise: tuple[float, float] = NOISE,
) -> list[tuple[float | None, Samples]]:
    """(budget, profiled samples) of one design and seed: strategy and under, one set per
    budget; the other designs, one set and no budget."""
    modes = trace.modes_array
    if design in REPLAYED:
        out = []
        sets = strategy_sets if design == "strategy" else mixed_sets
        for b, samples in sets(trace, ref, opts, seed, noise):
            s = Samples.coerce(samples)
            if s.time_ok.sum() >= 2 and s.power_ok.sum() >= 2:
                out.append((b, s))
        return out
    if design == "under":
        out = []
        for b in own_range_budgets(trace):
            fits = np.flatnonzero(trace.power_w <= b)
            if len(fits) < 2:
                continue
            idx = fits[select_modes("grid", modes[fits], min(k, len(fits)), seed=seed)]
            out.append((b, Samples(modes[idx], trace.time_ms[idx], trace.power_w[idx])))
        return out
    if design == "low":
        low = np.flatnonzero(trace.power_w <= np.quantile(trace.power_w, LOW_SHARE))
        idx = low[select_modes("grid", modes[low], min(k, len(low)), seed=seed)]
        return [(None, Samples(modes[idx], trace.time_ms[idx], trace.power_w[idx]))]
    pred = ref.predict(modes)
    idx = select_modes(design, modes, k, predicted=pred, seed=seed)
    return [(None, Samples(modes[idx], trace.time_ms[idx], trace.power_w[idx]))]


def fit_seconds(ref: ReferenceModel, trace: Trace, opts: RidgeOptions, k: int = 50) -> str:
    modes = trace.modes_array
    idx = select_modes("grid", modes, k, seed=0)
    s = Samples(modes[idx], trace.time_ms[idx], trace.power_w[idx])
    fit_ridge(s, ref, opts, modes)
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        fp = fit_ridge(s, ref, opts, modes)
        fp.predict_interval(modes)
        runs.append(time.perf_counter() - t0)
    return f"{1000 * statistics.median(runs):.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--designs", default="strategy,grid,front,low")
    ap.add_argument("--k", default="20,30,50", help="modes for grid/front")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument(
        "--time-model",
        default=RidgeOptions().time_model,
        help="the time head: auto (the daemon's default), physical, reference; "
        "comma-separated to compare",
    )
    ap.add_argument(
        "--growth",
        help="intervals growth_time:growth_power:extrapolation_time:extrapolation_power, "
        "several comma-separated to compare (default: the transfer's constants)",
    )
    ap.add_argument(
        "--noise",
        metavar="TIME_REL:POWER_W",
        help="measurement noise of the strategy and mixed designs (default "
        f"{NOISE[0]:g}:{NOISE[1]:g}; the emulated daemon's readings are closer to 0.006:0.05)",
    )
    ap.add_argument("--held-out", action="store_true", help="also the held-out trace")
    ap.add_argument("--only-held-out", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--traces",
        help="comma-separated file names, each optionally :batch_size (default: the visible "
        "ones, inference at batch size 1)",
    )
    ap.add_argument(
        "--ridge", action="append", default=[], help="RidgeOptions override, e.g. power_log=1"
    )
    args = ap.parse_args()
    noise = NOISE
    if args.noise:
        try:
            noise = tuple(float(x) for x in args.noise.split(":"))
        except ValueError:
            noise = ()
        if len(noise) != 2 or min(noise) < 0:
            ap.error(f"--noise {args.noise!r}: two numbers >= 0, TIME_REL:POWER_W")

    growths = [
        tuple(float(x) for x in g.split(":")) for g in (args.growth or "").split(",") if g
    ] or [
        (
            transfer.INTERVAL_GROWTH,
            transfer.INTERVAL_GROWTH_POWER,
            *transfer.INTERVAL_EXTRAPOLATION,
        )
    ]
    ref = ReferenceModel.load()
    seeds = [int(x) for x in args.seeds.split(",")]
    ks = [int(x) for x in args.k.split(",")]
    traces = list(TRACES)
    if args.traces:
        traces = []
        for item in args.traces.split(","):
            fname, _, bs = item.partition(":")
            if bs and not bs.isdigit():
                ap.error(f"--traces {item!r}: the batch size after ':' is a whole number")
            traces.append((fname, int(bs) if bs else dict(TRACES).get(fname)))
    hdr = (
        f"{'trace':36} {'sample':9} {'design':8} {'k':>4} {'time model':10} "
        f"{'tMAPE':>6} {'(med)':>6} {'pMAPE':>6} {'(med)':>6} {'tCov%':>6} {'pCov%':>6} "
        f"{'tWid%':>6} {'pWid%':>6} {'pIn':>6} {'pOver':>6}"
    )
    print(
        f"reference {ref.model_id}; nominal interval coverage {transfer.INTERVAL_COVERAGE:.0%}"
        f"; seeds {seeds}"
    )
    print(hdr)
    print("-" * len(hdr))
    for fname, bs in traces:
        trace = load_trace(TRACE_DIR / fname, bs)
        held = is_held_out(trace.name)
        if held and not (args.held_out or args.only_held_out):
            continue
        if args.only_held_out and not held:
            continue
        label = "held-out" if held else "in-sample"
        for tm in args.time_model.split(","):
            opts = replace(RidgeOptions(**knob_values(args.ridge)), time_model=tm)
            for design in args.designs.split(","):
                for k in [0] if design in REPLAYED else ks:
                    sets = [
                        s
                        for sd in seeds
                        for s in sample_sets(trace, ref, opts, design, k, sd, noise)
                    ]
                    if not sets:
                        continue
                    for g in growths:
                        transfer.INTERVAL_GROWTH, transfer.INTERVAL_GROWTH_POWER = g[:2]
                        if len(g) > 2:
                            transfer.INTERVAL_EXTRAPOLATION = tuple(g[2:4])
                        rows = [
                            judge(fit_ridge(s, ref, opts, trace.modes_array), trace, b)
                            for b, s in sets
                        ]
                        col = {key: [r[key] for r in rows] for key in rows[0]}
                        kk = (
                            f"{np.mean(col['n']):.0f}" if design in (*REPLAYED, "under") else str(k)
                        )
                        gg = " g=" + ":".join(f"{x:g}" for x in g) if len(growths) > 1 else ""
                        print(
                            f"{trace.name:36} {label:9} {design:8} {kk:>4} {tm + gg:10} "
                            f"{np.mean(col['t_mape']):6.1f} {np.median(col['t_mape']):6.1f} "
                            f"{np.mean(col['p_mape']):6.1f} {np.median(col['p_mape']):6.1f} "
                            f"{np.nanmean(col['t_cov']):6.0f} {np.nanmean(col['p_cov']):6.0f} "
                            f"{np.nanmean(col['t_width']):6.0f} {np.nanmean(col['p_width']):6.0f} "
                            f"{_mean_or_dash(col['p_within'])} {_mean_or_dash(col['p_over'])}",
                            flush=True,
                        )
            print(
                f"{'':36} fit + predict_interval of {len(trace)} modes (k=50, {tm}): "
                f"{fit_seconds(ref, trace, opts)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
