"""The committed reference model: loads without torch, matches its card, is fast."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from predictor_testlib import CORPUS, REPO, mape

from powerd.predictor.onnx_graph import MLPWeights
from powerd.predictor.reference import ReferenceModel


def test_no_torch_in_daemon_modules() -> None:
    code = (
        "import sys\n"
        "import powerd.predictor, powerd.predictor.features, powerd.predictor.paths\n"
        "import powerd.predictor.reference, powerd.predictor.transfer\n"
        "import powerd.predictor.sampling, powerd.predictor.onnx_graph\n"
        "import powerd.optimize.pareto\n"
        "from powerd.predictor.reference import ReferenceModel\n"
        "ReferenceModel.load().predict([[4, 729600, 624750000, 2133000000]])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_artifacts_describe_the_committed_corpus(reference: ReferenceModel) -> None:
    meta = reference.meta
    assert meta["corpus"]["sha256"] == hashlib.sha256(CORPUS.read_bytes()).hexdigest()
    assert meta["model_id"] == reference.model_id
    card = (reference.model_dir / "MODEL_CARD.md").read_text()
    assert meta["corpus"]["sha256"] in card
    assert "python tools/train_reference.py" in card


def test_predicts_held_out_corpus_within_card_mape(reference: ReferenceModel, corpus) -> None:
    meta = reference.meta
    n = len(corpus)
    # The split rule recorded in scaler.json (tools/train_reference.py: split()).
    perm = np.random.default_rng(meta["training"]["seed"]).permutation(n)
    test = perm[int(0.85 * n) :]
    assert len(test) == meta["test_rows"]
    t, p = reference.predict(corpus.modes_array)
    assert t.shape == p.shape == (n,)
    m = meta["metrics"]
    # onnxruntime float32 vs the torch evaluation at training: equal to well under 0.05%.
    assert mape(t[test], corpus.time_ms[test]) <= m["time_mape_test"] + 0.05
    assert mape(p[test], corpus.power_w[test]) <= m["power_mape_test"] + 0.05
    assert m["time_mape_test"] < 5 and m["power_mape_test"] < 3


def test_embed_is_consistent_with_predict(reference: ReferenceModel, corpus) -> None:
    modes = corpus.modes_array[:500]
    e = reference.embed(modes)
    t, p = reference.predict(modes)
    arch = reference.meta["architecture"]
    d = arch["members"] * arch["hidden"][-1]
    assert e.time_h.shape == e.power_h.shape == (500, d)
    np.testing.assert_allclose(np.exp(e.time_y), t, rtol=1e-6)
    np.testing.assert_allclose(e.power_y, p, rtol=1e-6)
    assert np.all(e.time_h >= 0)  # post-ReLU activations


@pytest.mark.parametrize("name", ["time", "power"])
def test_onnx_equals_numpy_forward(reference: ReferenceModel, corpus, name: str) -> None:
    model = onnx.load(reference.model_dir / f"{name}.onnx")
    w = MLPWeights.from_onnx(model)
    y_np, h_np = w.forward(corpus.modes_array[:300])
    e = reference.embed(corpus.modes_array[:300])
    y = e.time_y if name == "time" else e.power_y
    np.testing.assert_allclose(y, y_np, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(e.time_h if name == "time" else e.power_h, h_np, atol=1e-3)
    scaler = reference.meta["models"][name]
    np.testing.assert_allclose(w.x_mean, scaler["x_mean"], rtol=1e-6)
    np.testing.assert_allclose(w.x_std, scaler["x_std"], rtol=1e-6)
    assert w.exps.tolist() == scaler["exps"]


def test_model_files_are_small(reference: ReferenceModel) -> None:
    total = sum(f.stat().st_size for f in reference.model_dir.iterdir() if f.is_file())
    assert total < 2_000_000, f"models/ holds {total} bytes"
    json.loads((reference.model_dir / "scaler.json").read_text())


def agx_like_mode_space() -> np.ndarray:
    """~18,000 modes: the size of a full Orin AGX mode space."""
    grid = np.meshgrid(
        np.arange(1, 13),
        np.linspace(115200, 2201600, 15).astype(np.int64),
        np.linspace(114750000, 1300500000, 25).astype(np.int64),
        [204000000, 665600000, 2133000000, 3199000000],
    )
    return np.array(grid).reshape(4, -1).T


def test_predicts_a_full_18k_mode_space(reference: ReferenceModel) -> None:
    # its speed is measured by tools/bench_predictor.py, not asserted here
    modes = agx_like_mode_space()
    assert len(modes) == 18_000
    t, p = reference.predict(modes)
    assert t.shape == p.shape == (18_000,)
    assert np.all(np.isfinite(t)) and np.all(t > 0) and np.all(np.isfinite(p))


def test_bad_modes_rejected(reference: ReferenceModel) -> None:
    with pytest.raises(ValueError):
        reference.predict(np.array([[4, 0, 624750000, 2133000000]]))
    t, p = reference.predict(np.zeros((0, 4), dtype=np.int64))
    assert t.shape == p.shape == (0,)


def test_embed_domain_reuses_the_embedding_of_the_same_modes(corpus) -> None:
    ref = ReferenceModel.load()  # its own cache, apart from the session's model
    modes = corpus.modes_array[:300]
    calls = []
    embed = ref.embed
    ref.embed = lambda m: calls.append(len(m)) or embed(m)  # type: ignore[method-assign]
    first = ref.embed_domain(modes)
    again = ref.embed_domain(modes.copy())  # equal content, another array
    assert calls == [300] and again is first
    np.testing.assert_array_equal(first.time_h, embed(modes).time_h)
    with pytest.raises(ValueError):  # shared between fits: nobody may write into it
        first.power_h[0, 0] = 1.0
    # a changed mode space (a core count narrowed) is embedded anew, and only the last
    # set asked for is kept
    other = corpus.modes_array[300:400]
    ref.embed_domain(other)
    ref.embed_domain(other)
    assert calls == [300, 100]
    ref.embed_domain(modes)
    assert calls == [300, 100, 300]
