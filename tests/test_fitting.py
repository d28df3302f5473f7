"""The daemon's fitting (powerd.fitting): a fit is checked over the board's modes, and its
log line says when the power terms were left out for overshooting them."""

from __future__ import annotations

import logging

import numpy as np
from predictor.predictor_testlib import LOW_CORNER

from powerd.config import Config
from powerd.fitting import Fitting
from powerd.modes import PowerMode
from powerd.optimize.base import Measurement
from powerd.sim.trace import TRACE_DIR, Trace
from powerd.store import Store


def test_a_fit_over_the_boards_modes_leaves_out_power_terms_that_overshoot(
    tmp_path, caplog
) -> None:
    nano = Trace.load(TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv")
    samples = {}
    for m in LOW_CORNER:
        row = nano.lookup(PowerMode(*m))
        samples[row.mode] = Measurement(row.mode, row.time_ms, row.power_w, 10)
    fitting = Fitting(Config(), Store(tmp_path), "orin-nano")
    with caplog.at_level(logging.INFO, logger="powerd.fitting"):
        blind = fitting.fit("resnet18", samples, persist=False)
        checked = fitting.fit("resnet18", samples, persist=False, domain=nano.modes_array)
    lines = [r.getMessage() for r in caplog.records if "fitted resnet18" in r.getMessage()]
    assert len(lines) == 2
    assert "power terms left out" not in lines[0]
    assert "power terms left out: " in lines[1] and "x the rescaled reference" in lines[1]
    top = nano.power_w.max()
    assert np.max(blind.predict(nano.modes_array)[1]) > 2.0 * top
    assert np.max(checked.predict(nano.modes_array)[1]) < 1.3 * top
