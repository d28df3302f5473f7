"""Persistent state under [state] dir: measured samples and fitted models per workload.

Layout: <dir>/workloads/<board key>/<workload dir>/{samples.json, decisions.json,
inference.json, model/...}. Every write goes to a temporary file that is fsynced and
renamed, so a crash never leaves half a file. A corrupt file is logged and ignored (the
workload is profiled again), never fatal.

The workload directory (workload_dirname) is the workload name itself when the name is
file-system safe and short, and otherwise a readable slug of it plus a hash of the exact
name, so two names never share a directory. Every file records the workload name it was
written for, and a file recorded for another name is ignored: earlier versions stored
"bert/squad" and "bert squad" (and names differing after 120 characters) in one directory.
Such a name still finds what an earlier version stored for it (in the directory named by
its plain slug) as long as the files there are recorded for it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from powerd.fsutil import atomic_write_text
from powerd.modes import PowerMode
from powerd.optimize.base import Measurement

log = logging.getLogger("powerd.store")

SCHEMA_VERSION = 1

SAMPLES = "samples.json"
DECISIONS = "decisions.json"
MODEL = "model"

HASH_CHARS = 16  # hex digits of the sha256 of the name in a hashed directory name
_SLUG_PART = 100  # characters of the slug kept in front of the hash
_HASHED = re.compile(rf"-[0-9a-f]{{{HASH_CHARS}}}\Z")


def slug(name: str) -> str:
    """A file-system safe, still readable, name for a workload or board (not one to one:
    a workload's directory is workload_dirname)."""
    s = re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("._")
    return s[:120] or "unnamed"


def workload_dirname(name: str) -> str:
    """The directory of workload `name`: one to one (two names never share a directory).

    A name that is its own slug (safe characters only, at most 120 of them) keeps its name,
    as earlier versions stored it, unless it ends like a hashed directory ("-" and 16
    lowercase hex digits); every other name gets its slug, shortened, plus "-" and the
    first 16 hex digits of the sha256 of the exact name."""
    s = slug(name)
    if s == name and not _HASHED.search(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{s[:_SLUG_PART]}-{digest[:HASH_CHARS]}"


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
    # absent from files of releases before 2026-11-28: read as unknown
    power_se_w: float | None = None


class _SamplesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: int
    board: str
    workload: str
    samples: list[_SampleRecord]


class Store:
    def __init__(self, state_dir: str | os.PathLike[str]):
        self.dir = Path(state_dir)
        # path -> ((mtime_ns, size, inode), recorded workload name or None)
        self._names: dict[Path, tuple[tuple[int, int, int], str | None]] = {}

    def board_dir(self, board_key: str) -> Path:
        return self.dir / "workloads" / slug(board_key)

    def workload_dir(self, board_key: str, workload: str) -> Path:
        return self.board_dir(board_key) / workload_dirname(workload)

    # -- which file is a workload's --------------------------------------------------------
    def find(self, board_key: str, workload: str, filename: str) -> Path | None:
        """`filename` of `workload`: in its directory, or else in the directory an earlier
        version stored it in (its plain slug) if that differs."""
        path = self.workload_dir(board_key, workload) / filename
        if path.exists():
            return path
        legacy = self.board_dir(board_key) / slug(workload) / filename
        if legacy.parent != path.parent and legacy.exists():
            return legacy
        return None

    def _owned(self, path: Path, workload: str, recorded: Any) -> bool:
        """Whether `path`, recorded for `recorded` (None: written before files recorded
        their workload), may be read as `workload`'s; logs why not."""
        if recorded is not None:
            if recorded == workload:
                return True
            log.warning(
                "ignoring %s: it holds workload %r, not %r (another workload's data)",
                path,
                recorded,
                workload,
            )
            return False
        owner = None if path.name == SAMPLES else self.recorded_name(path.parent / SAMPLES)
        if owner is not None and owner != workload:
            log.warning(
                "ignoring %s: its directory holds workload %r, not %r (another workload's data)",
                path,
                owner,
                workload,
            )
            return False
        if owner is None and path.parent.name != workload_dirname(workload):
            # a file of an earlier version in a directory several names shared, and nothing
            # there says whose it is
            log.warning("ignoring %s: not recorded as workload %r's", path, workload)
            return False
        return True

    def recorded_name(self, path: Path) -> str | None:
        """The workload name `path` (a JSON file of a workload directory) was written for;
        None if it records none, or cannot be read."""
        try:
            st = path.stat()
        except OSError:
            return None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        known = self._names.get(path)
        if known is not None and known[0] == key:
            return known[1]
        try:
            obj = json.loads(path.read_bytes())
        except (OSError, ValueError):
            obj = None
        name = obj.get("workload") if isinstance(obj, dict) else None
        name = name if isinstance(name, str) else None
        self._names[path] = (key, name)
        return name

    def named_files(self, board_key: str, filename: str) -> dict[str, Path]:
        """Stored workloads that have `filename`: their real names (as their files record
        them), each with the file that load_samples / load_workload_json reads for it."""
        base = self.board_dir(board_key)
        if not base.is_dir():
            return {}
        out: dict[str, Path] = {}
        for d in sorted(base.iterdir()):
            path = d / filename
            if not path.is_file():
                continue
            name = self.recorded_name(path)
            if name is None and filename != SAMPLES:
                name = self.recorded_name(d / SAMPLES)
            if name is None and workload_dirname(d.name) == d.name:
                name = d.name  # an earlier version's file, in the directory of a safe name
            if name is None or name in out:
                continue
            found = self.find(board_key, name, filename)
            if found is not None:
                out[name] = found
        return dict(sorted(out.items()))

    def workloads(self, board_key: str) -> list[str]:
        """The names of the workloads with stored samples."""
        return list(self.named_files(board_key, SAMPLES))

    # -- samples -------------------------------------------------------------------------
    def load_samples(self, board_key: str, workload: str) -> dict[PowerMode, Measurement]:
        path = self.find(board_key, workload, SAMPLES)
        if path is None:
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
        if not self._owned(path, workload, data.workload):
            return {}
        out = {}
        for r in data.samples:
            mode = PowerMode(r.cores, r.cpu_khz, r.gpu_hz, r.emc_hz)
            t = math.nan if r.time_ms is None else r.time_ms
            out[mode] = Measurement(
                mode, t, r.power_w, r.steps, r.aborted_over_budget, r.power_se_w
            )
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
                power_se_w=m.power_se_w,
            )
            for m in samples.values()
            if math.isfinite(m.power_w)  # switch failures are not measurements
        ]
        f = _SamplesFile(
            schema_version=SCHEMA_VERSION, board=board_key, workload=workload, samples=records
        )
        d = self.workload_dir(board_key, workload)
        self._claim(d, workload)
        atomic_write_text(d / SAMPLES, f.model_dump_json(indent=1))

    def _claim(self, d: Path, workload: str) -> None:
        """Before `workload`'s samples replace another workload's in `d` (a directory an
        earlier version shared between names): record the files there that record no name
        as that other workload's, as they were read until now, and drop the model fitted to
        its samples, so that neither is ever read as `workload`'s."""
        owner = self.recorded_name(d / SAMPLES)
        if owner is None or owner == workload:
            return
        for path in sorted(d.glob("*.json")):
            obj = None if path.name == SAMPLES else self.load_json(path)
            if obj is not None and "workload" not in obj:
                self.save_json(path, {**obj, "workload": owner})
        if (d / MODEL).exists():
            log.warning(
                "%s: removing the model fitted to workload %r, whose samples %r's replace",
                d,
                owner,
                workload,
            )
            shutil.rmtree(d / MODEL, ignore_errors=True)

    # -- decisions: budget -> committed mode -------------------------------------------------
    def load_decisions(self, board_key: str, workload: str) -> dict[float, PowerMode]:
        obj = self.load_workload_json(board_key, workload, DECISIONS) or {}
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
        self.save_workload_json(board_key, workload, DECISIONS, obj)

    # -- a workload's JSON documents (decisions, inference pairs) ---------------------------
    def load_workload_json(
        self, board_key: str, workload: str, filename: str
    ) -> dict[str, Any] | None:
        """`filename` of `workload`'s directory (see find), or None if there is none, it
        is corrupt, or it is recorded for another workload."""
        path = self.find(board_key, workload, filename)
        if path is None:
            return None
        obj = self.load_json(path)
        if obj is None or not self._owned(path, workload, obj.get("workload")):
            return None
        return obj

    def save_workload_json(
        self, board_key: str, workload: str, filename: str, obj: dict[str, Any]
    ) -> None:
        """Write `obj` as `filename` of `workload`'s directory, recording the name."""
        path = self.workload_dir(board_key, workload) / filename
        self.save_json(path, {**obj, "workload": workload})

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
