"""The physical time model of the transfer: a step's time as a non-negative sum of time terms.

``t(mode) = s * t_ref(mode) + sum_j c_j * m_j(mode)``, with ``m_j`` the monomials of
:data:`powerd.predictor.features.PHYSICAL_TIME` (a constant, 1/f_gpu, 1/f_emc, 1/f_cpu,
1/(cores*f_cpu)), ``t_ref`` the reference model's predicted time and every weight >= 0.

Why: the reference was trained on a GPU-bound training job; a workload whose time goes
elsewhere (inference at batch size 1: kernel launches on one CPU thread) ranks the knobs
differently, and a refit of the reference's last layer from 20-50 modes cannot turn it
around (tools/bench_prediction.py: 12-44 % time MAPE on ResNet-18 inference at batch size
1). Six non-negative weights can: the samples say which resource the time goes to, the
signs keep this model monotone in every clock (no wild extrapolation from a low-power
sample set), and with few samples the fit stays small. Fitted on relative error
(weights 1/t), as the targets span 10x.

The bottleneck form below (the slower of a CPU side and a GPU side, not their sum) is a
second candidate; the transfer keeps whichever has the lower leave-one-out error.
"""

from __future__ import annotations

import numpy as np

from powerd.predictor.features import (
    PHYSICAL_POWER,
    PHYSICAL_POWER_PER_STEP,
    PHYSICAL_TIME,
    mode_features,
)

# Scale of the reference-time column (ms): keeps it in the range of the monomials (~0.1-10)
# so the active-set solver's tolerances mean the same for every column.
REF_UNIT_MS = 100.0
HIGH_LEVERAGE = 0.5


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0 (Lawson-Hanson active set). Small problems
    (a few columns) only: each step solves the passive set's least squares afresh."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-10 * max(1.0, float(np.abs(a).max(initial=0.0)) * max(m, n))
    for _ in range(max_iter or 3 * n + 3):
        grad = a.T @ (b - a @ x)
        free = ~passive & (grad > tol)
        if not free.any():
            break
        passive[int(np.argmax(np.where(free, grad, -np.inf)))] = True
        for _ in range(3 * n + 3):
            z = np.zeros(n)
            idx = np.flatnonzero(passive)
            z[idx] = np.linalg.lstsq(a[:, idx], b, rcond=None)[0]
            neg = passive & (z <= 0)
            if not neg.any():
                x = z
                break
            # Step from x towards z until the first passive weight reaches zero; drop it.
            step = np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        else:  # pragma: no cover - cycling; keep the last feasible x
            break
    return x


def design(modes: np.ndarray, ref_time_ms: np.ndarray) -> np.ndarray:
    """(N, F + 1): the monomials of PHYSICAL_TIME, then the reference's time / REF_UNIT_MS."""
    return np.column_stack(
        [mode_features(modes, PHYSICAL_TIME), np.asarray(ref_time_ms) / REF_UNIT_MS]
    )


# Scale of the reference-power column (W), for the same reason as REF_UNIT_MS.
REF_UNIT_W = 10.0


def power_design(
    modes: np.ndarray, ref_power_w: np.ndarray, time_ms: np.ndarray | None = None
) -> np.ndarray:
    """(N, F + 1): the monomials of PHYSICAL_POWER, with `time_ms` (the fitted step time of
    each mode) those of PHYSICAL_POWER_PER_STEP times REF_UNIT_MS / time_ms, then the
    reference's power / REF_UNIT_W."""
    cols = [mode_features(modes, PHYSICAL_POWER)]
    if time_ms is not None:
        cols.append(per_step(mode_features(modes, PHYSICAL_POWER_PER_STEP), time_ms))
    return np.column_stack([*cols, np.asarray(ref_power_w) / REF_UNIT_W])


def per_step(features: np.ndarray, time_ms: np.ndarray) -> np.ndarray:
    """Per-step terms as power: each column times REF_UNIT_MS / step time."""
    t = np.maximum(np.asarray(time_ms, dtype=np.float64), 1e-6)
    return features * (REF_UNIT_MS / t)[:, None]


def fit_weights(x: np.ndarray, time_ms: np.ndarray) -> np.ndarray:
    """Non-negative weights minimising the squared *relative* error over the samples."""
    w = 1.0 / np.asarray(time_ms, dtype=np.float64)
    return nnls(x * w[:, None], np.ones(len(w)))


