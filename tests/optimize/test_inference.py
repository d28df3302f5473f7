"""The inference planner, replayed on the visible inference traces (planner level, no daemon).

The prior is fitted on ResNet-18 inference and the planner is judged on MobileNet v3
inference, which the prior never saw."""

from __future__ import annotations

import numpy as np
import pytest

from powerd.modes import PowerMode
from powerd.optimize.inference import (
    RESOLVE_NEW_PAIRS,
    InferenceGoal,
    InferencePlanner,
    MeasurePair,
    Pair,
    PairMeasurement,
    ServePair,
    fit_for,
    worst_latency_ms,
)
from powerd.predictor.batch import InferenceReference, make_fitter
from powerd_replay.inference import (
    PairMeasurer,
    PairTrace,
    replay_goals,
    solve_goal,
    summarise,
)


@pytest.fixture(scope="module")
def prior(resnet_pairs: PairTrace) -> InferenceReference:
    return InferenceReference.fit(
        resnet_pairs.modes_all, resnet_pairs.b_all, resnet_pairs.t_all, resnet_pairs.p_all
    )


def planner(trace: PairTrace, prior: InferenceReference, **kw) -> InferencePlanner:
    return InferencePlanner(trace.modes, trace.batch_sizes, make_fitter(prior, "infer-ref"), **kw)


def test_worst_case_latency_formula() -> None:
    # 4 requests at 20 Hz: the first waits 3 * 50 ms for the batch to fill, then the batch.
    assert worst_latency_ms(4, 20.0, 30.0) == pytest.approx(180.0)
    m = PairMeasurement(Pair(PowerMode(4, 1, 1, 1), 4), 30.0, 10.0, 35.0)
    assert fit_for(m, InferenceGoal(20.0, 10.0, 185.0))
    assert not fit_for(m, InferenceGoal(20.0, 10.0, 184.0))  # p99 batch time counts
    assert not fit_for(m, InferenceGoal(20.0, 9.9, 185.0))  # power
    assert not fit_for(m, InferenceGoal(200.0, 10.0, None))  # 35 ms > 0.9 * 4/200 s


def test_serves_a_measured_pair_that_fits_near_the_least_power(mobilenet_pairs, prior) -> None:
    goal = InferenceGoal(rate_hz=30, budget_w=20, latency_ms=200)
    samples: dict[Pair, PairMeasurement] = {}
    served, probes = solve_goal(
        planner(mobilenet_pairs, prior), goal, samples, PairMeasurer(mobilenet_pairs)
    )
    assert served.feasible and served.best_latency_ms is None
    assert served.pair in samples and fit_for(samples[served.pair], goal)
    assert probes == len(samples) <= 30
    opt = mobilenet_pairs.optimal(goal)
    assert opt is not None
    assert mobilenet_pairs.rows[served.pair][1] <= 1.20 * opt[1]  # median over grids: ~1.10


def test_infeasible_target_serves_best_latency_under_budget(mobilenet_pairs, prior) -> None:
    goal = InferenceGoal(rate_hz=30, budget_w=16, latency_ms=10)  # below any batch time
    samples: dict[Pair, PairMeasurement] = {}
    served, _ = solve_goal(
        planner(mobilenet_pairs, prior), goal, samples, PairMeasurer(mobilenet_pairs)
    )
    assert not served.feasible
    assert served.within_budget and samples[served.pair].power_w <= 16
    assert served.best_latency_ms == pytest.approx(served.latency_ms)
    relaxed = mobilenet_pairs.optimal(InferenceGoal(30, 16, None))
    assert relaxed is not None
    # Within 10% of the lowest worst-case latency any pair reaches under the budget.
    true_latency = worst_latency_ms(
        served.pair.batch_size, 30, mobilenet_pairs.rows[served.pair][0]
    )
    assert true_latency <= 1.10 * relaxed[2]


