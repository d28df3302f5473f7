"""GEOPM-style save/restore of every knob file powerd may write.

Before the controller's first write, every value is saved to `<state_dir>/baseline.json`
(atomically). A saved baseline is never overwritten while it is pending restore: after a
crash it still holds the admin's state, while the hardware holds the dead daemon's mode.
`restore_baseline(root, state_dir)` needs nothing else (no daemon, no board detection), so
`powerd restore` works even when the daemon cannot start. The file is deleted only once
every saved value reads back.

A saved file that cannot be trusted (torn by a power cut, full disk, hand-edited) is moved
aside to `baseline.json.corrupt-<time>` and the board is returned to a known-good state
instead: the nvpmodel mode in force, else the hardware's own limits (KnownGood). Values a
save could not read (an offline cluster answers EBUSY) make a partial baseline: the restore
sets them from the known-good state and says so.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerd.device import nvpmodel, sysfs
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
    """What `restore` did. `ok`: nothing was pending, or every value it put back reads back.

    `source`: what the board was returned to ("saved baseline", or the known-good state
    used when there was none: "nvpmodel mode N (NAME)" / "hardware limits").
    `set_aside`: where a corrupt baseline file was moved. `partial`: values the saved
    baseline did not hold (unreadable at save time) and what was written instead."""

    path: Path | None
    found: bool
    restored: bool = False
    written: int = 0
    problems: list[str] = field(default_factory=list)
    source: str = "saved baseline"
    set_aside: Path | None = None
    partial: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.found or self.restored

    def __str__(self) -> str:
        if not self.found:
            return "no saved baseline: nothing to restore"
        what = (
            "baseline" if self.source == "saved baseline" else f"known-good state ({self.source})"
        )
        notes = []
        if self.set_aside is not None:
            notes.append(f"the corrupt saved baseline was moved to {self.set_aside}")
        if self.partial:
            notes.append("not put back as saved: " + "; ".join(self.partial))
        tail = "".join(f"; {n}" for n in notes)
        if self.restored:
            return f"{what} restored ({self.written} writes){tail}"
        return f"{what} NOT fully restored: " + "; ".join(self.problems) + tail


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


class KnownGood:
    """The state the board is returned to when the saved baseline cannot say: the nvpmodel
    mode in force (the admin's choice), else the hardware's own limits (cpuinfo range,
    devfreq available range), every core online, EMC back under DVFS, GPU railgating on
    (the boot default)."""

    def __init__(self, dev: sysfs.DeviceRoot):
        self.dev = dev
        self._values: dict[Path, int] | None = None
        self.active: nvpmodel.ActiveMode | None = None

    @property
    def values(self) -> dict[Path, int]:
        """The nvpmodel mode's file values, read on first use (a restore from a complete
        saved baseline never needs them)."""
        if self._values is None:
            conf = nvpmodel.read_conf(self.dev)
            self.active = nvpmodel.active_mode(self.dev, conf)
            self._values = {}
            if conf is not None and self.active is not None:
                self._values = nvpmodel.mode_file_values(self.dev, conf, self.active.id)
                if not self._values:
                    log.warning(
                        "%s is not described in %s: using the hardware limits",
                        self.active.describe(),
                        nvpmodel.CONF_FILE,
                    )
        return self._values

    @property
    def source(self) -> str:
        return self.active.describe() if self.values and self.active else "hardware limits"

    def _nvp(self, path: Path) -> int | None:
        try:
            return self.values.get(path.resolve())
        except OSError:
            return None

    @staticmethod
    def hardware_range(min_path: Path) -> tuple[int, int] | None:
        """cpufreq: cpuinfo_min/max_freq; devfreq: the ends of available_frequencies."""
        d = min_path.parent
        try:
            if (d / "cpuinfo_min_freq").exists():
                return sysfs.read_int(d / "cpuinfo_min_freq"), sysfs.read_int(
                    d / "cpuinfo_max_freq"
                )
            table = sysfs.read_int_list(d / "available_frequencies")
        except SysfsReadError:
            return None
        return (min(table), max(table)) if table else None

    def limits(self, min_path: Path, max_path: Path) -> tuple[int, int, str] | None:
        hw = self.hardware_range(min_path)
        if hw is None:
            return None
        lo, hi = hw
        want_min, want_max = self._nvp(min_path), self._nvp(max_path)
        # nvpmodel writes -1 for "no cap" and 0 for "no floor"; the kernel clamps into range.
        new_min = lo if want_min is None or want_min <= 0 else max(lo, min(hi, want_min))
        new_max = hi if want_max is None or want_max < 0 else max(lo, min(hi, want_max))
        if new_max < new_min:
            new_max = new_min
        source = self.source if (want_min, want_max) != (None, None) else "hardware limits"
        return new_min, new_max, source

    def online(self, path: Path) -> str:
        value = self._nvp(path)
        return "0" if value == 0 else "1"

    def state(self, knobs: KnobSet) -> dict[str, Any]:
        """A restore target in the saved-baseline format. Limits are filled in by the
        restorer once every core is online (an offline cluster's range cannot be read)."""
        rel = self.dev.rel
        return {
            "version": FORMAT_VERSION,
            "online": [{"path": rel(p), "value": self.online(p)} for p in knobs.online],
            "limits": [
                {
                    "label": pair.label,
                    "min_path": rel(pair.min_path),
                    "max_path": rel(pair.max_path),
                    "min": None,
                    "max": None,
                }
                for pair in knobs.limits
            ],
            "flags": [{"path": rel(p), "value": "1"} for p in knobs.flags],
            "emc": None
            if knobs.emc_lock is None or knobs.emc_rate is None
            else {
                "lock_path": rel(knobs.emc_lock),
                "rate_path": rel(knobs.emc_rate),
                "locked": 0,
                "rate": None,
            },
        }


def _discover_knobs(root: Path) -> KnobSet:
    # Late import: the controller imports this module. Only needed when there is no saved
    # baseline to say which files matter (a corrupt file), e.g. in `powerd restore`.
    from powerd.device.controller import Controller
    from powerd.device.detect import detect_board

    return Controller(detect_board(root)).knobs()


class Baseline:
    """The saved admin state of one board. `state_dir=None` keeps it in memory only (tests,
    or a daemon run without a state directory: a crash then loses the baseline).

    A corrupt saved file is never trusted: it is moved aside (named in the error), and the
    board is returned to the known-good state instead (KnownGood). Until that succeeds a
    restore stays pending, `problem` says why, and `retry` may be called again."""

    def __init__(
        self,
        root: Path | str,
        state_dir: Path | str | None,
        knobs: Callable[[], KnobSet] | None = None,
    ):
        self.dev = sysfs.DeviceRoot(root)
        self.path = Path(state_dir) / BASELINE_FILE if state_dir is not None else None
        self._memory: dict[str, Any] | None = None
        self._knobs = knobs
        self._known_good_pending = False  # the saved file was corrupt: KnownGood is the target
        self._validated = False  # the file on disk was saved or loaded by this process
        self.problem: str | None = None  # why the last restore failed (None: it did not)
        # of the baseline saved by this process: the nvpmodel mode then in force, and what
        # could not be read (a partial baseline)
        self.saved_nvpmodel: dict[str, Any] | None = None
        self.saved_unreadable: list[str] = []

    # -- saving --------------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """A restore is owed: a saved baseline exists (valid or not), or a return to the
        known-good state failed and must be retried."""
        if self._known_good_pending:
            return True
        if self.path is None:
            return self._memory is not None
        return self.path.exists()

    def needs_restore_before_save(self) -> bool:
        """True when the board must be put back before a new save can be trusted: the saved
        file is corrupt, or a return to the known-good state is still owed. Checks the file
        once per process, not on every switch."""
        if self._known_good_pending:
            return True
        if self.path is None or self._validated or not self.path.exists():
            return False
        try:
            self.load()
        except DeviceError:
            return True
        self._validated = True
        return False

    def save(self, knobs: KnobSet, board_key: str = "") -> bool:
        """Save every knob value unless a baseline is already pending. True if it saved now."""
        if self.pending:
            log.info("baseline pending restore at %s: kept, not overwritten", self.path)
            return False
        rel = self.dev.rel
        active = nvpmodel.active_mode(self.dev)
        data: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "board": board_key,
            "saved_at": time.time(),
            "pid": os.getpid(),
            "nvpmodel": active.as_dict() if active is not None else None,
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
            self._validated = True
        unreadable = unreadable_labels(data)
        self.saved_nvpmodel, self.saved_unreadable = data["nvpmodel"], unreadable
        where = self.path or "memory"
        mode = f", {active.describe()} in force" if active is not None else ", no nvpmodel"
        if unreadable:
            log.warning(
                "baseline saved to %s%s, PARTIAL: %s unreadable (cluster offline?); a restore "
                "sets them to the known-good state instead",
                where,
                mode,
                ", ".join(unreadable),
            )
        else:
            log.info("baseline saved (%d files) to %s%s", len(knobs.files()), where, mode)
        return True

    def load(self) -> dict[str, Any] | None:
        if self.path is None:
            return self._memory
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except PermissionError:
            raise  # not corrupt: the caller lacks the rights (not root)
        except (OSError, UnicodeDecodeError) as exc:
            raise DeviceError(f"saved baseline {self.path} is unreadable: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DeviceError(f"saved baseline {self.path} is corrupt: {exc}") from None
        if not isinstance(data, dict) or not {"online", "limits", "flags"} <= data.keys():
            raise DeviceError(f"saved baseline {self.path} is corrupt: missing sections")
        if data.get("version") != FORMAT_VERSION:
            raise DeviceError(
                f"saved baseline {self.path} is corrupt: unknown version {data.get('version')}"
            )
        bad = _malformed_entry(data)
        if bad:
            raise DeviceError(f"saved baseline {self.path} is corrupt: {bad}")
        return dict(data)

    def discard(self) -> None:
        self._validated = False
        self.saved_nvpmodel, self.saved_unreadable = None, []
        if self.path is None:
            self._memory = None
        else:
            self.path.unlink(missing_ok=True)

    def _set_aside(self) -> Path | None:
        """Move a corrupt file out of the way (kept for a post-mortem, never read again)."""
        assert self.path is not None
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 1
        while target.exists():
            n += 1
            target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{n}")
        try:
            os.replace(self.path, target)
        except OSError as exc:
            log.error("cannot move the corrupt baseline %s aside: %s", self.path, exc)
            return None
        return target

    # -- restoring -----------------------------------------------------------------------
    def restore(self, timeout_s: float = 1.0, skip: frozenset[str] = frozenset()) -> RestoreReport:
        """Write the saved values back in a safe order, verify, then forget the baseline. A
        corrupt saved file is moved aside and the board returned to the known-good state.

        `skip`: files (as on a real board) another tool has taken over; their values, and
        the other half of their [min, max] window or EMC pair, are left as they are."""
        set_aside: Path | None = None
        corrupt = ""
        try:
            data = self.load()
        except PermissionError as exc:
            report = RestoreReport(self.path, found=True)
            report.problems.append(f"cannot read the saved baseline: {exc} (run as root)")
            self.problem = str(report)
            return report
        except DeviceError as exc:
            corrupt = str(exc)
            set_aside = self._set_aside()
            log.error(
                "%s; %s; returning the board to a known-good state instead",
                corrupt,
                f"moved to {set_aside}" if set_aside else "left in place",
            )
            self._known_good_pending = True
            data = None
        if data is None and not self._known_good_pending:
            return RestoreReport(self.path, found=False)
        if data is None:
            report = self._restore_known_good(timeout_s)
            report.set_aside = set_aside
            if corrupt and set_aside is None:
                report.problems.append(f"{corrupt}, and it could not be moved aside")
                report.restored = False
            if report.restored:
                self._known_good_pending = False
        else:
            report = RestoreReport(self.path, found=True)
            if skip:
                data = _without(data, skip, report, self.dev)
            known_good = KnownGood(self.dev)
            try:
                _Restorer(self.dev, data, report, known_good).run(timeout_s)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                # well-formed JSON with damaged entries: the file is not to be trusted
                report.problems.append(f"saved baseline {self.path} is malformed: {exc!r}")
                report.restored = False
            if report.restored:
                self.discard()
        self.problem = None if report.restored else str(report)
        if report.restored:
            (log.warning if report.partial or report.set_aside else log.info)("%s", report)
        else:
            log.error("%s (a restore stays pending and is retried)", report)
        return report

    def _restore_known_good(self, timeout_s: float) -> RestoreReport:
        report = RestoreReport(self.path, found=True)
        try:
            knobs = self._knobs() if self._knobs is not None else _discover_knobs(self.dev.root)
        except (DeviceError, OSError) as exc:
            report.problems.append(f"cannot find the board's knob files: {exc}")
            return report
        known_good = KnownGood(self.dev)
        report.source = known_good.source
        _Restorer(self.dev, known_good.state(knobs), report, known_good).run(timeout_s)
        return report


def _without(
    data: dict[str, Any], skip: frozenset[str], report: RestoreReport, dev: sysfs.DeviceRoot
) -> dict[str, Any]:
    """The baseline without the files another tool took over. A [min, max] window of which
    the tool wrote one half keeps its other half: put back (it still holds powerd's pin,
    which would otherwise stay, and be saved as the next baseline), clamped so that the
    window stays valid around the tool's value."""
    out = dict(data)
    out["online"] = [i for i in data["online"] if i["path"] not in skip]
    out["flags"] = [i for i in data["flags"] if i["path"] not in skip]
    out["limits"] = []
    halves: list[tuple[str, int]] = []
    for lim in data["limits"]:
        taken = {lim["min_path"], lim["max_path"]} & skip
        if not taken:
            out["limits"].append(lim)
            continue
        if len(taken) == 2 or lim["min"] is None or lim["max"] is None:
            continue
        tool_half, own_half = ("min", "max") if lim["min_path"] in taken else ("max", "min")
        try:
            theirs = sysfs.read_int(dev.path(lim[f"{tool_half}_path"]))
        except (SysfsReadError, ValueError) as exc:
            report.problems.append(f"{lim['label']}: cannot read {exc}; its window left as is")
            continue
        value = max(lim["max"], theirs) if own_half == "max" else min(lim["min"], theirs)
        halves.append((lim[f"{own_half}_path"], value))
    out["halves"] = halves
    emc = data.get("emc")
    if emc and {emc["lock_path"], emc["rate_path"]} & skip:
        out["emc"] = None
    report.partial.append("left to the tool that changed them: " + ", ".join(sorted(skip)))
    return out


def _malformed_entry(data: dict[str, Any]) -> str:
    """What is wrong with a parsed baseline's entries ("" if nothing): a file that parses
    but would fail half-way through a restore is as corrupt as a torn one."""

    def opt(v: object, kind: type) -> bool:
        return v is None or (isinstance(v, kind) and not isinstance(v, bool))

    for section in ("online", "flags"):
        items = data[section]
        if not isinstance(items, list):
            return f"{section} is not a list"
        for item in items:
            if not (
                isinstance(item, dict)
                and isinstance(item.get("path"), str)
                and opt(item.get("value"), str)
            ):
                return f"bad {section} entry {item!r}"
    if not isinstance(data["limits"], list):
        return "limits is not a list"
    for lim in data["limits"]:
        if not (
            isinstance(lim, dict)
            and all(isinstance(lim.get(k), str) for k in ("label", "min_path", "max_path"))
            and opt(lim.get("min"), int)
            and opt(lim.get("max"), int)
        ):
            return f"bad limits entry {lim!r}"
    emc = data.get("emc")
    if emc is not None and not (
        isinstance(emc, dict)
        and isinstance(emc.get("lock_path"), str)
        and isinstance(emc.get("rate_path"), str)
        and opt(emc.get("locked"), int)
        and opt(emc.get("rate"), int)
    ):
        return f"bad emc entry {emc!r}"
    return ""


def unreadable_labels(data: dict[str, Any]) -> list[str]:
    """What a saved baseline could not read (a partial baseline), for messages."""
    out = [lim["label"] for lim in data["limits"] if lim["min"] is None or lim["max"] is None]
    out += [item["path"] for item in (*data["online"], *data["flags"]) if item["value"] is None]
    emc = data.get("emc")
    if emc and emc["locked"] is None:
        out.append(emc["lock_path"])
    return out


class _Restorer:
    """One restore pass. Errors are collected, never raised: restore does all it can.

    Limits the target does not hold (unreadable at save time, or a known-good target) are
    taken from `known_good` once every core is online."""

    def __init__(
        self,
        dev: sysfs.DeviceRoot,
        data: dict[str, Any],
        report: RestoreReport,
        known_good: KnownGood,
    ):
        self.dev = dev
        self.data = data
        self.report = report
        self.known_good = known_good
        self.from_baseline = report.source == "saved baseline"

    def _write(self, rel: str, value: object) -> None:
        try:
            sysfs.write_value(self.dev.path(rel), str(value))
            self.report.written += 1
        except SysfsWriteError as exc:
            self.report.problems.append(f"{exc} (errno {exc.errno})" if exc.errno else str(exc))

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
        out += [(rel, str(value)) for rel, value in self.data.get("halves", ())]
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
                bad.append(f"{rel} reads {got!r}, want {want!r}")
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

    def _wait_readable(self, timeout_s: float) -> None:
        """After cores come online their clusters' files can be read again (at once on a
        kernel; a moment later on slower trees)."""
        paths = [self.dev.path(lim[k]) for lim in self.data["limits"] for k in ("min_path",)]
        deadline = time.monotonic() + timeout_s
        for path in paths:
            while True:
                try:
                    sysfs.read_text(path)
                    break
                except SysfsReadError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.01)

    def _fill_limits(self) -> None:
        for lim in self.data["limits"]:
            if lim["min"] is not None and lim["max"] is not None:
                continue
            found = self.known_good.limits(
                self.dev.path(lim["min_path"]), self.dev.path(lim["max_path"])
            )
            if found is None:
                self.report.problems.append(
                    f"{lim['label']}: limits unknown (not in the saved baseline, and the "
                    f"hardware range of {lim['min_path']} cannot be read); left as they are"
                )
                continue
            lim["min"], lim["max"], source = found
            if self.from_baseline:
                self.report.partial.append(
                    f"{lim['label']} limits were unreadable at save time (cluster offline?): "
                    f"set to {lim['min']}-{lim['max']} from the {source}"
                )

    def run(self, timeout_s: float) -> None:
        data = self.data
        # 1. Every core online, so that every policy can be written (and read).
        for item in data["online"]:
            self._write(item["path"], 1)
        self._wait_readable(timeout_s)
        self._fill_limits()
        # 2. Frequency windows back, never passing through min > max.
        for lim in data["limits"]:
            if lim["min"] is None or lim["max"] is None:
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
        # the halves of windows another tool took the other half of (see _without)
        for rel, value in data.get("halves", ()):
            self._write(rel, value)
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
        self.report.restored = not self.report.problems


def restore_baseline(
    root: Path | str, state_dir: Path | str, timeout_s: float = 1.0
) -> RestoreReport:
    """Put back the baseline saved under `state_dir`, with nothing but the root and the
    state directory (`powerd restore`, start-up after a crash)."""
    return Baseline(root, state_dir).restore(timeout_s)
