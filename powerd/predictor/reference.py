"""The bundled reference predictor (step time and board power of ResNet-18 training on
Orin AGX), run with onnxruntime. No torch here: the daemon never imports it."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from powerd.optimize.base import Predictor
from powerd.predictor.features import validate_modes
from powerd.predictor.onnx_graph import MODES_INPUT, MLPWeights
from powerd.predictor.paths import find_model_dir

TIME_TARGET = "log_time_ms"
POWER_TARGET = "power_w"


@dataclass(frozen=True)
class Embedding:
    """The reference's outputs for a set of modes, as the refit needs them.

    ``time_y`` is log(ms), ``power_y`` is W (both in the reference's target space);
    ``*_h`` are the penultimate activations (N, D) of each model."""

    time_y: np.ndarray
    time_h: np.ndarray
    power_y: np.ndarray
    power_h: np.ndarray


def make_session(model: bytes | str | os.PathLike[str], threads: int = 1) -> ort.InferenceSession:
    """An onnxruntime CPU session. One intra-op thread by default: the graphs are small, and
    the daemon should not compete with the training job for cores."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    src = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


class ReferenceModel(Predictor):
    """The two ONNX models (time, power) of the model dir; see models/MODEL_CARD.md. A
    Predictor too: before any fit, strategies seed from the reference's own predictions."""

    def __init__(
        self, model_dir: Path, meta: dict, time_onnx: bytes, power_onnx: bytes, threads: int = 1
    ):
        self.model_dir = model_dir
        self.meta = meta
        self._time_bytes = time_onnx
        self._power_bytes = power_onnx
        self._time = make_session(time_onnx, threads)
        self._power = make_session(power_onnx, threads)
        # Identifies the exact reference a fitted predictor was derived from.
        self.model_id = hashlib.sha256(time_onnx + power_onnx).hexdigest()[:16]
        self._mlps: tuple[MLPWeights, MLPWeights] | None = None
        # (key of the mode set, its embedding): embed_domain's one kept set
        self._domain: tuple[tuple, Embedding] | None = None
        self._domain_lock = threading.Lock()
        for name, data, want in (
            ("time", time_onnx, TIME_TARGET),
            ("power", power_onnx, POWER_TARGET),
        ):
            got = self._target_of(data)
            if got != want:
                raise ValueError(f"{model_dir}/{name}.onnx predicts {got!r}, expected {want!r}")

    @staticmethod
    def _target_of(model_bytes: bytes) -> str:
        m = onnx.load_from_string(model_bytes)
        return {p.key: p.value for p in m.metadata_props}.get("target", "?")

    @classmethod
    def load(
        cls, model_dir: str | os.PathLike[str] | None = None, threads: int = 1
    ) -> ReferenceModel:
        """Load from `model_dir`, or from the first place :func:`find_model_dir` finds."""
        d = find_model_dir(model_dir)
        try:
            meta = json.loads((d / "scaler.json").read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{d}/scaler.json unreadable: {e}") from e
        return cls(
            d, meta, (d / "time.onnx").read_bytes(), (d / "power.onnx").read_bytes(), threads
        )

    def mlps(self) -> tuple[MLPWeights, MLPWeights]:
        """The (time, power) weights, for building a fitted model's ONNX graph."""
        if self._mlps is None:
            self._mlps = (
                MLPWeights.from_onnx(onnx.load_from_string(self._time_bytes)),
                MLPWeights.from_onnx(onnx.load_from_string(self._power_bytes)),
            )
        return self._mlps

    def embed(self, modes: np.ndarray) -> Embedding:
        m = validate_modes(modes)
        if len(m) == 0:
            d = self.mlps()[0].embed_dim
            z = np.zeros(0)
            return Embedding(z, np.zeros((0, d)), z, np.zeros((0, d)))
        ty, th = self._time.run(["y", "h"], {MODES_INPUT: m})
        py, ph = self._power.run(["y", "h"], {MODES_INPUT: m})
        return Embedding(
            ty.astype(np.float64),
            th.astype(np.float64),
            py.astype(np.float64),
            ph.astype(np.float64),
        )

    def embed_domain(self, modes: np.ndarray) -> Embedding:
        """`embed` of the mode set every fit sees again (the board's mode space), kept until
        another set is asked for: a daemon fits over one. Embedding a full Orin AGX grid
        (18,096 modes) took 150 ms of a 434 ms fit plus prediction on the project's test
        machine; kept, it holds 74 MB (Orin Nano, ~1,800 modes: 7 MB). The arrays returned
        are read-only: fits share them."""
        m = np.ascontiguousarray(validate_modes(modes))
        key = (m.shape, hashlib.blake2b(m.tobytes(), digest_size=16).digest())
        with self._domain_lock:
            if self._domain is not None and self._domain[0] == key:
                return self._domain[1]
        e = self.embed(m)
        for a in (e.time_y, e.time_h, e.power_y, e.power_h):
            a.flags.writeable = False
        with self._domain_lock:
            self._domain = (key, e)
        return e

    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(time_ms, power_w) of the reference workload (ResNet-18 training, Orin AGX)."""
        m = validate_modes(modes)
        if len(m) == 0:
            return np.zeros(0), np.zeros(0)
        (ty,) = self._time.run(["y"], {MODES_INPUT: m})
        (py,) = self._power.run(["y"], {MODES_INPUT: m})
        return np.exp(ty.astype(np.float64)), py.astype(np.float64)
