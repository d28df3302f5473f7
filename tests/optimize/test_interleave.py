"""The interleaving planner on MobileNet v3 training + ResNet-18 inference (planner level)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from pair_models import BumpAtFour

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement
from powerd.optimize.inference import Pair, PairMeasurement
from powerd.optimize.interleave import (
    InterleaveGoal,
    InterleavePlanner,
    MeasureJoint,
    ServeJoint,
    cycle_steps,
    interleaved_latency_ms,
    throughput_bound_hz,
)
from powerd.predictor.batch import InferenceReference, fit_pair_model, make_fitter
from powerd.sim.trace import TRACE_DIR, Trace
from powerd_replay.inference import (
    PairMeasurer,
    PairTrace,
    TrainMeasurer,
    joint_truth,
    judge_joint,
    solve_joint,
)


@pytest.fixture(scope="module")
def train() -> Trace:
    return Trace.load(TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv")


class BiasedTrain:
    """The training trace seen through a model that is 10% slow and 1 W high on every mode."""

    def __init__(self, trace: Trace):
        self.trace = trace

    def predict(self, modes: np.ndarray):
        rows = [self.trace.lookup(PowerMode(*map(int, m))) for m in modes]
        return np.array([r.time_ms * 1.1 for r in rows]), np.array([r.power_w + 1 for r in rows])


@pytest.fixture(scope="module")
def planner(train: Trace, resnet_pairs: PairTrace) -> InterleavePlanner:
    # The inference prior comes from the *other* inference trace (MobileNet).
    mob = PairTrace.load(TRACE_DIR / "orin_agx_mobilenetv3_gld23k_infer.csv")
    prior = InferenceReference.fit(mob.modes_all, mob.b_all, mob.t_all, mob.p_all)
    model = BiasedTrain(train)
    return InterleavePlanner(
        resnet_pairs.modes,
        resnet_pairs.batch_sizes,
        lambda s: model,
        make_fitter(prior, "infer-ref"),
    )


def test_formulas() -> None:
    # b = 4 at 10 Hz: a 400 ms cycle; a 100 ms batch leaves 300 ms, i.e. 2 steps of 120 ms.
    assert cycle_steps(4, 10.0, 100.0, 120.0) == 2
    assert throughput_bound_hz(4, 10.0, 100.0, 120.0) == pytest.approx(0.75 / 0.12)
    assert interleaved_latency_ms(4, 10.0, 100.0, 120.0) == pytest.approx(300 + 120 + 100)
    assert throughput_bound_hz(1, 10.0, 200.0, 50.0) == 0.0  # batches fill the GPU


def solve(planner, train, resnet_pairs, goal):
    tr, inf = {}, {}
    served, probes = solve_joint(
        planner, goal, tr, inf, TrainMeasurer(train), PairMeasurer(resnet_pairs)
    )
    return served, probes, tr, inf


@pytest.mark.parametrize("goal", [InterleaveGoal(5, 25, 1000), InterleaveGoal(2, 20, 300)])
def test_serves_a_measured_joint_pair_that_fits(planner, train, resnet_pairs, goal) -> None:
    served, probes, tr, inf = solve(planner, train, resnet_pairs, goal)
    assert isinstance(served, ServeJoint) and served.feasible
    assert 0 < probes <= 30
    m_i, m_t = inf[served.pair], tr[served.pair.mode]
    assert max(m_i.power_w, m_t.power_w) <= goal.budget_w
    lat = interleaved_latency_ms(served.pair.batch_size, goal.rate_hz, m_i.tail_ms, m_t.time_ms)
    assert lat <= goal.latency_ms
    res = judge_joint(
        joint_truth(train, resnet_pairs, goal, resnet_pairs.modes), goal, served, probes, 0.02
    )
    assert res.latency_ok and res.power_ok
    assert res.bound_share >= 0.85  # the chosen pair's bound vs the best pair's


def test_unreachable_latency_is_flagged_with_the_best_latency(planner, train, resnet_pairs) -> None:
    goal = InterleaveGoal(15, 20, 300)
    served, _, tr, inf = solve(planner, train, resnet_pairs, goal)
    assert not served.feasible
    assert served.best_latency_ms is not None and served.best_latency_ms > 300
    assert max(inf[served.pair].power_w, tr[served.pair.mode].power_w) <= 20


def test_probes_are_capped(train, resnet_pairs) -> None:
    class Wrong:
        def predict(self, modes, b=None):
            n = len(modes)
            return np.ones(n), np.ones(n)

    pl = InterleavePlanner(
        resnet_pairs.modes,
        resnet_pairs.batch_sizes,
        lambda s: Wrong(),
        lambda s: Wrong(),
        max_probes=4,
    )
    served, probes, _, _ = solve(pl, train, resnet_pairs, InterleaveGoal(15, 15, 100))
    assert probes == 4
    assert not served.feasible
    assert math.isfinite(served.latency_ms)


def test_a_glitched_reading_does_not_get_an_over_budget_pair_served(
    planner, train, resnet_pairs
) -> None:
    """The first joint probe reads 12 W over the budget (a sensor glitch, as one row of the
    ResNet-18 trace has). Nothing measured drains within the budget then, and the refit
    model reads high everywhere: the planner must keep measuring the pairs predicted to draw
    least rather than serve the glitched one."""
    goal = InterleaveGoal(5, 20, 1000)
    measure = PairMeasurer(resnet_pairs)
    glitched: list = []

    def first_glitches(pair):
        m = measure(pair)
        if not glitched:
            glitched.append(pair)
            return dataclasses.replace(m, power_w=m.power_w + 12.0)
        return m

    tr, inf = {}, {}
    served, probes = solve_joint(planner, goal, tr, inf, TrainMeasurer(train), first_glitches)
    assert glitched and served.pair != glitched[0]
    assert served.power_w <= goal.budget_w
    assert resnet_pairs.rows[served.pair][1] <= goal.budget_w + 0.5


def test_the_training_jobs_own_mode_is_measured_though_the_margins_exclude_it(
    planner, train, resnet_pairs
) -> None:
    """The training job alone holds its best mode under the budget, measured to fit but
    within a hair of it; the power margins on a model that reads 1 W high rule out every
    pair at that mode. Given it as the anchor, the planner measures the best pair there
    once, and serves it when it fits and beats what else was measured."""
    goal = InterleaveGoal(5, 20, 1000)
    grid = {PowerMode(*map(int, m)) for m in resnet_pairs.modes}
    under = [r for r in train.rows if r.power_w <= goal.budget_w and r.mode in grid]
    own = min(under, key=lambda r: r.time_ms)  # the training job's decision alone
    alone = Measurement(own.mode, own.time_ms, own.power_w, 20)
    truth = joint_truth(train, resnet_pairs, goal, resnet_pairs.modes)

    def run(anchor):
        tr, inf = {own.mode: alone}, {}
        served, probes = solve_joint(
            planner,
            goal,
            tr,
            inf,
            TrainMeasurer(train),
            PairMeasurer(resnet_pairs),
            anchor=anchor,
        )
        return served, probes, inf

    without, _, inf0 = run(None)
    assert not any(q.mode == own.mode for q in inf0)  # the margins kept it out
    served, probes, inf = run(own.mode)
    assert any(q.mode == own.mode for q in inf) and probes <= 30
    share = judge_joint(truth, goal, served, probes, 0.02).bound_share
    share0 = judge_joint(truth, goal, without, 1, 0.02).bound_share
    assert judge_joint(truth, goal, served, probes, 0.02).power_ok
    assert share >= share0 and share >= 0.9, (share, share0, served.pair)


def test_when_no_batch_size_keeps_up_the_most_requests_per_second_are_served(
    planner, train, resnet_pairs
) -> None:
    """400 requests/s beside MobileNet training steps (>= 100 ms): a batch waits for the
    step in flight, and even b=64 fills in 160 ms, so the queue grows whatever runs. A
    user-testing pass saw the least-power pair (b=1) served and reported as 'the latency
    target cannot be met, best 406 ms' (below the 3 s target) with queue_grows false."""
    goal = InterleaveGoal(400, 25, 3000)
    served, _, tr, inf = solve(planner, train, resnet_pairs, goal)
    assert not served.feasible and not served.drains
    assert served.best_latency_ms is None  # no latency is bounded when the queue grows
    assert max(inf[served.pair].power_w, tr[served.pair.mode].power_w) <= goal.budget_w
    # the measured pair within the budget serving the most requests per second
    rates = {
        pair: pair.batch_size * 1000.0 / (m.tail_ms + tr[pair.mode].time_ms)
        for pair, m in inf.items()
        if pair.mode in tr and max(m.power_w, tr[pair.mode].power_w) <= goal.budget_w
    }
    assert served.served_hz(goal.rate_hz) == pytest.approx(max(rates.values()), rel=1e-6)
    assert served.pair.batch_size == max(resnet_pairs.batch_sizes)
    assert served.served_hz(goal.rate_hz) < goal.rate_hz


