"""tools/bench_decisions.py's report helpers (the sweeps themselves run the daemon)."""

from __future__ import annotations

import math

import bench_decisions
import pytest

from powerd.optimize.base import Measurement
from powerd.sim.trace import TRACE_DIR, Trace


@pytest.fixture(scope="module")
def nano() -> Trace:
    return Trace.load(TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv")


def test_measurement_error_compares_stored_samples_with_the_trace(nano: Trace) -> None:
    scale = 0.03  # the daemon saw scaled step times
    rows = nano.rows[:4]
    measured = [
        Measurement(r.mode, r.time_ms * scale * (1 + e), r.power_w * (1 + f), steps=5)
        for r, e, f in zip(rows, (0.01, -0.01, 0.03, 0.01), (0.02, 0.0, -0.01, 0.03), strict=True)
    ]
    # an aborted window has no time: it counts for power only
    measured.append(Measurement(nano.rows[5].mode, math.nan, nano.rows[5].power_w * 1.04))
    line = bench_decisions.measurement_error(nano, measured, scale)
    assert "5 modes" in line
    assert "power mean +1.6 %, mean |error| 2.0 %" in line
    assert "time mean +1.0 %, mean |error| 1.5 %" in line
    assert "none stored" in bench_decisions.measurement_error(nano, [], scale)
