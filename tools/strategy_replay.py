#!/usr/bin/env python3
"""Replay the search strategies against the visible traces and print what each one pins.

    .venv/bin/python tools/strategy_replay.py                      # both strategies, 3 traces
    .venv/bin/python tools/strategy_replay.py --strategy powertrain \
        --trace powerd/sim/traces/orin_nano_resnet18_imagenet_train.csv
    .venv/bin/python tools/strategy_replay.py --summary --seeds 0,1,2 --fresh

No daemon, no emulator: powerd_replay.training plays the profiler (trace rows with ~2% time
and 0.2 W power noise, windows aborted 1 W over budget). Budgets span each trace's own power
range (its lowest mode + 1 W to its highest, 1 W apart), solved as one workload whose budget
changes in a mixed (seeded) order, so samples and the fitted model carry over; --order up
sweeps upwards; --fresh solves every budget from scratch instead. Inference traces replay
at batch size 1 (`--batch-size`) as if their batches were training steps.

Hold-out discipline: the traces in powerd_replay.training.HELD_OUT are never replayed unless
--include-held-out is given; do not tune knobs on what that prints.

powertrain runs with the bundled reference model and the ridge transfer of powerd.predictor
(--predictor reference, the default); --predictor oracle uses the replay's stand-ins (the
trace seen through a systematic distortion, refitted by a small ridge) instead.

Per budget: chosen mode and its true time/power, the trace's best mode within the budget,
the time penalty, overshoot, new probes (modes measured for this budget), probes whose
true power was over the budget, fits. Then the aggregates: median/mean/p90 penalty, share
of budgets over by > 0.5 W, distinct modes profiled, probes per budget. With --step-time,
per target: chosen mode, its true time and power, the least power of a traced mode (and of
a row that is no glitch) meeting the target, the excess, met within 2 %, modes measured.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from powerd.modes import FIELDS  # noqa: E402
from powerd.optimize import STRATEGIES, make_strategy  # noqa: E402
from powerd.sim.trace import TRACE_DIR, Trace  # noqa: E402
from powerd_replay.knobs import knob_values  # noqa: E402
from powerd_replay.training import (  # noqa: E402
    GridSpace,
    NoiseModel,
    NoisyOracle,
    RidgeFitter,
    SweepResult,
    TimeTargetResult,
    format_table,
    is_held_out,
    load_trace,
    mixed_order,
    own_range_budgets,
    replay_sweep,
    replay_time_targets,
    short_mode,
    time_targets,
)

VISIBLE = (
    TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv",
    TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv",
    TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv",
    TRACE_DIR / "orin_agx_mobilenetv3_gld23k_infer.csv",
)


def predictor_pair(kind: str, trace: Trace, seed: int, ridge: Sequence[str] = ()):
    """(reference factory, fitter) for powertrain; `ridge`: RidgeOptions overrides, "k=v"
    (none: the daemon's defaults)."""
    if kind == "reference":
        from powerd.predictor import ReferenceModel, fit_workload
        from powerd.predictor.transfer import RidgeOptions

        ref = ReferenceModel.load()
        opts = RidgeOptions(**knob_values(ridge))
        domain = GridSpace.from_trace(trace).as_array()
        return (lambda: ref), (
            lambda samples: fit_workload(
                samples, ref, method="ridge", ridge_options=opts, domain=domain
            )
        )
    oracle = NoisyOracle(trace, time_err=0.10, power_err=0.05, jitter=0.02, seed=seed)
    return (lambda: oracle), RidgeFitter(oracle, [trace.axis(f) for f in FIELDS])


def run(strategy: str, trace: Trace, args: argparse.Namespace, seed: int) -> SweepResult:
    space = GridSpace.from_trace(trace)
    budgets = list(parse_budgets(args.budgets) if args.budgets else own_range_budgets(trace))
    if not args.fresh and args.order == "mixed":
        budgets = mixed_order(budgets, seed)
    factory, fitter = (None, None)
    if strategy == "powertrain":
        factory, fitter = predictor_pair(args.predictor, trace, seed, args.ridge)
    return replay_sweep(
        lambda: make_strategy(
            strategy, space, predictor_factory=factory, max_modes=args.modes, **knobs(args)
        ),
        trace,
        budgets,
        fitter=fitter,
        noise=NoiseModel(seed=seed),
        share_samples=not args.fresh,
        refine_room=args.refine,
    )


def knobs(args: argparse.Namespace) -> dict[str, float]:
    """--set key=value pairs (numbers) for the strategy's Tuning."""
    return knob_values(args.set)


def parse_budgets(text: str) -> list[float]:
    if ":" in text:
        lo, hi = (float(x) for x in text.split(":"))
        return [lo + i for i in range(int(hi - lo) + 1)]
    return [float(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--strategy", action="append", choices=STRATEGIES, help="default: both")
    ap.add_argument("--trace", action="append", type=Path, help="default: the visible traces")
    ap.add_argument("--predictor", choices=("reference", "oracle"), default="reference")
    ap.add_argument(
        "--ridge",
        action="append",
        default=[],
        help="a RidgeOptions field of the refit, e.g. time_model=auto (default: the daemon's)",
    )
    ap.add_argument("--modes", type=int, default=50, help="[profiling] modes (default 50)")
    ap.add_argument("--budgets", help="lo:hi (1 W steps) or a,b,c; default by board")
    ap.add_argument(
        "--seeds",
        default="0",
        help="noise seeds, e.g. 0,1,2 (tables: first; --step-time: a line each)",
    )
    ap.add_argument("--fresh", action="store_true", help="solve every budget from scratch")
    ap.add_argument("--order", default="mixed", choices=("mixed", "up"), help="without --fresh")
    ap.add_argument("--batch-size", type=int, help="inference traces (default: smallest)")
    ap.add_argument(
        "--refine",
        type=int,
        default=0,
        help="modes a job may measure after its first commit per budget (Strategy.refine)",
    )
    ap.add_argument("--set", action="append", default=[], help="tuning knob, e.g. min_gain=0.02")
    ap.add_argument(
        "--step-time",
        action="store_true",
        help="the step-time objective: targets spread over the trace's own range instead",
    )
    ap.add_argument("--include-held-out", action="store_true", help="replay HELD_OUT too")
    ap.add_argument("--summary", action="store_true", help="aggregates only")
    args = ap.parse_args(argv)

    seeds = [int(s) for s in args.seeds.split(",")]
    traces = [load_trace(p, args.batch_size) for p in (args.trace or VISIBLE)]
    held = [t.name for t in traces if is_held_out(t.name)]
    if held and not args.include_held_out:
        print(f"skipping held-out {', '.join(held)} (--include-held-out to replay it)")
        traces = [t for t in traces if not is_held_out(t.name)]
    if args.step_time:
        for strategy in args.strategy or STRATEGIES:
            for trace in traces:
                for seed in seeds:
                    tag = f" [seed {seed}]" if len(seeds) > 1 else ""
                    res = step_time_results(strategy, trace, args, seed)
                    if not args.summary:
                        print(step_time_table(res))
                    print(step_time_line(strategy, trace.name, res) + tag, flush=True)
        return 0
    for strategy in args.strategy or STRATEGIES:
        for trace in traces:
            results = [run(strategy, trace, args, s) for s in seeds]
            if not args.summary:
                print(format_table(results[0]))
            if len(seeds) > 1 or args.summary:
                print(summary_line(strategy, trace.name, results))
            print()
    return 0


def step_time_results(
    strategy: str, trace: Trace, args: argparse.Namespace, seed: int
) -> list[TimeTargetResult]:
    """StepTimeSearch over the strategy, one new workload per target (the best time under
    each of the trace's own-range budgets, +3 %), power cap above the trace's top."""
    space = GridSpace.from_trace(trace)
    factory, fitter = (None, None)
    if strategy == "powertrain":
        factory, fitter = predictor_pair(args.predictor, trace, seed, args.ridge)
    targets = time_targets(trace, own_range_budgets(trace))
    return replay_time_targets(
        lambda: make_strategy(
            strategy, space, predictor_factory=factory, max_modes=args.modes, **knobs(args)
        ),
        trace,
        targets,
        cap_w=float(trace.power_w.max()) + 5.0,
        fitter=fitter,
        noise=NoiseModel(seed=seed),
    )


def step_time_table(res: list[TimeTargetResult]) -> str:
    """Per target: the pinned mode's true time and power against the lowest-power traced
    mode meeting the target (and the lowest among rows that are no glitch)."""
    lines = [
        f"{'target':>8s} {'chosen mode':18s} {'t_ms':>7s} {'P_W':>6s} {'least_P':>7s} "
        f"{'regular':>7s} {'excess%':>7s} {'met':>4s} {'probes':>6s}"
    ]
    for r in res:
        lines.append(
            f"{r.target_ms:8.1f} {short_mode(r.mode):18s} {r.time_ms:7.1f} {r.power_w:6.2f} "
            f"{r.best_power_w:7.2f} {r.regular_best_power_w:7.2f} "
            f"{100 * r.power_excess:7.1f} {'yes' if r.met else 'NO':>4s} {r.new_probes:6d}"
        )
    return "\n".join(lines)


def step_time_line(strategy: str, trace_name: str, res: list[TimeTargetResult]) -> str:
    """The step-time aggregates of one seed."""
    excess = [r.power_excess for r in res]
    regular = [r.regular_power_excess for r in res]
    return (
        f"{strategy:13s} {trace_name:38s} step-time targets {len(res)}: true time within "
        f"2 % of the target on {100 * np.mean([r.met for r in res]):.0f} %, power over the "
        f"lowest-power mode meeting it median {100 * np.median(excess):.1f} % "
        f"(worst {100 * max(excess):.1f} %; vs rows that are no glitch median "
        f"{100 * np.nanmedian(regular):.1f} %, worst {100 * np.nanmax(regular):.1f} %), "
        f"claimed infeasible "
        f"{sum(not r.feasible for r in res)}, probes per target "
        f"{np.mean([r.new_probes for r in res]):.1f}"
    )


def summary_line(strategy: str, trace: str, results: list[SweepResult]) -> str:
    med = [r.median_penalty for r in results]
    return (
        f"{strategy:13s} {trace:38s} median penalty {100 * np.mean(med):5.1f}% "
        f"(seeds {' '.join(f'{100 * m:.1f}' for m in med)})  "
        f"mean {100 * np.mean([r.mean_penalty for r in results]):5.1f}% "
        f"worst {100 * np.mean([r.worst_penalty for r in results]):5.1f}% "
        f"(1st commits mean {100 * np.mean([r.first_mean_penalty for r in results]):5.1f}%; "
        f"vs non-glitch rows mean "
        f"{100 * np.mean([r.consistent_mean_penalty for r in results]):5.1f}% worst "
        f"{100 * np.mean([r.consistent_worst_penalty for r in results]):5.1f}%)  "
        f"over>0.5W {100 * np.mean([r.share_over for r in results]):4.1f}%  "
        f"distinct modes {np.mean([r.distinct_modes for r in results]):5.1f}  "
        f"probes/budget {np.mean([r.probes_per_budget for r in results]):4.1f}  "
        f"over-budget probes {np.mean([r.probes_over_budget for r in results]):4.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
