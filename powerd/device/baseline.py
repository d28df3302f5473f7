"""GEOPM-style save/restore of every knob file powerd may write.

Before the controller's first write, every value is saved to `<state_dir>/baseline.json`
(atomically). A saved baseline is never overwritten while it is pending restore: after a
crash it still holds the admin's state, while the hardware holds the dead daemon's mode.
`restore_baseline(root, state_dir)` needs nothing else (no daemon, no board detection), so
`powerd restore` works even when the daemon cannot start. The file is deleted only once
every saved value reads back.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerd.device import sysfs
from powerd.device.errors import DeviceError, SysfsReadError, SysfsWriteError
from powerd.device.order import limit_writes
from powerd.fsutil import atomic_write_text

log = logging.getLogger(__name__)

BASELINE_FILE = "baseline.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class LimitPair:
    """A [min, max] frequency window: one cpufreq policy or the GPU devfreq."""

    label: str
    min_path: Path
    max_path: Path


@dataclass(frozen=True)
class KnobSet:
    """Every file the controller may write, grouped by how it must be restored."""

    online: tuple[Path, ...]  # cpuN/online for N >= 1, ascending
    limits: tuple[LimitPair, ...]
    flags: tuple[Path, ...]  # plain values (GPU railgate_enable)
    emc_lock: Path | None = None
    emc_rate: Path | None = None

    def files(self) -> list[Path]:
        out = list(self.online)
        for pair in self.limits:
            out += [pair.min_path, pair.max_path]
        out += list(self.flags)
        out += [p for p in (self.emc_lock, self.emc_rate) if p is not None]
        return out


@dataclass
class RestoreReport:
    """What `restore` did. `ok`: nothing was pending, or every saved value reads back."""

    path: Path | None
    found: bool
    restored: bool = False
    written: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.found or self.restored

    def __str__(self) -> str:
        if not self.found:
            return "no saved baseline: nothing to restore"
        if self.restored:
            return f"baseline restored ({self.written} writes)"
        return "baseline NOT fully restored: " + "; ".join(self.problems)


def _read_or_none(path: Path) -> str | None:
    try:
        return sysfs.read_text(path)
    except SysfsReadError as exc:
        # An inactive cpufreq policy (all its cores offline) answers EBUSY on a real kernel.
        log.warning("baseline: cannot save %s: %s", path, exc)
        return None


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


class Baseline:
    """The saved admin state of one board. `state_dir=None` keeps it in memory only (tests,
    or a daemon run without a state directory: a crash then loses the baseline)."""

    def __init__(self, root: Path | str, state_dir: Path | str | None):
        self.dev = sysfs.DeviceRoot(root)
        self.path = Path(state_dir) / BASELINE_FILE if state_dir is not None else None
        self._memory: dict[str, Any] | None = None

    # -- saving --------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """A saved baseline exists that has not been restored yet."""
        if self.path is None:
            return self._memory is not None
        return self.path.exists()

    def save(self, knobs: KnobSet, board_key: str = "") -> bool:
        """Save every knob value unless a baseline is already pending. True if it saved now."""
        if self.pending:
            log.info("baseline pending restore at %s: kept, not overwritten", self.path)
            return False
        rel = self.dev.rel
        data: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "board": board_key,
            "saved_at": time.time(),
            "pid": os.getpid(),
            "online": [{"path": rel(p), "value": _read_or_none(p)} for p in knobs.online],
            "limits": [
                {
                    "label": pair.label,
                    "min_path": rel(pair.min_path),
                    "max_path": rel(pair.max_path),
                    "min": _int_or_none(_read_or_none(pair.min_path)),
                    "max": _int_or_none(_read_or_none(pair.max_path)),
                }
                for pair in knobs.limits
            ],
            "flags": [{"path": rel(p), "value": _read_or_none(p)} for p in knobs.flags],
            "emc": None,
        }
        if knobs.emc_lock is not None and knobs.emc_rate is not None:
            data["emc"] = {
                "lock_path": rel(knobs.emc_lock),
                "rate_path": rel(knobs.emc_rate),
                "locked": _int_or_none(_read_or_none(knobs.emc_lock)),
                "rate": _int_or_none(_read_or_none(knobs.emc_rate)),
            }
        if self.path is None:
            self._memory = data
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.path, json.dumps(data, indent=1, sort_keys=True))
        log.info("baseline saved (%d files) to %s", len(knobs.files()), self.path or "memory")
        return True

    def load(self) -> dict[str, Any] | None:
        if self.path is None:
            return self._memory
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DeviceError(f"saved baseline {self.path} is corrupt: {exc}") from None
        if not isinstance(data, dict) or not {"online", "limits", "flags"} <= data.keys():
            raise DeviceError(f"saved baseline {self.path} is corrupt: missing sections")
        if data.get("version") != FORMAT_VERSION:
            raise DeviceError(f"saved baseline {self.path}: unknown version {data.get('version')}")
        return dict(data)

    def discard(self) -> None:
        if self.path is None:
            self._memory = None
        else:
            self.path.unlink(missing_ok=True)

    # -- restoring -----------------------------------------------------------------------
    def restore(self, timeout_s: float = 1.0) -> RestoreReport:
        """Write the saved values back in a safe order, verify, then forget the baseline."""
        try:
            data = self.load()
        except DeviceError as exc:
            return RestoreReport(self.path, found=True, problems=[str(exc)])
        if data is None:
            return RestoreReport(self.path, found=False)
        report = RestoreReport(self.path, found=True)
        try:
            _Restorer(self.dev, data, report).run(timeout_s)
        except (KeyError, TypeError, ValueError) as exc:  # a hand-edited or damaged file
            report.problems.append(f"saved baseline {self.path} is malformed: {exc!r}")
            report.restored = False
        if report.restored:
            self.discard()
            log.info("%s", report)
        else:
            log.error("%s (baseline kept at %s)", report, self.path or "memory")
        return report


class _Restorer:
    """One restore pass. Errors are collected, never raised: restore does all it can."""

    def __init__(self, dev: sysfs.DeviceRoot, data: dict[str, Any], report: RestoreReport):
        self.dev = dev
        self.data = data
        self.report = report

    def _write(self, rel: str, value: object) -> None:
        try:
            sysfs.write_value(self.dev.path(rel), str(value))
            self.report.written += 1
        except SysfsWriteError as exc:
            self.report.problems.append(str(exc))

    def _expected(self, online_phase: bool) -> list[tuple[str, str]]:
        """(file, value) pairs that must read back. Limits are checked before the saved
        offline cores go offline again: an inactive policy cannot be read on a real kernel."""
        out: list[tuple[str, str]] = []
        if online_phase:
            for item in self.data["online"]:
                if item["value"] is not None:
                    out.append((item["path"], item["value"]))
            return out
        for lim in self.data["limits"]:
            if lim["min"] is not None and lim["max"] is not None:
                out += [(lim["min_path"], str(lim["min"])), (lim["max_path"], str(lim["max"]))]
        for item in self.data["flags"]:
            if item["value"] is not None:
                out.append((item["path"], item["value"]))
        emc = self.data.get("emc")
        if emc and emc["locked"] is not None:
            out.append((emc["lock_path"], str(emc["locked"])))
            if emc["locked"] and emc["rate"] is not None:
                out.append((emc["rate_path"], str(emc["rate"])))
        return out

    def _mismatches(self, expected: list[tuple[str, str]]) -> list[str]:
        bad = []
        for rel, want in expected:
            try:
                got = sysfs.read_text(self.dev.path(rel))
            except SysfsReadError as exc:
                bad.append(str(exc))
                continue
            if got != want:
                bad.append(f"{rel} reads {got!r}, saved {want!r}")
        return bad

    def _verify(self, expected: list[tuple[str, str]], timeout_s: float) -> list[str]:
        """Poll until every value reads back (a kernel may apply some asynchronously),
        then confirm once more after a short pause."""
        deadline = time.monotonic() + timeout_s
        while True:
            bad = self._mismatches(expected)
            if not bad:
                time.sleep(0.02)
                bad = self._mismatches(expected)
                if not bad:
                    return []
            if time.monotonic() >= deadline:
                return bad
            time.sleep(0.01)

    def run(self, timeout_s: float) -> None:
        data = self.data
        # 1. Every core online, so that every policy can be written.
        for item in data["online"]:
            self._write(item["path"], 1)
        # 2. Frequency windows back, never passing through min > max.
        for lim in data["limits"]:
            if lim["min"] is None or lim["max"] is None:
                self.report.problems.append(
                    f"{lim['label']}: limits were unreadable at save time; left as they are"
                )
                continue
            try:
                cur_min = sysfs.read_int(self.dev.path(lim["min_path"]))
                cur_max = sysfs.read_int(self.dev.path(lim["max_path"]))
                writes = limit_writes(cur_min, cur_max, lim["min"], lim["max"])
            except (SysfsReadError, ValueError):
                # Unknown current window: widen to the saved max first, then narrow.
                writes = [("max", lim["max"]), ("min", lim["min"]), ("max", lim["max"])]
            for which, value in writes:
                self._write(lim[f"{which}_path"], value)
        for item in data["flags"]:
            if item["value"] is not None:
                self._write(item["path"], item["value"])
        # 3. EMC: a locked baseline needs the lock before its rate; an unlocked one only
        # needs the lock released (DVFS then owns the rate).
        emc = data.get("emc")
        if emc and emc["locked"] is not None:
            if emc["locked"]:
                self._write(emc["lock_path"], 1)
                if emc["rate"] is not None:
                    self._write(emc["rate_path"], emc["rate"])
            else:
                self._write(emc["lock_path"], 0)
        mismatches = self._verify(self._expected(online_phase=False), timeout_s)
        # 4. Cores that were offline go offline again (highest first, like nvpmodel).
        for item in reversed(data["online"]):
            if item["value"] == "0":
                self._write(item["path"], 0)
        mismatches += self._verify(self._expected(online_phase=True), timeout_s)
        self.report.problems += mismatches
        unreadable_only = all("unreadable at save time" in p for p in self.report.problems)
        self.report.restored = unreadable_only


def restore_baseline(
    root: Path | str, state_dir: Path | str, timeout_s: float = 1.0
) -> RestoreReport:
    """Put back the baseline saved under `state_dir`, with nothing but the root and the
    state directory (`powerd restore`, start-up after a crash)."""
    return Baseline(root, state_dir).restore(timeout_s)
