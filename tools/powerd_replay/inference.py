"""Offline replay of the inference planner against a measured inference trace.

Plays the profiler's part with no hardware: a `MeasurePair` returns the trace's batch time
and power for that pair with emulator-like noise (per-batch time jitter, power sampling
noise); a `ServePair` ends the goal. Each served pair is judged against the trace's truth:
its p99 worst-case latency under the same jitter, its true power, and the brute-force
optimal pair. Used by tests and tools/bench_inference.py.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from powerd.modes import FIELDS, PowerMode
from powerd.optimize.base import Measurement
from powerd.optimize.inference import (
    MAX_WINDOWS,
    RATE_CHANGE_PAIRS,
    InferenceAction,
    InferenceGoal,
    InferencePlanner,
    InferenceSession,
    MeasurePair,
    Pair,
    PairMeasurement,
    ServePair,
    drain_limit_ms,
    pooled,
    worst_latency_ms,
)
from powerd.optimize.interleave import (
    InterleaveGoal,
    InterleavePlanner,
    MeasureJoint,
    ServeJoint,
    cycle_steps,
    interleaved_latency_ms,
    throughput_bound_hz,
)
from powerd.sim.trace import Trace

P99_Z = 2.326  # the 99th percentile of a normal, in sds
OUTLIER_FACTOR = 1.0 / 0.6


class PairTrace:
    """One inference workload's measured (batch time, power) per (mode, batch size)."""

    def __init__(self, modes: np.ndarray, b: np.ndarray, t: np.ndarray, p: np.ndarray, name: str):
        self.name = name
        self.modes_all = modes
        self.b_all = b
        self.t_all = t
        self.p_all = p
        self.rows = {
            Pair(PowerMode(*map(int, m)), int(bb)): (float(tt), float(pp))
            for m, bb, tt, pp in zip(modes, b, t, p, strict=True)
        }
        self.batch_sizes = tuple(sorted({int(x) for x in b}))
        self.modes = np.unique(modes, axis=0)
        self._outliers: np.ndarray | None = None

    @classmethod
    def load(cls, path: str | Path) -> PairTrace:
        path = Path(path)
        with path.open(newline="") as f:
            raw = list(csv.DictReader(f))
        if not raw or "batch_ms" not in raw[0]:
            raise ValueError(f"{path}: not an inference trace (no batch_ms column)")
        modes = np.array([[int(r[k]) for k in FIELDS] for r in raw], dtype=np.int64)
        b = np.array([int(r["batch_size"]) for r in raw], dtype=np.int64)
        t = np.array([float(r["batch_ms"]) for r in raw])
        p = np.array([float(r["power_w"]) for r in raw])
        return cls(modes, b, t, p, path.stem)

    def outliers(self, factor: float = OUTLIER_FACTOR) -> np.ndarray:
        """Rows whose power is off by more than `factor` from the same mode's power at both
        neighbouring batch sizes (e.g. 18 W between 54 W and 55 W): measurement glitches,
        not behaviour. The smallest and largest sizes have one neighbour and are kept
        (batch size 1 is often far from 4 for real)."""
        sizes = self.batch_sizes
        at: dict[tuple[tuple[int, ...], int], int] = {
            (tuple(map(int, m)), int(b)): i
            for i, (m, b) in enumerate(zip(self.modes_all, self.b_all, strict=True))
        }
        mask = np.zeros(len(self.b_all), dtype=bool)
        for (mode, b), i in at.items():
            k = sizes.index(b)
            if k in (0, len(sizes) - 1):
                continue
            nb = [
                self.p_all[at[(mode, sizes[j])]] for j in (k - 1, k + 1) if (mode, sizes[j]) in at
            ]
            if len(nb) == 2 and (
                self.p_all[i] * factor < min(nb) or self.p_all[i] > factor * max(nb)
            ):
                mask[i] = True
        return mask

    def optimal(
        self, goal: InferenceGoal, jitter: float = 0.0, skip_outliers: bool = False
    ) -> tuple[Pair, float, float] | None:
        """The brute-force best pair for the goal on true values: (pair, power, latency);
        `skip_outliers`: ignoring the glitch rows (see outliers)."""
        tail = self.t_all * (1 + P99_Z * jitter)
        lat = worst_latency_ms(self.b_all, goal.rate_hz, tail)
        ok = (self.p_all <= goal.budget_w) & (tail <= drain_limit_ms(self.b_all, goal.rate_hz))
        if skip_outliers:
            if self._outliers is None:
                self._outliers = self.outliers()
            ok &= ~self._outliers
        if goal.latency_ms is not None:
            ok &= lat <= goal.latency_ms
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            return None
        if goal.latency_ms is not None:
            i = idx[np.lexsort((lat[idx], self.p_all[idx]))[0]]
        else:
            i = idx[np.lexsort((self.p_all[idx], lat[idx]))[0]]
        pair = Pair(PowerMode(*map(int, self.modes_all[i])), int(self.b_all[i]))
        return pair, float(self.p_all[i]), float(lat[i])


