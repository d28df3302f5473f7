"""Board-agnostic input features of a power mode, shared by training, inference and refit.

A mode is ``(cores, cpu_khz, gpu_hz, emc_hz)`` in native sysfs units. Every feature is a
*monomial* of the four base quantities in physical units (core count and GHz):
``prod_j base_j ** e_j`` for an integer exponent vector ``e``. Why monomials:

* they carry the physics that transfers between boards: a step's time is roughly work
  divided by a rate (``1/f`` terms, ``1/(cores*f_cpu)`` for the data-loading CPU side), and
  dynamic power grows with frequency (``f``, ``f**2`` as voltage rises with clock);
* they are in absolute units (GHz, not "index in this board's frequency table"), so an
  Orin Nano mode lands where the same clocks sit in the Orin AGX corpus instead of being
  stretched to the AGX's ranges;
* the same transform is expressible exactly in ONNX (``exp(log(base) @ E.T)``), so the
  exported models take raw modes as input and stay valid if this module changes later:
  a fitted predictor persisted by one release never depends on another release's code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BASE_NAMES: tuple[str, ...] = ("cores", "cpu_ghz", "gpu_ghz", "emc_ghz")
# Native sysfs units -> (count, GHz, GHz, GHz).
UNIT_SCALE: tuple[float, ...] = (1.0, 1e-6, 1e-9, 1e-9)

# Exponent rows over BASE_NAMES. Kept small on purpose: every extra feature is another
# direction in which a new board can extrapolate badly.
FEATURE_SETS: dict[str, tuple[tuple[int, int, int, int], ...]] = {
    # The published predictor's inputs: the four knobs.
    "raw": (
        (1, 0, 0, 0),
        (0, 1, 0, 0),
        (0, 0, 1, 0),
        (0, 0, 0, 1),
    ),
    # Knobs, their reciprocals (time ~ work / rate), and aggregate CPU throughput.
    "rate": (
        (1, 0, 0, 0),
        (0, 1, 0, 0),
        (0, 0, 1, 0),
        (0, 0, 0, 1),
        (-1, 0, 0, 0),
        (0, -1, 0, 0),
        (0, 0, -1, 0),
        (0, 0, 0, -1),
        (1, 1, 0, 0),
        (-1, -1, 0, 0),
    ),
    # "rate" plus squared clocks, the shape of dynamic power (P ~ f V^2, V rising with f).
    "rate_power": (
        (1, 0, 0, 0),
        (0, 1, 0, 0),
        (0, 0, 1, 0),
        (0, 0, 0, 1),
        (-1, 0, 0, 0),
        (0, -1, 0, 0),
        (0, 0, -1, 0),
        (0, 0, 0, -1),
        (1, 1, 0, 0),
        (-1, -1, 0, 0),
        (1, 2, 0, 0),
        (0, 0, 2, 0),
        (0, 0, 0, 2),
    ),
}
DEFAULT_FEATURE_SET = "rate"

# The time terms of the transfer's physical time model (powerd.predictor.transfer): a step's
# time as a non-negative sum of a constant (fixed overheads), work at each clock's rate
# (1/f_gpu, 1/f_emc, 1/f_cpu for a single-threaded launch/driver path) and CPU work spread
# over the cores (1/(cores*f_cpu), data loading). A GPU-bound training step and a
# launch-bound batch-size-1 inference differ in which terms carry the weight, which a few
# profiled modes pin down; the reference's own predicted time is one more term beside them.
PHYSICAL_TIME: tuple[tuple[int, int, int, int], ...] = (
    (0, 0, 0, 0),
    (0, 0, -1, 0),
    (0, 0, 0, -1),
    (0, -1, 0, 0),
    (-1, -1, 0, 0),
)


# The power terms of the transfer's physical power model: static power (a constant) and the
# dynamic power of each clock domain, ~ f V^2 with the voltage rising with the clock, as f
# and f^3 (the CPU's per core, plus an uncore share at f^3); the reference's own predicted
# power is one more term beside them. Non-negative weights keep it monotone in every knob.
PHYSICAL_POWER: tuple[tuple[int, int, int, int], ...] = (
    (0, 0, 0, 0),
    (1, 1, 0, 0),
    (1, 3, 0, 0),
    (0, 3, 0, 0),
    (0, 0, 1, 0),
    (0, 0, 3, 0),
    (0, 0, 0, 1),
)

# Power terms per step: each monomial times REF_UNIT_MS / t(mode), with t the fitted step
# time. A domain's dynamic power is the energy it spends per step over the step's time
# (~ its cycles x V^2 / t), not its clock alone: a launch-bound batch-size-1 inference
# hardly draws more at a faster GPU clock, because its steps are not shorter, while a
# GPU-bound step is and draws ~f^3. From a low budget's samples the clock-only terms
# extrapolate that slope to the top clocks 5-7 W high (ResNet-18 inference, 15-18 W budgets).
# Terms: work per step at a fixed voltage (a constant), GPU (V^2 ~ f^2), memory traffic
# (~ f_emc) and the CPU cores (~ cores x f^2).
PHYSICAL_POWER_PER_STEP: tuple[tuple[int, int, int, int], ...] = (
    (0, 0, 0, 0),
    (0, 0, 2, 0),
    (0, 0, 0, 1),
    (1, 2, 0, 0),
)


def exponents(feature_set: str = DEFAULT_FEATURE_SET) -> np.ndarray:
    """The (F, 4) integer exponent matrix of a named feature set."""
    try:
        return np.array(FEATURE_SETS[feature_set], dtype=np.int64)
    except KeyError:
        raise ValueError(
            f"unknown feature set {feature_set!r}; known: {sorted(FEATURE_SETS)}"
        ) from None


def feature_names(exps: np.ndarray | Sequence[Sequence[int]]) -> list[str]:
    """Readable names, e.g. ``cores^1*cpu_ghz^1`` or ``gpu_ghz^-1``."""
    names = []
    for row in np.asarray(exps, dtype=np.int64):
        parts = [f"{n}^{e}" for n, e in zip(BASE_NAMES, row, strict=True) if e != 0]
        names.append("*".join(parts) if parts else "1")
    return names


def validate_modes(modes: np.ndarray | Sequence[Sequence[int]]) -> np.ndarray:
    """Return modes as an (N, 4) int64 array; reject shapes and non-positive values clearly."""
    arr = np.asarray(modes)
    if arr.ndim == 1 and arr.shape[0] == 4:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(
            f"modes must be an (N, 4) array of (cores, cpu_khz, gpu_hz, emc_hz); got {arr.shape}"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise ValueError("modes must hold integers in native sysfs units")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and np.any(arr <= 0):
        bad = arr[np.any(arr <= 0, axis=1)][0].tolist()
        # log() of a zero clock would silently poison every prediction downstream.
        raise ValueError(f"mode values must be > 0 (cores, kHz, Hz, Hz); got {bad}")
    return arr


def base_quantities(modes: np.ndarray | Sequence[Sequence[int]]) -> np.ndarray:
    """(N, 4) float64: cores and CPU/GPU/EMC clocks in GHz."""
    return validate_modes(modes).astype(np.float64) * np.asarray(UNIT_SCALE)


def mode_features(
    modes: np.ndarray | Sequence[Sequence[int]],
    exps: np.ndarray | Sequence[Sequence[int]] | None = None,
) -> np.ndarray:
    """(N, F) float64 features. Same formula as the ONNX graphs: exp(log(base) @ E.T)."""
    e = exponents() if exps is None else np.asarray(exps, dtype=np.int64)
    if e.ndim != 2 or e.shape[1] != 4:
        raise ValueError(f"exponent matrix must be (F, 4); got {e.shape}")
    return np.exp(np.log(base_quantities(modes)) @ e.T.astype(np.float64))
