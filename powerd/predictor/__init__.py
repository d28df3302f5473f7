"""Time/power predictor: the bundled reference model and its transfer to new workloads.

The daemon's API (no torch anywhere in it)::

    from powerd.predictor import ReferenceModel, fit_workload, FittedPredictor

    ref = ReferenceModel.load()                       # models/ found by find_model_dir()
    t_ms, p_w = ref.predict(modes)                    # modes: (N, 4) int64
    fp = fit_workload((modes_k, time_k, power_k), ref, python=cfg.fit.python)
    t_ms, p_w = fp.predict(modes)                     # a powerd.optimize.base.Predictor
    fp.save(dir); fp = FittedPredictor.load(dir)

Names are resolved lazily so that ``python -m powerd.predictor.finetune_worker`` (run by an
interpreter that may lack onnxruntime) does not import the inference stack.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "mode_features": "powerd.predictor.features",
    "validate_modes": "powerd.predictor.features",
    "find_model_dir": "powerd.predictor.paths",
    "ModelNotFound": "powerd.predictor.paths",
    "ReferenceModel": "powerd.predictor.reference",
    "Embedding": "powerd.predictor.reference",
    "Samples": "powerd.predictor.transfer",
    "FitStats": "powerd.predictor.transfer",
    "FittedPredictor": "powerd.predictor.transfer",
    "RidgeOptions": "powerd.predictor.transfer",
    "fit_ridge": "powerd.predictor.transfer",
    "fit_workload": "powerd.predictor.transfer",
    "DEFAULT_METHOD": "powerd.predictor.transfer",
    "select_modes": "powerd.predictor.sampling",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'powerd.predictor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
