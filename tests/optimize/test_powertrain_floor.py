"""powertrain's floor probe in a budget change (Tuning.floor_probes): when the fastest
measured modes that fit all hold one knob at one level while other knobs vary, the step
waits on that knob, and a change measures one of them with the knob a level up, however
little the fitted model (which learnt the knob from modes that did not wait on it) thinks
that is worth."""

from __future__ import annotations

import numpy as np
from interval_models import as_budget_change

from powerd.device.modespace import ModeSpace
from powerd.modes import PowerMode
from powerd.optimize.base import Commit, Measure, Measurement, Predictor
from powerd.optimize.powertrain import PowerTrain, rank_index

SPACE = ModeSpace(
    cores=[2, 4, 8],
    cpu_khz=[1_000_000, 1_500_000, 2_000_000],
    gpu_hz=[300_000_000, 600_000_000, 900_000_000],
    emc_hz=[665_000_000, 2_133_000_000, 3_199_000_000],
)
BUDGET_W = 10.0
LOW, MID = 665_000_000, 2_133_000_000


def levels(modes: np.ndarray) -> np.ndarray:
    """Each knob's index (0-2) along its axis."""
    axes = [SPACE.cores, SPACE.cpu_khz, SPACE.gpu_hz, SPACE.emc_hz]
    return rank_index(np.asarray(modes).reshape(-1, 4), axes)


class MemoryBlind(Predictor):
    """Reads the memory clock as worth nothing to the step time and 1 W a level."""

    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = levels(modes)
        t = 50.0 + 25.0 * np.maximum(0, 3 - k[:, 1] - k[:, 2])
        p = 4.0 + 0.25 * np.asarray(modes).reshape(-1, 4)[:, 0] + k[:, 1] + k[:, 2] + k[:, 3]
        return t.astype(np.float64), p.astype(np.float64)


def mode(cores: int, cpu_ghz: float, gpu_mhz: int, emc_hz: int = LOW) -> PowerMode:
    return PowerMode(cores, int(cpu_ghz * 1_000_000), gpu_mhz * 1_000_000, emc_hz)


class MemoryCostly(MemoryBlind):
    """MemoryBlind, but each level of memory clock reads 2 W more: no floor mode fits a level up."""

    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t, p = super().predict(modes)
        return t, p + 2.0 * levels(modes)[:, 3]


def change(
    measured: dict[PowerMode, float], model: type[Predictor] = MemoryBlind, **tuning: float
) -> Commit | Measure:
    """The next action of a budget change at BUDGET_W whose measured modes (step time in
    ms) drew the power `model` predicts."""
    strategy = PowerTrain(SPACE, model, max_modes=50, rehearse_modes=0, **tuning)
    assert strategy._reference_ready()
    idx = np.array([list(m.as_tuple()) for m in measured])
    _, p = model().predict(idx)
    own = {m: Measurement(m, t, float(p[i])) for i, (m, t) in enumerate(measured.items())}
    as_budget_change(strategy, own, model(), BUDGET_W)
    return strategy.next_action(BUDGET_W, own)


# the fastest four run within 2 % of each other over 2-8 cores, 1.5-2 GHz and 600-900 MHz:
# the memory clock holds them back
FLOOR = {
    mode(2, 2.0, 900): 50.0,
    mode(4, 1.5, 900): 50.5,
    mode(8, 2.0, 600): 51.0,
    mode(4, 2.0, 900): 49.8,
    mode(2, 1.0, 300): 120.0,
    mode(4, 1.0, 600): 95.0,
    # the higher memory clock measured only where the step waits on the CPU and GPU
    mode(2, 1.0, 300, MID): 119.0,
}


FLOOR_KNOBS = {m.as_tuple()[:3] for m, t in FLOOR.items() if t < 52.0}


def probed(action: Commit | Measure) -> bool:
    """Is `action` a floor mode with the memory clock a level up?"""
    return (
        isinstance(action, Measure)
        and action.mode.emc_hz == MID
        and action.mode.as_tuple()[:3] in FLOOR_KNOBS
    )


def test_a_floor_at_one_memory_clock_gets_a_probe_a_level_up() -> None:
    action = change(FLOOR)
    assert probed(action), action
    assert action.why == "a floor probe: the memory clock a level up"  # the daemon logs it
    _, p = MemoryBlind().predict(np.array([action.mode.as_tuple()]))
    # the floor mode most likely to fit a level up: the least predicted power of them
    ups = np.array([[*k, MID] for k in FLOOR_KNOBS])
    assert p[0] == MemoryBlind().predict(ups)[1].min() <= BUDGET_W


def test_no_probe_without_a_floor_or_when_off() -> None:
    assert not probed(change(FLOOR, floor_probes=0))
    # one mode clearly the fastest: no floor, nothing to probe
    spread = {m: (t if t > 52.0 else 50.0 + 6.0 * i) for i, (m, t) in enumerate(FLOOR.items())}
    assert not probed(change(spread))


def test_the_probe_reaches_below_the_floor_when_no_floor_mode_fits_a_level_up() -> None:
    action = change(FLOOR, MemoryCostly)
    assert isinstance(action, Measure) and action.mode.emc_hz == MID, action
    assert action.why == "a floor probe: the memory clock a level up, the other knobs lower"
    knobs = levels(np.array([action.mode.as_tuple()]))[0]
    floor = levels(np.array([[*k, LOW] for k in FLOOR_KNOBS]))
    # under one floor mode in every other knob, and not one of them a level up
    assert any(np.all(knobs[:3] <= f[:3]) and np.any(knobs[:3] < f[:3]) for f in floor)
    _, p = MemoryCostly().predict(np.array([action.mode.as_tuple()]))
    assert p[0] <= BUDGET_W  # likely to fit, unlike every floor mode a level up
    ups = np.array([[*k, MID] for k in FLOOR_KNOBS])
    assert MemoryCostly().predict(ups)[1].min() >= BUDGET_W + 1.0
    # off: no mode at the higher memory clock is worth measuring to the plain picks
    off = change(FLOOR, MemoryCostly, floor_reach_prob=0)
    assert not (isinstance(off, Measure) and off.mode.emc_hz == MID), off
