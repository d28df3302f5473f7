"""A synthetic pair model for the inference planner's tests: three GPU clocks, three batch
sizes, measurements equal to the model (no noise)."""

from __future__ import annotations

import numpy as np

from powerd.modes import PowerMode
from powerd.optimize.inference import Pair, PairMeasurement

MODES = np.array([(4, 1000, g, 1000) for g in (1, 2, 3)])
SIZES = (1, 4, 16)


class Model:
    """Batch time (5 + 2b)/g ms, power 5 + 3g + 0.1b W: faster GPU clocks draw more."""

    def predict(self, modes, b):
        g = np.asarray(modes)[:, 2].astype(float)
        b = np.asarray(b, float)
        return (5 + 2 * b) / g, 5 + 3 * g + 0.1 * b


def exact(pair: Pair) -> PairMeasurement:
    t, p = Model().predict(np.array([pair.mode.as_tuple()]), np.array([pair.batch_size]))
    return PairMeasurement(pair, float(t[0]), float(p[0]), float(t[0]), 50)


def pair(g: int, b: int) -> Pair:
    return Pair(PowerMode(4, 1000, g, 1000), b)


class BumpAtFour:
    """An inference prior whose power has a bump at b=4 (13.3 W on the least GPU clock,
    where b=1 and b=64 draw 11.8 W), as a refit had in a user-testing pass; batch time
    (20 + 25 b) ms at the least GPU clock. For modes (4, 422400, g, 665600000)."""

    def predict(self, modes, b):
        g = np.asarray(modes)[:, 2] / 114750000.0
        b = np.asarray(b, float)
        return (20 + 25 * b) / np.sqrt(g), 11.8 + (g - 1) + 1.5 * (b == 4)
