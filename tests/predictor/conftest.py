"""Fixtures for the predictor tests: the committed reference model and the traces."""

from __future__ import annotations

import pytest
from predictor_testlib import AGX_MOBILENET, CORPUS, NANO_RESNET

from powerd.predictor.reference import ReferenceModel
from powerd.sim.trace import Trace


@pytest.fixture(scope="session")
def reference() -> ReferenceModel:
    # The committed artifacts (tests never train); POWERD_MODEL_DIR may point elsewhere.
    return ReferenceModel.load()


@pytest.fixture(scope="session")
def corpus() -> Trace:
    return Trace.load(CORPUS)


@pytest.fixture(scope="session")
def mobilenet() -> Trace:
    return Trace.load(AGX_MOBILENET)


@pytest.fixture(scope="session")
def nano() -> Trace:
    return Trace.load(NANO_RESNET)
