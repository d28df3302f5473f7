"""Feature transform: shapes, units, and agreement with the ONNX graph's own features."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from powerd.predictor.features import (
    FEATURE_SETS,
    base_quantities,
    exponents,
    feature_names,
    mode_features,
    validate_modes,
)
from powerd.predictor.onnx_graph import IR_VERSION, MODES_INPUT, OPSET, feature_nodes
from powerd.predictor.reference import make_session

MODES = np.array(
    [
        [2, 268800, 114750000, 204000000],
        [12, 2201600, 1300500000, 3199000000],
        [4, 1510400, 624750000, 2133000000],  # an Orin Nano mode
    ],
    dtype=np.int64,
)


@pytest.mark.parametrize("name", sorted(FEATURE_SETS))
def test_shapes_and_names(name: str) -> None:
    e = exponents(name)
    f = mode_features(MODES, e)
    assert f.shape == (3, len(FEATURE_SETS[name]))
    assert f.dtype == np.float64
    assert len(feature_names(e)) == f.shape[1]
    assert np.all(np.isfinite(f)) and np.all(f > 0)


def test_units_are_cores_and_ghz() -> None:
    b = base_quantities(MODES[:1])
    np.testing.assert_allclose(b[0], [2, 0.2688, 0.11475, 0.204])
    f = mode_features(MODES[:1], [[0, -1, 0, 0], [1, 1, 0, 0], [0, 0, 2, 0]])
    np.testing.assert_allclose(f[0], [1 / 0.2688, 2 * 0.2688, 0.11475**2])


def test_board_agnostic_same_clock_same_features() -> None:
    # The same clocks give the same features whichever board's table they came from.
    a = mode_features([[4, 729600, 624750000, 2133000000]])
    b = mode_features(np.array([[4, 729600, 624750000, 2133000000]], dtype=np.int32))
    np.testing.assert_array_equal(a, b)


def test_single_mode_and_empty() -> None:
    assert mode_features(MODES[0]).shape == (1, len(exponents()))
    assert mode_features(np.zeros((0, 4), dtype=np.int64)).shape == (0, len(exponents()))


@pytest.mark.parametrize(
    "bad, msg",
    [
        (np.zeros((2, 3)), "must be an"),
        (np.array([[0, 268800, 114750000, 204000000]]), "must be > 0"),
        (np.array([[2.5, 268800, 114750000, 204000000]]), "integers"),
    ],
)
def test_invalid_modes_rejected(bad: np.ndarray, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        validate_modes(bad)


def test_unknown_feature_set() -> None:
    with pytest.raises(ValueError, match="unknown feature set"):
        exponents("nope")


def test_onnx_feature_graph_equals_numpy() -> None:
    e = exponents("rate_power")
    nodes, inits, out = feature_nodes("", e)
    graph = helper.make_graph(
        nodes,
        "f",
        [helper.make_tensor_value_info(MODES_INPUT, TensorProto.INT64, ["N", 4])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", len(e)])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    (got,) = make_session(model.SerializeToString()).run([out], {MODES_INPUT: MODES})
    np.testing.assert_allclose(got, mode_features(MODES, e), rtol=2e-6)
