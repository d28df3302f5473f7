#!/usr/bin/env python3
"""Benchmark of inference and interleaved training + inference: planner replays of the visible
inference traces through powerd.optimize.inference / interleave with emulator-like
measurement noise, over grids of rates, latency targets and budgets that include infeasible
points; and the same questions through the real daemon on the emulated board.

    tools/bench_inference.py [--compare-priors] [--quick] [--interleave-only]
    tools/bench_inference.py --daemon --scale 0.5      # held-out grid through the daemon (~5 min)
    tools/bench_inference.py --daemon-interleave --scale 0.5 --max-pairs 12   # join/leave (~4 min)

Inference alone: each grid point is a new workload (fresh samples). The transfer prior
is the inference reference (models/inference_reference.json, fitted on ResNet-18 inference),
so ResNet-18 inference is the tuning workload and MobileNet v3 inference the held-out one.
Rate changes: per (latency, budget), the rates in sequence on one workload's samples.

Interleaved: MobileNet v3 training with each inference trace; the inference prior is fitted
on the *other* inference trace; the training predictor is the bundled reference refitted
(ridge) to the samples of the training tuner (PowerTrain, 50 modes, run over the grid's
budgets before the inference job joined). "Leave" compares the training tuner's decision for
the budget (kept from before: no re-profiling) with the trace's best mode under the budget.
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import time

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize.backlog import WATCH_BATCHES
from powerd.optimize.base import Measurement
from powerd.optimize.inference import (
    RATE_CHANGE_PAIRS,
    InferenceGoal,
    InferencePlanner,
    InferenceSession,
    Pair,
    PairMeasurement,
)
from powerd.optimize.interleave import InterleaveGoal, InterleavePlanner
from powerd.predictor.batch import InferenceReference, load_prior, make_fitter
from powerd.sim.memfs import scratch_dir
from powerd.sim.trace import TRACE_DIR, Trace
from powerd_replay.inference import (
    GoalResult,
    GridOrder,
    PairMeasurer,
    PairTrace,
    TrainMeasurer,
    joint_truth,
    judge,
    judge_joint,
    replay_goals,
    replay_walk,
    solve_joint,
    solve_session,
    summarise,
)
from powerd_replay.machine import load_note, start_watch

INFER = {
    "resnet18": TRACE_DIR / "orin_agx_resnet18_imagenet_infer.csv",
    "mobilenetv3": TRACE_DIR / "orin_agx_mobilenetv3_gld23k_infer.csv",
}
TRAIN = TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv"
RATES = (5.0, 15.0, 30.0, 60.0, 120.0)
LATENCIES = (50.0, 100.0, 200.0, 400.0, None)
BUDGETS = (14.0, 17.0, 20.0, 25.0, 30.0, 40.0)
IL_RATES = (1.0, 2.0, 5.0, 10.0)
IL_LATENCIES = (500.0, 1000.0, 3000.0, None)
IL_BUDGETS = (20.0, 25.0, 30.0, 40.0)


def pct(x: float) -> str:
    return f"{x:5.1f}%"


def inference_alone(method: str, quick: bool) -> None:
    prior = load_prior(method)
    for name, path in INFER.items():
        trace = PairTrace.load(path)
        rates = RATES[::2] if quick else RATES
        goals = [InferenceGoal(r, b, lat) for r in rates for lat in LATENCIES for b in BUDGETS]
        planner = InferencePlanner(trace.modes, trace.batch_sizes, make_fitter(prior, method))
        t0 = time.perf_counter()
        measurer = PairMeasurer(trace)
        seen: list[Pair] = []

        def measure(pair: Pair, again: int = 0, m=measurer, seen=seen) -> PairMeasurement:
            seen.append(pair)
            return m(pair, again)

        res = replay_goals(planner, trace, goals, measure)
        s = summarise(res)
        # Time to a settled decision, estimated as the profiler would spend it: per pair a
        # 2 s settle after the switch plus max(4 s window, 5 batches at the goal's rate).
        settle_s, k = [], 0
        for r in res:
            pairs, k = seen[k : k + r.probes], k + r.probes
            settle_s.append(sum(2.0 + max(4.0, 5 * p.batch_size / r.goal.rate_hz) for p in pairs))
        # Points where no pair at all is within the budget cannot stay within it.
        possible = [r for r in res if (trace.p_all <= r.goal.budget_w).any()]
        within = 100.0 * np.mean([r.within_budget for r in possible]) if possible else 100.0
        no_l = [r.latency_ratio for r in res if r.feasible and r.goal.latency_ms is None]
        role = "tuning (prior fitted on it)" if name == "resnet18" else "held out"
        print(
            f"  {name:12s} [{role}] points {s['points']}, feasible {s['feasible']}: "
            f"meet latency+power {pct(s['meet_pct'])}, within budget {pct(within)} "
            f"({len(possible)} points with any pair under B), median power / optimal "
            f"{s['median_power_ratio']:.3f}, no-L median latency / best "
            f"{np.median(no_l):.3f}, windows measured median {s['median_probes']:.0f} "
            f"max {s['max_probes']} (distinct pairs max {s['max_pairs']}), "
            f"time to decision (est.) median {np.median(settle_s):.0f} s "
            f"max {max(settle_s):.0f} s, infeasible flagged {pct(s['infeasible_flagged_pct'])} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        # Rate changes on one workload: new pairs after the first rate.
        extra, zero, n, after = [], 0, 0, []
        for lat, b in itertools.product(LATENCIES, BUDGETS):
            samples: dict[Pair, PairMeasurement] = {}
            session = InferenceSession(planner, InferenceGoal(rates[0], b, lat))
            for i, r in enumerate(rates):
                if i:
                    session.set_rate(r)  # the daemon's re-solve, its rule for new pairs
                served, probes = solve_session(session, samples, PairMeasurer(trace))
                if i:
                    n += 1
                    extra.append(probes)
                    zero += probes == 0
                    after.append(judge(trace, session.goal, served, probes, 0.02))
        sa = summarise(after)
        print(
            f"  {'':12s} rate changes: {n}, re-solved with no new pair {pct(100 * zero / n)}, "
            f"new pairs per change mean {np.mean(extra):.2f} max {max(extra)} (only when no "
            f"measured pair fits the new goal); after the change: meet {pct(sa['meet_pct'])}, "
            f"within budget {pct(sa['within_budget_pct'])}, median power / optimal "
            f"{sa['median_power_ratio']:.3f}"
        )


def interleaved(quick: bool, train_refine: int = 0) -> None:
    from powerd.optimize import make_strategy
    from powerd.predictor.reference import ReferenceModel
    from powerd.predictor.transfer import fit_ridge, fit_workload
    from powerd_replay.training import GridSpace, NoiseModel, TraceMeasurer, solve_budget

    ref = ReferenceModel.load()
    train = Trace.load(TRAIN)
    mt = TrainMeasurer(train)
    # The training job was tuned alone first, by the training tuner (PowerTrain, 50 modes,
    # ridge refit) over the budgets of the grid: its samples and per-budget decisions.
    strategy = make_strategy(
        "powertrain", GridSpace.from_trace(train), predictor_factory=lambda: ref, max_modes=50
    )
    base: dict[PowerMode, Measurement] = {}
    alone: dict[float, PowerMode] = {}
    measurer = TraceMeasurer(train, NoiseModel(seed=0))
    for b in IL_BUDGETS:
        commit, _ = solve_budget(
            strategy,
            b,
            base,
            measurer,
            lambda s: fit_workload(s, ref, method="ridge", domain=train.modes_array),
            refine_room=train_refine,
        )
        alone[b] = commit.mode
    # "after leaving" below is this decision by construction: training decision quality
    print(
        "  the training tuner's decision per budget / the trace's best mode under it: "
        + ", ".join(
            f"{b:g} W {train.best_under(b).time_ms / train.lookup(alone[b]).time_ms:.3f}"
            for b in IL_BUDGETS
        )
    )
    fitted = {}

    def train_fitter(samples):
        key = frozenset(samples)
        if key not in fitted:
            fitted.clear()
            fitted[key] = fit_ridge(samples, ref, domain=train.modes_array) if samples else ref
        return fitted[key]

    for name, path in INFER.items():
        other = PairTrace.load(INFER["mobilenetv3" if name == "resnet18" else "resnet18"])
        prior = InferenceReference.fit(other.modes_all, other.b_all, other.t_all, other.p_all)
        infer = PairTrace.load(path)
        planner = InterleavePlanner(
            infer.modes, infer.batch_sizes, train_fitter, make_fitter(prior, "infer-ref")
        )
        rates = IL_RATES[::2] if quick else IL_RATES
        t0 = time.perf_counter()
        results, leave = [], []
        for r, lat, b in itertools.product(rates, IL_LATENCIES, IL_BUDGETS):
            goal = InterleaveGoal(r, b, lat)
            tr, inf = dict(base), {}
            served, probes = solve_joint(planner, goal, tr, inf, mt, PairMeasurer(infer))
            truth = joint_truth(train, infer, goal, infer.modes)
            results.append(judge_joint(truth, goal, served, probes, 0.02))
            # The inference job leaves: training returns to its own decision for B (fitted
            # before the inference job joined: no re-profiling).
            true_best = train.best_under(b)
            if true_best is not None:
                leave.append(true_best.time_ms / train.lookup(alone[b]).time_ms)
        feas = [x for x in results if x.feasible]
        meet = 100 * np.mean([x.latency_ok and x.power_ok for x in feas]) if feas else 0.0
        share = [x.bound_share for x in feas if x.latency_ok and x.power_ok]
        print(
            f"  mobilenetv3-train + {name}-infer: points {len(results)}, feasible {len(feas)}: "
            f"meet latency+power {pct(meet)}, within budget "
            f"{pct(100 * np.mean([x.power_ok for x in results]))}, training throughput "
            f"(work-conserving) / best pair's bound: mean {np.mean(share):.3f} "
            f"median {np.median(share):.3f}; strict-cycle k*r/b / own bound mean "
            f"{np.nanmean([x.cycle_share for x in feas]):.3f}; joint pairs profiled median "
            f"{np.median([x.probes for x in results]):.0f} max "
            f"{max(x.probes for x in results)}; after the inference job leaves, training "
            f"throughput / best mode under B: mean {np.mean(leave):.3f} min "
            f"{np.min(leave):.3f} ({time.perf_counter() - t0:.1f} s)"
        )


def emulated(duration_s: float, scale: float) -> None:
    """Both jobs through the real client on the emulated board (stand-in daemon serving a
    fixed b at the board's default mode): client-measured p99 and training steps/s vs the
    bound, for a few (b, rate) points."""
    import tempfile
    import threading
    from pathlib import Path

    from powerd.optimize.interleave import interleaved_latency_ms, throughput_bound_hz
    from powerd.sim.emulator import Emulator
    from powerd.sim.fake_daemon import FakeDaemon, FakeDecision
    from powerd.sim.gpu import Gpu, idle_power
    from powerd.sim.inference_job import load_batch_traces, run_inference_job
    from powerd.sim.job import run_training_job
    from powerd.sim.tree import build_tree

    train = Trace.load(TRAIN)
    batches = load_batch_traces(INFER["resnet18"])
    for b, rate in ((4, 20.0), (16, 10.0), (32, 10.0)):
        with tempfile.TemporaryDirectory(prefix="powerd-emu-", dir=scratch_dir()) as d:
            root = Path(d) / "board"
            build_tree(root, "orin-agx", train)
            with Emulator(root, "orin-agx", train, time_scale=0.1) as emu:
                gpu = Gpu(emu, idle_power(batches[1]), time_scale=scale)
                mode = emu.effective_mode()
                ep = f"ipc://{d}/powerd.sock"
                out: dict = {}
                wall = duration_s * scale
                with FakeDaemon(ep, FakeDecision(batch_size=b)):
                    th = threading.Thread(
                        target=lambda kw, o=out: o.setdefault("r", run_training_job(**kw)),
                        args=(
                            dict(
                                root=root,
                                trace=train,
                                budget_w=20,
                                workload="mobilenet",
                                time_scale=scale,
                                endpoint=ep,
                                stay_tuned_s=wall,
                                max_s=wall,
                                gpu=gpu,
                            ),
                        ),
                    )
                    th.start()
                    inf = run_inference_job(gpu, batches, rate, duration_s=duration_s, endpoint=ep)
                    th.join()
                tr = [s for s in gpu.log if s.kind == "training"]
                ib = [s for s in gpu.log if s.kind.startswith("inference")]
                start, stop = tr[0].start, min(tr[-1].end, ib[-1].end)
                steps = sum(s.end <= stop for s in tr) / ((stop - start) / scale)
                t_tr, t_inf = train.lookup(mode).time_ms, batches[b].lookup(mode).time_ms
                bound = float(throughput_bound_hz(b, rate, t_inf, t_tr))
                worst = float(interleaved_latency_ms(b, rate, t_inf, t_tr))
                print(
                    f"  b={b:2d} r={rate:4.0f}/s at {mode}: training {steps:.2f} steps/s = "
                    f"{steps / bound:.3f} of the bound {bound:.2f}; inference p99 "
                    f"{inf.p99_ms(skip=b):.0f} ms vs worst case {worst:.0f} ms"
                )


# The grid through the daemon (trace units): every (latency, budget, rate) of one job that
# changes its goal, plus the first goal of a few fresh workloads (fresh profiling).
D_RATES = (30.0, 100.0, 250.0)
D_LATENCIES = (400.0, 100.0, None)
D_BUDGETS = (20.0, 15.0, 25.0)
D_FRESH = ((30.0, 400.0, 20.0), (250.0, None, 25.0))
D_QUICK = dict(rates=(30.0, 250.0), latencies=(400.0, None), budgets=(20.0, 15.0))


def walks(n: int, methods: tuple[str, ...], rate_change_pairs: int = RATE_CHANGE_PAIRS) -> None:
    """The daemon grid's walk (--daemon) replayed at planner level: n walks per trace and
    prior, the first in the daemon's order, the others with the rates, latencies and
    budgets each shuffled. Points feasible only through a glitch row of the trace (see
    PairTrace.outliers) count as infeasible. `rate_change_pairs`: the daemon's
    `[inference] rate_change_pairs`."""
    base = GridOrder(D_RATES, D_LATENCIES, D_BUDGETS)
    for method in methods:
        prior = load_prior(method)
        for name, path in INFER.items():
            trace = PairTrace.load(path)
            planner = InferencePlanner(trace.modes, trace.batch_sizes, make_fitter(prior, method))
            t0 = time.perf_counter()
            rows: list[tuple[int, str, GoalResult]] = []
            for k in range(n):
                order = base if k == 0 else base.shuffled(k)
                meas = PairMeasurer(trace, seed=f"walk{k}")
                walk = replay_walk(planner, trace, order, meas, rate_change_pairs=rate_change_pairs)
                rows += [(k, kind, r) for kind, r in walk]
            feas = [(k, kind, r) for k, kind, r in rows if r.feasible]
            met = [r.latency_ok and r.power_ok for _, _, r in feas]
            per_walk = [
                np.mean([r.latency_ok and r.power_ok for kk, _, r in feas if kk == k])
                for k in range(n)
            ]
            missed: dict[str, int] = {}
            for _, kind, r in feas:
                if not (r.latency_ok and r.power_ok):
                    missed[kind] = missed.get(kind, 0) + 1
            new = {
                True: [r.probes for _, kind, r in rows if kind == "rate" and r.feasible],
                False: [r.probes for _, kind, r in rows if kind == "rate" and not r.feasible],
            }
            ratio = [r.power_ratio for _, _, r in feas if r.goal.latency_ms is not None]
            role = (
                "prior fitted on it"
                if name == "resnet18" and method == "infer-ref"
                else ("held out" if name == "mobilenetv3" else "prior never saw inference")
            )
            print(
                f"  {name:12s} prior {method} [{role}]: {n} walks, {len(rows)} points, "
                f"feasible {len(feas)}: met {pct(100 * np.mean(met))} (walks at 100 %: "
                f"{sum(x == 1.0 for x in per_walk)}/{n}, worst walk {pct(100 * min(per_walk))}), "
                f"misses by change {missed or 0}, all points within the budget "
                f"{pct(100 * np.mean([r.within_budget for _, _, r in rows]))}, median power / "
                f"optimal {np.median(ratio):.3f}; windows per rate change: feasible mean "
                f"{np.mean(new[True]):.2f} (none {pct(100 * np.mean([x == 0 for x in new[True]]))}"
                f"), infeasible mean {np.mean(new[False]):.2f} "
                f"({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )


def oracle(batches: dict, rate: float, latency: float | None, budget: float) -> dict:
    """Brute force over the trace for the goal: the least-power pair meeting latency, drain
    and budget (the least latency under the budget without a target), and the least
    worst-case latency of any pair that drains within the budget (what an infeasible point
    should be served with)."""
    best, best_lat = None, None
    for b, tr in batches.items():
        for row in tr.rows:
            lat = (b - 1) * 1000.0 / rate + row.time_ms
            if row.power_w > budget or row.time_ms > 0.9 * b * 1000.0 / rate:
                continue
            best_lat = lat if best_lat is None else min(best_lat, lat)
            if latency is not None and lat > latency:
                continue
            key = (row.power_w, lat) if latency is not None else (lat, row.power_w)
            if best is None or key < best[0]:
                best = (key, b, row)
    return {
        "feasible": best is not None,
        "power_w": None if best is None else best[2].power_w,
        "latency_ms": None if best is None else best[0][0 if latency is None else 1],
        "b": None if best is None else best[1],
        "best_latency_ms": best_lat,
    }


def _job_of(st: dict, job_id: str | None) -> dict | None:
    return next((j for j in st["jobs"] if j["id"] == job_id), None)


def _settle(eb, client, scale: float, budget: float, timeout_s: float) -> dict | None:
    """Poll status until the job's phase is tuned (or idle: nothing within the budget) for
    the goal just set; the decision does not change after that (the planner re-derives the
    same answer from the same samples). Returns the status of the job then."""
    deadline = time.monotonic() + timeout_s
    want_rate = client.rate_hz / scale
    while time.monotonic() < deadline:
        st = eb.status()
        job = _job_of(st, client.job_id)
        if (
            job is not None
            and job["phase"] in ("tuned", "idle")
            and job.get("rate_hz") is not None
            and abs(job["rate_hz"] - want_rate) <= 1e-6 * want_rate
            and job["budget_w"] == budget
            and st["mode"] is not None
        ):
            return {"job": job, "mode": st["mode"], "at": time.monotonic()}
        if client.error is not None:
            raise client.error
        time.sleep(0.05)
    return None


def _drained(
    eb, client, gpu, t0: float, b: int, span_s: float, timeout_s: float
) -> tuple[float, bool]:
    """When a steady-state window may open for a job served a fit pair: a backlog drain is a
    transient at a faster pair, and the planner needs WATCH_BATCHES batches of the new size
    spanning the latency target, after the switch has settled, to see one (the requests
    queued while the client switches batch size can start one). So: once that many batches
    ran, the job is not draining and less than a batch is queued (t0 itself if no wait was
    needed); and whether it drained. Without a target a drain starts only once the queue
    holds a batch of the drain pair, so a backlog left by an infeasible goal (growing for
    minutes) is waited for too."""
    deadline = time.monotonic() + timeout_s
    waited = drained = False
    watched = t0 + eb.config.profiling.settle_ms / 1000.0
    while time.monotonic() < deadline:
        ends = [
            sl.end for sl in list(gpu.log) if sl.start >= watched and sl.kind == f"inference/{b}"
        ]
        # two batches more: the planner reads them at its next tick
        if len(ends) >= WATCH_BATCHES + 2 and ends[-1] - ends[0] >= span_s:
            break
        waited = True
        time.sleep(0.02)
    while time.monotonic() < deadline:
        job = _job_of(eb.status(), client.job_id)
        if job is None:
            break
        if job.get("draining_backlog"):
            drained = True
        elif client.backlog < b:
            break
        waited = True
        time.sleep(0.05)
    return (time.monotonic() if waited else t0), drained


def _steady(client, t0: float, rate: float, b: int, scale: float) -> tuple[list, list, float]:
    """Client-measured latencies (trace ms) of the requests that arrive in a steady-state
    window after t0: at least 150 requests and 6 batches (trace time), capped at 40 trace s.
    A request still unserved a while after the window (a queue that does not drain) counts
    with the time it has waited so far."""
    # the client learns a new batch size from its next state update, and the requests
    # queued meanwhile drain: the window opens once it runs batches of size b with less
    # than a batch waiting (or after 20 trace s: a queue that does not drain)
    limit = time.monotonic() + 20.0 * scale
    while time.monotonic() < limit:
        first = next((q for q in client.since(t0) if q.batch_size == b), None)
        if first is not None and client.backlog < b:
            break
        time.sleep(0.01)
    t0 = max(t0, time.monotonic())
    span = min(40.0, max(150.0 / rate, 6.0 * b / rate)) * scale
    time.sleep(max(0.0, t0 + span - time.monotonic()))
    # the client logs arrivals when its loop runs: wait until it has logged the window's
    t1 = time.monotonic() + 4.0 * (b / rate + 0.5) * scale
    while time.monotonic() < t1 and not any(a > t0 + span for a in client.arrivals[-8:]):
        time.sleep(0.02)
    arrived = [a for a in client.arrivals_since(t0) if a <= t0 + span]
    deadline = time.monotonic() + 4.0 * (b / rate + 0.5) * scale
    while time.monotonic() < deadline:
        served = {q.arrival: q for q in client.since(t0)}
        if all(a in served for a in arrived):
            break
        time.sleep(0.02)
    served = {q.arrival: q for q in client.since(t0)}
    now = time.monotonic()
    lats = [((served[a].end if a in served else now) - a) / scale * 1000.0 for a in arrived]
    return lats, [served[a] for a in arrived if a in served], t0


def through_daemon(scale: float, max_pairs: int, quick: bool, daemon_log: str | None) -> None:
    """The held-out inference workload (MobileNet v3 inference on Orin AGX; the daemon's prior
    is fitted on ResNet-18 inference) through the real daemon on the emulated board: one job
    moved across the grid (budget and rate changes through the client; a latency change is a
    new registration of the same workload), plus fresh workloads. Each point: time to the
    settled decision, then a steady-state window of client-measured request latencies and
    the true in-batch power of the pairs that served them (trace)."""
    import tempfile

    from powerd.sim.gpu import Gpu, idle_power
    from powerd.sim.harness import EmulatedBoard
    from powerd.sim.inference_job import InferenceClient, load_batch_traces

    batches = load_batch_traces(INFER["mobilenetv3"])
    g = D_QUICK if quick else dict(rates=D_RATES, latencies=D_LATENCIES, budgets=D_BUDGETS)
    fresh = D_FRESH[:1] if quick else D_FRESH
    rows: list[dict] = []
    t_start = time.monotonic()
    # tmpfs: the emulator writes its power files every few ms under its lock; on a disk
    # shared with other jobs' I/O one write can stall for 100 ms, and every batch with it
    with tempfile.TemporaryDirectory(prefix="powerd-bench-", dir=scratch_dir()) as d:
        cfg = {"inference": {"max_pairs": max_pairs}}
        eb = EmulatedBoard(
            "orin-agx", batches[1], time_scale=scale, workdir=d, config=cfg, daemon_log=daemon_log
        )
        with eb:
            gpu = Gpu(eb.emulator, idle_power(batches[1]), time_scale=scale)

            def point(client, kind: str, workload: str, before: int | None) -> None:
                rate, lat, budget = client.rate_hz, client.latency_ms, client.budget_w
                t_change = time.monotonic()
                got = _settle(eb, client, scale, budget, timeout_s=600 * scale)
                goal = f"r={rate:g}/s L={lat if lat is not None else '-'} ms B={budget:g} W"
                if got is None:
                    print(f"  {kind:7s} {goal}: no decision in {600:g} trace s", flush=True)
                    rows.append({"kind": kind, "decided": False})
                    return
                job, b = got["job"], got["job"]["batch_size"]
                # a backlog drain (at a fit decision) is a transient at a faster fit pair:
                # steady state opens once one would have shown and ended
                t_open, drained = got["at"], False
                if job["feasible"]:
                    span = (lat or 0.0) / 1000.0 * scale
                    t_open, drained = _drained(eb, client, gpu, t_open, b, span, 60 * scale)
                lats, reqs, t_w = _steady(client, t_open, rate, b, scale)
                p99 = float(np.percentile(lats, 99)) if lats else float("nan")
                p50 = float(np.percentile(lats, 50)) if lats else float("nan")
                # every batch that ran in the window (also those of requests that arrived
                # before it: a queue that does not drain serves none of the window's own)
                used = {
                    (int(sl.kind.split("/")[1]), sl.mode)
                    for sl in list(gpu.log)
                    if sl.start >= t_w and sl.kind.startswith("inference/")
                }
                power = max(batches[bb].lookup(m).power_w for bb, m in used) if used else math.nan
                o = oracle(batches, rate, lat, budget)
                feasible = job["feasible"]
                best = job.get("best_latency_ms")
                row = {
                    "kind": kind,
                    "workload": workload,
                    "decided": True,
                    "rate": rate,
                    "latency": lat,
                    "budget": budget,
                    "truth": o,
                    "feasible_flag": feasible,
                    "best_latency_ms": None if best is None else best / scale,
                    "b": b,
                    "p99": p99,
                    "power": power,
                    "pairs": job["pairs_profiled"],
                    "new_pairs": None if before is None else job["pairs_profiled"] - before,
                    "settle_s": (got["at"] - t_change) / scale,
                    "drain_s": (t_open - got["at"]) / scale,
                    "drained": drained,
                    "switches": len(used),
                }
                row["pow_ok"] = power <= budget + 0.5
                # the decision on the trace's noise-free values: does the served pair fit?
                tv = batches[b].lookup(PowerMode(**got["mode"]))
                true_lat = (b - 1) * 1000.0 / rate + tv.time_ms
                # without a target, latency counts as met when the queue drains: the client
                # p99 within 2x the served pair's worst case + 100 ms (timing noise of short
                # batches); a queue that grows is seconds above
                drains = 2.0 * true_lat + 100.0
                row["lat_ok"] = p99 <= (1.05 * lat if lat is not None else drains)
                row["pair_fits"] = (
                    tv.time_ms <= 0.9 * b * 1000.0 / rate
                    and tv.power_w <= budget + 0.5
                    and (lat is None or true_lat <= 1.05 * lat)
                )
                rows.append(row)
                ratio = f"{power / o['power_w']:.3f}" if o["feasible"] and lat is not None else "-"
                flag = (
                    f"feasible={feasible}"
                    if feasible
                    else f"feasible={feasible} best_latency "
                    f"{row['best_latency_ms'] or float('nan'):.0f} ms "
                    f"(trace best {o['best_latency_ms'] or float('nan'):.0f})"
                )
                print(
                    f"  {kind:7s} {goal} [truth {'feasible' if o['feasible'] else 'INFEASIBLE'}]"
                    f": {flag}, b={b}, p99 {p99:.0f} ms (p50 {p50:.0f}, {len(lats)} req, "
                    f"{'ok' if row['lat_ok'] else 'MISS'}), true power {power:.2f} W "
                    f"({'ok' if row['pow_ok'] else 'OVER'}), /optimal {ratio}, pairs "
                    f"{job['pairs_profiled']}"
                    + ("" if row["new_pairs"] is None else f" (+{row['new_pairs']})")
                    + f", served pair on the trace: {true_lat:.0f} ms, t/drain "
                    f"{tv.time_ms / (0.9 * b * 1000.0 / rate):.2f}"
                    + f", settled {row['settle_s']:.1f} trace s "
                    + (
                        f"(window {row['drain_s']:.1f} s later"
                        + (", after a drain) " if drained else ") ")
                        if row["drain_s"] > 0
                        else ""
                    )
                    + f"[{time.monotonic() - t_start:.0f} s]",
                    flush=True,
                )

            sizes = {b: t for b, t in batches.items()}
            for i, (rate, lat, budget) in enumerate(fresh):
                name = f"mobilenetv3-infer-{i}"
                with InferenceClient(
                    gpu,
                    sizes,
                    rate,
                    budget_w=budget,
                    latency_ms=lat,
                    workload=name,
                    endpoint=eb.endpoint,
                    seed=i,
                ) as client:
                    point(client, "fresh", name, None)
                    if i:
                        continue
                    # the first workload moves through the grid: latency, then budget, then rate
                    for lat in g["latencies"]:
                        if lat != client.latency_ms:
                            before = rows[-1].get("pairs")
                            client.set_latency(lat)
                            point(client, "latency", name, before)
                        for budget in g["budgets"]:
                            if budget != client.budget_w:
                                before = rows[-1].get("pairs")
                                client.set_budget(budget)
                                point(client, "budget", name, before)
                            for rate in g["rates"]:
                                if rate != client.rate_hz:
                                    before = rows[-1].get("pairs")
                                    client.set_rate(rate)
                                    point(client, "rate", name, before)
            costs = (eb.status() or {}).get("inference_profiling") or {}
    _daemon_summary(rows, time.monotonic() - t_start, costs)


def _cost_line(costs: dict[str, dict]) -> str:
    """Profiling time above the budget (+ 1 W), pooled over the workloads' windows."""
    total = sum(c["seconds"] for c in costs.values())
    if not total:
        return "-"
    above = sum(c["share_above_budget"] * c["seconds"] for c in costs.values()) / total
    above1 = sum(c["share_above_budget_1w"] * c["seconds"] for c in costs.values()) / total
    pairs = sum(c["modes_measured"] for c in costs.values())
    return (
        f"{pct(100 * above1)} above budget + 1 W (above the budget: {pct(100 * above)}) of "
        f"{total:.1f} s of {pairs} windows (emulated seconds, all readings of each window)"
    )


def _daemon_summary(rows: list[dict], wall_s: float, costs: dict[str, dict]) -> None:
    ok = [r for r in rows if r["decided"]]
    feas = [r for r in ok if r["truth"]["feasible"]]
    infeas = [r for r in ok if not r["truth"]["feasible"]]
    meet = [r["lat_ok"] and r["pow_ok"] for r in feas]
    ratios = [r["power"] / r["truth"]["power_w"] for r in feas if r["latency"] is not None]
    no_l = [r["p99"] / r["truth"]["latency_ms"] for r in feas if r["latency"] is None]
    fresh = [r for r in ok if r["kind"] == "fresh"]
    rate = [r for r in ok if r["kind"] == "rate"]
    flagged = [r for r in infeas if r["feasible_flag"] is False]
    best = [
        r["best_latency_ms"] / r["truth"]["best_latency_ms"]
        for r in flagged
        if r["best_latency_ms"] and r["truth"]["best_latency_ms"]
    ]
    print(
        f"  points {len(rows)} ({len(rows) - len(ok)} undecided), feasible {len(feas)}, "
        f"infeasible {len(infeas)}"
    )
    print(
        f"  feasible points meeting latency (client p99 <= 1.05 L; no L: the queue drains) and "
        f"power (true <= B+0.5 W): "
        f"{pct(100 * np.mean(meet)) if meet else '-'} ({sum(meet)}/{len(meet)})"
    )
    waits = [r["drain_s"] for r in ok if r["drain_s"] > 0]
    print(
        f"  points whose window waited for the planner's backlog watch (8 batches, the "
        f"latency target's span) and the queue: {len(waits)}"
        + (f" (longest wait {max(waits):.1f} trace s)" if waits else "")
        + f"; of them after a backlog drain: {sum(r['drained'] for r in ok)}"
    )
    fits = [r["pair_fits"] for r in feas]
    print(
        f"  feasible points whose served pair fits on the trace's noise-free values (the "
        f"decision, without the emulator's timing noise): {pct(100 * np.mean(fits))} "
        f"({sum(fits)}/{len(fits)})"
    )
    print(
        f"  all points within the power budget: {pct(100 * np.mean([r['pow_ok'] for r in ok]))}"
        f" ({sum(r['pow_ok'] for r in ok)}/{len(ok)})"
    )
    if ratios:
        print(
            f"  median true power / optimal pair's (feasible, with L): {np.nanmedian(ratios):.3f} "
            f"(max {np.nanmax(ratios):.3f}, n={len(ratios)})"
        )
    if no_l:
        print(
            f"  without L: client p99 / the trace's least latency under B: median "
            f"{np.median(no_l):.3f} (n={len(no_l)})"
        )
    print(
        f"  pairs profiled per new workload: {[r['pairs'] for r in fresh]}; by the end of the "
        f"moving job: {max(r['pairs'] for r in ok)}\n"
        f"  rate changes: {len(rate)}, re-solved with no new pair "
        f"{sum(r['new_pairs'] == 0 for r in rate)}, new pairs max "
        f"{max((r['new_pairs'] for r in rate), default=0)}\n"
        f"  profiling time: {_cost_line(costs)}\n"
        f"  time to a settled decision (trace s): fresh {[round(r['settle_s']) for r in fresh]}; "
        f"changes median {np.median([r['settle_s'] for r in ok if r['kind'] != 'fresh']):.1f} "
        f"max {max(r['settle_s'] for r in ok if r['kind'] != 'fresh'):.1f}\n"
        f"  infeasible points flagged feasible=False: {len(flagged)}/{len(infeas)}; their "
        f"best_latency_ms / the trace's least latency under B: "
        f"{', '.join(f'{x:.2f}' for x in best) or '-'}\n"
        f"  wall time {wall_s:.0f} s"
    )


# ---- interleaved training + inference through the daemon ---------------------------------

IL_DAEMON_BUDGET = 25.0
IL_DAEMON_POINTS = ((5.0, 1000.0), (10.0, 1000.0), (2.0, 3000.0))  # (rate /s, latency ms)


class _Trainer:
    """An emulated training job through the real client, on the emulated GPU, until stopped:
    the time of every step's end (time.monotonic())."""

    def __init__(self, gpu, trace: Trace, budget_w: float, workload: str, endpoint: str):
        import threading

        from powerd.sim.job import gpu_power

        self.gpu, self.trace, self.ends = gpu, trace, []
        self.job = None
        self._stop = threading.Event()
        self._power = gpu_power(trace)
        self._req = dict(budget_w=budget_w, workload=workload, endpoint=endpoint)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> _Trainer:
        import powerd

        self.job = powerd.request(**self._req)
        self._thread.start()
        return self

    def _run(self) -> None:
        import random

        rng = random.Random(1)
        while not self._stop.is_set():
            jitter = max(0.5, rng.gauss(1.0, 0.02))
            self.gpu.run("training", lambda m: self.trace.lookup(m).time_ms, self._power, jitter)
            self.job.step()
            self.ends.append(time.monotonic())

    def steps_between(self, t0: float, t1: float) -> int:
        return sum(t0 < e <= t1 for e in self.ends)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.job.close()


def _il_best(train: Trace, infer: dict, modes, rate: float, latency: float | None, budget: float):
    """Brute force over the board's modes and batch sizes: the largest work-conserving bound
    (1 - r t_inf / b) / t_tr (steps/s) among pairs meeting power max(P_tr, P_inf) <= B, drain
    t_inf <= 0.9 b/r, a cycle with room for a step (t_inf + t_tr <= b/r) and latency
    (b-1)/r + t_tr + t_inf <= L."""
    best = None
    for m in modes:
        tr = train.lookup(m)
        for b, bt in infer.items():
            row = bt.lookup(m)
            cyc = b * 1000.0 / rate
            if max(tr.power_w, row.power_w) > budget or row.time_ms > 0.9 * cyc:
                continue
            if row.time_ms + tr.time_ms > cyc:
                continue
            if latency is not None and (b - 1) * 1000.0 / rate + tr.time_ms + row.time_ms > latency:
                continue
            bound = (1 - rate * row.time_ms / 1000.0 / b) / (tr.time_ms / 1000.0)
            if best is None or bound > best[0]:
                best = (bound, m, b)
    return best


def _bound(train: Trace, infer: dict, mode, b: int, rate: float) -> float:
    t_inf = infer[b].lookup(mode).time_ms / 1000.0
    return (1 - rate * t_inf / b) / (train.lookup(mode).time_ms / 1000.0)


def _wait_status(eb, pred, timeout_s: float, period_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = eb.status()
        if pred(st):
            return st, time.monotonic()
        time.sleep(period_s)
    return None, time.monotonic()


def _steps_per_s(trainer: _Trainer, t0: float, t1: float, scale: float) -> float:
    return trainer.steps_between(t0, t1) / ((t1 - t0) / scale)


def _hiccup(trainer: _Trainer, t0: float, t1: float, scale: float) -> float:
    """The longest gap between training steps in [t0, t1], trace ms."""
    ends = [e for e in trainer.ends if t0 - 5 <= e <= t1]
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False) if b >= t0]
    return max(gaps) / scale * 1000.0 if gaps else float("nan")


