"""The standard normal distribution, vectorised over numpy arrays: the strategies turn a
model's stated spread into a chance to fit with it (numpy has no erf; scipy is no
dependency)."""

from __future__ import annotations

import math

import numpy as np


def norm_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + erf(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)))


def norm_pdf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7)."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = np.zeros_like(t)
    for coef in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592):
        y = (y + coef) * t
    return s * (1.0 - y * np.exp(-a * a))
