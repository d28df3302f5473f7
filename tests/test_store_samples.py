"""What the store keeps of each measurement: a restarted daemon must decide from the same
facts as before. The standard error of a window's power rides with its measurement: the
refine's second look at a near miss (PowerTrain._near_miss) measures a reading over the
budget again only when it is within a few standard errors of it, and an unknown error
counts as within."""

from __future__ import annotations

import json
import math

from powerd.modes import PowerMode
from powerd.optimize.base import Measurement
from powerd.store import SAMPLES, Store

BOARD = "orin-nano-l4t36.3.0"
FULL = PowerMode(6, 1510400, 624750000, 2133000000)
ABORTED = PowerMode(6, 1510400, 624750000, 3199000000)


def test_a_measurement_comes_back_as_it_was_saved(tmp_path) -> None:
    samples = {
        FULL: Measurement(FULL, 182.5, 15.21, 24, False, 0.043),
        ABORTED: Measurement(ABORTED, math.nan, 17.9, 3, True, None),
    }
    Store(tmp_path).save_samples(BOARD, "r18", samples)
    back = Store(tmp_path).load_samples(BOARD, "r18")
    assert back[FULL] == samples[FULL]
    assert back[FULL].power_se_w == 0.043
    got = back[ABORTED]
    assert math.isnan(got.time_ms) and got.aborted_over_budget and got.power_se_w is None
    assert (got.power_w, got.steps) == (17.9, 3)


def test_samples_written_before_the_error_was_kept_load_with_it_unknown(tmp_path) -> None:
    store = Store(tmp_path)
    store.save_samples(BOARD, "r18", {FULL: Measurement(FULL, 182.5, 15.21, 24, False, 0.05)})
    path = store.workload_dir(BOARD, "r18") / SAMPLES
    data = json.loads(path.read_text())
    for record in data["samples"]:
        del record["power_se_w"]  # as an earlier release wrote the file
    path.write_text(json.dumps(data))
    back = store.load_samples(BOARD, "r18")
    assert back[FULL].power_se_w is None
    assert (back[FULL].time_ms, back[FULL].power_w, back[FULL].steps) == (182.5, 15.21, 24)
