"""Stored inference pairs for a workload, as an earlier job would have left them."""

from __future__ import annotations

import json

from powerd.sim.harness import EmulatedBoard
from powerd.sim.trace import Trace
from powerd.store import Store


def seed_pairs(eb: EmulatedBoard, trace: Trace, name: str, n: int) -> None:
    """`n` pairs (b=4, 20 ms batches, the trace's first modes and their power) for `name`."""
    d = Store(eb.state_dir).workload_dir(eb.status()["board_key"], name)
    d.mkdir(parents=True, exist_ok=True)
    rows = [
        {**r.mode.as_dict(), "batch_size": 4, "batch_ms": 20.0, "power_w": r.power_w}
        for r in trace.rows[:n]
    ]
    (d / "inference.json").write_text(json.dumps({"format": 1, "pairs": rows}))
