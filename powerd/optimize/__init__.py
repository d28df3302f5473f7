"""Search strategies: which power mode to measure next, and which to pin.

    strategy = make_strategy(cfg.strategy.name, space, max_modes=cfg.profiling.modes)
    action = strategy.next_action(budget_w, samples)   # Measure | Fit | Commit

`space` is anything with four ascending axes (`cores`, `cpu_khz`, `gpu_hz`, `emc_hz`) plus
`as_array()` / `modes()` (powerd.device.modespace.ModeSpace, or the replay's GridSpace).
"""

from __future__ import annotations

from typing import Any

from powerd.optimize.base import (
    Action,
    Commit,
    Fit,
    Measure,
    Measurement,
    Predictor,
    Strategy,
    best_within,
    conclude,
    fits,
)
from powerd.optimize.binary_search import BinarySearch, ModeSpaceLike
from powerd.optimize.powertrain import PowerTrain, PredictorFactory

STRATEGIES = ("powertrain", "binary-search")
BINARY_SEARCH_PROBES = 12  # distinct modes on one budget's search path


def make_strategy(
    name: str,
    space: ModeSpaceLike,
    predictor_factory: PredictorFactory | None = None,
    max_modes: int = 50,
    **options: Any,
) -> Strategy:
    """A fresh strategy for one workload on this board.

    powertrain: `predictor_factory()` returns the reference predictor (default: the bundled
    model, loaded on first use; if it cannot be loaded the strategy runs binary-search and
    logs why). `max_modes` (config ``[profiling] modes``) caps the distinct modes profiled
    for the workload over all its budgets.

    binary-search: needs no predictor; `max_modes` caps the modes on one budget's search
    path (at most BINARY_SEARCH_PROBES), not the workload's total.

    `options` go to the strategy's constructor (tuning knobs, see its signature).
    """
    if name == "powertrain":
        return PowerTrain(space, predictor_factory, max_modes=max_modes, **options)
    if name == "binary-search":
        probes = options.pop("max_probes", min(BINARY_SEARCH_PROBES, max_modes))
        return BinarySearch(space, max_probes=probes, **options)
    raise ValueError(f"unknown strategy {name!r}; expected one of {', '.join(STRATEGIES)}")


__all__ = [
    "STRATEGIES",
    "Action",
    "BinarySearch",
    "Commit",
    "Fit",
    "Measure",
    "Measurement",
    "PowerTrain",
    "Predictor",
    "Strategy",
    "best_within",
    "conclude",
    "fits",
    "make_strategy",
]