def _normals(key: str, n: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).standard_normal(n)


@dataclass
class PairMeasurer:
    """Measures a pair as the daemon would while serving: `batches` batch times with
    relative jitter `time_rel` (median and p99 kept) and the mean of power samples with
    relative noise `power_rel` (the emulator's INA3221 noise), seeded per pair."""

    trace: PairTrace
    batches: int = 20
    time_rel: float = 0.02
    power_rel: float = 0.01
    power_samples: int = 10
    seed: str = ""

    def __call__(self, pair: Pair, again: int = 0) -> PairMeasurement:
        """`again`: windows of this pair the job measured before; each reads anew."""
        t, p = self.trace.rows[pair]
        key = f"{self.seed}/{self.trace.name}/{pair}" + (f"/{again}" if again else "")
        z = _normals(key, self.batches + self.power_samples)
        times = t * np.maximum(0.5, 1 + self.time_rel * z[: self.batches])
        power = p * (1 + self.power_rel * z[self.batches :])
        return PairMeasurement(
            pair,
            float(np.median(times)),
            float(power.mean()),
            float(np.percentile(times, 99)),
            self.batches,
            float(power.std(ddof=1)),
            self.power_samples,
        )


@dataclass
class GoalResult:
    goal: InferenceGoal
    served: ServePair
    probes: int  # measuring windows for this goal (a pair measured again counts again)
    feasible: bool  # the trace has a pair meeting the goal
    latency_ok: bool  # true p99 latency <= L * 1.05 (no L: the queue drains)
    power_ok: bool  # true power <= B + 0.5 W
    within_budget: bool  # true power <= B + 0.5 W regardless of feasibility
    power_ratio: float  # served true power / the optimal pair's (nan if infeasible)
    latency_ratio: float  # no L: served true latency / the best under B
    pairs: int = 0  # distinct pairs the workload had measured by then


def solve_goal(
    planner: InferencePlanner,
    goal: InferenceGoal,
    samples: dict[Pair, PairMeasurement],
    measure: Callable[..., PairMeasurement],
    max_steps: int = 200,
    new_pairs_limit: int | None = None,
) -> tuple[ServePair, int]:
    """Run the planner to a ServePair, measuring into `samples` (shared across goals).
    `new_pairs_limit`: a re-solve's cap on new pairs (see InferencePlanner.next_action)."""
    return _settle(
        lambda probes: planner.next_action(goal, samples, probes, new_pairs_limit),
        samples,
        measure,
        max_steps,
    )


