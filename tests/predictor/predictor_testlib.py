"""Shared paths and helpers of the predictor tests (a unique module name: the test dirs
have no __init__.py, so a plain `conftest` import could resolve to another dir's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "models" / "corpus" / "orin_agx_resnet18_imagenet_train.csv"
TRACES = REPO / "powerd" / "sim" / "traces"
AGX_MOBILENET = TRACES / "orin_agx_mobilenetv3_gld23k_train.csv"
NANO_RESNET = TRACES / "orin_nano_resnet18_imagenet_train.csv"
RESNET_INFER = TRACES / "orin_agx_resnet18_imagenet_infer.csv"


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - true) / true) * 100)
