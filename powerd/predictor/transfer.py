"""Transfer the reference predictor to a new workload (and board) from profiled samples.

Two methods, both ending in a self-contained ONNX model (modes -> time_ms, power_w):

* ``"ridge"``: a closed-form refit, in numpy, of each model's last layer. The inputs are
  the reference's penultimate activations ``h`` plus an anchor ``r``; the target is log
  step time (power: W). ``r`` and the intercept are unpenalised and ``h``'s weights are
  ridge-penalised, so with few samples the fit shrinks towards the anchor and departs
  from it only where the samples agree. The ridge strength is chosen by exact
  leave-one-out error, and gross outliers are left out (see :func:`_trimmed`). The power
  anchor is the reference's power or, where that predicts left-out clock levels worse
  (``RidgeOptions.power_model``), a physical power model fitted first: a non-negative sum
  of a constant, per-core and uncore CPU power (f and f^3), GPU and memory clock terms
  and the reference's power, so that far from the samples power still rises with every
  clock as this workload's does. The time anchor (from 4 samples on,
  ``RidgeOptions.time_model``) is the log of a *physical* time model fitted first
  (:mod:`powerd.predictor.physical`: a non-negative sum of a constant, 1/f_gpu, 1/f_emc,
  1/f_cpu, 1/(cores*f_cpu) and the reference's time): the reference was trained on a
  GPU-bound job, and a workload whose time goes elsewhere (inference at batch size 1:
  launch-bound on one CPU thread) needs the samples to say which resource dominates; a
  rescaled reference cannot (time MAPE over every mode of ResNet-18 inference at batch
  size 1, from the strategy's own profiled modes: 11.9 % mean, 8.8 % median over budgets,
  instead of 43.9 / 22.4 %; docs/experiments.md "Prediction accuracy"). ~20-150 ms per
  fit, no torch.
* ``"torch-finetune"`` (default of :func:`fit_workload`): every layer of the reference
  ensemble fine-tuned with torch in a worker subprocess
  (:mod:`powerd.predictor.finetune_worker`) on the samples the ridge did not flag as
  outliers. Falls back to the ridge fit when that interpreter lacks torch or the worker
  fails, and records why. A few seconds per fit.

Why that default: ``tools/eval_transfer.py`` on the validation traces (MobileNet on Orin
AGX, ResNet-18 on Orin Nano; 10-50 profiled modes; random, grid and front-seeded
profiling) measured lower MAPE *and* better decisions for the full fine-tuning than for
the ridge or the published last-layer-only fine-tuning, e.g. at 50 modes median time
penalty after the closed-loop guard ~1-2% vs ~2-3% (ridge) and time MAPE 4-5% vs 5-7% on
Orin AGX. (DESIGN.md reports the opposite for the published single-network reference;
with the ensemble reference of models/MODEL_CARD.md the measurement favours fine-tuning.)
The ridge stays the fallback and the method for quick refits.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from powerd.fsutil import atomic_write_bytes
from powerd.modes import PowerMode
from powerd.optimize.base import Measurement, Predictor
from powerd.predictor import physical
from powerd.predictor.features import (
    PHYSICAL_POWER,
    PHYSICAL_POWER_PER_STEP,
    PHYSICAL_TIME,
    base_quantities,
    validate_modes,
)
from powerd.predictor.onnx_graph import MODES_INPUT, POWER_OVERALL_OUTPUT, Head, fitted_model
from powerd.predictor.reference import Embedding, ReferenceModel, make_session

METHODS = ("ridge", "torch-finetune")
DEFAULT_METHOD = "torch-finetune"
FORMAT = 1
WORKER_TIMEOUT_S = 60.0
# Fewer samples than this: the ridge even when torch-finetune is asked for. Fine-tuning every
# layer on a handful of modes is unconstrained away from them; 10 is the fewest at which
# tools/eval_transfer.py measured it ahead of the ridge (which, with few samples, shrinks
# to the rescaled reference).
MIN_TORCH_SAMPLES = 10


@dataclass(frozen=True)
class Samples:
    """Profiled modes of one workload. NaN time (aborted before enough steps) or NaN power
    excludes that sample from that model's fit only. `power_min_w` holds lower bounds on
    power where `power_w` is NaN (a window cut short over the budget; NaN: no bound), see
    :func:`with_power_floors`."""

    modes: np.ndarray  # (k, 4) int64
    time_ms: np.ndarray  # (k,)
    power_w: np.ndarray  # (k,)
    power_min_w: np.ndarray | None = None  # (k,)

    def __post_init__(self) -> None:
        m = validate_modes(self.modes)
        t = np.asarray(self.time_ms, dtype=np.float64).reshape(-1)
        p = np.asarray(self.power_w, dtype=np.float64).reshape(-1)
        lo = self.power_min_w
        lo = np.full(len(p), np.nan) if lo is None else np.asarray(lo, np.float64).reshape(-1)
        if not len(m) == len(t) == len(p) == len(lo):
            raise ValueError(f"samples: {len(m)} modes, {len(t)} times, {len(p)} powers")
        object.__setattr__(self, "modes", m)
        object.__setattr__(self, "time_ms", t)
        object.__setattr__(self, "power_w", p)
        object.__setattr__(self, "power_min_w", lo)

    def __len__(self) -> int:
        return len(self.modes)

    @property
    def time_ok(self) -> np.ndarray:
        return np.isfinite(self.time_ms) & (self.time_ms > 0)

    @property
    def power_ok(self) -> np.ndarray:
        return np.isfinite(self.power_w) & (self.power_w > 0)

    @classmethod
    def coerce(cls, obj: Samples | tuple | Mapping[PowerMode, Measurement]) -> Samples:
        """Accept Samples, a (modes, time_ms, power_w) tuple, or a strategy's sample map."""
        if isinstance(obj, Samples):
            return obj
        if isinstance(obj, Mapping):
            return cls.from_measurements(obj)
        modes, t, p = obj
        return cls(np.asarray(modes), np.asarray(t), np.asarray(p))

    @classmethod
    def from_measurements(cls, samples: Mapping[PowerMode, Measurement]) -> Samples:
        ms = list(samples.values())
        modes = np.array([m.mode.as_tuple() for m in ms], dtype=np.int64).reshape(-1, 4)
        # An aborted measurement's time is unknown; its power (a few readings, possibly
        # with the switch's transient) is a lower bound at best: see with_power_floors.
        ab = [m.aborted_over_budget for m in ms]
        t = np.array([np.nan if a else m.time_ms for m, a in zip(ms, ab, strict=True)])
        p = np.array([np.nan if a else m.power_w for m, a in zip(ms, ab, strict=True)])
        lo = np.array([m.power_w if a else np.nan for m, a in zip(ms, ab, strict=True)])
        return cls(modes, t, p, np.where(np.isfinite(lo) & (lo > 0), lo, np.nan))


