"""Persistent state under [state] dir: measured samples and fitted models per workload.

Layout: <dir>/workloads/<board key>/<workload>/{samples.json, model/...}. Every write goes
to a temporary file that is fsynced and renamed, so a crash never leaves half a file.
A corrupt file is logged and ignored (the workload is profiled again), never fatal.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from powerd.fsutil import atomic_write_text
from powerd.modes import PowerMode
from powerd.optimize.base import Measurement

log = logging.getLogger("powerd.store")

SCHEMA_VERSION = 1


def slug(name: str) -> str:
    """A file-system safe, still readable, name for a workload or board."""
    s = re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("._")
    return s[:120] or "unnamed"


class _SampleRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cores: int
    cpu_khz: int
    gpu_hz: int
    emc_hz: int
    time_ms: float | None
    power_w: float
    steps: int = 0
    aborted_over_budget: bool = False


class _SamplesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int
    board: str
    workload: str
    samples: list[_SampleRecord]


class Store:
    def __init__(self, state_dir: str | os.PathLike[str]):
        self.dir = Path(state_dir)

    def workload_dir(self, board_key: str, workload: str) -> Path:
        return self.dir / "workloads" / slug(board_key) / slug(workload)

    # -- samples -------------------------------------------------------------------------
    def load_samples(self, board_key: str, workload: str) -> dict[PowerMode, Measurement]:
        path = self.workload_dir(board_key, workload) / "samples.json"
        if not path.exists():
            return {}
        try:
            data = _SamplesFile.model_validate_json(path.read_bytes())
            if data.schema_version != SCHEMA_VERSION:
                raise ValueError(f"schema version {data.schema_version}")
        except (OSError, ValueError, ValidationError) as exc:
            log.error(
                "ignoring corrupt samples file %s (%s); the workload will be profiled again",
                path,
                str(exc).splitlines()[0],
            )
            return {}
        out = {}
        for r in data.samples:
            mode = PowerMode(r.cores, r.cpu_khz, r.gpu_hz, r.emc_hz)
            t = math.nan if r.time_ms is None else r.time_ms
            out[mode] = Measurement(mode, t, r.power_w, r.steps, r.aborted_over_budget)
        return out

    def save_samples(
        self, board_key: str, workload: str, samples: dict[PowerMode, Measurement]
    ) -> None:
        records = [
            _SampleRecord(
                **m.mode.as_dict(),
                time_ms=None if math.isnan(m.time_ms) else m.time_ms,
                power_w=m.power_w,
                steps=m.steps,
                aborted_over_budget=m.aborted_over_budget,
            )
            for m in samples.values()
            if math.isfinite(m.power_w)  # switch failures are not measurements
        ]
        f = _SamplesFile(
            schema_version=SCHEMA_VERSION, board=board_key, workload=workload, samples=records
        )
        atomic_write_text(
            self.workload_dir(board_key, workload) / "samples.json", f.model_dump_json(indent=1)
        )

    # -- decisions: budget -> committed mode -------------------------------------------------
    def load_decisions(self, board_key: str, workload: str) -> dict[float, PowerMode]:
        obj = self.load_json(self.workload_dir(board_key, workload) / "decisions.json") or {}
        out = {}
        try:
            for b, mode in obj.get("decisions", {}).items():
                out[float(b)] = PowerMode.from_dict(mode)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            log.error("ignoring corrupt decisions of %s: %s", workload, exc)
            return {}
        return out

    def save_decisions(
        self, board_key: str, workload: str, decisions: dict[float, PowerMode]
    ) -> None:
        obj = {"decisions": {repr(b): m.as_dict() for b, m in sorted(decisions.items())}}
        self.save_json(self.workload_dir(board_key, workload) / "decisions.json", obj)

    # -- small JSON documents (fitted-model metadata, corrections, settings) ----------------
    def load_json(self, path: Path) -> dict[str, Any] | None:
        if not path.exists():
            return None
        try:
            obj = json.loads(path.read_text())
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            return obj
        except (OSError, ValueError) as exc:
            log.error("ignoring corrupt file %s (%s)", path, exc)
            return None

    def save_json(self, path: Path, obj: dict[str, Any]) -> None:
        atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True))

    def settings_path(self) -> Path:
        return self.dir / "settings.json"

    def workloads(self, board_key: str) -> list[str]:
        base = self.dir / "workloads" / slug(board_key)
        if not base.is_dir():
            return []
        return sorted(p.name for p in base.iterdir() if (p / "samples.json").exists())
