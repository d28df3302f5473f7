"""Traces and helpers shared by the strategy tests (replays of the visible traces)."""

from __future__ import annotations

import pytest

from powerd.sim.trace import REFERENCE_CORPUS, TRACE_DIR, Trace

TRACE_FILES = {
    "resnet18-agx": REFERENCE_CORPUS,
    "mobilenet-agx": TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv",
    "resnet18-nano": TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv",
}


@pytest.fixture(scope="session")
def traces() -> dict[str, Trace]:
    return {name: Trace.load(path) for name, path in TRACE_FILES.items()}


@pytest.fixture(scope="session")
def nano(traces: dict[str, Trace]) -> Trace:
    return traces["resnet18-nano"]


@pytest.fixture(scope="session")
def mobilenet(traces: dict[str, Trace]) -> Trace:
    return traces["mobilenet-agx"]
