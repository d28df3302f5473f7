"""Build the predictor's ONNX graphs from numpy weights, with ``onnx.helper`` only.

One builder serves the reference models (tools/train_reference.py), the ridge-refit
predictors (transfer.py) and the torch fine-tuning worker, so every exported model has
the same structure and none of them needs torch's exporter (which, in recent torch, also
needs onnxscript). Graphs take the raw modes (N, 4) int64 as input and compute the
features of :mod:`powerd.predictor.features` themselves, so a persisted model stays valid
whatever later releases do to the Python side.

Opset 17 / IR version 8: loadable by every onnxruntime >= 1.14, i.e. by what JetPack 5
and 6 ship, not only by the newest wheel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from powerd.predictor.features import UNIT_SCALE, mode_features
from powerd.predictor.physical import (
    MAX_SIDES,
    REF_UNIT_MS,
    bottleneck_time,
    per_step,
    side_count,
)

OPSET = 17
IR_VERSION = 8
MODES_INPUT = "modes"
# A fitted graph's second power output, when it has one (fitted_model).
POWER_OVERALL_OUTPUT = "power_overall_w"
# Clamp for a reference power prediction before a log head; a power model that extrapolates
# below this on some exotic mode must not turn into NaN.
LOG_FLOOR = 1e-3


def _f32(a: np.ndarray | float | list[float]) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


@dataclass
class MLPWeights:
    """An ensemble of MLP trunks with one linear last layer over their joined activations.

    ``features -> (x - x_mean) / x_std -> each trunk m: [Gemm, Relu]* -> h_m``;
    ``h = concat_m h_m`` (the penultimate activations, N x D); ``y = (h @ W + b) * y_std +
    y_mean``. With the stacked member heads divided by M as ``W``, ``y`` is the mean of the
    members' predictions; a single MLP is the one-trunk case. ``y`` is in target space (log ms
    for the time model, W for the power model). Layers are ``(W (in, out), b (out,))``.
    """

    exps: np.ndarray
    x_mean: np.ndarray
    x_std: np.ndarray
    trunks: list[list[tuple[np.ndarray, np.ndarray]]]
    last: tuple[np.ndarray, np.ndarray]
    y_mean: float
    y_std: float

    @property
    def embed_dim(self) -> int:
        return int(self.last[0].shape[0])

    def forward_features(self, feats: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """numpy forward (float64) from features: (y (N,), h (N, D)). For checks and tests."""
        x0 = (np.asarray(feats, dtype=np.float64) - self.x_mean) / self.x_std
        hs = []
        for trunk in self.trunks:
            x = x0
            for w, b in trunk:
                x = np.maximum(x @ w.astype(np.float64) + b, 0.0)
            hs.append(x)
        h = np.concatenate(hs, axis=1)
        w, b = self.last
        y = (h @ w.astype(np.float64) + b)[:, 0] * self.y_std + self.y_mean
        return y, h

    def forward(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.forward_features(mode_features(modes, self.exps))

    def nodes(self, prefix: str, feats: str) -> tuple[list, list, str, str]:
        """Nodes + initializers computing (y (N,), h (N, D)) from the features tensor."""
        nodes: list = []
        inits = [
            numpy_helper.from_array(_f32(self.x_mean), f"{prefix}x_mean"),
            numpy_helper.from_array(_f32(self.x_std), f"{prefix}x_std"),
            numpy_helper.from_array(_f32([self.y_std]), f"{prefix}y_std"),
            numpy_helper.from_array(_f32([self.y_mean]), f"{prefix}y_mean"),
        ]
        nodes.append(helper.make_node("Sub", [feats, f"{prefix}x_mean"], [f"{prefix}xc"]))
        nodes.append(helper.make_node("Div", [f"{prefix}xc", f"{prefix}x_std"], [f"{prefix}a_in"]))
        outs = []
        for m, trunk in enumerate(self.trunks):
            x = f"{prefix}a_in"
            for i, (w, b) in enumerate(trunk):
                tag = f"{prefix}m{m}_"
                inits.append(numpy_helper.from_array(_f32(w), f"{tag}W{i}"))
                inits.append(numpy_helper.from_array(_f32(b), f"{tag}b{i}"))
                nodes.append(
                    helper.make_node("Gemm", [x, f"{tag}W{i}", f"{tag}b{i}"], [f"{tag}z{i}"])
                )
                x = f"{tag}a{i}"
                nodes.append(helper.make_node("Relu", [f"{tag}z{i}"], [x]))
            outs.append(x)
        h = f"{prefix}h"
        if len(outs) == 1:
            nodes.append(helper.make_node("Identity", outs, [h]))
        else:
            nodes.append(helper.make_node("Concat", outs, [h], axis=1))
        w, b = self.last
        inits.append(numpy_helper.from_array(_f32(w), f"{prefix}W_last"))
        inits.append(numpy_helper.from_array(_f32(b), f"{prefix}b_last"))
        nodes.append(
            helper.make_node("Gemm", [h, f"{prefix}W_last", f"{prefix}b_last"], [f"{prefix}z_last"])
        )
        nodes.append(
            helper.make_node("Mul", [f"{prefix}z_last", f"{prefix}y_std"], [f"{prefix}ys"])
        )
        nodes.append(helper.make_node("Add", [f"{prefix}ys", f"{prefix}y_mean"], [f"{prefix}y2"]))
        inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), f"{prefix}flat"))
        nodes.append(helper.make_node("Reshape", [f"{prefix}y2", f"{prefix}flat"], [f"{prefix}y"]))
        return nodes, inits, f"{prefix}y", h

    @classmethod
    def from_onnx(cls, model: onnx.ModelProto, prefix: str = "") -> MLPWeights:
        """Recover the weights from a graph built by :meth:`nodes` (reference models)."""
        init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        try:
            trunks = []
            m = 0
            while f"{prefix}m{m}_W0" in init:
                layers = []
                i = 0
                while f"{prefix}m{m}_W{i}" in init:
                    layers.append((init[f"{prefix}m{m}_W{i}"], init[f"{prefix}m{m}_b{i}"]))
                    i += 1
                trunks.append(layers)
                m += 1
            if not trunks:
                raise KeyError(f"{prefix}m0_W0")
            return cls(
                exps=np.rint(init[f"{prefix}expsT"]).T.astype(np.int64),
                x_mean=init[f"{prefix}x_mean"].astype(np.float64),
                x_std=init[f"{prefix}x_std"].astype(np.float64),
                trunks=trunks,
                last=(init[f"{prefix}W_last"], init[f"{prefix}b_last"]),
                y_mean=float(init[f"{prefix}y_mean"][0]),
                y_std=float(init[f"{prefix}y_std"][0]),
            )
        except KeyError as e:
            raise ValueError(f"not a powerd MLP graph (missing initializer {e})") from None


def feature_nodes(prefix: str, exps: np.ndarray) -> tuple[list, list, str]:
    """modes int64 (N, 4) -> features float32 (N, F) = exp(log(modes * unit) @ E.T)."""
    exps = np.asarray(exps, dtype=np.int64)
    inits = [
        numpy_helper.from_array(_f32(UNIT_SCALE), f"{prefix}unit"),
        # Small integers: exact in float32, so :meth:`MLPWeights.from_onnx` reads them back.
        numpy_helper.from_array(_f32(exps.T), f"{prefix}expsT"),
    ]
    nodes = [
        helper.make_node("Cast", [MODES_INPUT], [f"{prefix}mf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", [f"{prefix}mf", f"{prefix}unit"], [f"{prefix}base"]),
        helper.make_node("Log", [f"{prefix}base"], [f"{prefix}logb"]),
        helper.make_node("MatMul", [f"{prefix}logb", f"{prefix}expsT"], [f"{prefix}logf"]),
        helper.make_node("Exp", [f"{prefix}logf"], [f"{prefix}feats"]),
    ]
    return nodes, inits, f"{prefix}feats"


@dataclass
class Head:
    """A refit last layer on top of a reference MLP.

    ``out = g(intercept + coef_ref * r(y) + h @ w)`` with ``r`` = identity or log (the
    reference's own prediction as an input) and ``g`` = identity or exp (the target space:
    log step time, or power in W / log W).

    ``r`` = "physical" (time heads): ``r = log(max(ref_scale * exp(y) + sum_j c_j * m_j(mode),
    floor))``, a non-negative sum of time terms (:data:`powerd.predictor.features.PHYSICAL_TIME`:
    a constant, 1/f_gpu, 1/f_emc, 1/f_cpu, 1/(cores*f_cpu)) and the reference's predicted
    time, fitted by :func:`powerd.predictor.transfer.physical_time`. ``phys_exps`` (F, 4) are
    the monomials' exponents, ``phys_coef`` (F,) their weights, ``ref_scale`` the reference
    time's weight. The head then needs the modes as well as ``y`` and ``h``. With
    ``phys_groups`` (F,) set, the bottleneck form of :mod:`powerd.predictor.physical`:
    ``sum_{g=0} c_j m_j + max(sum_{g=1} c_j m_j, ref_scale * exp(y) + sum_{g=2} c_j m_j[,
    sum_{g=3} c_j m_j])``, the third side the memory's when a term has group 3.

    ``r`` = "physical-power" (power heads, W): ``r = ref_scale * y + sum_j c_j * m_j(mode)``,
    the non-negative power terms of :data:`powerd.predictor.features.PHYSICAL_POWER` and the
    reference's predicted power (no log: the target is W). Terms flagged in ``phys_per_step``
    are divided by the fitted step time (``m_j(mode) * REF_UNIT_MS / t(mode)``, the terms of
    :data:`powerd.predictor.features.PHYSICAL_POWER_PER_STEP`): the head then needs the time
    head's output too.
    """

    intercept: float = 0.0
    coef_ref: float = 1.0
    w: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ref_transform: str = "identity"  # or "log", "physical"
    out_transform: str = "identity"  # or "exp"
    phys_exps: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), dtype=np.int64))
    phys_coef: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ref_scale: float = 0.0
    phys_groups: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    phys_per_step: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __post_init__(self) -> None:
        if self.ref_transform not in ("identity", "log", "physical", "physical-power"):
            raise ValueError(f"bad head ref_transform: {self.ref_transform!r}")
        if self.out_transform not in ("identity", "log", "exp"):
            raise ValueError(f"bad head out: {self.out_transform!r}")
        self.phys_exps = np.asarray(self.phys_exps, dtype=np.int64).reshape(-1, 4)
        self.phys_coef = np.asarray(self.phys_coef, dtype=np.float64).reshape(-1)
        if len(self.phys_exps) != len(self.phys_coef):
            raise ValueError(
                f"head: {len(self.phys_exps)} physical terms, {len(self.phys_coef)} weights"
            )
        self.phys_groups = np.asarray(self.phys_groups, dtype=np.int64).reshape(-1)
        self.phys_per_step = np.asarray(self.phys_per_step, dtype=bool).reshape(-1)
        if not self.phys_per_step.size:
            self.phys_per_step = np.zeros(len(self.phys_coef), dtype=bool)
        if len(self.phys_per_step) != len(self.phys_coef) or (
            self.phys_per_step.any() and self.ref_transform != "physical-power"
        ):
            raise ValueError(f"head: bad per-step flags {self.phys_per_step.tolist()}")
        if self.phys_groups.size and (
            len(self.phys_groups) != len(self.phys_coef)
            or not np.isin(self.phys_groups, np.arange(MAX_SIDES + 1)).all()
        ):
            raise ValueError(f"head: bad physical term groups {self.phys_groups.tolist()}")

    @property
    def bottleneck(self) -> bool:
        return bool(self.phys_groups.size)

    def physical(self, y: np.ndarray, modes: np.ndarray) -> np.ndarray:
        """The physical head's time in ms (before the log): the fitted sum of time terms."""
        ref = np.exp(np.asarray(y, dtype=np.float64))
        if self.bottleneck:
            x = np.column_stack([mode_features(modes, self.phys_exps), ref])
            t = bottleneck_time(x, np.append(self.phys_coef, self.ref_scale), self.phys_groups)
        else:
            t = self._scaled_plus_terms(ref, modes)
        return np.maximum(t, LOG_FLOOR)

    def _scaled_plus_terms(
        self, ref: np.ndarray, modes: np.ndarray, time_ms: np.ndarray | None = None
    ) -> np.ndarray:
        """ref_scale * ref + sum_j c_j m_j(mode): the sum form of both physical heads."""
        t = self.ref_scale * ref
        if self.phys_coef.size:
            f = mode_features(modes, self.phys_exps)
            if self.needs_time:
                if time_ms is None:
                    raise ValueError("a per-step power head needs the step times")
                f[:, self.phys_per_step] = per_step(f[:, self.phys_per_step], time_ms)
            t = t + f @ self.phys_coef
        return t

    @property
    def needs_modes(self) -> bool:
        return self.ref_transform in ("physical", "physical-power")

    @property
    def needs_time(self) -> bool:
        return bool(self.phys_per_step.any())

    def ref_input(
        self, y: np.ndarray, modes: np.ndarray | None = None, time_ms: np.ndarray | None = None
    ) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        if self.needs_modes and modes is None:
            raise ValueError("a physical head needs the modes")
        if self.ref_transform == "physical":
            return np.log(self.physical(y, modes))
        if self.ref_transform == "physical-power":
            return self._scaled_plus_terms(y, modes, time_ms)
        return np.log(np.maximum(y, LOG_FLOOR)) if self.ref_transform == "log" else y

    def linear(
        self,
        y: np.ndarray,
        h: np.ndarray,
        modes: np.ndarray | None = None,
        time_ms: np.ndarray | None = None,
    ) -> np.ndarray:
        z = self.intercept + self.coef_ref * self.ref_input(y, modes, time_ms)
        if self.w.size:
            z = z + np.asarray(h, dtype=np.float64) @ self.w
        return z

    def apply(
        self,
        y: np.ndarray,
        h: np.ndarray,
        modes: np.ndarray | None = None,
        time_ms: np.ndarray | None = None,
    ) -> np.ndarray:
        """`time_ms`: the step times the time head predicts for `modes` (a per-step power
        head only)."""
        z = self.linear(y, h, modes, time_ms)
        return np.exp(z) if self.out_transform == "exp" else z

    def nodes(
        self,
        prefix: str,
        y: str,
        h: str,
        out: str,
        base: str | None = None,
        time: str | None = None,
    ) -> tuple[list, list]:
        """`base`: the (N, 4) float tensor of base quantities (cores, GHz), needed by a
        physical head; `time`: the (N,) step times in ms, needed by a per-step one."""
        nodes: list = []
        inits = [
            numpy_helper.from_array(_f32([self.intercept]), f"{prefix}a"),
            numpy_helper.from_array(_f32([self.coef_ref]), f"{prefix}b"),
        ]
        r = y
        if self.ref_transform == "physical-power":
            if base is None:
                raise ValueError("a physical head needs the base-quantity tensor")
            inits.append(numpy_helper.from_array(_f32([self.ref_scale]), f"{prefix}rs"))
            nodes.append(helper.make_node("Mul", [y, f"{prefix}rs"], [f"{prefix}r0"]))
            r = f"{prefix}r0"
            if self.phys_coef.size:
                nodes += self._term_feature_nodes(prefix, base, inits, time)
                nodes += self._terms_sum_nodes(prefix, r, f"{prefix}r1", inits)
                r = f"{prefix}r1"
        elif self.ref_transform in ("log", "physical"):
            inits.append(numpy_helper.from_array(_f32([LOG_FLOOR]), f"{prefix}floor"))
            src = y
            if self.ref_transform == "physical":
                if base is None:
                    raise ValueError("a physical head needs the base-quantity tensor")
                inits.append(numpy_helper.from_array(_f32([self.ref_scale]), f"{prefix}rs"))
                nodes.append(helper.make_node("Exp", [y], [f"{prefix}ey"]))
                nodes.append(
                    helper.make_node("Mul", [f"{prefix}ey", f"{prefix}rs"], [f"{prefix}t0"])
                )
                src = f"{prefix}t0"
                if self.phys_coef.size:
                    nodes += self._term_feature_nodes(prefix, base, inits)
                    if self.bottleneck:
                        more, src = self._bottleneck_nodes(prefix, src, inits)
                        nodes += more
                    else:
                        nodes += self._terms_sum_nodes(prefix, src, f"{prefix}t1", inits)
                        src = f"{prefix}t1"
            nodes.append(helper.make_node("Max", [src, f"{prefix}floor"], [f"{prefix}yc"]))
            nodes.append(helper.make_node("Log", [f"{prefix}yc"], [f"{prefix}r"]))
            r = f"{prefix}r"
        nodes.append(helper.make_node("Mul", [r, f"{prefix}b"], [f"{prefix}br"]))
        nodes.append(helper.make_node("Add", [f"{prefix}br", f"{prefix}a"], [f"{prefix}z0"]))
        z = f"{prefix}z0"
        if self.w.size:
            inits.append(numpy_helper.from_array(_f32(self.w), f"{prefix}w"))
            nodes.append(helper.make_node("MatMul", [h, f"{prefix}w"], [f"{prefix}hw"]))
            nodes.append(helper.make_node("Add", [z, f"{prefix}hw"], [f"{prefix}z1"]))
            z = f"{prefix}z1"
        op = "Exp" if self.out_transform == "exp" else "Identity"
        nodes.append(helper.make_node(op, [z], [out]))
        return nodes, inits

    def _term_feature_nodes(
        self, prefix: str, base: str, inits: list, time: str | None = None
    ) -> list:
        """Nodes of the physical terms' features `{prefix}pf` (N, F): exp(log(base) @ exps.T),
        the monomials m_j(mode) of mode_features, the per-step ones times
        REF_UNIT_MS / `time`."""
        p = prefix
        inits.append(numpy_helper.from_array(_f32(self.phys_exps.T), f"{p}pexpsT"))
        raw = f"{p}pfm" if self.needs_time else f"{p}pf"
        nodes = [
            helper.make_node("Log", [base], [f"{p}plb"]),
            helper.make_node("MatMul", [f"{p}plb", f"{p}pexpsT"], [f"{p}plf"]),
            helper.make_node("Exp", [f"{p}plf"], [raw]),
        ]
        if not self.needs_time:
            return nodes
        if time is None:
            raise ValueError("a per-step power head needs the step-time tensor")
        # pf = pfm * (flag * REF_UNIT_MS / t + (1 - flag)), per column
        flag = self.phys_per_step.astype(np.float64)[None, :]
        inits += [
            numpy_helper.from_array(_f32([REF_UNIT_MS]), f"{p}unit_ms"),
            numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), f"{p}col"),
            numpy_helper.from_array(_f32(flag), f"{p}psf"),
            numpy_helper.from_array(_f32(1.0 - flag), f"{p}psk"),
            numpy_helper.from_array(_f32([1e-6]), f"{p}tmin"),
        ]
        return nodes + [
            helper.make_node("Max", [time, f"{p}tmin"], [f"{p}tc"]),
            helper.make_node("Div", [f"{p}unit_ms", f"{p}tc"], [f"{p}rate"]),
            helper.make_node("Reshape", [f"{p}rate", f"{p}col"], [f"{p}rate2"]),
            helper.make_node("Mul", [f"{p}rate2", f"{p}psf"], [f"{p}psr"]),
            helper.make_node("Add", [f"{p}psr", f"{p}psk"], [f"{p}psm"]),
            helper.make_node("Mul", [raw, f"{p}psm"], [f"{p}pf"]),
        ]

    def _terms_sum_nodes(self, prefix: str, src: str, out: str, inits: list) -> list:
        """Nodes of `out` = `src` + `{prefix}pf` @ phys_coef (the sum form's terms)."""
        inits.append(numpy_helper.from_array(_f32(self.phys_coef), f"{prefix}pc"))
        return [
            helper.make_node("MatMul", [f"{prefix}pf", f"{prefix}pc"], [f"{prefix}pt"]),
            helper.make_node("Add", [src, f"{prefix}pt"], [out]),
        ]

    def _bottleneck_nodes(self, prefix: str, ref_t: str, inits: list) -> tuple[list, str]:
        """Nodes of the bottleneck form over the term features `{prefix}pf` and the scaled
        reference time `ref_t`; returns (nodes, output name)."""
        p, nodes, sides = prefix, [], []
        for g in range(side_count(self.phys_groups) + 1):
            coef = np.where(self.phys_groups == g, self.phys_coef, 0.0)
            inits.append(numpy_helper.from_array(_f32(coef), f"{p}pc{g}"))
            nodes.append(helper.make_node("MatMul", [f"{p}pf", f"{p}pc{g}"], [f"{p}s{g}r"]))
            if g == 2:  # the reference's time is on the GPU side
                nodes.append(helper.make_node("Add", [ref_t, f"{p}s2r"], [f"{p}s2"]))
                sides.append(f"{p}s2")
            elif g:
                sides.append(f"{p}s{g}r")
        nodes.append(helper.make_node("Max", sides, [f"{p}smax"]))
        nodes.append(helper.make_node("Add", [f"{p}s0r", f"{p}smax"], [f"{p}t1"]))
        return nodes, f"{p}t1"


