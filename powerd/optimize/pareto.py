"""Pareto front of (step time, power) over a mode space, and lookups on it. numpy only.

Dominance: mode j dominates mode i when it is no slower and draws no more power, and is
strictly better in one of the two. Among modes with *identical* (time, power) only the
lowest index is kept, so walking the front never steps between equivalent modes. Modes
with a NaN time or power are never on the front and never chosen.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np


def _as_pair(time_ms: np.ndarray, power_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(time_ms, dtype=np.float64).reshape(-1)
    p = np.asarray(power_w, dtype=np.float64).reshape(-1)
    if t.shape != p.shape:
        raise ValueError(f"time_ms and power_w differ in length: {t.shape} vs {p.shape}")
    return t, p


def pareto_front(time_ms: np.ndarray, power_w: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated modes, sorted by power ascending (so time descending).

    O(n log n): sort by (power, time, index); a mode is on the front iff it is strictly
    faster than every mode before it in that order."""
    t, p = _as_pair(time_ms, power_w)
    valid = np.flatnonzero(~(np.isnan(t) | np.isnan(p)))
    if valid.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = valid[np.lexsort((valid, t[valid], p[valid]))]
    ts = t[order]
    prev_min = np.concatenate([[np.inf], np.minimum.accumulate(ts)[:-1]])
    return order[ts < prev_min].astype(np.int64)


def _mask(n: int, exclude: Iterable[int] | np.ndarray | None) -> np.ndarray:
    ok = np.ones(n, dtype=bool)
    if exclude is None:
        return ok
    ex = np.asarray(exclude if isinstance(exclude, np.ndarray) else list(exclude))
    if ex.dtype == bool:
        if ex.shape != (n,):
            raise ValueError(f"boolean exclude mask must have shape ({n},), got {ex.shape}")
        return ~ex
    if ex.size:
        ok[ex.astype(np.int64)] = False
    return ok


def fastest_under(
    time_ms: np.ndarray,
    power_w: np.ndarray,
    budget_w: float,
    exclude: Iterable[int] | np.ndarray | None = None,
) -> int | None:
    """Index of the fastest mode with power <= budget_w (ties: lower power, then lower
    index), skipping `exclude` (indices or a boolean mask of excluded modes). None if no
    mode fits."""
    t, p = _as_pair(time_ms, power_w)
    ok = _mask(len(t), exclude) & (p <= budget_w) & ~np.isnan(t)
    idx = np.flatnonzero(ok)
    if idx.size == 0:
        return None
    best = idx[np.lexsort((idx, p[idx], t[idx]))[0]]
    return int(best)


def next_lower_on_front(
    time_ms: np.ndarray,
    power_w: np.ndarray,
    current: int,
    front: np.ndarray | None = None,
    exclude: Iterable[int] | np.ndarray | None = None,
) -> int | None:
    """The front member with the highest power strictly below mode `current`'s power (the
    next step down when `current` measured over budget), skipping `exclude`. None at the
    bottom. Pass a precomputed `front` to avoid recomputing it on every step."""
    t, p = _as_pair(time_ms, power_w)
    if not 0 <= current < len(t):
        raise IndexError(f"mode index {current} out of range for {len(t)} modes")
    f = pareto_front(t, p) if front is None else np.asarray(front, dtype=np.int64)
    f = f[_mask(len(t), exclude)[f]]
    below = f[p[f] < p[current]]
    if below.size == 0:
        return None
    # The front is sorted by power ascending; the last one below is the nearest step down.
    return int(below[np.argmax(p[below])])


def walk_down(
    time_ms: np.ndarray,
    power_w: np.ndarray,
    start: int,
    front: np.ndarray | None = None,
) -> Iterator[int]:
    """Yield the front members below `start`, from the next lower power downwards."""
    t, p = _as_pair(time_ms, power_w)
    f = pareto_front(t, p) if front is None else np.asarray(front, dtype=np.int64)
    cur: int | None = start
    while cur is not None:
        cur = next_lower_on_front(t, p, cur, f)
        if cur is not None:
            yield cur