@dataclass(frozen=True)
class RidgeOptions:
    """Variants of the ridge refit (measured by tools/eval_transfer.py; defaults = chosen)."""

    time_ref: bool = True  # reference log time as an unpenalised input
    power_ref: bool = True  # reference power as an unpenalised input
    power_log: bool = False  # fit log power (and log reference power) instead of W
    select: str = "loo"  # ridge strength: "loo" (exact leave-one-out), "gcv", "fixed"
    lam: float = 10.0  # used by select="fixed"
    # Below this many samples only the scale is fitted (coef_ref = 1, no activations):
    # an affine fit through two or three noisy points can tilt the whole mode space.
    min_affine: int = 5
    # Outlier trimming (see _trimmed), at most max_outlier_frac of the samples. Real traces
    # hold a few anomalous rows (Orin AGX at 2 cores / 268 MHz with the GPU at its top clock
    # runs 3-4x faster than its neighbours, in both AGX traces), and maximin coverage
    # loves exactly such corners. outlier_z = 0 disables.
    outlier_z: float = 4.0
    max_outlier_frac: float = 0.1
    min_gain: float = 0.2  # removal must cut the others' mean squared LOO error by this
    # Fewer samples than this: too few to tell an outlier from a trend (measured: trimming
    # at k=10 hurt more than it helped).
    min_trim: int = 20
    time_floor: float = 0.1  # log ms (~10%)
    power_floor: float = 1.0  # W (log W: 0.05)
    # "physical": the time head's reference input is the physical time model of
    # powerd.predictor.physical (non-negative time terms plus the reference's time, fitted
    # to the samples), the activations then correct it; "reference": the reference's log
    # time itself (the first releases' head); "auto": whichever of the two has the lower
    # leave-one-out error on the samples (two fits), see auto_reference_factor. Measured
    # by tools/bench_prediction.py (docs/experiments.md, "Prediction accuracy"):
    # "physical" predicts best overall, but on GPU-bound training (MobileNet v3) it reads
    # the core count as nearly free and the picks drift to 2-core modes; the reference
    # head (a rescaled GPU-bound corpus) ranks those modes right.
    time_model: str = "auto"
    # "auto" keeps the reference head only when its leave-one-out error (mean squared log
    # ratio) is below the physical head's times this factor. Replayed (in-sample traces,
    # tools/strategy_replay.py --refine 50, seeds 0,1), mean penalty physical -> auto at
    # 0.5: fresh MobileNet training 9.5 -> 9.2 %, Orin Nano 6.3 -> 7.4 %, ResNet-18
    # inference 0.4 -> 0.1 %; mixed order 11.2 -> 12.0 % (budgets over by > 0.5 W 3.1 ->
    # 0 %), 3.4 -> 1.9 %, 4.2 -> 4.2 %; MobileNet training's budgets 20-25-30-40 W in turn
    # (the interleave bench's training job, 8 seeds) 0.907 -> 0.965 of the best mode
    # (0.950 -> 0.969 measuring after the commit). At 1.0 (plain "auto") the Nano's median
    # went 0.9 -> 3.8 % (fresh, no measuring after the commit) and MobileNet put 1 of 64
    # budgets over.
    auto_reference_factor: float = 0.5
    # Fewer usable time samples than this: the "reference" head. From 4 on, the physical
    # head did better on the strategy's own sets (a 9 W budget on Orin Nano profiles 4-5
    # modes: worst time MAPE 32 % instead of 51 %); its weights' signs keep it tame.
    min_physical: int = 4
    # 1: the physical time heads only once the samples moved the core count. At one core
    # count the per-core CPU term 1/(cores*f_cpu) and the single-thread one 1/f_cpu are one
    # column, and the non-negative fit keeps either: on Orin Nano's 2-core samples of a
    # 10 W budget it kept 1/f_cpu and read 4 and 6 cores as no faster than 2 (968 ms
    # predicted for each; 545 and 473 ms true), so no pick ever tried more cores. The
    # reference head carries the reference's core effect instead (438 / 312 ms predicted).
    # Replayed (16 seeds, --refine 50, with explore_fit_prob): docs/experiments.md, session 15.
    physical_time_varied: int = 1
    # Smallest ridge strength on the activations above a physical head: the LOO choice can
    # only see the profiled region, and below 1 it bent predictions away from it.
    physical_min_lambda: float = 1.0
    # The physical head's bottleneck form (powerd.predictor.physical: const + max(CPU terms,
    # GPU terms + reference)) is a third candidate of "auto" and "physical", its
    # leave-one-out error (each sample's side held fixed) divided by this factor; 0: the
    # sum form only.
    bottleneck_factor: float = 1.0
    # The memory clock as a third side of the bottleneck form (physical.MEMORY_SIDE_GROUPS)
    # is one more candidate, its leave-one-out error divided by this factor (0: not tried),
    # and only once the kept timed samples moved the memory clock at
    # `memory_side_core_counts` core counts or more and number `memory_side_min_samples`:
    # the extra side fitted 10 low-power samples of ResNet-18 inference bs 1 better and
    # predicted every mode worse (time MAPE 6.5 -> 22.6 %, docs/experiments.md, session 58).
    # Off: at 1.3 with these gates, 9 replays of the in-sample traces moved the sum of mean
    # penalties by -0.2 points, within their noise (session 59).
    memory_side_factor: float = 0.0
    memory_side_core_counts: int = 2
    memory_side_min_samples: int = 20
    # Smallest ridge strength on the ridge power head's activations (0: any the LOO picks;
    # 30 admits 31.6 and up of the grid). The leave-one-out sees only the samples, which
    # bunch where a budget's picks are, and a weak penalty bends the activations to them
    # at the cost of every mode beyond; a bent ridge head also loses the clock-level block
    # score to the physical power terms, which extrapolate a low budget's samples worse
    # still (MobileNet v3 training, a 14 W budget's 25 readings within 3.4 W: the physical
    # terms chosen, every mode's power 27.5 % off; with the floor the ridge head, 4.8 %).
    # Power MAPE over every mode of the strategy's own sets (seeds 0-1), 0 -> 30: MobileNet
    # training 3.86 -> 3.42 %, Orin Nano 5.59 -> 5.51 %, ResNet-18 inference bs 1 3.31 ->
    # 3.24 %, bs 4 7.46 -> 7.22 %, bs 16 4.10 -> 3.94 % (docs/experiments.md, session 36).
    power_min_lambda: float = 30.0
    # Bound on the ridge power head's coefficient on the reference's power (0: none), held
    # by a pseudo sample of weight power_slope_weight (W per unit of slope: ~the noise of
    # a power reading over how far past the bound a slope may go unseen), so that samples
    # spanning tens of W can still tilt past it. The reference learnt a GPU-bound training
    # job, the most power per clock step a workload draws: over every mode of each
    # in-sample trace the best affine map of its power has a slope of 0.29-1.06. A low
    # budget's samples span a few W, and the slope they fit is the tilt of noisy points
    # (ResNet-18 inference at batch size 16, a 16 W budget's 7 readings: 1.41, every
    # mode's power 14 % off; bounded: 1.11, 4.3 %). Power MAPE over every mode of the
    # strategy's own sets (seeds 0-1), free -> bounded: Orin Nano 5.9 -> 5.6 %, ResNet-18
    # inference bs 4 8.0 -> 7.5 %, bs 16 4.5 -> 4.1 %, bs 1 and MobileNet training within
    # 0.1; decisions within what seeds vary (docs/experiments.md, session 35).
    power_max_slope: float = 1.1
    power_slope_weight: float = 3.0
    # "ridge": the power head's reference input is the reference's power; "physical": the
    # physical power model of powerd.predictor.physical (non-negative power terms plus the
    # reference's power, fitted to the samples), the activations then correct it; "auto":
    # whichever predicts the samples better when every sample at one clock level is left
    # out in turn (leave-one-out cannot tell: near the samples both fit alike, and the
    # samples of a budget sweep bunch where its picks are). Why "auto": the reference's
    # power shape does not fit every workload (ResNet-18 inference at batch size 1: the
    # best affine map of it over all 441 modes is 6.4 % off) and the ridge head drifts
    # away from bunched samples, but the power terms fitted to a low budget's samples can
    # extrapolate far worse (Orin Nano at 9-12 W: 13-153 % over the grid). Power MAPE of
    # the strategy's own sets (tools/bench_prediction.py), ridge / physical / auto:
    # MobileNet training 3.6 / 7.3 / 3.6 %, Orin Nano 7.0 / 22.9 / 7.0 %, ResNet-18
    # inference 9.9 / 7.6 / 8.4 %; decisions alike (docs/experiments.md, session 14).
    power_model: str = "auto"
    # "auto" with power_blend > 0: a mix of the two heads instead of the better one, each
    # weighted by its block error to the power -power_blend (0: off, the better one).
    # Off: at 2 the power MAPE over every mode of the strategy's own sets (seeds 0-1) fell
    # on four in-sample traces of five (Orin Nano 5.42 -> 4.88 %, ResNet-18 inference bs 4
    # 7.31 -> 6.96 %, bs 16 4.06 -> 3.82 %, MobileNet training 3.24 -> 3.01 %; bs 1 3.44
    # -> 3.63 %), but replayed decisions got worse on Orin Nano over 16 seeds (mean
    # penalty, new workload per budget 5.3 -> 5.7 %, mixed order 3.9 -> 4.9 %): the gain
    # is far from the samples, the picks are near them (docs/experiments.md, session 38).
    power_blend: float = 0.0
    # The power head of the predictions users read (`powerctl predict`/`pareto`; the
    # exported graph's power_overall_w): with power_model "auto", a blend of the two heads
    # as power_blend makes it, at this power (0: the decision head). The decisions keep
    # the better head, sharper near the samples where the picks are; over every mode,
    # far from a budget's samples, the blend is closer (power MAPE over every mode of the
    # default code's own sets, seeds 0-1, docs/experiments.md session 40).
    overall_blend: float = 2.0
    min_power_block: int = 8  # fewer samples left after taking a block out: not scored
    # Fewer power samples than this, or (physical_power_varied 1) samples that left a knob
    # at one level: the ridge head whatever power_model says. The clock-level check can
    # still pick the power terms from a low budget's few samples and be wrong: replayed
    # (tests/optimize/test_powertrain_changes.py, 40 noise draws of Orin Nano budgets
    # 9-12-16-20 W) "auto" from 4 samples put one budget at 2.19x the best step time.
    min_physical_power: int = 12
    physical_power_varied: int = 1  # 1: only when the samples moved every knob
    # 1: the power terms include the per-step ones (features.PHYSICAL_POWER_PER_STEP, each
    # divided by the fitted step time); 0: clock terms only (the form before session 24).
    power_per_step: int = 1
    # "auto" (and the overall blend) keep the physical power head only while, over every
    # mode the fit will be asked about (the `domain` of fit_ridge; none given: no check),
    # it predicts at most this factor times the ridge head (0: no check). Its terms have
    # non-negative weights and rise with every clock, so fitted to samples that held a
    # clock low, the curvature they read into noise can only extrapolate upwards: Orin
    # Nano, the first 12-20 samples of budgets raised from 9 W (CPU at 268-576 MHz) read
    # 6 cores at 1.5 GHz at 48-56 W (14 W true; every mode 72-100 % off) where the ridge
    # head, on the reference's shape, stayed within 25 W. Only upwards: the ridge head
    # can overshoot too (ResNet-18 inference at batch size 1: 43 W at the top, 26.9 W
    # true, where the physical head was 3 % off over every mode).
    power_domain_ratio: float = 1.5


