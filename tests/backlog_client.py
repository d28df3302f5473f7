"""A client's request queue, simulated request by request, for the backlog-drain tests
(tests/optimize/test_backlog_hysteresis.py replays the planner's pure drain decision on it,
tests/test_inference_planner_backlog.py drives the planner itself): an inference job at
200/s with a 300-ms target, served with batches of 1 (~92 % busy), its fastest fit pair
batches of 32."""

from __future__ import annotations

import random

from powerd.modes import PowerMode
from powerd.optimize.inference import InferenceGoal, Pair, PairMeasurement

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
