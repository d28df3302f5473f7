"""Telling a backlog from the batches, and choosing the pair that drains it
(powerd.optimize.backlog, pure: synthetic batch windows and measurements)."""

from __future__ import annotations

import math

import pytest

from powerd.modes import PowerMode
from powerd.optimize.backlog import (
    BACKLOG_SHARE,
    DRAINED_SHARE,
    WATCH_BATCHES,
    backlog_span_s,
    busy_share,
    load_share,
    recovery_pair,
)
from powerd.optimize.inference import InferenceGoal, Pair, PairMeasurement, ServePair

RATE = 100.0  # requests/s: a batch of 10 fills in 100 ms
GOAL = InferenceGoal(RATE, 15.0, 400.0)


def batches(batch_s: float, period_s: float, n: int = WATCH_BATCHES) -> list[tuple[float, float]]:
    """n batches of `batch_s`, one starting every `period_s` (or back to back if shorter)."""
    out, t = [], 0.0
    for _ in range(n):
        out.append((t, t + batch_s))
        t = max(t + period_s, t + batch_s)
    return out


def test_batches_back_to_back_read_as_busy_and_batches_waiting_for_requests_do_not():
    # a pair at 0.9 of b/r with an empty queue: each batch waits for its requests
    idle = busy_share(batches(0.090, 0.100))
    assert idle == pytest.approx(0.9)
    assert idle < BACKLOG_SHARE
    # the same pair with requests queued: the next batch starts when the last one ends
    assert busy_share(batches(0.090, 0.0)) == pytest.approx(1.0)
    assert busy_share(batches(0.090, 0.0)) >= BACKLOG_SHARE
    # a faster pair's batches with gaps: drained
    assert busy_share(batches(0.050, 0.100)) < DRAINED_SHARE


def test_too_few_batches_say_nothing():
    assert busy_share(batches(0.090, 0.0, n=WATCH_BATCHES - 1)) is None
    assert busy_share([(0.0, 0.1)] * WATCH_BATCHES) is None  # no time between the ends


def test_a_backlog_must_last_the_span_asked_for():
    # a few batches queued at a switch of batch size, then gaps: over 8 batches it looks
    # like a backlog, over the latency target's span (1 s here) it does not
    short = batches(0.020, 0.0, n=10)
    t = short[-1][1]
    gaps = [(t - 1.5 + 0.033 * i, t - 1.5 + 0.033 * i + 0.020) for i in range(40)]
    seen = gaps + [(s + 0.1, e + 0.1) for s, e in short]
    seen.sort(key=lambda w: w[1])
    assert busy_share(seen) >= BACKLOG_SHARE
    assert busy_share(seen, span_s=1.0) < BACKLOG_SHARE
    # a backlog that lasts: back to back over the whole span
    long = batches(0.020, 0.0, n=60)
    assert busy_share(long, span_s=1.0) >= BACKLOG_SHARE
    # not enough history to span it
    assert busy_share(batches(0.020, 0.0, n=20), span_s=1.0) is None


def q(gpu: int, b: int) -> Pair:
    return Pair(PowerMode(4, 1000, gpu, 1000), b)


def m(gpu: int, b: int, batch_ms: float, power_w: float) -> PairMeasurement:
    return PairMeasurement(q(gpu, b), batch_ms, power_w, batch_ms, 40)


def serve(x: PairMeasurement, feasible: bool = True) -> ServePair:
    return ServePair(x.pair, feasible, (x.pair.batch_size - 1) * 10.0 + x.batch_ms, x.power_w)


def test_the_pair_with_the_most_spare_capacity_within_the_budget_drains_the_backlog():
    slow = m(1, 10, 88.0, 11.0)  # the least power: 88 % busy at 100/s
    mid = m(2, 10, 60.0, 13.0)  # 60 % busy
    fast = m(3, 10, 40.0, 14.5)  # 40 % busy: the most spare capacity
    over = m(4, 10, 20.0, 15.3)  # faster still, but measured over the budget
    big = m(2, 40, 250.0, 12.0)  # 62.5 % busy
    samples = {x.pair: x for x in (slow, mid, fast, over, big)}
    got = recovery_pair(samples, GOAL, serve(slow))
    assert got is not None and got.pair == fast.pair
    assert got.feasible and got.power_w <= GOAL.budget_w
    assert load_share(fast, RATE) == pytest.approx(0.4)


def test_no_recovery_pair_when_none_drains_clearly_faster_or_the_served_pair_does_not_fit():
    slow = m(1, 10, 88.0, 11.0)
    barely = m(2, 10, 80.0, 12.0)  # 80 % busy: 8 points of spare capacity more, too little
    samples = {x.pair: x for x in (slow, barely)}
    assert recovery_pair(samples, GOAL, serve(slow)) is None
    # an infeasible goal is served with its best already; nothing to switch to
    fast = m(3, 10, 40.0, 14.5)
    samples[fast.pair] = fast
    assert recovery_pair(samples, GOAL, serve(slow)).pair == fast.pair
    assert recovery_pair(samples, GOAL, serve(slow, feasible=False)) is None
    # a served pair with no measurement (nothing to compare with)
    assert recovery_pair({fast.pair: fast}, GOAL, serve(slow)) is None


def test_without_a_latency_target_a_backlog_must_hold_a_batch_of_the_drain_pair():
    # the least-latency pair at 88 % busy; a b=40 pair at 25 % busy drains faster, but its
    # batch takes 390 ms to fill: worth it only once 40 requests wait
    slow = m(1, 10, 88.0, 11.0)
    big = m(3, 40, 100.0, 12.0)
    samples = {x.pair: x for x in (slow, big)}
    free = InferenceGoal(RATE, 15.0, None)
    assert recovery_pair(samples, free, serve(slow)).pair == big.pair
    # back to back, the served pair takes 1000 * 10 / 88 - 100 = 13.6 requests/s more than
    # arrive: 40 queued take 2.9 s of back-to-back batches to show
    span = backlog_span_s(samples, free, slow.pair, big.pair)
    assert span == pytest.approx(40 / (10_000 / 88 - RATE))
    assert busy_share(batches(0.088, 0.0, n=20), span_s=span) is None  # 1.7 s: too short
    assert busy_share(batches(0.088, 0.0, n=40), span_s=span) >= BACKLOG_SHARE
    # with a target its own span decides (a shorter backlog costs no request its target)
    assert backlog_span_s(samples, GOAL, slow.pair, big.pair) == pytest.approx(0.4)
    # a served pair that does not drain at the rate has no span
    jammed = m(1, 10, 120.0, 11.0)
    assert backlog_span_s({jammed.pair: jammed}, free, jammed.pair, big.pair) is None


def test_a_recovery_pair_must_fit_the_goal_latency_included():
    slow = m(1, 10, 88.0, 11.0)
    # b=40 fills in 390 ms: with a 100 ms batch its worst case is 490 ms > 400 ms
    late = m(3, 40, 100.0, 12.0)
    samples = {x.pair: x for x in (slow, late)}
    assert recovery_pair(samples, GOAL, serve(slow)) is None
    unmeasured = PairMeasurement(q(3, 10), math.nan, 14.0)
    samples[unmeasured.pair] = unmeasured
    assert recovery_pair(samples, GOAL, serve(slow)) is None