def loo_log_ratio(x: np.ndarray, time_ms: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """log(full-fit prediction / leave-one-out prediction) at each sample: how much each
    sample's own presence pulled the physical model towards it (for honest residuals).
    Closed form for least squares on the full fit's non-zero terms (a left-out sample rarely
    changes which terms are non-zero; refitting the NNLS k times cost ~100 ms at k = 50)."""
    k = len(time_ms)
    out = np.zeros(k)
    active = np.asarray(coef) > 0
    if k < 3 or not active.any():
        return out
    t = np.asarray(time_ms, dtype=np.float64)
    a = x[:, active] / t[:, None]
    q, _ = np.linalg.qr(a)
    lev = np.minimum(np.sum(q**2, axis=1), 1.0 - 1e-6)
    rel = 1.0 - a @ np.asarray(coef)[active]  # (t - prediction) / t
    loo_pred = t * (1.0 - rel / (1.0 - lev))
    # A sample that alone supports a term (leverage near 1: a corner of the grid) changes
    # the terms when left out, where the closed form blows up: refit those exactly.
    mask = np.ones(k, dtype=bool)
    for i in np.flatnonzero(lev > HIGH_LEVERAGE):
        mask[i] = False
        loo_pred[i] = float(x[i] @ fit_weights(x[mask], t[mask]))
        mask[i] = True
    full = np.maximum(x @ coef, 1e-9)
    return np.log(full / np.maximum(loo_pred, 1e-3 * t))


# -- the bottleneck form --------------------------------------------------------------------
# A step's CPU side (kernel launches, data handling: the 1/f_cpu terms) and its GPU side
# (kernels: 1/f_gpu and the reference's time) run overlapped, so the slower side sets the
# pace: t = const + 1/f_emc term + max(CPU side, GPU side). The memory clock serves both
# sides, so its term stays outside the max (inside the GPU side, a sample set that never
# moved the memory clock read it as worthless wherever the CPU side dominated: ResNet-18
# inference replays lost 2-5 points of mean penalty). The sum form reads a CPU-bound sample
# (at 422 MHz CPU a faster GPU clock changes nothing) as "the GPU clock is nearly free"
# everywhere; this form reads it as "this mode waits on the CPU": fitted to 10 low-power
# modes of ResNet-18 inference at batch size 1, time MAPE over every mode 24-28 % -> 4-7 %
# (tests/predictor/test_bottleneck.py), and through the daemon the 17 W budget of that
# workload, which had pinned a 114 MHz GPU mode ~95 % slower than the best in 2 of 6
# runs, found it in 6 of 6.
# Group of each PHYSICAL_TIME term: 0 added outside the max, 1 CPU side, 2 GPU side (the
# reference's time joins side 2).
BOTTLENECK_GROUPS = np.array([0, 2, 0, 1, 1], dtype=np.int64)
# The memory clock as a third side (const + max(CPU, GPU, memory)): a step at 4 cores and
# 726 MHz GPU waited on the memory at 665 MHz (224.9 ms; 169.9 ms at 2133 MHz) and on the
# CPU at 2133, so more cores pay off only at a high memory clock, which the form above
# cannot say (ResNet-18 inference bs 16, docs/experiments.md, session 58). One more side
# overfits a small sample, so the transfer admits it only under stricter terms
# (RidgeOptions.memory_side_factor).
MEMORY_SIDE_GROUPS = np.array([0, 2, 3, 1, 1], dtype=np.int64)
MAX_SIDES = 3
_RESTARTS = 24  # random side assignments tried besides the sum fit's (seeded: deterministic)


def _column_groups(groups: np.ndarray) -> np.ndarray:
    """The group of each design column: the terms', then the reference's time (GPU side)."""
    return np.append(groups, 2)


def side_count(groups: np.ndarray) -> int:
    """How many sides the max of a bottleneck form with these term groups has (2 or 3)."""
    return max(2, int(_column_groups(groups).max()))


def _sides(x: np.ndarray, coef: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(outside the max (N,), the sides (N, S), column s the time of side s + 1) of each row
    of a design `x` (monomials, then the reference's time column), in ms."""
    g, c = _column_groups(groups), np.asarray(coef, dtype=np.float64)
    outside = x @ np.where(g == 0, c, 0.0)
    n_sides = side_count(groups)
    sides = np.column_stack([x @ np.where(g == k, c, 0.0) for k in range(1, n_sides + 1)])
    return outside, sides


def bottleneck_time(x: np.ndarray, coef: np.ndarray, groups: np.ndarray) -> np.ndarray:
    outside, sides = _sides(x, coef, groups)
    return outside + sides.max(axis=1)


def _slowest(sides: np.ndarray) -> np.ndarray:
    """The side (1-based) each row waits on; a tie goes to the lower side (the CPU's)."""
    return np.argmax(sides, axis=1) + 1


def dominant_design(x: np.ndarray, coef: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """`x` with each row's slowest side kept and the other sides' columns zeroed: the linear
    model the bottleneck form is at these rows (for its leave-one-out residuals)."""
    return _masked(x, _slowest(_sides(x, coef, groups)[1]), groups)


def _masked(x: np.ndarray, side: np.ndarray, groups: np.ndarray) -> np.ndarray:
    g = _column_groups(groups)
    xm = np.array(x, dtype=np.float64, copy=True)
    off = (g[None, :] > 0) & (g[None, :] != np.asarray(side)[:, None])
    xm[off] = 0.0
    return xm


def fit_bottleneck(x: np.ndarray, time_ms: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Non-negative weights of the bottleneck form minimising the squared relative error.
    Given which side each sample waits on, the form is linear (fit_weights on the masked
    design); the assignment is found by alternating from the sum fit's and from seeded
    random starts, keeping the best (the objective is not convex in the assignment)."""
    t = np.asarray(time_ms, dtype=np.float64)
    k = len(t)
    rng = np.random.default_rng(k)
    n_sides = side_count(groups)

    def random_start() -> np.ndarray:
        if n_sides == 2:  # the draws of the two-sided form's first release: same fits
            return np.where(rng.random(k) < 0.5, 1, 2)
        return rng.integers(1, n_sides + 1, size=k)

    starts = [_slowest(_sides(x, fit_weights(x, t), groups)[1])]
    starts += [random_start() for _ in range(_RESTARTS)]
    best_err, best = np.inf, np.zeros(x.shape[1])
    seen: set[bytes] = set()
    for side in starts:
        for _ in range(10):
            key = np.asarray(side, dtype=np.int8).tobytes()
            if key in seen:
                break
            seen.add(key)
            coef = fit_weights(_masked(x, side, groups), t)
            err = float(np.mean((bottleneck_time(x, coef, groups) / t - 1.0) ** 2))
            if err < best_err - 1e-12:
                best_err, best = err, coef
            side = _slowest(_sides(x, coef, groups)[1])
    return best