@dataclass
class FitStats:
    """What a fit saw and how well it matches its own samples (MAPE in %)."""

    n_time: int = 0  # samples the time model was fitted to (outliers excluded)
    n_power: int = 0
    time_mape: float = float("nan")  # in-sample, over the samples fitted to
    power_mape: float = float("nan")
    time_loo_mape: float | None = None  # leave-one-out (ridge only): an honest error estimate
    power_loo_mape: float | None = None
    lambda_time: float | None = None  # inf: activations unused; None: no ridge (or none ran)
    lambda_power: float | None = None
    seconds: float = 0.0
    fallback_reason: str = ""  # why torch-finetune was requested but ridge ran
    # Samples (indices into the fit's samples) left out as outliers; worth re-measuring.
    time_outliers: list[int] = field(default_factory=list)
    power_outliers: list[int] = field(default_factory=list)
    # Split-conformal half-widths from the ridge's leave-one-out residuals, at
    # INTERVAL_COVERAGE: log time (relative), power W. None: too few samples to say.
    # With interval_growth set (fits since the physical head), the intervals grow away from
    # the samples (see INTERVAL_GROWTH) and power's is power_halfwidth_rel (log ratio);
    # power_halfwidth_w is kept for older readers.
    time_halfwidth: float | None = None
    power_halfwidth_w: float | None = None
    power_halfwidth_rel: float | None = None
    # the same for the overall power head, when the fit has one (RidgeOptions.overall_blend)
    power_overall_halfwidth_rel: float | None = None
    interval_growth: float | None = None
    interval_growth_power: float | None = None  # None: interval_growth
    interval_extrapolation: tuple[float, float] = (0.0, 0.0)  # (time, power)
    time_reach: float = 0.0
    power_reach: float = 0.0
    time_model: str = "reference"
    extra: dict[str, Any] = field(default_factory=dict)


INTERVAL_COVERAGE = 0.9
# Fits saved before interval_growth existed: a fixed widening of the conformal half-width.
INTERVAL_WIDEN = 1.5
MIN_INTERVAL_SAMPLES = 5
# Jackknife intervals: the conformal quantile q of the leave-one-out residuals (log ratios)
# is what a prediction misses at the distance the samples lie from each other (their
# "reach": the median distance of a sample to its nearest other one, in e-folds of
# (cores, f_cpu, f_gpu, f_emc)). Predictions reach further (the profiled modes of a low
# budget are all low-power; `predict` covers the whole grid), so a mode's half-width is
#   q * (1 + growth * max(0, d - reach)) + extrapolation * e
# with d its distance to the nearest fitted sample and e how far (log) its predicted value
# lies beyond the range of the measured ones: a slope fitted on 11-15 W misses more at 25 W.
# Chosen on the in-sample traces with tools/bench_prediction.py (coverage over every mode
# near the nominal 90 % on the strategy's own sets, on spread sets of 20-50 modes and on
# sets drawn from the lowest third of the power range); never on the held-out trace.
# Power grows twice as fast as time: after many budget changes most samples sit near the
# picks and, read with little noise (0.2 % here), their leave-one-out misses are small
# while the misses far from them are not; at 1 the power intervals held 79 % of
# MobileNet training's true powers in such sets (bench_prediction's `mixed` design at
# 0.006:0.05 noise; 67-74 % in daemon runs), at 2 88 %, with median half-widths 10 %
# wider. Time stays at 1: its intervals set the search's doubt (powertrain's
# interval_doubt_time), and both at 2 raised the Orin Nano's mixed-order replay mean from
# 1.4 to 3.2 %; power's alone at 2 (they reach only the long shots) left the replays
# within their seeds' spread (docs/experiments.md, session 51).
INTERVAL_GROWTH = 1.0  # time
INTERVAL_GROWTH_POWER = 2.0
INTERVAL_EXTRAPOLATION = (0.5, 1.0)  # (time, power)
# No half-width beyond a factor of 4 either way: wider says nothing more, and a fit from a
# handful of samples with one corner far off (replays of a 9 W budget on Orin Nano, 15 W on
# ResNet-18 inference) otherwise reported bounds 40-70x apart.
INTERVAL_MAX_LOG = float(np.log(4.0))


def log_coords(modes: np.ndarray) -> np.ndarray:
    """(N, 4) log of (cores, GHz, GHz, GHz): distances in e-folds, any board."""
    return np.log(base_quantities(modes))


def nearest_distance(query: np.ndarray, ref: np.ndarray, chunk: int = 4096) -> np.ndarray:
    """Euclidean distance from each row of `query` to its nearest row of `ref` (log coords)."""
    out = np.empty(len(query))
    if len(ref) == 0:
        out.fill(np.inf)
        return out
    for i in range(0, len(query), chunk):
        q = query[i : i + chunk]
        d2 = np.sum(q * q, 1)[:, None] - 2 * q @ ref.T + np.sum(ref * ref, 1)[None, :]
        out[i : i + chunk] = np.sqrt(np.maximum(d2.min(axis=1), 0.0))
    return out


def loo_distances(coords: np.ndarray) -> np.ndarray:
    """Each sample's distance to the nearest *other* sample."""
    d2 = np.sum((coords[:, None, :] - coords[None, :, :]) ** 2, axis=2)
    np.fill_diagonal(d2, np.inf)
    return np.sqrt(d2.min(axis=1)) if len(coords) > 1 else np.full(len(coords), np.inf)


def _reach(dist: np.ndarray) -> float:
    """How far the leave-one-out predictions reached: the median distance of a sample to
    its nearest other sample (0 when there is none)."""
    d = dist[np.isfinite(dist)]
    return float(np.median(d)) if len(d) else 0.0


def conformal_halfwidth(resid: np.ndarray, coverage: float = INTERVAL_COVERAGE) -> float | None:
    """Split-conformal: the ceil((n + 1) * coverage)-th smallest |residual|; None with fewer
    than MIN_INTERVAL_SAMPLES (or when that rank exceeds n: the interval is unbounded)."""
    a = np.sort(np.abs(np.asarray(resid, dtype=np.float64)))
    n = len(a)
    if n < MIN_INTERVAL_SAMPLES:
        return None
    k = int(np.ceil((n + 1) * coverage))
    return float(a[min(k, n) - 1])


def _mape(pred: np.ndarray, true: np.ndarray) -> float:
    if len(true) == 0:
        return float("nan")
    return float(np.mean(np.abs(pred - true) / np.abs(true)) * 100)


_LAMBDAS = np.concatenate([np.logspace(-3, 5, 33), [np.inf]])


