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

# The 16 full windows an Orin Nano sweep had measured by its raised 11 W budget (budgets
# raised 1 W at a time from 9 W, through the daemon; docs/experiments.md, session 49): the
# CPU clock at 268-576 MHz of up to 1510, two and four of six cores.
LOW_CORNER = [
    (2, 268800, 306000000, 665600000),
    (2, 422400, 306000000, 665600000),
    (2, 268800, 510000000, 665600000),
    (2, 268800, 306000000, 2133000000),
    (2, 268800, 624750000, 665600000),
    (2, 268800, 510000000, 2133000000),
    (2, 268800, 624750000, 2133000000),
    (2, 576000, 510000000, 665600000),
    (2, 576000, 306000000, 665600000),
    (2, 422400, 624750000, 2133000000),
    (4, 268800, 306000000, 665600000),
    (4, 268800, 510000000, 665600000),
    (2, 422400, 510000000, 665600000),
    (2, 422400, 624750000, 665600000),
    (4, 268800, 624750000, 665600000),
    (4, 268800, 510000000, 2133000000),
]


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - true) / true) * 100)