def interleaved_daemon(scale: float, max_pairs: int, modes: int, daemon_log: str | None) -> None:
    """MobileNet v3 training with each inference workload through the real daemon: the
    training job tuned alone, the inference job joins (the switch: join to the interleaved
    mode pinned, the longest training step gap), each (rate, latency) point measured in
    steady state (training steps/s vs the work-conserving bound at the chosen pair and at the
    best pair under the budget, client p99, true power), then the inference job leaves (the
    switch back, the training job's mode vs its alone decision and the best under B)."""
    import tempfile

    from powerd.modes import PowerMode
    from powerd.sim.gpu import Gpu, idle_power
    from powerd.sim.harness import EmulatedBoard
    from powerd.sim.inference_job import InferenceClient, load_batch_traces

    train = Trace.load(TRAIN)
    budget = IL_DAEMON_BUDGET
    shares_own, shares_best = [], []
    for name, path in (("mobilenetv3", INFER["mobilenetv3"]), ("resnet18", INFER["resnet18"])):
        infer = load_batch_traces(path, batch_sizes=(1, 4, 16))
        board_modes = [r.mode for r in infer[1].rows]
        t_start = time.monotonic()
        held = "held out" if name == "mobilenetv3" else "in-sample inference prior"
        print(f"  mobilenetv3-train + {name}-infer ({held}), B={budget:g} W:", flush=True)
        with tempfile.TemporaryDirectory(prefix="powerd-il-", dir=scratch_dir()) as d:
            cfg = {"inference": {"max_pairs": max_pairs}, "profiling": {"modes": modes}}
            eb = EmulatedBoard(
                "orin-agx",
                infer[1],
                time_scale=scale,
                workdir=d,
                config=cfg,
                strategy="powertrain",
                daemon_log=daemon_log,
            )
            with eb:
                gpu = Gpu(eb.emulator, idle_power(infer[1]), time_scale=scale)
                trainer = _Trainer(gpu, train, budget, f"mobilenetv3-train-{name}", eb.endpoint)
                trainer.start()
                tid = trainer.job.id

                def train_tuned(st, tid=tid):
                    j = _job_of(st, tid)
                    return st["planner"] == "training" and j is not None and j["phase"] == "tuned"

                st, t_alone = _wait_status(eb, train_tuned, 600 * scale)
                if st is None:
                    print("    training never tuned", flush=True)
                    trainer.stop()
                    continue
                alone = PowerMode(**st["mode"])
                best_m = min(
                    (m for m in board_modes if train.lookup(m).power_w <= budget),
                    key=lambda m: train.lookup(m).time_ms,
                )
                t_best, t_alone_ms = train.lookup(best_m).time_ms, train.lookup(alone).time_ms
                time.sleep(10 * scale)
                alone_sps = _steps_per_s(trainer, t_alone, time.monotonic(), scale)
                print(
                    f"    training alone: tuned after {(t_alone - t_start) / scale:.0f} trace s, "
                    f"{_job_of(st, tid)['profiled_modes']} modes profiled; {alone} true "
                    f"{t_alone_ms:.1f} ms/step vs best under B {t_best:.1f} ms "
                    f"(decision quality {t_best / t_alone_ms:.3f}); measured {alone_sps:.2f} "
                    f"steps/s vs trace {1000 / t_alone_ms:.2f}",
                    flush=True,
                )
                client = None
                for i, (rate, lat) in enumerate(IL_DAEMON_POINTS):
                    t0 = time.monotonic()
                    if client is None:
                        client = InferenceClient(
                            gpu,
                            infer,
                            rate,
                            budget_w=budget,
                            latency_ms=lat,
                            workload=f"{name}-infer",
                            endpoint=eb.endpoint,
                        ).start()
                    else:
                        if lat != client.latency_ms:
                            client.set_latency(lat)
                        client.set_rate(rate)
                    want = rate / scale

                    def il_tuned(st, client=client, want=want):
                        j = _job_of(st, client.job_id)
                        pl = st["tuner"] or {}
                        return (
                            st["planner"] == "interleave"
                            and pl.get("state") == "tuned"
                            and j is not None
                            and j.get("rate_hz") is not None
                            and abs(j["rate_hz"] - want) <= 1e-6 * want
                        )

                    if i == 0:
                        # the switch: join -> the first interleaved mode pinned
                        st1, t_first = _wait_status(
                            eb,
                            lambda st, alone=alone: (
                                st["planner"] == "interleave"
                                and st["mode"] is not None
                                and PowerMode(**st["mode"]) != alone
                            ),
                            60 * scale,
                            period_s=0.01,
                        )
                    st, t_set = _wait_status(eb, il_tuned, 600 * scale)
                    if st is None:
                        print(f"    r={rate:g}/s L={lat:g} ms: no decision", flush=True)
                        continue
                    mode = PowerMode(**st["mode"])
                    ij = _job_of(st, client.job_id)
                    b = ij["batch_size"]
                    t_w = time.monotonic()
                    lats, reqs, t_w = _steady(client, t_w, rate, b, scale)
                    t_w1 = time.monotonic()
                    sps = _steps_per_s(trainer, t_w, t_w1, scale)
                    # GPU time not used by either job: gate round trips and the emulated
                    # jobs' own loops (a perfect work-conserving schedule leaves none)
                    busy = sum(
                        min(sl.end, t_w1) - max(sl.start, t_w)
                        for sl in list(gpu.log)
                        if sl.end > t_w and sl.start < t_w1
                    )
                    idle = 1.0 - busy / (t_w1 - t_w)
                    p99 = float(np.percentile(lats, 99)) if lats else float("nan")
                    used = {(q.batch_size, q.mode) for q in reqs}
                    p_true = (
                        max(
                            max(infer[bb].lookup(m).power_w, train.lookup(m).power_w)
                            for bb, m in used
                        )
                        if used
                        else math.nan
                    )
                    own = _bound(train, infer, mode, b, rate)
                    best = _il_best(train, infer, board_modes, rate, lat, budget)
                    s_own = sps / own
                    s_best = sps / best[0] if best else math.nan
                    shares_own.append(s_own)
                    if best:
                        shares_best.append(s_best)
                    join = ""
                    if i == 0:
                        join = (
                            f"; join->interleaved mode {(t_first - t0) * 1000:.0f} ms wall, "
                            f"->settled {(t_set - t0) / scale:.0f} trace s, longest training "
                            f"step gap at the join {_hiccup(trainer, t0, t0 + 2.0, scale):.0f} "
                            f"ms vs {t_alone_ms:.0f}"
                            if st1 is not None
                            else "; interleaved mode never seen"
                        )
                    print(
                        f"    r={rate:g}/s L={lat:g} ms: {mode} b={b} "
                        f"({(st['tuner'] or {}).get('joint_probes')} joint probes): training "
                        f"{sps:.2f} steps/s = {s_own:.3f} of the bound at this pair "
                        f"({own:.2f}), {s_best:.3f} of the best pair's under B "
                        f"({best[0] if best else float('nan'):.2f}), GPU idle {100 * idle:.1f} %; "
                        f"inference p99 {p99:.0f} ms "
                        f"vs L {lat:g} ({'ok' if p99 <= 1.05 * lat else 'MISS'}), feasible="
                        f"{ij['feasible']}; true max power {p_true:.2f} W "
                        f"({'ok' if p_true <= budget + 0.5 else 'OVER'}){join}",
                        flush=True,
                    )
                # the inference job leaves
                marker = eb.daemon_log.read_text().count("\n")
                t_leave = time.monotonic()
                client.stop()
                st, t_back = _wait_status(
                    eb,
                    lambda st, alone=alone: train_tuned(st) and PowerMode(**st["mode"]) == alone,
                    60 * scale,
                    period_s=0.01,
                )
                st_any, _ = _wait_status(eb, train_tuned, 60 * scale)
                back = None if st_any is None else PowerMode(**st_any["mode"])
                time.sleep(10 * scale)
                t_end = time.monotonic()
                sps = _steps_per_s(trainer, t_end - 8 * scale, t_end, scale)
                log_tail = eb.daemon_log.read_text().splitlines()[marker:]
                pat = r"tuner: measured|measured .* b=\d+|interleaved probe"
                reprof = [ln for ln in log_tail if re.search(pat, ln)]
                t_back_ms = train.lookup(back).time_ms if back else math.nan
                print(
                    f"    inference left: back to {back} "
                    f"({'the alone decision' if back == alone else 'NOT the alone decision'}) "
                    + (
                        f"{(t_back - t_leave) * 1000:.0f} ms wall after close"
                        if st is not None
                        else "(not the alone mode)"
                    )
                    + f", longest training step gap "
                    f"{_hiccup(trainer, t_leave, t_leave + 2.0, scale):.0f} ms; training "
                    f"{sps:.2f} steps/s measured, true {t_back_ms:.1f} ms/step = "
                    f"{t_best / t_back_ms:.3f} of the best mode under B (measured "
                    f"{sps * t_best / 1000:.3f}); re-profiling log lines: {len(reprof)}",
                    flush=True,
                )
                trainer.stop()
                costs = (eb.status() or {}).get("inference_profiling") or {}
                print(f"    inference profiling time: {_cost_line(costs)}", flush=True)
        print(f"    ({time.monotonic() - t_start:.0f} s)", flush=True)
    if shares_own:
        print(
            f"  training steps/s / bound at the chosen pair: mean {np.mean(shares_own):.3f} min "
            f"{np.min(shares_own):.3f}; / the best pair's bound under B: mean "
            f"{np.mean(shares_best):.3f} min {np.min(shares_best):.3f} (n={len(shares_own)})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare-priors", action="store_true", help="also run train-head")
    ap.add_argument("--quick", action="store_true", help="every other rate")
    ap.add_argument("--no-interleave", action="store_true")
    ap.add_argument("--interleave-only", action="store_true", help="only the interleaved replay")
    ap.add_argument(
        "--emulate",
        type=float,
        default=0.0,
        metavar="S",
        help="also run both jobs on the emulator for S trace seconds per point",
    )
    ap.add_argument("--scale", type=float, default=0.5, help="emulated GPU time scale")
    ap.add_argument(
        "--daemon",
        action="store_true",
        help="only: the held-out inference grid through the real daemon",
    )
    ap.add_argument("--max-pairs", type=int, default=30, help="with --daemon")
    ap.add_argument("--daemon-log", help="with --daemon: keep the daemon's log in this file")
    ap.add_argument(
        "--daemon-interleave",
        action="store_true",
        help="only: training + inference through the real daemon (join, points, leave)",
    )
    ap.add_argument("--train-modes", type=int, default=30, help="with --daemon-interleave")
    ap.add_argument(
        "--train-refine",
        type=int,
        default=0,
        metavar="N",
        help="interleaved replay: the training job says how long it runs (expected_steps) "
        "and may measure N modes past each commit (default 0: it does not say)",
    )
    ap.add_argument(
        "--walks",
        type=int,
        default=0,
        metavar="N",
        help="only: the --daemon grid's walk replayed at planner level, N orders per trace",
    )
    ap.add_argument(
        "--rate-change-pairs",
        type=int,
        default=RATE_CHANGE_PAIRS,
        metavar="N",
        help="with --walks: the daemon's [inference] rate_change_pairs (new pairs a rate "
        f"change may measure when no measured pair fits; default {RATE_CHANGE_PAIRS})",
    )
    args = ap.parse_args()
    if args.walks:
        methods = ("infer-ref", "train-head") if args.compare_priors else ("infer-ref",)
        print(
            f"the daemon grid's walk, replayed (planner level, {args.walks} orders, "
            f"rate_change_pairs {args.rate_change_pairs}):"
        )
        walks(args.walks, methods, args.rate_change_pairs)
        return
    if args.daemon_interleave:
        print(
            f"interleaved training + inference through the real daemon (emulated Orin AGX, "
            f"time scale {args.scale:g}, training modes {args.train_modes}, joint probes "
            f"<= {args.max_pairs}):"
        )
        watch, note = start_watch()
        print(note, flush=True)
        interleaved_daemon(args.scale, args.max_pairs, args.train_modes, args.daemon_log)
        print(load_note("at the end", own=1.0, watch=watch))
        return
    if args.daemon:
        print(
            f"held-out MobileNet v3 inference through the real daemon (emulated Orin AGX, "
            f"time scale {args.scale:g}, max_pairs {args.max_pairs}):"
        )
        watch, note = start_watch()
        print(note, flush=True)
        through_daemon(args.scale, args.max_pairs, args.quick, args.daemon_log)
        print(load_note("at the end", own=1.0, watch=watch))
        return
    methods = ("infer-ref", "train-head") if args.compare_priors else ("infer-ref",)
    for method in () if args.interleave_only else methods:
        print(f"inference alone, prior {method} (planner replay, not yet through the daemon):")
        inference_alone(method, args.quick)
    if not args.no_interleave:
        told = (
            f"it measures up to {args.train_refine} modes past each commit"
            if args.train_refine
            else "it does not say how long it runs"
        )
        print(
            "interleaved training + inference (planner replay, not yet through the daemon; "
            f"the training job: {told}):"
        )
        interleaved(args.quick, args.train_refine)
    if args.emulate > 0:
        print("interleaved on the emulator (real client, stand-in daemon, FIFO GPU):")
        emulated(args.emulate, args.scale)


if __name__ == "__main__":
    main()