def ridge_head(
    y_ref: np.ndarray,
    h: np.ndarray,
    target: np.ndarray,
    scale: np.ndarray,
    *,
    use_ref: bool,
    ref_transform: str,
    out_transform: str,
    options: RidgeOptions,
    modes: np.ndarray | None = None,
    phys: tuple[np.ndarray, np.ndarray, float, np.ndarray, np.ndarray] | None = None,
    min_lambda: float = 0.0,
    time_ms: np.ndarray | None = None,
    max_slope: float = 0.0,
    slope_weight: float = 0.0,
) -> tuple[Head, float | None, np.ndarray]:
    """Fit ``target ~ a + b*r(y_ref) + h @ w`` with a ridge penalty on ``w`` only.

    ``scale`` is each activation's std over the reference corpus: a fixed, sample-free
    column scale (k samples are too few to estimate it). With ``ref_transform="physical"``,
    ``phys`` = (exponents, weights, reference weight, term groups: empty for the sum form)
    of the fitted physical time model and ``modes`` the samples' modes (see Head); a power
    head's ``phys`` adds its per-step flags, and ``time_ms`` the samples' fitted step times.
    ``max_slope`` > 0 bounds the coefficient on the reference input: a fit that would
    exceed it is redone with one more (pseudo) sample, ``slope_weight * (b - max_slope)
    = 0``, which holds it near the bound unless the samples span enough power to say
    otherwise. Returns
    (head, lambda, leave-one-out residuals in target space)."""
    k = len(target)
    none = (np.zeros((0, 4)), np.zeros(0), 0.0, np.zeros(0), np.zeros(0, dtype=bool))
    px, pc, ps, pg, pps = phys if phys is not None else none
    head = Head(
        ref_transform=ref_transform,
        out_transform=out_transform,
        phys_exps=px,
        phys_coef=pc,
        ref_scale=ps,
        phys_groups=pg,
        phys_per_step=pps,
    )
    r = head.ref_input(y_ref, modes, time_ms) if use_ref else np.zeros(k)
    if k == 0:
        return head, None, np.zeros(0)
    base = r if use_ref else np.zeros(k)
    t = target - base if (use_ref and k < options.min_affine) else target
    if use_ref and k >= options.min_affine:
        u = np.column_stack([np.ones(k), r])
    else:
        u = np.ones((k, 1))
    lam, w, lev, coefs = _ridge_solve(u, t, h, scale, options, min_lambda, k)
    b = float(coefs[1]) if u.shape[1] == 2 else (1.0 if use_ref else 0.0)
    if u.shape[1] == 2 and 0 < max_slope < b and slope_weight > 0:
        # the pseudo sample joins the fit and the leverages, never the residuals
        lam, w, lev, coefs = _ridge_solve(
            np.vstack([u, [0.0, slope_weight]]),
            np.append(t, slope_weight * max_slope),
            np.vstack([h, np.zeros((1, h.shape[1]))]),
            scale,
            options,
            min_lambda,
            k,
        )
        b = float(coefs[1])
    a = float(coefs[0])
    head = Head(
        a, b, w if np.any(w) else np.zeros(0), ref_transform, out_transform, px, pc, ps, pg, pps
    )
    resid = target - head.linear(y_ref, h, modes, time_ms)
    loo = resid / np.maximum(1.0 - lev[:k], 1e-9)
    return head, lam, loo


def _ridge_solve(
    u: np.ndarray,
    t: np.ndarray,
    h: np.ndarray,
    scale: np.ndarray,
    options: RidgeOptions,
    min_lambda: float,
    real: int,
) -> tuple[float | None, np.ndarray, np.ndarray, np.ndarray]:
    """``t ~ u @ c + h @ w`` with the ridge penalty on ``w`` only, its strength chosen by
    `options` (at least `min_lambda`); rows past the first `real` are pseudo samples.
    Returns (lambda, w, leverages, c)."""
    k = len(t)
    keep = scale > 1e-6 * max(float(scale.max(initial=0.0)), 1e-12)
    hs = h[:, keep] / scale[keep]
    # Orthogonal basis of the unpenalised columns; project them out of targets/activations.
    qu, _ = np.linalg.qr(u)
    pu = qu.shape[1]
    ty = t - qu @ (qu.T @ t)
    if real >= options.min_affine and real > pu + 1 and hs.shape[1]:
        hp = hs - qu @ (qu.T @ hs)
        # Spectrum from the k x k Gram matrix (k samples << D activations): cheaper than an
        # SVD of the k x D matrix, and immune to OpenBLAS' threaded gesdd, which took
        # ~250 ms instead of ~1 ms on 50 x 256 once onnxruntime shared the process.
        s2, a_ = np.linalg.eigh(hp @ hp.T)
        good = s2 > 1e-10 * max(float(s2.max(initial=0.0)), 1e-300)
        s2, a_ = s2[good], a_[:, good]
        alpha = a_.T @ ty
        lev_u = np.sum(qu**2, axis=1)
        if options.select == "fixed":
            lams = np.array([options.lam])
        else:
            lams = _LAMBDAS[_LAMBDAS >= min_lambda]
        best: tuple[float, float, np.ndarray | None] = (np.inf, np.inf, None)
        for lam in lams:
            shrink = np.zeros_like(s2) if np.isinf(lam) else s2 / (s2 + lam)
            resid = ty - a_ @ (shrink * alpha)
            if options.select == "gcv":
                dof = pu + shrink.sum()
                score = k * float(resid @ resid) / max(k - dof, 1e-9) ** 2
            else:
                lev = lev_u + (a_**2) @ shrink
                loo = resid / np.maximum(1.0 - lev, 1e-9)
                score = float(np.mean(loo**2))
            if score < best[0]:
                best = (score, lam, shrink)
        if best[2] is None:  # every score NaN (degenerate samples): keep the affine fit
            best = (np.inf, np.inf, np.zeros_like(s2))
        lam = float(best[1])
        shrink = best[2]
        # w = V diag(s / (s^2 + lam)) alpha with V = hp.T A / s, i.e. hp.T A (alpha / (s^2 + lam))
        coef = np.zeros_like(s2) if np.isinf(lam) else alpha / (s2 + lam)
        ws = hp.T @ (a_ @ coef)
        w = np.zeros(h.shape[1])
        w[keep] = ws / scale[keep]
        lev = lev_u + (a_**2) @ shrink
    else:
        lam, w = None, np.zeros(h.shape[1])
        lev = np.sum(qu**2, axis=1)
    # The unpenalised coefficients, given w (exact for the joint problem).
    coefs, *_ = np.linalg.lstsq(u, t - h @ w, rcond=None)
    return lam, w, lev, coefs


# The saved heads of a ridge fit, in order (the third only when it has an overall head).
HEAD_NAMES = ("time", "power", "power_overall")