def solve_session(
    session: InferenceSession,
    samples: dict[Pair, PairMeasurement],
    measure: Callable[..., PairMeasurement],
    max_steps: int = 200,
) -> tuple[ServePair, int]:
    """solve_goal for a job's current goal as the daemon runs it: through its
    InferenceSession, so a rate change (`session.set_rate`) re-solves under the daemon's
    own rule for how many new pairs it may measure."""

    def measured(pair: Pair, **again: int) -> PairMeasurement:
        session.measured(pair)
        return measure(pair, **again)

    return _settle(lambda _: session.next_action(samples), samples, measured, max_steps)


def _settle(
    next_action: Callable[[int], InferenceAction],
    samples: dict[Pair, PairMeasurement],
    measure: Callable[..., PairMeasurement],
    max_steps: int,
) -> tuple[ServePair, int]:
    """Take actions (given the pairs measured so far) until one serves, measuring into
    `samples`; (what it serves, windows measured). A pair measured again is measured with
    `again=` its windows so far (a new reading), and pooled."""
    probes = 0
    for _ in range(max_steps):
        action = next_action(probes)
        if isinstance(action, ServePair):
            return action, probes
        assert isinstance(action, MeasurePair)
        old = samples.get(action.pair)
        if old is not None and old.windows >= MAX_WINDOWS:
            raise RuntimeError(f"planner asked to re-measure {action.pair} again")
        new = measure(action.pair) if old is None else measure(action.pair, again=old.windows)
        samples[action.pair] = pooled(old, new)
        probes += 1
    raise RuntimeError("planner did not settle")


def judge(
    trace: PairTrace,
    goal: InferenceGoal,
    served: ServePair,
    probes: int,
    jitter: float,
    skip_outliers: bool = False,
) -> GoalResult:
    t, p = trace.rows[served.pair]
    lat99 = float(worst_latency_ms(served.pair.batch_size, goal.rate_hz, t * (1 + P99_Z * jitter)))
    opt = trace.optimal(goal, jitter=0.0, skip_outliers=skip_outliers)
    feasible = opt is not None
    within = p <= goal.budget_w + 0.5
    # without a target the latency is met when the queue drains: the served pair's true
    # batch time below the batch interval b/r (else the queue, and every latency, grows)
    if goal.latency_ms is None:
        lat_ok = t < served.pair.batch_size * 1000.0 / goal.rate_hz
    else:
        lat_ok = lat99 <= goal.latency_ms * 1.05
    ratio = p / opt[1] if opt is not None else float("nan")
    lratio = lat99 / opt[2] if (opt is not None and goal.latency_ms is None) else float("nan")
    return GoalResult(goal, served, probes, feasible, lat_ok, within, within, ratio, lratio)


def replay_goals(
    planner: InferencePlanner,
    trace: PairTrace,
    goals: list[InferenceGoal],
    measure: Callable[..., PairMeasurement],
    shared: bool = False,
) -> list[GoalResult]:
    """Each goal as a new workload (fresh samples, a new job's session as the daemon runs
    it: seeds, covering, search), or all goals sharing one workload's samples (`shared`:
    each goal a full search of the planner alone)."""
    out = []
    samples: dict[Pair, PairMeasurement] = {}
    for goal in goals:
        if shared:
            served, probes = solve_goal(planner, goal, samples, measure)
        else:
            samples = {}
            served, probes = solve_session(InferenceSession(planner, goal), samples, measure)
        res = judge(trace, goal, served, probes, getattr(measure, "time_rel", 0.02))
        out.append(dataclasses.replace(res, pairs=len(samples)))
    return out


@dataclass(frozen=True)
class GridOrder:
    """One moving job's walk over a grid, as tools/bench_inference.py --daemon walks it: a
    fresh job at the first goal; then per latency (a new registration of the same
    workload), per budget (`set_budget`), per rate (`set_rate`), each in this order."""

    rates: tuple[float, ...]
    latencies: tuple[float | None, ...]
    budgets: tuple[float, ...]

    def shuffled(self, seed: int) -> GridOrder:
        rnd = random.Random(seed)
        return GridOrder(
            *(tuple(rnd.sample(x, len(x))) for x in (self.rates, self.latencies, self.budgets))
        )