class _LightTraining:
    def predict(self, modes):
        n = len(modes)
        return np.full(n, 40.0), np.full(n, 11.0)


def test_a_batch_size_between_two_measured_ones_is_measured_when_they_are_within_budget() -> None:
    """Interleaved at 12 W, 20 requests/s, a 150 ms target no batch size meets: b=1 and b=64
    measured at 11.8-11.9 W on the least mode; b=4 there, predicted at 13.3 W, was never
    measured, and b=64 was served at 4.4 s worst-case latency where b=4 gives ~310 ms."""
    modes = np.array([(4, 422400, g, 665600000) for g in (114750000, 318750000, 522750000)])
    least = PowerMode(*map(int, modes[0]))
    planner = InterleavePlanner(
        modes,
        (1, 4, 16, 64),
        lambda s: _LightTraining(),
        lambda s: fit_pair_model(BumpAtFour(), s, "infer-ref"),
    )
    goal = InterleaveGoal(20, 12, 150)
    train = {least: Measurement(least, 40.0, 11.0, 20)}
    infer = {
        Pair(least, 1): PairMeasurement(Pair(least, 1), 45.0, 11.8, 46.0, 20),
        Pair(least, 64): PairMeasurement(Pair(least, 64), 1620.0, 11.9, 1650.0, 20),
    }
    action = planner.next_action(goal, train, infer)
    assert action == MeasureJoint(Pair(least, 4)), action
    infer[Pair(least, 4)] = PairMeasurement(Pair(least, 4), 120.0, 11.85, 124.0, 20)
    served = planner.next_action(goal, train, infer, probes_used=1)
    assert isinstance(served, ServeJoint) and served.pair == Pair(least, 4)
    assert served.latency_ms < 400 and served.power_w <= goal.budget_w


