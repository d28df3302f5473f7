"""Covering the rate axis: which pair to measure so that a later rate change finds a
measured pair fitting it, with no measurement of its own.

At a fixed latency target L and budget B, a pair (mode, b) fits every arrival rate r with

    r <= 0.9 * b / t_inf              (the queue drains)
    r >= (b - 1) / (L - t_tail)       (the batch fills and runs within L)

and power <= B: an interval of rates per pair. The rates a workload can serve at (L, B) are
the union of those intervals over every pair; the rates a rate change can be served at
*without measuring* are the union over the measured pairs. Covering measures the pair
expected to add the most of the first to the second, on a geometric ladder of rates:
each unmeasured pair's chance to fit each rate not yet covered comes from the model's
predictions and stated spread (as InferencePlanner.fit_probability), and their sum over
the uncovered rates is the pair's expected gain in covered rates. Covering stops once no
pair is expected to cover MIN_COVER_GAIN rates of the ladder.

Why on rates and not the fastest pair at every batch size (which covers every rate its
size can serve): on a narrow front the fastest pair within the budget at a size is one
pair of hundreds, often read within noise of the budget, and a model picks it only
roughly; a wrong pick left whole rate ranges uncovered while sizes whose rates other
sizes already serve were covered again. Scoring rates spends the measurements where a
rate change would otherwise find nothing measured.
"""

from __future__ import annotations

import math

import numpy as np

from powerd.optimize.normal import norm_cdf

RATE_STEP = 1.1  # ratio of neighbouring rates on the ladder: a 10 % rate change
RATE_SPAN = 100.0  # the ladder runs from the fastest predicted drain rate down to 1/100 of it
MIN_COVER_GAIN = 0.2  # expected newly covered ladder rates for a pair to be worth a window
MIN_POWER_CHANCE = 0.02  # pairs less likely than this to be within the budget are skipped


def rate_ladder(top_hz: float) -> np.ndarray:
    """Geometric rates from `top_hz` down to top_hz / RATE_SPAN, highest first."""
    if not (math.isfinite(top_hz) and top_hz > 0):
        return np.zeros(0)
    n = int(math.floor(math.log(RATE_SPAN) / math.log(RATE_STEP))) + 1
    return top_hz / RATE_STEP ** np.arange(n)


def time_limits_ms(
    b: np.ndarray, rates_hz: np.ndarray, latency_ms: float | None, drain_fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per (rate, pair): the longest median batch time that drains and the longest tail
    batch time that meets the latency target (inf without one), in ms."""
    per_batch = np.asarray(b, float)[None, :] * 1000.0 / rates_hz[:, None]
    drain = drain_fraction * per_batch
    if latency_ms is None:
        return drain, np.full_like(drain, np.inf)
    fill = per_batch - 1000.0 / rates_hz[:, None]  # (b - 1) / r
    return drain, latency_ms - fill


def covered(
    b: np.ndarray,
    batch_ms: np.ndarray,
    tail_ms: np.ndarray,
    power_w: np.ndarray,
    rates_hz: np.ndarray,
    budget_w: float,
    latency_ms: float | None,
    drain_fraction: float,
) -> np.ndarray:
    """Per rate of `rates_hz`: does a measured pair fit it (its measured median, tail and
    power; see inference.fit_for)?"""
    if len(b) == 0:
        return np.zeros(len(rates_hz), dtype=bool)
    drain, lat = time_limits_ms(b, rates_hz, latency_ms, drain_fraction)
    ok = (batch_ms[None, :] <= drain) & (tail_ms[None, :] <= lat)
    ok &= (power_w <= budget_w)[None, :] & np.isfinite(batch_ms)[None, :]
    return ok.any(axis=1)


def best_cover(
    b: np.ndarray,
    t_ms: np.ndarray,
    t_spread: np.ndarray,
    power_w: np.ndarray,
    p_spread: np.ndarray,
    candidate: np.ndarray,
    rates_hz: np.ndarray,
    budget_w: float,
    latency_ms: float | None,
    drain_fraction: float,
    time_margin: float,
) -> tuple[int | None, float]:
    """The candidate pair expected to newly cover the most of `rates_hz` (the ladder's
    uncovered rates), from its predicted batch time and power and their spreads (sd of
    the log error); (its index, the expected gain), or (None, 0) when no candidate is
    expected to cover MIN_COVER_GAIN rates."""
    if len(rates_hz) == 0:
        return None, 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        p_ok = norm_cdf(np.log(budget_w / power_w) / p_spread)
    idx = np.flatnonzero(candidate & np.isfinite(t_ms) & (t_ms > 0) & (p_ok >= MIN_POWER_CHANCE))
    if idx.size == 0:
        return None, 0.0
    drain, lat = time_limits_ms(b[idx], rates_hz, latency_ms, drain_fraction)
    limit = np.minimum(drain, lat)
    tail = t_ms[idx] * (1 + time_margin)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(limit > 0, np.log(np.maximum(limit, 1e-9) / tail) / t_spread[idx], -np.inf)
    gain = (norm_cdf(z) * p_ok[idx]).sum(axis=0)
    gain = np.where(np.isfinite(gain), gain, 0.0)
    k = int(np.argmax(gain))
    if gain[k] < MIN_COVER_GAIN:
        return None, float(gain[k])
    return int(idx[k]), float(gain[k])
