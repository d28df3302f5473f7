"""Transfer learning in the daemon: the bundled reference predictor, per-workload fits,
and their persistence. Fits run on the server's fit executor, never on its loop; torch
never runs in the daemon's process (fine-tuning, if chosen, runs in a worker process)."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import numpy as np

from powerd.config import Config
from powerd.modes import PowerMode
from powerd.optimize.base import Measurement, Predictor
from powerd.store import Store

log = logging.getLogger("powerd.fitting")


class Fitting:
    def __init__(self, cfg: Config, store: Store, board_key: str):
        self.cfg = cfg
        self.store = store
        self.board_key = board_key
        self._lock = threading.Lock()
        self._reference = None
        self._reference_error: str | None = None

    def reference(self) -> Predictor:
        """The bundled reference model, loaded once (raises if it cannot be loaded)."""
        with self._lock:
            if self._reference is None:
                if self._reference_error is not None:
                    raise RuntimeError(self._reference_error)
                from powerd.predictor.reference import ReferenceModel

                try:
                    self._reference = ReferenceModel.load()
                except Exception as exc:  # noqa: BLE001 - reported once, strategy falls back
                    self._reference_error = f"reference predictor unavailable: {exc}"
                    log.error("%s", self._reference_error)
                    raise RuntimeError(self._reference_error) from None
                log.info("reference predictor loaded from %s", self._reference.model_dir)
            return self._reference

    def model_dir(self, workload: str) -> Path:
        return self.store.workload_dir(self.board_key, workload) / "model"

    def fit(
        self,
        workload: str,
        samples: dict[PowerMode, Measurement],
        persist: bool,
        domain: np.ndarray | None = None,
    ) -> Predictor:
        """Fit `workload` to its samples (runs on the fit executor). `domain`: the board's
        modes, over which the fit checks how its power heads extrapolate."""
        from powerd.predictor.transfer import fit_workload

        fp = fit_workload(
            samples,
            self.reference(),
            python=self.cfg.fit.python,
            method=self.cfg.fit.method,
            domain=domain,
        )
        s = fp.stats
        strayed = s.extra.get("power_physical_strayed")
        log.info(
            "fitted %s on %d samples with %s in %.2f s (leave-one-out MAPE: time %s, power %s)%s%s",
            workload,
            len(samples),
            fp.method,
            s.seconds,
            _pct(s.time_loo_mape),
            _pct(s.power_loo_mape),
            f"; power terms left out: {strayed:g}x the rescaled reference at a mode"
            if strayed
            else "",
            f"; torch worker not used: {s.fallback_reason}" if s.fallback_reason else "",
        )
        if persist:
            try:
                fp.save(self.model_dir(workload))
            except OSError as exc:
                log.error("could not save the fitted model of %s: %s", workload, exc)
        return fp

    def load_fitted(self, workload: str) -> Predictor | None:
        d = self.model_dir(workload)
        if not (d / "fitted.json").exists():
            return None
        from powerd.predictor.transfer import FittedPredictor

        try:
            return FittedPredictor.load(d)
        except Exception as exc:  # noqa: BLE001 - garbage ONNX, missing keys, bad arrays...
            # Any failure to load is a corrupt model: left in place, every later register
            # of this workload would fail the same way.
            moved = self._set_aside(d)
            log.error(
                "corrupt fitted model of %s (%s: %s); %s; the workload will be profiled and "
                "fitted again",
                workload,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
                f"moved to {moved}" if moved else "could not be moved aside",
            )
            return None

    @staticmethod
    def _set_aside(d: Path) -> Path | None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = d.with_name(f"{d.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = d.with_name(f"{d.name}.corrupt-{stamp}-{n}")
        try:
            os.replace(d, target)
        except OSError as exc:
            log.error("cannot move %s aside: %s", d, exc)
            return None
        return target


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x != x else f"{x:.1f}%"
