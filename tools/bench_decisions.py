#!/usr/bin/env python3
"""Decision benchmark: replay a trace through the emulator and the real daemon over a sweep
of budgets, and compare each pinned mode with the trace's brute-force best under the budget.

    .venv/bin/python tools/bench_decisions.py --board orin-agx --fresh \
        --trace powerd/sim/traces/orin_agx_mobilenetv3_gld23k_train.csv
    .venv/bin/python tools/bench_decisions.py --board orin-agx --batch-size 1 \
        --trace powerd/sim/traces/orin_agx_mobilenetv3_gld23k_infer.csv

Budgets: by default the trace's OWN power range, from its lowest mode's power + 1 W up to
its highest mode's power, 1 W apart (`--budgets lo:hi` or `a,b,c` to choose). An inference
trace is replayed as if its batches were training steps, at `--batch-size` (default: the
smallest traced one).

One job per budget, in one of two regimes:
* `--fresh`: every budget is a new workload, profiled from scratch (the common case);
* default: one workload whose budget changes, in a MIXED order (a shuffle seeded by
  `--seed`, so steps down follow steps up): samples and the fitted model carry over,
  as for `job.set_budget`. `--order up` sweeps upwards instead.

Totals: median/mean/worst time penalty, budgets whose pinned mode's true power is over by
more than 0.5 W, modes profiled (per budget and in total; changed budgets apart from the
first), share of profiling time above the budget + 1 W (the daemon's own accounting),
prediction MAPE over every traced mode (`powerctl predict`; with --fresh the median over
the budgets' models) and the share of true values inside the predicted intervals, and
time to the first committed mode (from the job's start, emulated seconds at the time
scale).

`--plot FILE.png` draws the sweep: the pinned mode's true step time against the best mode
under each budget (and the best among rows that are no glitch), and the pinned mode's true
power against the budget.

`--step-time`: the step-time objective instead (`powerd.request(step_time_ms=T)`), one new
workload per target; the targets are the best step time under each own-range budget + 3 %
(tools/strategy_replay.py --step-time replays the same targets without a daemon), within a
power cap 5 W above the trace's top. Per target: the pinned mode, whether its true step
time meets T (2 % slack), its true power over the lowest-power mode that meets T (and over
the lowest among rows that are no glitch), whether the daemon claimed T infeasible.

Each trace is labelled in-sample (the strategy's knobs were tuned by replaying it) or
held-out (never used for tuning: its figures are the honest ones); see HELD_OUT.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from powerd import protocol as p  # noqa: E402
from powerd.client import call_once  # noqa: E402
from powerd.config import ProfilingConfig  # noqa: E402
from powerd.errors import PowerdError  # noqa: E402
from powerd.optimize.powertrain import Tuning, seed_count  # noqa: E402
from powerd.predictor.transfer import INTERVAL_COVERAGE  # noqa: E402
from powerd.sim.harness import EmulatedBoard, scaled_profiling  # noqa: E402
from powerd.sim.job import run_training_job  # noqa: E402
from powerd.sim.trace import Trace  # noqa: E402
from powerd.store import Store  # noqa: E402
from powerd_replay.machine import load_note, start_watch  # noqa: E402
from powerd_replay.plots import BudgetOutcome, save_decisions_plot  # noqa: E402
from powerd_replay.training import (  # noqa: E402
    TimeTargetResult,
    consistent_best_time,
    inconsistent_rows,
    load_trace,
    mixed_order,
    own_range_budgets,
    sample_label,
    short_mode,
    time_targets,
)


def parse_budgets(text: str) -> list[float]:
    if ":" in text:
        lo, hi = (float(x) for x in text.split(":"))
        return [lo + i for i in range(int(hi - lo) + 1)]
    return [float(x) for x in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--trace", required=True)
    ap.add_argument("--board", default="orin-agx", choices=["orin-agx", "orin-nano"])
    ap.add_argument("--batch-size", type=int, help="inference trace: the batch size to replay")
    ap.add_argument("--budgets", help="lo:hi (1 W steps) or a,b,c; default: the trace's own range")
    ap.add_argument("--strategy", default="powertrain", choices=["powertrain", "binary-search"])
    ap.add_argument("--time-scale", type=float, default=0.03)
    ap.add_argument("--fresh", action="store_true", help="a new workload for every budget")
    ap.add_argument("--order", default="mixed", choices=["mixed", "up"], help="without --fresh")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--daemon-log", metavar="FILE", help="keep the daemon's log in this file")
    ap.add_argument(
        "--job-hours",
        type=float,
        default=1.0,
        help="each job says it runs this long: request(expected_steps=) is this many hours "
        "of steps at the trace's median step time (the daemon may measure [profiling] "
        "refine_share of them after its first commit); 0: unknown length (the daemon then "
        "sizes that share by the steps run so far; each job here ends 0.3 s after tuned)",
    )
    ap.add_argument("--expected-steps", type=int, help="give expected_steps directly instead")
    ap.add_argument(
        "--run-after-tuned",
        type=float,
        default=0.0,
        metavar="S",
        help="each job trains on for at least S wall seconds after it first reads tuned "
        "(with --job-hours 0: a long job of unknown length)",
    )
    ap.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw the sweep: pinned vs best step time and the pinned power per budget",
    )
    ap.add_argument(
        "--step-time",
        action="store_true",
        help="the step-time objective: one new workload per target (the best time under each "
        "budget + 3 %%) instead of budgets",
    )
    args = ap.parse_args()
    if args.step_time and args.plot:
        ap.error("--plot draws budget sweeps; --step-time prints its table only")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            ap.error("--plot needs matplotlib (pip install 'powerd[plot]')")

    trace = load_trace(args.trace, args.batch_size)
    length = ""
    if args.expected_steps is None:
        median_s = float(np.median(trace.time_ms)) / 1000.0
        args.expected_steps = round(args.job_hours * 3600.0 / median_s) if args.job_hours else 0
        length = f" ({args.job_hours:g} h of steps)" if args.job_hours else ""
    if args.run_after_tuned:
        length += f", each training {args.run_after_tuned:g} s on after it first reads tuned"
    budgets = parse_budgets(args.budgets) if args.budgets else list(own_range_budgets(trace))
    if args.step_time:
        return step_time_sweep(args, trace, budgets, length)
    if not args.fresh and args.order == "mixed":
        budgets = mixed_order(budgets, args.seed)
    regime = "new workload per budget" if args.fresh else f"one workload, {args.order} order"
    rows = []
    bad = inconsistent_rows(trace)
    watch, note = start_watch()
    print(note, flush=True)
    t_start = time.monotonic()
    with emulated_board(args, trace) as board:
        store = Store(board.state_dir)
        board_key = board.status()["board_key"]
        what = f"{regime}, {len(budgets)} budgets {min(budgets):g}-{max(budgets):g} W"
        print(sweep_header(args, trace, what, length), flush=True)
        print(
            f"{'budget':>6} {'new':>4} {'chosen (c/cpu/gpu/emc MHz)':>28} {'true ms':>8} "
            f"{'true W':>7} {'best ms':>8} {'best W':>7} {'penalty':>8} {'over':>6} "
            f"{'decide s':>8} {'1st pen':>8}"
        )
        seen = 0
        for i, b in enumerate(budgets):
            workload = f"{trace.name}-{b:g}W" if args.fresh else trace.name
            before = 0 if args.fresh else seen
            run = run_training_job(
                board.root,
                trace,
                b,
                workload,
                args.time_scale,
                endpoint=board.endpoint,
                seed=args.seed + i,
                **job_length(args),
            )
            samples = store.load_samples(board_key, workload)
            seen = len(samples)
            best = trace.best_under(b)
            if run.final_mode is None or run.final_phase != "tuned" or best is None:
                print(f"{b:>6g}  no decision (phase {run.final_phase})")
                continue
            row = trace.lookup(run.final_mode)
            pen = row.time_ms / best.time_ms - 1
            first_ms = trace.lookup(run.first_tuned_mode or run.final_mode).time_ms
            pen1 = first_ms / best.time_ms - 1
            regular_ms = consistent_best_time(trace, b, bad)
            desc = short_mode(run.final_mode)
            rows.append(
                dict(
                    budget=b,
                    first=i == 0,
                    new=seen - before,
                    penalty=pen,
                    first_penalty=pen1,
                    consistent=row.time_ms / regular_ms - 1,
                    over=row.power_w - b,
                    decide_s=run.tuned_after_s or 0.0,
                    outcome=BudgetOutcome(
                        budget_w=b,
                        pinned_ms=row.time_ms,
                        pinned_w=row.power_w,
                        first_ms=first_ms,
                        best_ms=best.time_ms,
                        regular_best_ms=regular_ms,
                    ),
                )
            )
            print(
                f"{b:>6g} {seen - before:>4} {desc:>28} {row.time_ms:>8.1f} {row.power_w:>7.2f} "
                f"{best.time_ms:>8.1f} {best.power_w:>7.2f} {100 * pen:>7.1f}% "
                f"{row.power_w - b:>+6.2f} {run.tuned_after_s or 0:>8.1f} {100 * pen1:>7.1f}%",
                flush=True,
            )
        status = board.status()
        mape = None
        workloads = [trace.name]
        if args.fresh:
            workloads = [f"{trace.name}-{r['budget']:g}W" for r in rows]
        measured = [m for w in workloads for m in store.load_samples(board_key, w).values()]
        if args.strategy == "powertrain" and rows:
            got = [prediction_mape(board.endpoint, trace, w, args.time_scale) for w in workloads]
            got = [g for g in got if g is not None]
            if got:
                # fresh: every budget's workload has its own model, fitted on the modes that
                # fit that budget: the median over them
                cal_t = [g[2] for g in got if g[2] is not None]
                cal_p = [g[3] for g in got if g[3] is not None]
                mape = (
                    statistics.median(g[0] for g in got),
                    statistics.median(g[1] for g in got),
                    statistics.median(cal_t) if cal_t else None,
                    statistics.median(cal_p) if cal_p else None,
                )
    if not rows:
        return 1
    report(args, trace, budgets, rows, status, workloads, mape, int(bad.sum()))
    print(measurement_error(trace, measured, args.time_scale))
    if args.plot:
        title = f"{trace.name} ({sample_label(trace.name)}), {regime}, {args.strategy}"
        save_decisions_plot([r["outcome"] for r in rows], title, args.plot)
        print(f"plot:                     {args.plot}")
    print(f"wall time:                {time.monotonic() - t_start:.0f} s")
    print(load_note("at the end", own=1.0, watch=watch))
    return 0


def emulated_board(args, trace: Trace) -> EmulatedBoard:
    return EmulatedBoard(
        args.board,
        trace,
        time_scale=args.time_scale,
        strategy=args.strategy,
        seed=args.seed,
        daemon_log=args.daemon_log,
    )


def sweep_header(args, trace: Trace, what: str, length: str) -> str:
    return (
        f"{trace.name} ({sample_label(trace.name)}) on emulated {args.board}, strategy "
        f"{args.strategy}, {what}, time scale {args.time_scale:g}, "
        f"expected_steps {args.expected_steps or 'unknown'}{length}"
    )


def job_length(args) -> dict:
    """How long each emulated job trains (run_training_job's arguments)."""
    prof = scaled_profiling(args.time_scale)
    window_s = (prof["settle_ms"] + prof["window_ms"]) / 1000.0
    return dict(
        # between measurements after the commit the job reads tuned for a settle + window
        # (0.21 s at 0.03, 1.8 s at 0.3, more on a loaded machine): it ends once the daemon
        # has nothing more to measure
        stay_tuned_s=max(1.0, 1.5 * window_s) if args.expected_steps else 0.3,
        max_s=300 + args.run_after_tuned,
        expected_steps=args.expected_steps or None,
        run_after_tuned_s=args.run_after_tuned,
    )


def step_time_sweep(args, trace: Trace, budgets: list[float], length: str) -> int:
    """One new workload per step-time target, through the daemon; judged against the trace."""
    targets = time_targets(trace, budgets)
    cap_w = min(80.0, float(np.ceil(trace.power_w.max())) + 5.0)
    regular = ~inconsistent_rows(trace)
    watch, note = start_watch()
    print(note, flush=True)
    t_start = time.monotonic()
    results: list[TimeTargetResult] = []
    decide_s: list[float] = []
    mapes = []
    with emulated_board(args, trace) as board:
        store = Store(board.state_dir)
        board_key = board.status()["board_key"]
        what = (
            f"step-time objective, {len(targets)} targets {min(targets):g}-{max(targets):g} "
            f"ms (trace ms), power cap {cap_w:g} W"
        )
        print(sweep_header(args, trace, what, length), flush=True)
        print(
            f"{'target':>8} {'new':>4} {'chosen (c/cpu/gpu/emc MHz)':>28} {'true ms':>8} "
            f"{'met':>4} {'true W':>7} {'least W':>7} {'excess':>7} {'regular':>8} "
            f"{'claim':>6} {'decide s':>8}"
        )
        for i, target in enumerate(targets):
            workload = f"{trace.name}-{target:g}ms"
            run = run_training_job(
                board.root,
                trace,
                cap_w,
                workload,
                args.time_scale,
                endpoint=board.endpoint,
                seed=args.seed + i,
                **job_length(args),
                # the daemon measures the emulated (scaled) step times
                step_time_ms=target * args.time_scale,
            )
            new = len(store.load_samples(board_key, workload))
            if run.final_mode is None or run.final_phase != "tuned":
                print(f"{target:>8g}  no decision (phase {run.final_phase})")
                continue
            r = TimeTargetResult.judge(
                trace, regular, target, run.final_mode, run.final_feasible is not False, new
            )
            results.append(r)
            decide_s.append(run.tuned_after_s or 0.0)
            if args.strategy == "powertrain":
                got = prediction_mape(board.endpoint, trace, workload, args.time_scale)
                if got is not None:
                    mapes.append(got)
            desc = short_mode(run.final_mode)
            print(
                f"{target:>8g} {new:>4} {desc:>28} {r.time_ms:>8.1f} {'yes' if r.met else 'NO':>4} "
                f"{r.power_w:>7.2f} {r.best_power_w:>7.2f} {100 * r.power_excess:>6.1f}% "
                f"{100 * r.regular_power_excess:>7.1f}% "
                f"{'meets' if r.feasible else 'infeas':>6} {decide_s[-1]:>8.1f}",
                flush=True,
            )
    if not results:
        return 1
    print()
    print(f"trace:                    {trace.name} ({sample_label(trace.name)})")
    met = sum(r.met for r in results)
    print(
        f"targets met:              {met} of {len(results)} ({100 * met / len(results):.0f} %) "
        f"within T + 2 % (every target is feasible); of {len(targets)} targets"
    )
    excess = [r.power_excess for r in results]
    print(
        f"power over the least:     median {100 * statistics.median(excess):.1f} %, mean "
        f"{100 * statistics.fmean(excess):.1f} %, worst {100 * max(excess):.1f} % (over the "
        "lowest-power traced mode meeting T)"
    )
    reg = [r.regular_power_excess for r in results if not np.isnan(r.regular_power_excess)]
    if reg:
        print(
            f"vs rows that are no glitch: median {100 * statistics.median(reg):.1f} %, mean "
            f"{100 * statistics.fmean(reg):.1f} %, worst {100 * max(reg):.1f} %"
        )
    print(f"claimed infeasible:       {sum(not r.feasible for r in results)}")
    new = [r.new_probes for r in results]
    print(f"modes profiled:           per target mean {statistics.fmean(new):.1f}, max {max(new)}")
    if mapes:
        mt = statistics.median(g[0] for g in mapes)
        mp = statistics.median(g[1] for g in mapes)
        print(
            f"prediction MAPE (every traced mode): time {mt:.1f} %, power {mp:.1f} % "
            "(median over the targets' models)"
        )
    print(
        f"time to first committed mode: median {statistics.median(decide_s):.1f} s, worst "
        f"{max(decide_s):.1f} s (emulated, time scale {args.time_scale:g})"
    )
    print(f"wall time:                {time.monotonic() - t_start:.0f} s")
    print(load_note("at the end", own=1.0, watch=watch))
    return 0


def report(args, trace, budgets, rows, status, workloads, mape, n_bad) -> None:
    pens = [r["penalty"] for r in rows]
    over = [r for r in rows if r["over"] > 0.5]
    print()
    print(f"trace:                    {trace.name} ({sample_label(trace.name)})")
    print(f"budgets decided:          {len(rows)}/{len(budgets)}")
    print(
        f"time penalty:             median {100 * statistics.median(pens):.1f} %, "
        f"mean {100 * statistics.fmean(pens):.1f} %, worst {100 * max(pens):.1f} %"
    )
    firsts = [r["first_penalty"] for r in rows]
    print(
        f"at the first commit:      median {100 * statistics.median(firsts):.1f} %, "
        f"mean {100 * statistics.fmean(firsts):.1f} %, worst {100 * max(firsts):.1f} % "
        "(before measuring after the commit)"
    )
    cons = [r["consistent"] for r in rows if r["consistent"] == r["consistent"]]
    if cons:
        print(
            f"vs rows that are no glitch: median {100 * statistics.median(cons):.1f} %, "
            f"mean {100 * statistics.fmean(cons):.1f} %, worst {100 * max(cons):.1f} % "
            f"(best within each budget leaving out the {n_bad} of {len(trace.rows)} rows "
            "drawing > 1 W less than a mode they dominate in every knob)"
        )
    print(f"over budget by > 0.5 W:   {len(over)} ({100 * len(over) / len(rows):.1f} % of budgets)")
    new = [r["new"] for r in rows]
    line = f"{sum(new)} in all, per budget mean {statistics.fmean(new):.1f}, max {max(new)}"
    # Budgets that came before the workload had a first budget's seeds share the first's
    # room (powerd.optimize.powertrain): they count with it, not as changes.
    seeds = seed_count(ProfilingConfig().modes, Tuning())
    had = np.cumsum([0] + new[:-1])
    shared = [i for i in range(1, len(rows)) if had[i] < seeds]
    later = [r["new"] for i, r in enumerate(rows) if i > 0 and i not in shared]
    if not args.fresh and rows[0]["first"] and later:
        line += f"; first budget {rows[0]['new']}"
        if shared:
            line += (
                f" (and {len(shared)} after it before the workload had {seeds} modes: "
                f"{sum(new[i] for i in shared)})"
            )
        line += f", each change after that mean {statistics.fmean(later):.1f}, max {max(later)}"
    print(f"modes profiled:           {line}")
    costs = [c for w in workloads if (c := (status.get("profiling") or {}).get(w))]
    seconds = sum(c["seconds"] for c in costs)
    if seconds > 0:
        above = sum(c["share_above_budget"] * c["seconds"] for c in costs) / seconds
        above1 = sum(c["share_above_budget_1w"] * c["seconds"] for c in costs) / seconds
        print(
            f"profiling time above budget + 1 W: {100 * above1:.1f} % "
            f"(above budget: {100 * above:.1f} %) of {seconds:.0f} s"
        )
    if mape is not None:
        line = f"time {mape[0]:.1f} %, power {mape[1]:.1f} %"
        if args.fresh:
            line += " (median over the budgets' models)"
        print(f"prediction MAPE (every traced mode): {line}")
        if mape[2] is not None and mape[3] is not None:
            print(
                f"interval calibration:     true time inside {mape[2]:.0f} %, true power "
                f"inside {mape[3]:.0f} % of modes (nominal {100 * INTERVAL_COVERAGE:.0f} %)"
            )
    first = rows[0]["decide_s"]
    line = f"first budget {first:.1f} s"
    if args.fresh:
        line = f"median {statistics.median(r['decide_s'] for r in rows):.1f} s, worst "
        line += f"{max(r['decide_s'] for r in rows):.1f} s"
    elif len(rows) > 1:
        later_s = statistics.median(r["decide_s"] for r in rows[1:])
        line += f", after a change median {later_s:.1f} s"
    print(f"time to first committed mode: {line} (emulated, time scale {args.time_scale:g})")


def measurement_error(trace: Trace, measured: list, time_scale: float) -> str:
    """How far the daemon's stored measurements lie from the trace's values of the same
    modes: the noise (and any bias) every fit and every interval has to live with."""
    t_err, p_err = [], []
    for m in measured:
        row = trace.lookup(m.mode)
        if math.isfinite(m.time_ms):
            t_err.append(m.time_ms / (row.time_ms * time_scale) - 1)
        if math.isfinite(m.power_w):
            p_err.append(m.power_w / row.power_w - 1)
    if not p_err:
        return "measurements vs trace:    none stored"
    t = np.asarray(t_err) * 100
    pw = np.asarray(p_err) * 100
    line = f"measurements vs trace:    {len(pw)} modes; power mean {pw.mean():+.1f} %, "
    line += f"mean |error| {np.abs(pw).mean():.1f} %"
    if len(t):
        line += f"; time mean {t.mean():+.1f} %, mean |error| {np.abs(t).mean():.1f} %"
    return line


def prediction_mape(
    endpoint: str, trace: Trace, workload: str | None, time_scale: float
) -> tuple[float, float, float | None, float | None] | None:
    """`powerctl predict` for the workload against the trace, over every traced mode:
    (time MAPE %, power MAPE %, share of true times / powers inside the predicted interval
    in % (None when the reply carries no intervals))."""
    if workload is None:
        return None
    try:
        reply = call_once(endpoint, p.Predict(workload=workload), timeout_s=30)
    except PowerdError as exc:
        print(f"(no predictions: {exc})")
        return None
    assert isinstance(reply, p.Predictions)
    pred = {(r["cores"], r["cpu_khz"], r["gpu_hz"], r["emc_hz"]): r for r in reply.rows}
    t_err, p_err, t_in, p_in = [], [], [], []
    for row in trace.rows:
        r = pred.get(row.mode.as_tuple())
        if r is None:
            continue
        # the daemon sees the emulated (scaled) step times
        true_t = row.time_ms * time_scale
        t_err.append(abs(r["time_ms"] / true_t - 1))
        p_err.append(abs(r["power_w"] / row.power_w - 1))
        if r.get("time_ms_lo") is not None and r.get("time_ms_hi") is not None:
            t_in.append(r["time_ms_lo"] <= true_t <= r["time_ms_hi"])
        if r.get("power_w_lo") is not None and r.get("power_w_hi") is not None:
            p_in.append(r["power_w_lo"] <= row.power_w <= r["power_w_hi"])
    if not t_err:
        return None
    return (
        100 * float(np.mean(t_err)),
        100 * float(np.mean(p_err)),
        100 * float(np.mean(t_in)) if t_in else None,
        100 * float(np.mean(p_in)) if p_in else None,
    )


if __name__ == "__main__":
    sys.exit(main())
