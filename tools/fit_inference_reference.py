#!/usr/bin/env python3
"""Fit the inference prior (powerd.predictor.batch.InferenceReference) on one inference trace
and write models/inference_reference.json.

    tools/fit_inference_reference.py [--trace TRACE.csv] [--out FILE.json]

The default corpus is ResNet-18 inference on Orin AGX; MobileNet v3 inference is held out
for validation (tools/bench_inference.py --compare-priors).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from powerd.modes import FIELDS
from powerd.predictor.batch import REFERENCE_FILE, InferenceReference

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT / "powerd" / "sim" / "traces" / "orin_agx_resnet18_imagenet_infer.csv"


def load_rows(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    modes = np.array([[int(r[k]) for k in FIELDS] for r in rows], dtype=np.int64)
    b = np.array([int(r["batch_size"]) for r in rows], dtype=np.int64)
    t = np.array([float(r["batch_ms"]) for r in rows])
    p = np.array([float(r["power_w"]) for r in rows])
    return modes, b, t, p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--out", type=Path, default=ROOT / "models" / REFERENCE_FILE)
    args = ap.parse_args()
    modes, b, t, p = load_rows(args.trace)
    ref = InferenceReference.fit(modes, b, t, p, source=args.trace.name)
    pt, pp = ref.predict(modes, b)
    print(
        f"{args.trace.name}: {len(t)} rows, in-sample MAPE time "
        f"{np.mean(np.abs(pt / t - 1)) * 100:.1f}% power {np.mean(np.abs(pp / p - 1)) * 100:.1f}%"
    )
    ref.save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
