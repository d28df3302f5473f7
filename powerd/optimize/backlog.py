"""Draining an inference client's backlog: when to serve a faster pair, and which.

The least-power pair that fits a goal may drain the queue with little to spare (its
median batch time up to 0.9 * b/r). That holds the latency target in steady state, but a
backlog left by anything else (profiling windows at pairs too slow for the rate, a burst
of requests, a spell at a budget nothing drains under) then shrinks by as little as 10 %
of the arrival rate: minutes of queued requests for every minute of backlog, every
request of them late.

The daemon never sees the client's queue, but it sees the batches: with requests
waiting, the client starts the next batch as soon as the last one ends, so the batches
run back to back; with none, each batch waits for its b requests to arrive, and the GPU
idles between batches for a share 1 - r*t/b. So a busy share near 1 over several batches
of a pair that should leave gaps means a backlog. Then the measured pair that fits the
goal with the most spare capacity (its measured power within the budget; with a target,
its worst-case latency within it) serves until gaps show again, and the goal's own pair
takes over.

How long the batches must run back to back first (`backlog_span_s`):
- with a latency target, the target's span: a shorter backlog, such as the few batches
  queued while the client switches to a new batch size, drains by itself, and costs no
  request its target;
- without one, long enough that the queue must hold at least one batch of the drain pair
  (back to back for T s, the served pair took T * (b/t - r) requests more than arrived).
  The served pair is then the least-latency one, and the drain pair has a larger batch:
  with less than a batch of it queued, its requests would wait for the batch to fill (at a
  low rate, seconds), longer than the backlog would have made them wait.

Pure, like the rest of :mod:`powerd.optimize`: batch windows and measurements in,
answers out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from powerd.optimize.inference import (
    InferenceGoal,
    Pair,
    PairMeasurement,
    ServePair,
    fit_for,
    worst_latency_ms,
)

# Batches looked at: the last WATCH_BATCHES served (after the switch settled), and for a
# backlog at least the latency target's span of them.
WATCH_BATCHES = 8
# Busy share at or above which the batches run back to back (a backlog). A fit pair's
# median batch leaves >= 10 % idle with an empty queue; 2 % batch-time noise does not
# close that gap over 8 batches.
BACKLOG_SHARE = 0.97
# Busy share below which the recovery pair's batches wait for requests again: drained.
DRAINED_SHARE = 0.9
# A recovery pair must leave at least this much more of the GPU idle than the served pair
# (else it drains hardly faster), and itself at most RECOVERY_MAX_SHARE busy at the rate.
MIN_SPARE_GAIN = 0.1
RECOVERY_MAX_SHARE = 0.8


def busy_share(batches: Sequence[tuple[float, float]], span_s: float = 0.0) -> float | None:
    """Share of the time between the first and the last batch end that batches ran, over
    the last WATCH_BATCHES (start, end) windows, more if needed to span `span_s`; None
    when the batches seen do not reach that far."""
    seen = list(batches)
    if len(seen) < WATCH_BATCHES:
        return None
    last = seen[-1][1]
    k = len(seen) - WATCH_BATCHES
    while k > 0 and last - seen[k][1] < span_s:
        k -= 1
    recent = seen[k:]
    span = last - recent[0][1]
    if span <= 0 or span < span_s:
        return None
    return sum(e - s for s, e in recent[1:]) / span


def load_share(m: PairMeasurement, rate_hz: float) -> float:
    """The share of time the GPU runs batches of this pair at the rate: r * t / b."""
    return rate_hz * m.batch_ms / 1000.0 / m.pair.batch_size


def backlog_span_s(
    samples: Mapping[Pair, PairMeasurement], goal: InferenceGoal, served: Pair, fast: Pair
) -> float | None:
    """How long `served`'s batches must run back to back to mean a backlog worth draining
    with `fast` (module docstring); None when the served pair does not drain at all."""
    if goal.latency_ms is not None:
        return goal.latency_ms / 1000.0
    here = samples.get(served)
    if here is None or not here.batch_ms > 0:
        return None
    spare = served.batch_size * 1000.0 / here.batch_ms - goal.rate_hz  # requests/s
    return fast.batch_size / spare if spare > 0 else None


def recovery_pair(
    samples: Mapping[Pair, PairMeasurement], goal: InferenceGoal, served: ServePair
) -> ServePair | None:
    """The measured pair that fits `goal` with the most spare capacity, if it drains a
    backlog clearly faster than `served` (None otherwise, or when `served` does not fit)."""
    here = samples.get(served.pair)
    if not served.feasible or here is None:
        return None
    fits = [m for m in samples.values() if fit_for(m, goal)]
    if not fits:
        return None
    best = min(fits, key=lambda m: (load_share(m, goal.rate_hz), m.power_w, m.pair))
    share = load_share(best, goal.rate_hz)
    if share > RECOVERY_MAX_SHARE or share > load_share(here, goal.rate_hz) - MIN_SPARE_GAIN:
        return None
    latency = float(worst_latency_ms(best.pair.batch_size, goal.rate_hz, best.tail_ms))
    return ServePair(best.pair, True, latency, best.power_w)