def replay_walk(
    planner: InferencePlanner,
    trace: PairTrace,
    order: GridOrder,
    measure: Callable[..., PairMeasurement],
    skip_outliers: bool = True,
    rate_change_pairs: int = RATE_CHANGE_PAIRS,
) -> list[tuple[str, GoalResult]]:
    """The daemon's sessions over `order` (see GridOrder): (kind of change, result) per
    point, kinds "fresh", "latency", "budget", "rate"; samples shared along the walk.
    `rate_change_pairs`: the daemon's `[inference] rate_change_pairs`."""
    jitter = getattr(measure, "time_rel", 0.02)
    samples: dict[Pair, PairMeasurement] = {}
    out: list[tuple[str, GoalResult]] = []

    def point(kind: str, session: InferenceSession) -> None:
        served, probes = solve_session(session, samples, measure)
        res = judge(trace, session.goal, served, probes, jitter, skip_outliers)
        out.append((kind, dataclasses.replace(res, pairs=len(samples))))

    first = InferenceGoal(order.rates[0], order.budgets[0], order.latencies[0])
    session = InferenceSession(planner, first, rate_search_pairs=rate_change_pairs)
    point("fresh", session)
    for lat in order.latencies:
        if lat != session.goal.latency_ms:
            g = session.goal
            session = InferenceSession(
                planner,
                InferenceGoal(g.rate_hz, g.budget_w, lat),
                profiled=True,
                rate_search_pairs=rate_change_pairs,
            )
            point("latency", session)
        for budget in order.budgets:
            if budget != session.goal.budget_w:
                session.set_budget(budget)
                point("budget", session)
            for rate in order.rates:
                if rate != session.goal.rate_hz:
                    session.set_rate(rate)
                    point("rate", session)
    return out


def summarise(results: list[GoalResult]) -> Mapping[str, float]:
    feas = [r for r in results if r.feasible]
    with_l = [r for r in feas if r.goal.latency_ms is not None]
    return {
        "points": len(results),
        "feasible": len(feas),
        "meet_pct": 100.0 * np.mean([r.latency_ok and r.power_ok for r in feas]) if feas else 0.0,
        "within_budget_pct": 100.0 * np.mean([r.within_budget for r in results]),
        "median_power_ratio": float(np.median([r.power_ratio for r in with_l])) if with_l else 0.0,
        "max_probes": max((r.probes for r in results), default=0),
        "median_probes": float(np.median([r.probes for r in results])) if results else 0.0,
        "max_pairs": max((r.pairs for r in results), default=0),
        "infeasible_flagged_pct": 100.0
        * np.mean([not r.served.feasible for r in results if not r.feasible])
        if any(not r.feasible for r in results)
        else 100.0,
    }


# ---- interleaved training + inference ---------------------------------------------------


@dataclass
class TrainMeasurer:
    """A training trace measured like the profiler does: median step time and mean power
    with the emulator's noise, seeded per mode."""

    trace: Trace
    time_rel: float = 0.01  # median of many steps with 2% jitter each
    power_rel: float = 0.005
    seed: str = ""

    def __call__(self, mode: PowerMode) -> Measurement:
        row = self.trace.lookup(mode)
        z = _normals(f"{self.seed}/{self.trace.name}/{mode}", 2)
        return Measurement(
            mode,
            row.time_ms * (1 + self.time_rel * z[0]),
            row.power_w * (1 + self.power_rel * z[1]),
        )


