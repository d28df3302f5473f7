"""Which modes to profile for a new workload: the sampling designs tools/eval_transfer.py
compares, exposed so that search strategies can use the measured winner.

Coverage is measured on the board's own grid in *rank* space (each axis' values mapped
to 0..1 by their index): every knob then counts equally and a board with a short axis
(Orin Nano: 2 EMC rates) is covered as evenly as one with a long one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from powerd.optimize.pareto import pareto_front
from powerd.predictor.features import validate_modes

POLICIES = ("random", "grid", "front")


def rank_coords(modes: np.ndarray) -> np.ndarray:
    """(N, 4) in [0, 1]: each value's index among its axis' distinct values, normalised."""
    m = validate_modes(modes)
    out = np.zeros(m.shape, dtype=np.float64)
    for j in range(m.shape[1]):
        vals, inv = np.unique(m[:, j], return_inverse=True)
        out[:, j] = inv / max(len(vals) - 1, 1)
    return out


def farthest_point(
    coords: np.ndarray, k: int, chosen: Sequence[int] = (), rng: np.random.Generator | None = None
) -> list[int]:
    """Greedy maximin: add modes, each the farthest from those chosen, until k are chosen.
    Starts from `chosen`, or from a random mode (seeded) when nothing is chosen yet."""
    n = len(coords)
    k = min(k, n)
    sel = list(dict.fromkeys(int(i) for i in chosen))[:k]
    if not sel and k > 0:
        sel = [int((rng or np.random.default_rng(0)).integers(n))]
    dist = np.full(n, np.inf)
    for i in sel:
        dist = np.minimum(dist, np.sum((coords - coords[i]) ** 2, axis=1))
    while len(sel) < k:
        i = int(np.argmax(dist))
        sel.append(i)
        dist = np.minimum(dist, np.sum((coords - coords[i]) ** 2, axis=1))
    return sel


def front_members(pred_time: np.ndarray, pred_power: np.ndarray, m: int) -> list[int]:
    """`m` members of the predicted Pareto front, spread evenly in predicted power."""
    front = pareto_front(pred_time, pred_power)
    if m <= 0 or front.size == 0:
        return []
    p = pred_power[front]
    targets = np.linspace(p[0], p[-1], m)
    picks = front[np.searchsorted(p, targets).clip(0, len(front) - 1)]
    return list(dict.fromkeys(int(i) for i in picks))


def select_modes(
    policy: str,
    modes: np.ndarray,
    k: int,
    *,
    predicted: tuple[np.ndarray, np.ndarray] | None = None,
    front_share: float = 0.5,
    seed: int = 0,
) -> np.ndarray:
    """Indices (into `modes`) of k modes to profile.

    random: uniform without replacement; grid: maximin coverage of the rank grid; front:
    ``front_share`` of k spread along the front of `predicted` (the reference model's
    (time, power) over `modes`), the rest by maximin coverage around them."""
    m = validate_modes(modes)
    rng = np.random.default_rng(seed)
    k = min(int(k), len(m))
    if policy == "random":
        return rng.choice(len(m), size=k, replace=False).astype(np.int64)
    coords = rank_coords(m)
    if policy == "grid":
        return np.array(farthest_point(coords, k, rng=rng), dtype=np.int64)
    if policy == "front":
        if predicted is None:
            raise ValueError("policy 'front' needs the reference's predicted (time, power)")
        seeds = front_members(predicted[0], predicted[1], int(round(k * front_share)))
        return np.array(farthest_point(coords, k, seeds, rng=rng), dtype=np.int64)
    raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")