class FittedPredictor(Predictor):
    """A workload's fitted predictor, backed by its own ONNX model (modes -> time, power).

    Self-contained: it does not need the reference model dir once built, so a fit persisted
    by one release keeps working after an upgrade changes the bundled reference."""

    def __init__(
        self,
        onnx_bytes: bytes,
        method: str,
        stats: FitStats,
        samples: Samples,
        reference_id: str = "",
        heads: tuple[Head, ...] | None = None,
        threads: int = 1,
    ):
        """`heads`: (time, power) or (time, power, overall power) of a ridge fit, else None."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
        self.onnx_bytes = onnx_bytes
        self.method = method
        self.stats = stats
        self.samples = samples
        self.reference_id = reference_id
        self.heads = heads
        self._session = make_session(onnx_bytes, threads)
        outputs = {o.name for o in self._session.get_outputs()}
        self.has_overall = POWER_OVERALL_OUTPUT in outputs

    def predict(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The predictions the strategies decide by."""
        return self._run(modes, "power_w")

    def predict_overall(self, modes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The predictions users are shown (`powerctl predict`/`pareto`): the power of the
        overall head where the fit has one (RidgeOptions.overall_blend), else predict()'s."""
        return self._run(modes, POWER_OVERALL_OUTPUT if self.has_overall else "power_w")

    def _run(self, modes: np.ndarray, power_output: str) -> tuple[np.ndarray, np.ndarray]:
        m = validate_modes(modes)
        if len(m) == 0:
            return np.zeros(0), np.zeros(0)
        t, p = self._session.run(["time_ms", power_output], {MODES_INPUT: m})
        return t.astype(np.float64), p.astype(np.float64)

    def predict_interval(
        self, modes: np.ndarray, overall: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(time_ms, time_lo, time_hi, power_w, power_lo, power_hi): the prediction and an
        interval meant to hold the true value for INTERVAL_COVERAGE of the modes: conformal
        on the fit's leave-one-out residuals, each mode's half-width growing with its
        distance to the nearest fitted sample (see INTERVAL_GROWTH). With too few samples to
        say, the bounds are NaN. `overall`: predict_overall()'s power and its interval."""
        overall = overall and self.has_overall
        t, p = self.predict_overall(modes) if overall else self.predict(modes)
        st = self.stats
        if st.interval_growth is not None:
            return (t, *self._bounds(modes, t, p, overall))
        ht, hp = st.time_halfwidth, st.power_halfwidth_w
        if ht is None:
            t_lo = t_hi = np.full_like(t, np.nan)
        else:
            t_lo, t_hi = t * np.exp(-INTERVAL_WIDEN * ht), t * np.exp(INTERVAL_WIDEN * ht)
        if hp is None:
            p_lo = p_hi = np.full_like(p, np.nan)
        else:
            p_lo, p_hi = p - INTERVAL_WIDEN * hp, p + INTERVAL_WIDEN * hp
        return t, t_lo, t_hi, p, p_lo, p_hi

    def _bounds(
        self, modes: np.ndarray, t: np.ndarray, p: np.ndarray, overall: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(time_lo, time_hi, power_w, power_lo, power_hi) of a distance-scaled interval."""
        st, s = self.stats, self.samples
        p_half = st.power_halfwidth_rel
        if overall and st.power_overall_halfwidth_rel is not None:
            p_half = st.power_overall_halfwidth_rel
        g_t = float(st.interval_growth or 0.0)
        g_p = g_t if st.interval_growth_power is None else float(st.interval_growth_power)
        q = log_coords(validate_modes(modes)) if len(t) else np.zeros((0, 4))
        out = []
        ext_t, ext_p = (tuple(st.interval_extrapolation) + (0.0, 0.0))[:2]
        for half, ok, bad, y, g, measured, ext, reach in (
            (
                st.time_halfwidth,
                s.time_ok,
                st.time_outliers,
                t,
                g_t,
                s.time_ms,
                ext_t,
                st.time_reach,
            ),
            (
                p_half,
                s.power_ok,
                st.power_outliers,
                p,
                g_p,
                s.power_w,
                ext_p,
                st.power_reach,
            ),
        ):
            if half is None:
                out += [np.full_like(y, np.nan), np.full_like(y, np.nan)]
                continue
            ok = ok.copy()
            ok[list(bad)] = False
            d = nearest_distance(q, log_coords(s.modes[ok]))
            w = half * (1.0 + g * np.maximum(d - reach, 0.0))
            if ext > 0 and ok.any():
                lo, hi = float(measured[ok].min()), float(measured[ok].max())
                ly = np.log(np.maximum(y, 1e-9))
                w = w + ext * (np.maximum(ly - np.log(hi), 0) + np.maximum(np.log(lo) - ly, 0))
            w = np.minimum(w, INTERVAL_MAX_LOG)
            out += [y * np.exp(-w), y * np.exp(w)]
        return out[0], out[1], p, out[2], out[3]

    def predict_with(
        self, reference: ReferenceModel, modes: np.ndarray, overall: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """The same prediction computed in numpy from `reference`'s outputs and the heads
        (ridge fits only): a cross-check of the exported graph. `overall`: as
        predict_overall()."""
        if self.heads is None:
            raise ValueError(f"a {self.method} fit has no numpy heads")
        m = validate_modes(modes)
        e = reference.embed(m)
        th, ph = self.heads[0], self.heads[2 if overall and len(self.heads) > 2 else 1]
        t = th.apply(e.time_y, e.time_h, m)
        return t, ph.apply(e.power_y, e.power_h, m, t)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write predictor.onnx, fit.npz (samples, heads) and fitted.json into `directory`.
        Each file is written to a temporary name and renamed, so a crash leaves either the
        old or the new file, never a torn one."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {
            "modes": self.samples.modes,
            "time_ms": self.samples.time_ms,
            "power_w": self.samples.power_w,
        }
        heads_meta = None
        if self.heads is not None:
            heads_meta = []
            for name, hd in zip(HEAD_NAMES, self.heads, strict=False):
                arrays[f"head_{name}_w"] = np.asarray(hd.w, dtype=np.float64)
                hm = {
                    "intercept": hd.intercept,
                    "coef_ref": hd.coef_ref,
                    "ref_transform": hd.ref_transform,
                    "out_transform": hd.out_transform,
                }
                if hd.needs_modes:
                    arrays[f"head_{name}_phys_exps"] = hd.phys_exps
                    arrays[f"head_{name}_phys_coef"] = hd.phys_coef
                    if hd.bottleneck:
                        arrays[f"head_{name}_phys_groups"] = hd.phys_groups
                    if hd.needs_time:
                        arrays[f"head_{name}_phys_per_step"] = hd.phys_per_step
                    hm["ref_scale"] = hd.ref_scale
                heads_meta.append(hm)
        meta = {
            "format": FORMAT,
            "method": self.method,
            "reference_id": self.reference_id,
            "stats": _jsonable(_lambdas_out(asdict(self.stats))),  # plain JSON: NaN -> null
            "heads": heads_meta,
        }
        atomic_write_bytes(d / "predictor.onnx", self.onnx_bytes)
        npz = io.BytesIO()
        np.savez(npz, **arrays)
        atomic_write_bytes(d / "fit.npz", npz.getvalue())
        atomic_write_bytes(d / "fitted.json", (json.dumps(meta, indent=1) + "\n").encode())
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike[str], threads: int = 1) -> FittedPredictor:
        d = Path(directory)
        try:
            meta = json.loads((d / "fitted.json").read_text())
            onnx_bytes = (d / "predictor.onnx").read_bytes()
            with np.load(d / "fit.npz", allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{d}: not a saved powerd predictor: {e}") from e
        if meta.get("format") != FORMAT:
            raise ValueError(f"{d}: predictor format {meta.get('format')}, expected {FORMAT}")
        stats = _stats_from_json(meta["stats"])
        heads = None
        if meta.get("heads"):
            heads = tuple(
                Head(
                    w=arrays[f"head_{name}_w"],
                    phys_exps=arrays.get(f"head_{name}_phys_exps", np.zeros((0, 4))),
                    phys_coef=arrays.get(f"head_{name}_phys_coef", np.zeros(0)),
                    phys_groups=arrays.get(f"head_{name}_phys_groups", np.zeros(0)),
                    phys_per_step=arrays.get(f"head_{name}_phys_per_step", np.zeros(0)),
                    **hm,
                )
                for name, hm in zip(HEAD_NAMES, meta["heads"], strict=False)
            )
        samples = Samples(arrays["modes"], arrays["time_ms"], arrays["power_w"])
        return cls(
            onnx_bytes, meta["method"], stats, samples, meta.get("reference_id", ""), heads, threads
        )  # type: ignore[arg-type]


def _jsonable(v: Any) -> Any:
    """Plain JSON (no NaN/Infinity tokens, which strict parsers such as jq reject):
    non-finite floats become null."""
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, float | np.floating):
        return float(v) if np.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


_LAMBDA_FIELDS = ("lambda_time", "lambda_power")


def _lambdas_out(d: dict[str, Any]) -> dict[str, Any]:
    """An infinite ridge strength (activations unused) is "inf" in JSON, not null (which
    means no ridge ran)."""
    return {k: "inf" if k in _LAMBDA_FIELDS and v == float("inf") else v for k, v in d.items()}


def _stats_from_json(d: dict[str, Any]) -> FitStats:
    known = {f.name for f in fields(FitStats)}
    kw = {k: v for k, v in d.items() if k in known}  # a newer writer may add fields
    for k in _LAMBDA_FIELDS:
        if kw.get(k) == "inf":
            kw[k] = float("inf")
    for k in ("time_mape", "power_mape"):
        if kw.get(k) is None:
            kw[k] = float("nan")
    return FitStats(**kw)


def _in_sample(fp: FittedPredictor, s: Samples) -> None:
    """In-sample MAPE over the samples each model was fitted to (outliers excluded)."""
    if len(s) == 0:
        return
    t, p = fp.predict(s.modes)
    to, po = s.time_ok.copy(), s.power_ok.copy()
    to[fp.stats.time_outliers] = False
    po[fp.stats.power_outliers] = False
    fp.stats.time_mape = _mape(t[to], s.time_ms[to])
    fp.stats.power_mape = _mape(p[po], s.power_w[po])


def _trimmed(
    fit: Any, k: int, floor: float, opts: RidgeOptions
) -> tuple[Head, float | None, np.ndarray, np.ndarray]:
    """Run `fit(mask)`, then drop outliers one at a time, largest leave-one-out residual
    first. A candidate must stand out (> outlier_z robust sigmas and > floor) *and* its
    removal must cut the other samples' leave-one-out error by min_gain: an anomalous row
    drags its neighbours' predictions, while an informative extreme (the one sample in a
    corner of the grid) has a large residual but the others do not improve without it.
    Returns (head, lambda, loo residuals of the kept samples, kept mask)."""
    keep = np.ones(k, dtype=bool)
    head, lam, loo = fit(keep)
    if opts.outlier_z <= 0 or k < opts.min_trim:
        return head, lam, loo, keep
    for _ in range(int(opts.max_outlier_frac * k)):
        kept = np.flatnonzero(keep)
        a = np.abs(loo)
        sigma = 1.4826 * float(np.median(a))
        j = int(np.argmax(a))
        if a[j] <= max(opts.outlier_z * sigma, floor):
            break
        trial = keep.copy()
        trial[kept[j]] = False
        t_head, t_lam, t_loo = fit(trial)
        others = np.delete(loo, j)
        if np.mean(t_loo**2) > (1.0 - opts.min_gain) * np.mean(others**2):
            break
        keep, head, lam, loo = trial, t_head, t_lam, t_loo
    return head, lam, loo, keep


def memory_side_sampled(modes: np.ndarray, core_counts: int, min_samples: int) -> bool:
    """Whether timed sample modes can tell a memory side from the others: at least
    `min_samples` of them, and the memory clock moved (two levels or more) at `core_counts`
    core counts or more, so that a core count's gain can show where the memory waits."""
    modes = np.asarray(modes)
    if len(modes) < min_samples:
        return False
    moved = sum(len(np.unique(modes[modes[:, 0] == c, 3])) >= 2 for c in np.unique(modes[:, 0]))
    return moved >= core_counts


def knobs_moved(modes: np.ndarray) -> np.ndarray:
    """Per knob (cores, CPU, GPU, EMC): did the samples hold it at two levels or more?"""
    return np.array([len(np.unique(modes[:, j])) >= 2 for j in range(modes.shape[1])])


def blend_weight(scores: list[float], power: float) -> float | None:
    """The physical power head's weight in a blend with the ridge head, from their block
    errors (ridge, physical): inverse-error weights, each error raised to `power`. None:
    no blend (power 0, or a score that is not finite: keep the lower one)."""
    if power <= 0 or not np.isfinite(scores).all():
        return None
    inv = 1.0 / np.maximum(np.asarray(scores, dtype=np.float64), 1e-9) ** power
    return float(inv[1] / inv.sum())


def blend_power_heads(ridge: Head, phys: Head, alpha: float) -> Head:
    """``(1 - alpha) * ridge + alpha * phys`` as one physical-power head: both are linear
    in the reference's power, the activations and the power terms, so their mix is too."""
    if ridge.ref_transform != "identity" or phys.ref_transform != "physical-power":
        raise ValueError("a blend takes a ridge power head and a physical one")
    a, b = 1.0 - alpha, alpha
    w_r = ridge.w if ridge.w.size else np.zeros_like(phys.w)
    w_p = phys.w if phys.w.size else np.zeros_like(w_r)
    return Head(
        intercept=a * ridge.intercept + b * phys.intercept,
        coef_ref=1.0,
        w=a * w_r + b * w_p,
        ref_transform="physical-power",
        out_transform="identity",
        phys_exps=phys.phys_exps,
        phys_coef=b * phys.coef_ref * phys.phys_coef,
        ref_scale=a * ridge.coef_ref + b * phys.coef_ref * phys.ref_scale,
        phys_per_step=phys.phys_per_step,
    )


def _block_error(fit: Any, at: Any, modes: np.ndarray, target: np.ndarray, min_left: int) -> float:
    """Mean absolute relative error of `fit(mask)` (a fit to the samples in mask; `at(head,
    mask)` predicts with it) on the samples it was not given, leaving out every sample at
    one level of one clock in turn: an extrapolation test (inf when no block leaves enough
    samples)."""
    errs: list[float] = []
    for j in (1, 2, 3):
        for level in np.unique(modes[:, j]):
            out = modes[:, j] == level
            if (~out).sum() < min_left:
                continue
            head = fit(~out)[0]
            errs.extend(np.abs(at(head, out) / target[out] - 1.0).tolist())
    return float(np.mean(errs)) if errs else float("inf")


def fit_heads(
    e: Embedding,
    s: Samples,
    reference_meta: dict[str, Any],
    options: RidgeOptions | None = None,
    domain: tuple[np.ndarray, Embedding] | None = None,
) -> tuple[Head, Head, FitStats, Samples, Head | None]:
    """The ridge refit proper, on the reference's outputs `e` for the sample modes (rows of
    `e` match `s`). Separate from :func:`fit_ridge` so that an evaluation that refits many
    times over one mode space can embed every mode once. Returns the heads, their stats,
    the samples the power head was fitted to (`s` with the power floors it broke taken as
    measured, see :func:`with_power_floors`) and the overall power head (None: the power
    head serves both; see RidgeOptions.overall_blend). `domain`: (modes, their embedding),
    the modes the fit will predict (see RidgeOptions.power_domain_ratio)."""
    opts = options or RidgeOptions()
    scaler = reference_meta["models"]
    ti = np.flatnonzero(s.time_ok)
    t_target = np.log(s.time_ms[ti])
    t_scale = np.asarray(scaler["time"]["embed_std"])
    if opts.time_model not in ("physical", "reference", "auto"):
        raise ValueError(f"unknown time model {opts.time_model!r}")
    can_phys = opts.time_ref and len(ti) >= opts.min_physical
    if can_phys and opts.physical_time_varied:
        can_phys = bool(knobs_moved(s.modes[ti])[0])
    x_phys = physical.design(s.modes[ti], np.exp(e.time_y[ti])) if can_phys else None

    def fit_reference(m: np.ndarray) -> tuple[Head, float | None, np.ndarray]:
        r = ti[m]
        return ridge_head(
            e.time_y[r],
            e.time_h[r],
            t_target[m],
            t_scale,
            use_ref=opts.time_ref,
            ref_transform="identity",
            out_transform="exp",
            options=opts,
        )

    def fit_physical(
        m: np.ndarray, bottleneck: bool = False, memory_side: bool = False
    ) -> tuple[Head, float | None, np.ndarray]:
        assert x_phys is not None
        r = ti[m]
        if bottleneck:
            groups = physical.MEMORY_SIDE_GROUPS if memory_side else physical.BOTTLENECK_GROUPS
            c = physical.fit_bottleneck(x_phys[m], s.time_ms[r], groups)
        else:
            groups = np.zeros(0, dtype=np.int64)
            c = physical.fit_weights(x_phys[m], s.time_ms[r])
        phys = (
            np.array(PHYSICAL_TIME, dtype=np.int64),
            c[:-1],
            float(c[-1]) / physical.REF_UNIT_MS,
            groups,
            np.zeros(len(PHYSICAL_TIME), dtype=bool),
        )
        return ridge_head(
            e.time_y[r],
            e.time_h[r],
            t_target[m],
            t_scale,
            use_ref=True,
            ref_transform="physical",
            out_transform="exp",
            options=opts,
            modes=s.modes[r],
            phys=phys,
            min_lambda=opts.physical_min_lambda,
        )

    def honest(fitted: tuple[Head, float | None, np.ndarray, np.ndarray]) -> np.ndarray:
        """Leave-one-out residuals of a time fit, the physical model's own pull included
        (the activations' LOO is exact given it)."""
        head, _, loo, keep = fitted
        if head.ref_transform != "physical" or len(loo) < 3 or x_phys is None:
            return loo
        kt = np.flatnonzero(keep)
        coef = np.append(head.phys_coef, head.ref_scale * physical.REF_UNIT_MS)
        x = x_phys[kt]
        if head.bottleneck:
            x = physical.dominant_design(x, coef, head.phys_groups)
        return loo + head.coef_ref * physical.loo_log_ratio(x, s.time_ms[ti[kt]], coef)

    candidates, factors = [], []
    if opts.time_model in ("reference", "auto") or x_phys is None:
        candidates.append(_trimmed(fit_reference, len(ti), opts.time_floor, opts))
        factors.append(opts.auto_reference_factor if opts.time_model == "auto" else 1.0)
    if opts.time_model in ("physical", "auto") and x_phys is not None:
        summed = _trimmed(fit_physical, len(ti), opts.time_floor, opts)
        candidates.append(summed)
        factors.append(1.0)
        if opts.bottleneck_factor > 0:
            # on the samples the sum form kept: the max can fit a gross outlier on a side of
            # its own, so it does not show up in its own leave-one-out residuals
            keep = summed[3]
            candidates.append((*fit_physical(keep, bottleneck=True), keep))
            factors.append(opts.bottleneck_factor)
            if opts.memory_side_factor > 0 and memory_side_sampled(
                s.modes[ti[keep]], opts.memory_side_core_counts, opts.memory_side_min_samples
            ):
                fit = fit_physical(keep, bottleneck=True, memory_side=True)
                candidates.append((*fit, keep))
                factors.append(opts.memory_side_factor)
    # "auto": the head whose leave-one-out error (mean squared log ratio) is lower, the
    # reference head's divided by auto_reference_factor.
    scored = [
        (float(np.mean(honest(c) ** 2)) / f if len(c[2]) and f > 0 else np.inf, n)
        for n, (c, f) in enumerate(zip(candidates, factors, strict=True))
    ]
    best = candidates[min(scored)[1]]
    time_head, lam_t, _, keep_t = best
    loo_t = honest(best)

    # The fitted step time of every sample mode (those with a power reading only, too): the
    # per-step power terms divide by it, as the exported graph divides by its time output.
    t_fit = time_head.apply(e.time_y, e.time_h, s.modes) if opts.power_per_step else None
    per_step_terms = PHYSICAL_POWER_PER_STEP if opts.power_per_step else ()
    power_exps = np.array(PHYSICAL_POWER + per_step_terms, dtype=np.int64)
    power_per_step = np.arange(len(power_exps)) >= len(PHYSICAL_POWER)

    def t_at(r: np.ndarray) -> np.ndarray | None:
        return None if t_fit is None else t_fit[r]

    p_scale = np.asarray(scaler["power"]["embed_std"])
    p_floor = 0.05 if opts.power_log else opts.power_floor

    if opts.power_model not in ("ridge", "physical", "auto"):
        raise ValueError(f"unknown power model {opts.power_model!r}")

    def fit_power_head(sp: Samples):
        """(power sample rows, their targets, the trimmed power fit, the physical head's
        share when it blends the two heads, else None, the overall head: a call returning
        (its physical share, its trimmed fit), or None, and the ratio for which the physical
        head was left out, else None; see stray_ratio) of samples `sp`."""
        alpha: float | None = None
        overall = None
        strayed: float | None = None
        rows = np.flatnonzero(sp.power_ok)
        target = np.log(sp.power_w[rows]) if opts.power_log else sp.power_w[rows]

        def fit_power(m: np.ndarray) -> tuple[Head, float | None, np.ndarray]:
            r = rows[m]
            return ridge_head(
                e.power_y[r],
                e.power_h[r],
                target[m],
                p_scale,
                use_ref=opts.power_ref,
                ref_transform="log" if opts.power_log else "identity",
                out_transform="exp" if opts.power_log else "identity",
                options=opts,
                min_lambda=opts.power_min_lambda,
                max_slope=opts.power_max_slope,
                slope_weight=opts.power_slope_weight,
            )

        def fit_physical_power(m: np.ndarray) -> tuple[Head, float | None, np.ndarray]:
            r = rows[m]
            x = physical.power_design(sp.modes[r], e.power_y[r], t_at(r))
            # A knob the samples hold at fewer than 3 levels shows a slope, not a curve:
            # its terms above first power stay out (ResNet-18 inference, a 15 W budget's
            # modes at the two lowest GPU clocks: the top clock read 13.7 W high).
            levels = np.array([len(np.unique(sp.modes[r][:, j])) for j in range(4)])
            curved = (power_exps[:, levels < 3] > 1).any(axis=1)
            x[:, np.flatnonzero(curved)] = 0.0  # the last column, the reference's, stays
            c = physical.fit_weights(x, sp.power_w[r])
            phys = (
                power_exps,
                c[:-1],
                float(c[-1]) / physical.REF_UNIT_W,
                np.zeros(0, dtype=np.int64),
                power_per_step,
            )
            return ridge_head(
                e.power_y[r],
                e.power_h[r],
                target[m],
                p_scale,
                use_ref=True,
                ref_transform="physical-power",
                out_transform="identity",
                options=opts,
                modes=sp.modes[r],
                phys=phys,
                min_lambda=opts.physical_min_lambda,
                time_ms=t_at(r),
            )

        fit = fit_power
        # every knob moved by the samples: else the terms of a knob never moved are one
        # column with the constant (e.g. per-core and uncore CPU power at one core count)
        varied = bool(knobs_moved(sp.modes[rows]).all())
        usable = (
            not opts.power_log
            and opts.power_ref
            and len(rows) >= opts.min_physical_power
            and (varied or not opts.physical_power_varied)
        )
        if opts.power_model == "physical" and usable:
            fit = fit_physical_power
        elif opts.power_model == "auto" and usable:

            def at(head: Head, m: np.ndarray) -> np.ndarray:
                r = rows[m]
                return head.apply(e.power_y[r], e.power_h[r], sp.modes[r], t_at(r))

            scores = [
                _block_error(f, at, sp.modes[rows], target, opts.min_power_block)
                for f in (fit_power, fit_physical_power)
            ]

            def blended(share: float) -> Any:
                def fit(m: np.ndarray) -> tuple[Head, float | None, np.ndarray]:
                    r_head, r_lam, r_loo = fit_power(m)
                    p_head, _, p_loo = fit_physical_power(m)
                    return (
                        blend_power_heads(r_head, p_head, share),
                        r_lam,
                        (1.0 - share) * r_loo + share * p_loo,
                    )

                return fit

            ratio = stray_ratio(fit_power, fit_physical_power, len(rows))
            if ratio > opts.power_domain_ratio > 0:
                strayed = ratio
                scores[1] = np.inf
            alpha = blend_weight(scores, opts.power_blend)
            if alpha is not None:
                fit = blended(alpha)
            elif scores[1] < scores[0]:
                fit = fit_physical_power
            share = blend_weight(scores, opts.overall_blend)
            if alpha is None and share is not None:
                # fitted on demand: a refit after the power floors drops this one unused
                def fit_overall() -> tuple[float, tuple]:
                    return share, _trimmed(blended(share), len(rows), p_floor, opts)

                overall = fit_overall

        trimmed = _trimmed(fit, len(rows), p_floor, opts)
        return rows, target, trimmed, alpha, overall, strayed

    def stray_ratio(ridge_fit: Any, physical_fit: Any, n: int) -> float:
        """How many times the ridge head's prediction the physical power head, fitted to
        all `n` power samples, predicts at its worst mode of the domain; 0 without a domain
        or the check, inf where a prediction is not a positive number."""
        if domain is None or opts.power_domain_ratio <= 0 or len(domain[0]) == 0:
            return 0.0
        modes, d = domain
        t_dom = time_head.apply(d.time_y, d.time_h, modes) if opts.power_per_step else None
        every = np.ones(n, dtype=bool)
        heads = (ridge_fit(every)[0], physical_fit(every)[0])
        ridge_w, phys_w = (h.apply(d.power_y, d.power_h, modes, t_dom) for h in heads)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = phys_w / ridge_w
        if not np.all(np.isfinite(ratio) & (ratio > 0)):
            return np.inf
        return float(ratio.max())

    pi, p_target, (power_head, lam_p, loo_p, keep_p), blend, overall, strayed = fit_power_head(s)
    # Only the power head sees the floors (an aborted window has no time): refit it alone.
    lifted = with_power_floors(s, power_head.apply(e.power_y, e.power_h, s.modes, t_fit))
    if lifted is not s:
        s = lifted
        pi, p_target, (power_head, lam_p, loo_p, keep_p), blend, overall, strayed = fit_power_head(
            s
        )
    stats = FitStats(
        n_time=int(keep_t.sum()),
        n_power=int(keep_p.sum()),
        lambda_time=lam_t,
        lambda_power=lam_p,
        time_outliers=ti[~keep_t].tolist(),
        power_outliers=pi[~keep_p].tolist(),
        interval_growth=INTERVAL_GROWTH,
        interval_growth_power=INTERVAL_GROWTH_POWER,
        interval_extrapolation=tuple(INTERVAL_EXTRAPOLATION),
        time_model="physical" if time_head.ref_transform == "physical" else "reference",
    )
    if len(loo_t):
        stats.time_loo_mape = float(np.mean(np.abs(np.expm1(-loo_t))) * 100)
        d_t = loo_distances(log_coords(s.modes[ti[keep_t]]))
        stats.time_halfwidth = conformal_halfwidth(loo_t)
        stats.time_reach = _reach(d_t)

    def loo_power(loo: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(leave-one-out predictions, measured powers) of a power fit's kept samples."""
        pk = p_target[keep]
        return (np.exp(pk - loo) if opts.power_log else pk - loo), s.power_w[pi[keep]]

    def rel_halfwidth(pred: np.ndarray, true_p: np.ndarray) -> float | None:
        return conformal_halfwidth(np.log(true_p / np.maximum(pred, 1e-3)))

    if len(loo_p):
        pred, true_p = loo_power(loo_p, keep_p)
        stats.power_loo_mape = _mape(pred, true_p)
        stats.power_halfwidth_w = conformal_halfwidth(true_p - pred)
        d_p = loo_distances(log_coords(s.modes[pi[keep_p]]))
        stats.power_halfwidth_rel = rel_halfwidth(pred, true_p)
        stats.power_reach = _reach(d_p)
    overall_head = None
    if overall is not None:
        share, (overall_head, _, loo_o, keep_o) = overall()
        if len(loo_o):
            stats.power_overall_halfwidth_rel = rel_halfwidth(*loo_power(loo_o, keep_o))
        stats.extra["power_overall_blend"] = round(share, 4)
    if time_head.bottleneck:
        stats.extra["time_form"] = (
            "memory-side" if physical.side_count(time_head.phys_groups) == 3 else "bottleneck"
        )
    if blend is not None:
        stats.extra["power_form"] = "blend"
        stats.extra["power_blend"] = round(blend, 4)
    elif power_head.ref_transform == "physical-power":
        stats.extra["power_form"] = "physical"
    if strayed is not None:
        stats.extra["power_physical_strayed"] = round(strayed, 2)
    floors = int(np.sum(np.isfinite(s.power_min_w) & s.power_ok))
    if floors:
        stats.extra["power_floors"] = floors
    return time_head, power_head, stats, s, overall_head


def with_power_floors(s: Samples, predicted_w: np.ndarray) -> Samples:
    """`s` with the power lower bounds the fit under-predicts taken as measured powers
    (else `s` itself). A mode measured well over the budget is cut short and only bounds
    its power from below; left out of the fit, the power model never hears that it was
    wrong where it was most wrong (Orin Nano, ResNet-18 training budgets 9-12-16-20 W in
    turn: a model fitted on 9 W samples put 2 cores at 1 GHz 6 W low, and a budget
    change's four picks all landed over the budget). A bound the fit already respects
    stays out: it says nothing the fit does not know."""
    short = ~s.power_ok & np.isfinite(s.power_min_w) & (s.power_min_w > predicted_w)
    if not short.any():
        return s
    p = np.where(short, s.power_min_w, s.power_w)
    return Samples(s.modes, s.time_ms, p, s.power_min_w)


def fit_ridge(
    samples: Samples | tuple | Mapping[PowerMode, Measurement],
    reference: ReferenceModel,
    options: RidgeOptions | None = None,
    domain: np.ndarray | None = None,
) -> FittedPredictor:
    """Closed-form refit of both last layers; see the module docstring. `domain`: the
    modes the fit will be asked about (the board's mode space), where given: the power
    heads are checked over them (RidgeOptions.power_domain_ratio)."""
    t0 = time.perf_counter()
    s = Samples.coerce(samples)
    if len(s) == 0:
        raise ValueError("cannot fit a predictor without samples")
    embedded = None
    if domain is not None:
        modes = validate_modes(domain)
        embedded = (modes, reference.embed_domain(modes))
    time_head, power_head, stats, s, overall = fit_heads(
        reference.embed(s.modes), s, reference.meta, options, embedded
    )
    tm, pm = reference.mlps()
    meta = {"method": "ridge", "reference": reference.model_id}
    model = fitted_model(tm, pm, time_head, power_head, meta, overall)
    heads = (time_head, power_head) + (() if overall is None else (overall,))
    fp = FittedPredictor(model.SerializeToString(), "ridge", stats, s, reference.model_id, heads)
    _in_sample(fp, s)
    stats.seconds = time.perf_counter() - t0
    return fp


class WorkerUnavailable(RuntimeError):
    """The torch fine-tuning worker could not run; the message says why."""


def _package_root() -> Path:
    return Path(__file__).resolve().parents[2]


def run_finetune_worker(
    samples: Samples,
    reference: ReferenceModel,
    python: str = "",
    options: dict[str, Any] | None = None,
    timeout_s: float = WORKER_TIMEOUT_S,
) -> FittedPredictor:
    """Fine-tune in a subprocess of `python` (empty: this interpreter). Raises
    WorkerUnavailable with the reason when it cannot (no torch, crash, timeout)."""
    t0 = time.perf_counter()
    exe = python or sys.executable
    with tempfile.TemporaryDirectory(prefix="powerd-fit-") as tmp:
        inp = Path(tmp) / "in.npz"
        out = Path(tmp) / "out"
        np.savez(
            inp,
            modes=samples.modes,
            time_ms=samples.time_ms,
            power_w=samples.power_w,
            model_dir=np.array(str(reference.model_dir)),
            options=np.array(json.dumps(options or {})),
        )
        env = dict(os.environ)
        # Run by path, not with -m: then the worker checks for torch before anything imports
        # the powerd package (whose client needs pyzmq), so a missing torch is reported as
        # such. Its later imports must find *this* powerd, whatever that interpreter has.
        env["PYTHONPATH"] = os.pathsep.join(
            [str(_package_root())] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        try:
            proc = subprocess.run(
                [exe, str(Path(__file__).with_name("finetune_worker.py")), str(inp), str(out)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env=env,
                cwd=tmp,
            )
        except FileNotFoundError:
            raise WorkerUnavailable(f"fit interpreter {exe!r} not found") from None
        except subprocess.TimeoutExpired:
            raise WorkerUnavailable(
                f"fine-tuning worker timed out after {timeout_s:.0f} s"
            ) from None
        except OSError as e:
            raise WorkerUnavailable(f"cannot run fit interpreter {exe!r}: {e}") from None
        if proc.returncode == 3:
            raise WorkerUnavailable(f"torch not importable by {exe}")
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise WorkerUnavailable(f"fine-tuning worker failed (exit {proc.returncode}): {tail}")
        try:
            onnx_bytes = (out / "predictor.onnx").read_bytes()
            wstats = json.loads((out / "worker.json").read_text())
        except (OSError, ValueError) as e:
            raise WorkerUnavailable(f"fine-tuning worker wrote no usable output: {e}") from e
    stats = FitStats(
        n_time=int(samples.time_ok.sum()),
        n_power=int(samples.power_ok.sum()),
        extra={"worker": wstats, "python": exe},
    )
    fp = FittedPredictor(onnx_bytes, "torch-finetune", stats, samples, reference.model_id)
    _in_sample(fp, samples)
    stats.seconds = time.perf_counter() - t0
    return fp


def fit_workload(
    samples: Samples | tuple | Mapping[PowerMode, Measurement],
    reference: ReferenceModel,
    python: str = "",
    method: str = DEFAULT_METHOD,
    *,
    ridge_options: RidgeOptions | None = None,
    worker_options: dict[str, Any] | None = None,
    timeout_s: float = WORKER_TIMEOUT_S,
    domain: np.ndarray | None = None,
) -> FittedPredictor:
    """Fit a workload's predictor: what the daemon calls (off its event loop).

    The ridge refit always runs first (milliseconds): it is the fallback, and its outlier
    screen decides which samples the torch worker may train on. ``method="torch-finetune"``
    then runs the worker with `python` (config ``[fit] python``; "" = this interpreter).
    The ridge fit is returned instead when fewer than MIN_TORCH_SAMPLES samples are usable,
    when that interpreter lacks torch, or when the worker fails or times out: ``fp.method``
    says what ran and ``fp.stats.fallback_reason`` why not torch. `domain`: the board's
    mode space, as fit_ridge takes it.
    """
    if method not in METHODS:
        raise ValueError(f"unknown fit method {method!r}; expected one of {METHODS}")
    s = Samples.coerce(samples)
    if len(s) == 0:
        raise ValueError("cannot fit a predictor without samples")
    ridge = fit_ridge(s, reference, ridge_options, domain)
    if method == "ridge":
        return ridge
    s = ridge.samples  # with the power floors the ridge took as measured
    if min(ridge.stats.n_time, ridge.stats.n_power) < MIN_TORCH_SAMPLES:
        ridge.stats.fallback_reason = (
            f"{min(ridge.stats.n_time, ridge.stats.n_power)} usable samples, "
            f"fine-tuning needs {MIN_TORCH_SAMPLES}"
        )
        return ridge
    t, p = s.time_ms.copy(), s.power_w.copy()
    t[ridge.stats.time_outliers] = np.nan
    p[ridge.stats.power_outliers] = np.nan
    try:
        fp = run_finetune_worker(
            Samples(s.modes, t, p), reference, python, worker_options, timeout_s
        )
    except WorkerUnavailable as e:
        ridge.stats = replace(ridge.stats, fallback_reason=str(e))
        return ridge
    # Keep the caller's samples (outliers included) with the fit, and say which were left out.
    fp.samples = s
    fp.stats.time_outliers = list(ridge.stats.time_outliers)
    fp.stats.power_outliers = list(ridge.stats.power_outliers)
    fp.stats.time_halfwidth = ridge.stats.time_halfwidth
    fp.stats.power_halfwidth_w = ridge.stats.power_halfwidth_w
    fp.stats.power_halfwidth_rel = ridge.stats.power_halfwidth_rel
    fp.stats.interval_growth = ridge.stats.interval_growth
    fp.stats.interval_growth_power = ridge.stats.interval_growth_power
    fp.stats.extra["ridge"] = {
        "time_loo_mape": ridge.stats.time_loo_mape,
        "power_loo_mape": ridge.stats.power_loo_mape,
    }
    _in_sample(fp, s)
    return fp
