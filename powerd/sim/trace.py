"""Per-power-mode measurement traces (the CSV format of the PowerTrain corpus)."""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from powerd.modes import FIELDS, PowerMode

TRACE_DIR = Path(__file__).parent / "traces"
REFERENCE_CORPUS = (
    Path(__file__).resolve().parents[2]
    / "models"
    / "corpus"
    / ("orin_agx_resnet18_imagenet_train.csv")
)

# The trace an emulated board replays when none is named: one of its own.
DEFAULT_TRACES = {
    "orin-agx": TRACE_DIR / "orin_agx_mobilenetv3_gld23k_train.csv",
    "orin-nano": TRACE_DIR / "orin_nano_resnet18_imagenet_train.csv",
}


@dataclass(frozen=True)
class TraceRow:
    mode: PowerMode
    time_ms: float
    power_w: float


class Trace:
    """One workload's measured (step time, power) per mode; training or one inference batch size."""

    def __init__(self, rows: list[TraceRow], name: str = "trace"):
        if not rows:
            raise ValueError(f"{name}: empty trace")
        self.name = name
        self.rows = rows
        self._by_mode = {r.mode: r for r in rows}
        self.modes_array = np.array([r.mode.as_tuple() for r in rows], dtype=np.int64)
        self.time_ms = np.array([r.time_ms for r in rows])
        self.power_w = np.array([r.power_w for r in rows])

    @classmethod
    def load(cls, path: str | Path, batch_size: int | None = None) -> Trace:
        """Load a CSV. Inference traces hold several batch sizes: pick one (default: smallest)."""
        path = Path(path)
        with path.open(newline="") as f:
            raw = list(csv.DictReader(f))
        if not raw:
            raise ValueError(f"{path}: no rows")
        inference = "batch_ms" in raw[0]
        if inference:
            sizes = sorted({int(r["batch_size"]) for r in raw})
            bs = sizes[0] if batch_size is None else batch_size
            if bs not in sizes:
                raise ValueError(f"{path}: batch size {bs} not in {sizes}")
            raw = [r for r in raw if int(r["batch_size"]) == bs]
        tkey = "batch_ms" if inference else "minibatch_ms"
        rows = [
            TraceRow(PowerMode(*(int(r[k]) for k in FIELDS)), float(r[tkey]), float(r["power_w"]))
            for r in raw
        ]
        return cls(rows, name=path.stem)

    def __len__(self) -> int:
        return len(self.rows)

    def axis(self, field: str) -> list[int]:
        """Distinct values of one mode field, ascending."""
        return sorted({getattr(r.mode, field) for r in self.rows})

    def exact(self, mode: PowerMode) -> TraceRow | None:
        return self._by_mode.get(mode)

    def lookup(self, mode: PowerMode) -> TraceRow:
        """The row of `mode`, or of the nearest traced mode (per-axis relative distance)."""
        row = self._by_mode.get(mode)
        if row is not None:
            return row
        target = np.array(mode.as_tuple(), dtype=float)
        rel = np.abs(np.log(self.modes_array.astype(float) / np.maximum(target, 1.0)))
        return self.rows[int(np.argmin(rel.sum(axis=1)))]

    def best_under(self, budget_w: float) -> TraceRow | None:
        """The fastest traced mode whose power is within the budget (brute force)."""
        ok = np.flatnonzero(self.power_w <= budget_w)
        if ok.size == 0:
            return None
        return self.rows[int(ok[np.argmin(self.time_ms[ok])])]


def load_board_trace(
    board: str, path: str | Path | None, batch_size: int | None, prog: str
) -> Trace | None:
    """The trace to replay on `board` (`path`, else the board's default), or None after
    printing why it cannot be loaded, prefixed with `prog`: the command lines' shared
    first step."""
    trace_path = path or DEFAULT_TRACES[board]
    try:
        return Trace.load(trace_path, batch_size=batch_size)
    except (OSError, ValueError) as exc:
        print(f"{prog}cannot load trace {trace_path}: {exc}", file=sys.stderr)
        return None