def joint_truth(
    train: Trace, infer: PairTrace, goal: InterleaveGoal, modes: np.ndarray
) -> dict[str, np.ndarray]:
    """True (trace) values over the joint grid of `modes` x the inference batch sizes."""
    sizes = np.array(infer.batch_sizes)
    gm = np.repeat(modes, len(sizes), axis=0)
    gb = np.tile(sizes, len(modes))
    t_i = np.array(
        [infer.rows[Pair(PowerMode(*map(int, m)), int(b))][0] for m, b in zip(gm, gb, strict=True)]
    )
    p_i = np.array(
        [infer.rows[Pair(PowerMode(*map(int, m)), int(b))][1] for m, b in zip(gm, gb, strict=True)]
    )
    rows = [train.lookup(PowerMode(*map(int, m))) for m in gm]
    t_tr = np.array([r.time_ms for r in rows])
    p_tr = np.array([r.power_w for r in rows])
    return {"modes": gm, "b": gb, "t_inf": t_i, "p_inf": p_i, "t_tr": t_tr, "p_tr": p_tr}


@dataclass
class JointResult:
    goal: InterleaveGoal
    served: ServeJoint
    probes: int
    feasible: bool
    latency_ok: bool
    power_ok: bool
    bound_share: float  # served pair's true bound / the best true bound (nan if infeasible)
    cycle_share: float  # strict-cycle rate k*r/b over the served pair's own bound


def solve_joint(
    planner: InterleavePlanner,
    goal: InterleaveGoal,
    train: dict[PowerMode, Measurement],
    infer: dict[Pair, PairMeasurement],
    measure_train: TrainMeasurer,
    measure_pair: PairMeasurer,
    max_steps: int = 100,
    anchor: PowerMode | None = None,
) -> tuple[ServeJoint, int]:
    """`anchor`: the training job's own mode under the budget (the daemon passes the
    training workload's decision for the budget)."""
    probes = 0
    for _ in range(max_steps):
        action = planner.next_action(goal, train, infer, probes_used=probes, anchor=anchor)
        if isinstance(action, ServeJoint):
            return action, probes
        assert isinstance(action, MeasureJoint)
        infer[action.pair] = measure_pair(action.pair)
        train.setdefault(action.pair.mode, measure_train(action.pair.mode))
        probes += 1
    raise RuntimeError("interleave planner did not settle")


def judge_joint(
    truth: dict[str, np.ndarray],
    goal: InterleaveGoal,
    served: ServeJoint,
    probes: int,
    jitter: float,
) -> JointResult:
    b, t_i, t_tr = truth["b"], truth["t_inf"], truth["t_tr"]
    p = np.maximum(truth["p_inf"], truth["p_tr"])
    cyc = b * 1000.0 / goal.rate_hz
    lat = interleaved_latency_ms(b, goal.rate_hz, t_i, t_tr)
    ok = (p <= goal.budget_w) & (t_i <= 0.9 * cyc) & (t_i + t_tr <= cyc)
    if goal.latency_ms is not None:
        ok &= lat <= goal.latency_ms
    bound = throughput_bound_hz(b, goal.rate_hz, t_i, t_tr)
    key = served.pair.mode.as_tuple()
    i = int(np.flatnonzero((truth["modes"] == key).all(axis=1) & (b == served.pair.batch_size))[0])
    lat99 = interleaved_latency_ms(
        b[i], goal.rate_hz, t_i[i] * (1 + P99_Z * jitter), t_tr[i] * (1 + P99_Z * jitter)
    )
    feasible = bool(ok.any())
    best = float(bound[ok].max()) if feasible else float("nan")
    k = cycle_steps(int(b[i]), goal.rate_hz, float(t_i[i]), float(t_tr[i]))
    own = float(bound[i])
    # without a target the latency is met when the inference queue drains
    lat_ok = (
        float(t_i[i]) < float(cyc[i])
        if goal.latency_ms is None
        else float(lat99) <= goal.latency_ms * 1.05
    )
    return JointResult(
        goal,
        served,
        probes,
        feasible,
        lat_ok,
        float(p[i]) <= goal.budget_w + 0.5,
        own / best if feasible and best > 0 else float("nan"),
        (k * goal.rate_hz / b[i]) / own if own > 0 else float("nan"),
    )