def test_no_latency_target_minimises_latency_under_budget(mobilenet_pairs, prior) -> None:
    goal = InferenceGoal(rate_hz=60, budget_w=25)
    samples: dict[Pair, PairMeasurement] = {}
    served, _ = solve_goal(
        planner(mobilenet_pairs, prior), goal, samples, PairMeasurer(mobilenet_pairs)
    )
    best = mobilenet_pairs.optimal(goal)
    assert served.feasible and best is not None
    t, p = mobilenet_pairs.rows[served.pair]
    assert p <= 25.5
    assert worst_latency_ms(served.pair.batch_size, 60, t) <= 1.05 * best[2]


def test_rate_change_resolves_from_what_is_measured(mobilenet_pairs, prior) -> None:
    pl = planner(mobilenet_pairs, prior)
    measure = PairMeasurer(mobilenet_pairs)
    samples: dict[Pair, PairMeasurement] = {}
    first, probes = solve_goal(pl, InferenceGoal(30, 20, 200), samples, measure)
    assert probes > 0
    assert any(fit_for(m, InferenceGoal(45, 20, 200)) for m in samples.values())
    second, probes2 = solve_goal(
        pl, InferenceGoal(45, 20, 200), samples, measure, new_pairs_limit=RESOLVE_NEW_PAIRS
    )
    # The fitted model carries over: at most a verification of a never-measured pick.
    assert probes2 <= RESOLVE_NEW_PAIRS
    assert second.feasible and fit_for(samples[second.pair], InferenceGoal(45, 20, 200))
    # Back to the first rate: everything is measured, nothing new is profiled.
    again, probes3 = solve_goal(pl, InferenceGoal(30, 20, 200), samples, measure)
    assert probes3 == 0 and again.pair == first.pair


def test_never_profiles_more_than_max_pairs(mobilenet_pairs) -> None:
    class Wrong:
        """A model that is confidently wrong: everything fits at 1 ms and 1 W."""

        def predict(self, modes, b):
            return np.ones(len(b)), np.ones(len(b))

    pl = InferencePlanner(
        mobilenet_pairs.modes, mobilenet_pairs.batch_sizes, lambda s: Wrong(), max_pairs=5
    )
    samples: dict[Pair, PairMeasurement] = {}
    served, probes = solve_goal(
        pl, InferenceGoal(30, 14, 40), samples, PairMeasurer(mobilenet_pairs)
    )
    assert probes == len(samples) == 5
    assert isinstance(served, ServePair)
    # What it serves was measured, and is flagged unless its measurement fits.
    assert served.pair in samples
    assert served.feasible == fit_for(samples[served.pair], InferenceGoal(30, 14, 40))


def test_first_action_measures_within_the_predicted_budget(mobilenet_pairs, prior) -> None:
    pl = planner(mobilenet_pairs, prior)
    action = pl.next_action(InferenceGoal(30, 18, 200), {})
    assert isinstance(action, MeasurePair)
    t, p = pl.fitter({}).predict(
        np.array([action.pair.mode.as_tuple()]), np.array([action.pair.batch_size])
    )
    assert p[0] <= 18


def test_grid_replay_on_an_unseen_workload(mobilenet_pairs, prior) -> None:
    goals = [
        InferenceGoal(r, b, lat) for r in (15, 60) for lat in (100, 400, None) for b in (15, 20, 30)
    ]
    res = replay_goals(
        planner(mobilenet_pairs, prior), mobilenet_pairs, goals, PairMeasurer(mobilenet_pairs)
    )
    s = summarise(res)
    assert s["within_budget_pct"] == 100.0
    assert s["meet_pct"] >= 90.0
    assert s["max_probes"] <= 30


