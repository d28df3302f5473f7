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

After a drain (`after_drain_s`), hysteresis: the return to the served pair leaves queued
what the client had gathered towards its next batch of the drain pair, less than a batch
of it. The served pair works that off back to back for up to b_fast / (b/t - r) s: near
the 0.9 * b/r limit far longer than a latency target's span (1.4 s for 32 requests with a
batch of 1 at 200/s, 90 % busy; 1.8 s at 92 %), so the target's span alone takes that
leftover for a new backlog, drains again, and does so after every drain. So for twice that
time after the served pair's batches count again, they show no backlog; after it the
check above applies as anywhere else, and a client that stalls again still starts a drain.

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
# After a drain, batches of the drain pair's size the served pair's first batches may be
# working off: less than one is queued at the switch (the batch the client was filling), and
# twice its work-off time covers a served pair running at up to half the spare capacity its
# measured median batch time gives (the busy share counts mean batch times; the fit leaves
# >= 10 % spare, so a pair measured at 90 % stays covered up to ~95 % busy).
LEFTOVER_BATCHES = 2.0


def busy_share(
    batches: Sequence[tuple[float, float]], span_s: float = 0.0, since: float | None = None
) -> float | None:
    """Share of the time between the first and the last batch end that batches ran, over
    the last WATCH_BATCHES (start, end) windows, more if needed to span `span_s`; None
    when the batches seen do not reach that far. Batches that start before `since` are not
    seen (after a drain: the ones that may work off the switch's leftover, `after_drain_s`)."""
    seen = list(batches) if since is None else [w for w in batches if w[0] >= since]
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
    spare = _spare_hz(samples, goal, served)
    return fast.batch_size / spare if spare is not None else None


def after_drain_s(
    samples: Mapping[Pair, PairMeasurement], goal: InferenceGoal, served: Pair, fast: Pair
) -> float | None:
    """How long, once `served`'s batches count again after a drain with `fast` ended, they
    may still be working off what the switch left queued: LEFTOVER_BATCHES batches of
    `fast` over `served`'s spare capacity (module docstring). Batches starting before then
    show no backlog (`busy_share(..., since=...)`). None when `served` does not drain at the
    rate (nor has `backlog_span_s` a span for it without a target)."""
    spare = _spare_hz(samples, goal, served)
    return LEFTOVER_BATCHES * fast.batch_size / spare if spare is not None else None


def _spare_hz(
    samples: Mapping[Pair, PairMeasurement], goal: InferenceGoal, served: Pair
) -> float | None:
    """Requests/s more than arrive that `served` takes with its batches back to back (its
    measured median batch time); None when unmeasured or not more than the rate."""
    here = samples.get(served)
    if here is None or not here.batch_ms > 0:
        return None
    spare = served.batch_size * 1000.0 / here.batch_ms - goal.rate_hz
    return spare if spare > 0 else None


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