class _FloorTooHigh:
    """The synthetic pair model of pair_models with the least GPU clock predicted to draw
    the most (a refit on pairs of a higher budget can put the floor that wrong)."""

    def predict(self, modes, b):
        from pair_models import Model

        t, p = Model().predict(modes, b)
        return t, p + 9.0 * (np.asarray(modes)[:, 2] == 1)


def test_nothing_measured_within_the_budget_tries_the_least_mode_before_holding_over_it() -> None:
    from pair_models import MODES, SIZES, exact, pair

    planner = InterleavePlanner(MODES, SIZES, lambda s: _LightTraining(), lambda s: _FloorTooHigh())
    goal = InterleaveGoal(5, 10, 1000)  # g=1 draws 8.1-9.6 W; g=2 and g=3 11.1 W and more
    train = {pair(g, 1).mode: Measurement(pair(g, 1).mode, 40.0, 9.0, 20) for g in (1, 2, 3)}
    infer = {q: exact(q) for q in (pair(2, 1), pair(3, 1), pair(3, 16))}
    probes = 0
    while isinstance(action := planner.next_action(goal, train, infer, probes), MeasureJoint):
        infer[action.pair] = exact(action.pair)
        probes += 1
    assert action.power_w <= goal.budget_w and action.pair.mode == pair(1, 1).mode, action


class _Stubborn:
    """The synthetic pair model, never refitted: it keeps reading every GPU clock within a
    12 W budget however the probes read (a refit that does not bend to a stopped window)."""

    def predict(self, modes, b):
        from pair_models import Model

        return Model().predict(modes, b)


def _run_stopping_over(over, max_probes: int):
    """Solve at 5 requests/s, 12 W, 2 s; a probe of a pair `over(pair)` is stopped over the
    budget (13 W, nothing finished). Returns (final action, times each pair was probed)."""
    from pair_models import MODES, SIZES, exact

    planner = InterleavePlanner(
        MODES, SIZES, lambda s: _LightTraining(), lambda s: _Stubborn(), max_probes=max_probes
    )
    goal = InterleaveGoal(5, 12, 2000)
    train: dict = {}
    infer: dict = {}
    probed: dict = {}
    for probes in range(100):
        action = planner.next_action(goal, train, infer, probes)
        if not isinstance(action, MeasureJoint):
            return action, probed
        q = action.pair
        probed[q] = probed.get(q, 0) + 1
        if over(q):
            infer[q] = PairMeasurement(q, math.nan, 13.0, None, 0)
            train[q.mode] = Measurement(q.mode, math.nan, 13.0, 0, True)
        else:
            infer[q] = exact(q)
            train[q.mode] = Measurement(q.mode, 40.0, 11.0, 20)
    raise AssertionError(f"still measuring after 100 actions: {probed}")


def test_a_pair_stopped_over_the_budget_is_not_probed_again() -> None:
    """Found by a planner-level check: the model still read the pair within the budget
    after its probe was stopped over it, and the planner probed that pair again until its
    probes ran out (30 times, each holding the board over the budget)."""
    action, probed = _run_stopping_over(lambda q: q.mode.gpu_hz >= 2, max_probes=30)
    assert max(probed.values()) == 1, probed
    assert isinstance(action, ServeJoint) and action.feasible
    assert action.pair.mode.gpu_hz == 1 and action.power_w <= 12


def test_when_every_probe_stops_over_the_budget_the_lowest_reading_is_held_flagged() -> None:
    """No pair fits and the probes are spent: the planner holds the pair read lowest,
    flagged, instead of asking to measure one more pair for ever."""
    action, probed = _run_stopping_over(lambda q: True, max_probes=3)
    assert sum(probed.values()) == 3 and max(probed.values()) == 1, probed
    assert isinstance(action, ServeJoint) and not action.feasible and not action.drains
    assert action.power_w == 13.0 and math.isfinite(action.latency_ms)
