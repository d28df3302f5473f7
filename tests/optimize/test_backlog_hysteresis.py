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
import random

import pytest

from powerd.modes import PowerMode
from powerd.optimize.backlog import (
    BACKLOG_SHARE,
    DRAINED_SHARE,
    LEFTOVER_BATCHES,
    after_drain_s,
    backlog_span_s,
    busy_share,
    recovery_pair,
)
from powerd.optimize.inference import InferenceGoal, Pair, PairMeasurement, ServePair

RATE = 200.0  # requests/s
GOAL = InferenceGoal(RATE, 15.0, 300.0)
TICK_S = 0.02  # the daemon's passes
PICKUP_S = 0.2  # the client sees a new batch size with a later state: within ~0.2 s


def q(gpu: int, b: int) -> Pair:
    return Pair(PowerMode(4, 1000, gpu, 1000), b)


# b=1 measured at 4.5 ms (90 % busy at 200/s: the fit limit), the least power; its batches
# in fact take 4.6 ms on average (92 % busy, as the tester saw). b=32 at 19.2 ms: 12 % busy,
# worst case 155 + 19 ms.
SERVED = PairMeasurement(q(1, 1), 4.5, 9.0, 4.5, 40)
FAST = PairMeasurement(q(3, 32), 19.2, 14.0, 19.2, 40)
SAMPLES = {x.pair: x for x in (SERVED, FAST)}
TRUE_S = {SERVED.pair: 0.0046, FAST.pair: 0.0192}


class Client:
    """A client's queue: a request every 1/RATE s from t=0, batches of the size last asked
    for (seen PICKUP_S or less after the daemon asked) run one at a time as soon as enough
    requests wait, none begun during a stall (the client not serving); ~2 % batch-time
    noise. The daemon's mode follows the pair at once."""

    def __init__(self, stalls: list[tuple[float, float]], seed: int):
        self.stalls = stalls
        self.taken = 0  # requests taken into batches
        self.free = 0.0  # when the GPU is done with the last batch
        self.pair = SERVED.pair  # the size the client forms, the mode the GPU runs
        self.next: tuple[float, Pair] | None = None  # a size the client has yet to see
        self.rng = random.Random(seed)

    def ask(self, now: float, pair: Pair) -> None:
        self.next = (now + self.rng.uniform(0.0, PICKUP_S), pair)

    def run(self, until: float) -> list[tuple[float, float, Pair]]:
        """Batches begun before `until`: (start, end, pair)."""
        out = []
        while True:
            b = self.pair.batch_size
            start = max(self.free, (self.taken + b - 1) / RATE)
            for a, z in self.stalls:
                if a <= start < z:
                    start = z
            if self.next is not None and self.next[0] <= min(start, until):
                # the new size is seen before this batch begins: it forms the next one
                self.free = max(self.free, self.next[0])
                self.pair, self.next = self.next[1], None
                continue
            if start >= until:
                return out
            end = start + TRUE_S[self.pair] * self.rng.gauss(1.0, 0.02)
            out.append((start, end, self.pair))
            self.taken += b
            self.free = end


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