def test_session_full_search_then_resolves(mobilenet_pairs, prior) -> None:
    from powerd.optimize.inference import InferenceSession

    pl = planner(mobilenet_pairs, prior)
    measure = PairMeasurer(mobilenet_pairs)
    samples: dict[Pair, PairMeasurement] = {}
    session = InferenceSession(pl, InferenceGoal(30, 20, 200))

    def settle() -> tuple[ServePair, int]:
        n = 0
        while True:
            action = session.next_action(samples)
            if isinstance(action, ServePair):
                return action, n
            samples[action.pair] = measure(action.pair)
            session.measured(action.pair)
            n += 1

    first, n1 = settle()
    assert first.feasible and n1 >= 2 and session.served == first
    session.set_rate(45)
    assert session.served is None and session.goal.rate_hz == 45
    second, n2 = settle()
    assert second.feasible and n2 <= RESOLVE_NEW_PAIRS
    session.set_budget(17)
    third, n3 = settle()
    assert samples[third.pair].power_w <= 17


def test_latency_power_front_per_batch_size(mobilenet_pairs, prior) -> None:
    from powerd.optimize.inference import latency_power_front

    rows = latency_power_front(prior, mobilenet_pairs.modes, (1, 16), 30.0)
    assert {r["batch_size"] for r in rows} == {1, 16}
    for b in (1, 16):
        front = [r for r in rows if r["batch_size"] == b]
        # Along a front, more power buys strictly less latency.
        for lo, hi in zip(front, front[1:], strict=False):
            assert hi["power_w"] > lo["power_w"] and hi["latency_ms"] < lo["latency_ms"]
        assert all(
            r["latency_ms"] == pytest.approx((b - 1) / 30 * 1000 + r["batch_ms"]) for r in front
        )


@pytest.mark.parametrize("rate_change_pairs", [0, 8])
def test_the_daemon_grid_walk_stays_within_budget_and_finds_thin_pairs(
    resnet_pairs, rate_change_pairs: int
) -> None:
    """The --daemon benchmark's walk (one job through latency, budget and rate changes),
    replayed in its own order and three shuffled ones on ResNet-18 inference: rate changes
    that need a batch size never measured at the new rate, with a handful of fitting pairs
    among 2,205. Nothing may be served over the budget: with the re-solve's cap spent and
    no measured pair under the budget, the planner measures one that is (it used to serve
    the least-power pair measured, 1-3 W over, on 11 points of the fourth walk).

    By default a rate change measures nothing: the covered rate axis serves all but a few
    points (the misses: 100/s at 400 ms and 20 W, which one pair of 2,205 fits, and 100/s
    at 100 ms and 25 W, seven). An admin's `rate_change_pairs = 8` lets a rate change that
    no measured pair fits probe for such thin pairs: then every point is met.

    Without a latency target a point is met when the served pair drains the queue. Two such
    goals here (30/s at 15 W, 250/s at 25 W) are fitted by one or two odd rows of the trace
    (a b=16 pair at the 114 MHz GPU clock; a b=64 pair at 164.5 ms where its neighbours take
    >= 250 ms) that no model finds: missing them is allowed, but only flagged infeasible."""
    from powerd.predictor.batch import load_prior
    from powerd_replay.inference import GridOrder, replay_walk

    pl = InferencePlanner(
        resnet_pairs.modes,
        resnet_pairs.batch_sizes,
        make_fitter(load_prior("infer-ref"), "infer-ref"),
    )
    base = GridOrder((30.0, 100.0, 250.0), (400.0, 100.0, None), (20.0, 15.0, 25.0))
    met = feasible = rate_probes = 0
    for k in range(4):
        order = base.shuffled(k) if k else base
        meas = PairMeasurer(resnet_pairs, seed=f"w{k}")
        for kind, r in replay_walk(
            pl, resnet_pairs, order, meas, rate_change_pairs=rate_change_pairs
        ):
            assert r.within_budget, r.goal
            rate_probes += r.probes if kind == "rate" else 0
            if not r.feasible:
                continue
            if r.goal.latency_ms is None:
                # a queue that does not drain is never reported as meeting the goal
                assert r.latency_ok or not r.served.feasible, r.goal
                continue
            feasible += 1
            met += r.latency_ok and r.power_ok
    assert feasible >= 30
    if rate_change_pairs == 0:
        assert rate_probes == 0
        assert met >= 0.9 * feasible
    else:
        assert rate_probes > 0
        assert met >= 0.97 * feasible