def _model(nodes: list, inits: list, outputs: list, doc: str, meta: dict[str, str]):
    graph = helper.make_graph(
        nodes,
        "powerd",
        [helper.make_tensor_value_info(MODES_INPUT, TensorProto.INT64, ["N", 4])],
        outputs,
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="powerd",
        doc_string=doc,
    )
    for k, v in meta.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=str(v)))
    onnx.checker.check_model(model)
    return model


def reference_model(mlp: MLPWeights, target: str, meta: dict[str, str]) -> onnx.ModelProto:
    """A reference model: modes -> ``y`` (N,) in target space and ``h`` (N, D) penultimate."""
    fn, fi, feats = feature_nodes("", mlp.exps)
    mn, mi, y, h = mlp.nodes("", feats)
    nodes = fn + mn
    # With an empty prefix the builder already names its outputs "y" and "h".
    assert (y, h) == ("y", "h"), (y, h)
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"]),
        helper.make_tensor_value_info("h", TensorProto.FLOAT, ["N", mlp.embed_dim]),
    ]
    doc = f"powerd reference predictor: modes (cores, cpu_khz, gpu_hz, emc_hz) -> {target}"
    return _model(nodes, fi + mi, outputs, doc, {"target": target, **meta})


def fitted_model(
    time_mlp: MLPWeights,
    power_mlp: MLPWeights,
    time_head: Head,
    power_head: Head,
    meta: dict[str, str],
    overall_power_head: Head | None = None,
) -> onnx.ModelProto:
    """A workload's fitted predictor: modes -> ``time_ms`` (N,), ``power_w`` (N,) and, with
    `overall_power_head`, ``power_overall_w`` (N,): the power users are shown, the other
    the one decisions use (see RidgeOptions.overall_blend)."""
    nodes: list = []
    inits: list = []
    feats = {}
    # The two MLPs usually share one feature set: compute it once.
    for key, mlp in (("t_", time_mlp), ("p_", power_mlp)):
        k = mlp.exps.tobytes()
        if k not in feats:
            fn, fi, f = feature_nodes(key + "f_", mlp.exps)
            nodes += fn
            inits += fi
            feats[k] = f
    base = None
    power_heads = [(power_head, "power_w", "p_head_")]
    if overall_power_head is not None:
        power_heads.append((overall_power_head, POWER_OVERALL_OUTPUT, "po_head_"))
    if any(hd.needs_modes for hd in (time_head, *(ph for ph, _, _ in power_heads))):
        base = "hb_base"
        inits.append(numpy_helper.from_array(_f32(UNIT_SCALE), "hb_unit"))
        nodes.append(helper.make_node("Cast", [MODES_INPUT], ["hb_mf"], to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Mul", ["hb_mf", "hb_unit"], [base]))
    for key, mlp, heads in (
        ("t_", time_mlp, [(time_head, "time_ms", "t_head_")]),
        ("p_", power_mlp, power_heads),
    ):
        mn, mi, y, h = mlp.nodes(key, feats[mlp.exps.tobytes()])
        nodes += mn
        inits += mi
        for head, out, prefix in heads:
            # the time head's output is built first: a per-step power head divides by it
            hn, hi = head.nodes(prefix, y, h, out, base, time="time_ms")
            nodes += hn
            inits += hi
    outputs = [
        helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N"])
        for out in ("time_ms", *(out for _, out, _ in power_heads))
    ]
    doc = "powerd fitted predictor: modes (cores, cpu_khz, gpu_hz, emc_hz) -> " + ", ".join(
        o.name for o in outputs
    )
    return _model(nodes, inits, outputs, doc, meta)
