"""No drain right after a drain unless the backlog is real (powerd.optimize.backlog, pure).

The case a user-testing pass found: an inference job at 200/s with a 300-ms target, served
with batches of 1 that run ~92 % of the time, its fastest fit pair batches of 32. The
client stopped serving for 5 s. The daemon drained the backlog at b=32, then every return
to b=1 found up to 31 requests queued (the b=32 batch the client was filling), b=1 worked
them off back to back for ~1.8 s, longer than the target's 0.3-s span, and the drain
started again: 13 drains in 25 s. Here a client's queue is simulated request by request
and the planner's drain decision is replayed on the batches it runs."""

from __future__ import annotations

import collections

import pytest

from powerd.optimize.backlog import (
    BACKLOG_SHARE,
    DRAINED_SHARE,
    LEFTOVER_BATCHES,
    after_drain_s,
    backlog_span_s,
    busy_share,
    recovery_pair,
)
from powerd.optimize.inference import InferenceGoal, PairMeasurement, ServePair
from tests.backlog_client import FAST, GOAL, RATE, SAMPLES, SERVED, TICK_S, TRUE_S, Client, q


def replay(
    stalls: list[tuple[float, float]], hysteresis: bool, horizon_s: float = 32.0, seed: int = 2
) -> tuple[list[float], list[float]]:
    """The planner's drain decision (InferenceJobsPlanner._drain_backlog) on the client's
    batches, one pass per TICK_S: batches of the pair served, begun since it was asked for
    (settle 0, the worst case: the whole leftover of a switch counts). With `hysteresis`,
    a drain's end sets quiet_until = now + settle + after_drain_s and the backlog check
    reads busy_share(..., since=quiet_until), as the planner is to do; without, the check
    as it stood. Returns the times drains started, and ended."""
    client = Client(stalls, seed)
    chosen = ServePair(SERVED.pair, True, 4.5, SERVED.power_w)
    fast = recovery_pair(SAMPLES, GOAL, chosen)
    assert fast is not None and fast.pair == FAST.pair
    span = backlog_span_s(SAMPLES, GOAL, chosen.pair, fast.pair)
    draining, since, quiet_until = False, 0.0, None
    served: collections.deque = collections.deque(maxlen=2048)  # the planner's served_ends
    started, ended = [], []
    t = 0.0
    while t < horizon_s:
        t += TICK_S
        pair = fast.pair if draining else chosen.pair
        served.extend((s, e) for s, e, p in client.run(t) if p == pair and s >= since)
        seen = [w for w in served if w[1] <= t]
        if draining:
            share = busy_share(seen)
            if share is not None and share < DRAINED_SHARE:
                draining, since = False, t
                ended.append(t)
                if hysteresis:
                    quiet_until = t + after_drain_s(SAMPLES, GOAL, chosen.pair, fast.pair)
        else:
            share = busy_share(seen, span_s=span, since=quiet_until if hysteresis else None)
            if share is not None and share >= BACKLOG_SHARE:
                draining, since = True, t
                started.append(t)
        if since == t:
            served.clear()
            client.ask(t, fast.pair if draining else chosen.pair)
    return started, ended


def test_the_return_from_a_drain_does_not_start_another():
    # the client stops serving for 5 s (1000 requests pile up), then serves again
    stalls = [(2.0, 7.0)]
    # as the tester saw it: a drain at b=32, then every return to b=1 (up to 31 requests
    # queued, worked off back to back for up to 1.8 s) starts another, until the job ends
    flapping, _ = replay(stalls, hysteresis=False)
    assert len(flapping) >= 10, flapping
    # with the quiet time after a drain: one drain, whatever the switches leave queued
    for seed in range(1, 6):
        once, ended = replay(stalls, hysteresis=True, seed=seed)
        assert len(once) == 1 and len(ended) == 1, (seed, once, ended)
        assert 7.0 < once[0] < 7.0 + 0.3 + 3 * TICK_S  # the target's span after the resume


def test_a_later_stall_still_starts_a_drain():
    # the same stall, and a second one 10 s after the first drain ended
    got, ended = replay([(2.0, 7.0), (18.0, 20.0)], hysteresis=True)
    assert len(got) == 2 and ended[0] < 9.0, (got, ended)
    # past the quiet time after a drain the check is the target's span, as before
    assert 20.0 < got[1] < 20.0 + 0.3 + 3 * TICK_S


def test_a_stall_right_after_a_drain_starts_one_once_the_quiet_time_is_over():
    # the client stops again just after its return from the first drain: its requests pile
    # up, and the batches run back to back from the resume on
    first, ended = replay([(2.0, 7.0)], hysteresis=True)
    back = ended[0]  # the return to b=1
    got, ended = replay([(2.0, 7.0), (back + 0.2, back + 1.2)], hysteresis=True)
    assert len(got) == 2 and got[0] == first[0] and ended[0] == back, (got, ended)
    # no drain in the quiet time (2.9 s), then one after the target's span, no later
    quiet = after_drain_s(SAMPLES, GOAL, SERVED.pair, FAST.pair)
    assert ended[0] + quiet + 0.3 <= got[1] < ended[0] + quiet + 0.3 + 3 * TICK_S, (got, ended)


def test_the_quiet_time_after_a_drain_covers_what_the_switch_leaves():
    # b=1 takes 1000/4.5 - 200 = 22.2 requests/s more than arrive: two b=32 batches' worth
    spare = 1000.0 / SERVED.batch_ms - RATE
    quiet = after_drain_s(SAMPLES, GOAL, SERVED.pair, FAST.pair)
    assert quiet == pytest.approx(LEFTOVER_BATCHES * 32 / spare)
    assert quiet == pytest.approx(2.88, abs=0.01)
    # 31 requests at the pair's true 92 %: worked off in 31 / (1/0.0046 - 200) = 1.8 s
    assert 31 / (1.0 / TRUE_S[SERVED.pair] - RATE) < quiet
    # the same without a latency target
    free = InferenceGoal(RATE, 15.0, None)
    assert after_drain_s(SAMPLES, free, SERVED.pair, FAST.pair) == pytest.approx(quiet)
    # a served pair that does not drain at the rate, or unmeasured: nothing to go on
    jammed = PairMeasurement(q(1, 1), 5.5, 9.0, 5.5, 40)
    assert after_drain_s({jammed.pair: jammed}, GOAL, jammed.pair, FAST.pair) is None
    assert after_drain_s({}, GOAL, SERVED.pair, FAST.pair) is None


def test_batches_begun_before_since_are_not_seen():
    back_to_back = [(0.005 * i, 0.005 * i + 0.005) for i in range(400)]  # 2 s
    assert busy_share(back_to_back, span_s=0.3) == pytest.approx(1.0)
    assert busy_share(back_to_back, span_s=0.3, since=1.0) == pytest.approx(1.0)
    # not enough left after `since` to span 0.3 s
    assert busy_share(back_to_back, span_s=0.3, since=1.8) is None
    assert busy_share(back_to_back, since=2.5) is None
