"""The only code that changes the board's power mode (and so the only sysfs writer).

A switch writes in an order no kernel can refuse (cores online before their cluster's
frequency; each [min, max] window moved without passing through min > max; EMC locked
before its rate is set; extra cores offline last), then reads everything back, because
newer kernels clamp silently where older ones refuse. Anything less than the asked mode,
lasting past `verify_timeout_s`, is a failed switch: the board is put back into a known
state (the last verified mode, else the saved baseline) and SwitchError says which.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from powerd.device import sysfs
from powerd.device.baseline import Baseline, KnobSet, LimitPair, RestoreReport
from powerd.device.detect import BoardInfo, Cluster
from powerd.device.errors import DeviceError, SwitchError, SysfsReadError, SysfsWriteError
from powerd.device.order import Limit, limit_writes
from powerd.modes import PowerMode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Window:
    """A frequency window's files (cpufreq policy or devfreq) and its frequency table."""

    label: str
    min_path: Path
    max_path: Path
    cur_path: Path
    available: tuple[int, ...]


@dataclass(frozen=True)
class ExternalChange:
    """A pinned knob file that no longer holds what powerd wrote (nvpmodel, jetson_clocks,
    jtop or an admin rewrote it). `file` is the path as on a real board."""

    file: str
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.file}: powerd pinned {self.expected}, now {self.found}"


def _nearest(value: int, table: Sequence[int]) -> int:
    return min(table, key=lambda f: abs(f - value)) if table else value


class Controller:
    """Applies and verifies power modes on one board.

    `state_dir`: where the baseline is saved before the first write (None: memory only).
    Thread-safe: one switch at a time.
    """

    def __init__(
        self,
        board: BoardInfo,
        verify_timeout_s: float = 0.2,
        *,
        state_dir: Path | str | None = None,
        confirm_s: float = 0.02,
        poll_s: float = 0.005,
    ):
        self.board = board
        self.verify_timeout_s = verify_timeout_s
        # A kernel applies limits synchronously, but cur files, BPMP and an emulated tree
        # may lag: a match is trusted only if it still holds `confirm_s` later.
        self.confirm_s = confirm_s
        self.poll_s = poll_s
        self.baseline = Baseline(board.root, state_dir, knobs=self.knobs)
        self._lock = threading.RLock()
        self._last_verified: PowerMode | None = None
        self._cpu_windows = {c.policy_dir: self._cpu_window(c) for c in board.clusters}
        gpu = board.gpu_dir
        self._gpu = _Window(
            "gpu",
            gpu / "min_freq",
            gpu / "max_freq",
            gpu / "cur_freq",
            tuple(sorted(sysfs.read_int_list(gpu / "available_frequencies"))),
        )
        self._railgate = gpu / "device" / "railgate_enable"
        self._emc_rates: tuple[int, ...] = ()
        if board.emc_rates_file is not None:
            try:
                khz = sysfs.read_int_list(board.emc_rates_file)
                self._emc_rates = tuple(sorted(r * 1000 for r in khz))
            except SysfsReadError as exc:
                log.warning("%s", exc)
        cpu_tables = [set(w.available) for w in self._cpu_windows.values() if w.available]
        self._cpu_freqs: frozenset[int] = (
            frozenset(set.intersection(*cpu_tables)) if cpu_tables else frozenset()
        )
        for key, window in self._cpu_windows.items():
            if not window.available:  # unreadable while offline: the other clusters' table
                self._cpu_windows[key] = _Window(
                    window.label,
                    window.min_path,
                    window.max_path,
                    window.cur_path,
                    tuple(sorted(self._cpu_freqs)),
                )

    def _cpu_window(self, cluster: Cluster) -> _Window:
        d = cluster.policy_dir
        try:
            table = tuple(sorted(sysfs.read_int_list(d / "scaling_available_frequencies")))
        except SysfsReadError:
            table = ()  # inactive policy (all cores offline): other clusters give the table
        return _Window(
            f"cpu {cluster.name}",
            d / "scaling_min_freq",
            d / "scaling_max_freq",
            d / "scaling_cur_freq",
            table,
        )

    # -- what it touches -----------------------------------------------------------------
    def _online_file(self, cpu: int) -> Path | None:
        path = self.board.cpu_dir(cpu) / "online"
        return path if path.exists() else None  # cpu0 usually has none: it never goes offline

    def knobs(self) -> KnobSet:
        online = tuple(
            p for cpu in self.board.cpus if cpu != 0 and (p := self._online_file(cpu)) is not None
        )
        windows = [*self._cpu_windows.values(), self._gpu]
        limits = tuple(LimitPair(w.label, w.min_path, w.max_path) for w in windows)
        flags = (self._railgate,) if self._railgate.exists() else ()
        emc = self.board.emc_dir
        return KnobSet(
            online=online,
            limits=limits,
            flags=flags,
            emc_lock=emc / "mrq_rate_locked" if emc else None,
            emc_rate=emc / "rate" if emc else None,
        )

    def knob_files(self) -> list[Path]:
        """Every file this controller may write (the baseline saves exactly these)."""
        return self.knobs().files()

    @property
    def last_verified(self) -> PowerMode | None:
        return self._last_verified

    # -- switching -----------------------------------------------------------------------
    def validate(self, mode: PowerMode) -> None:
        """Refuse, before any write, a mode this board cannot take (a caller's bug)."""
        if not 1 <= mode.cores <= self.board.ncpu:
            raise ValueError(f"{mode}: cores must be 1..{self.board.ncpu}")
        if self._cpu_freqs and mode.cpu_khz not in self._cpu_freqs:
            raise ValueError(f"{mode}: CPU {mode.cpu_khz} kHz is not offered by every cluster")
        if mode.gpu_hz not in self._gpu.available:
            raise ValueError(f"{mode}: GPU {mode.gpu_hz} Hz not in available_frequencies")
        if self.board.emc_dir is None:
            if mode.emc_hz != 0:
                raise ValueError(f"{mode}: EMC cannot be driven on this board (use emc_hz=0)")
        elif mode.emc_hz <= 0:
            raise ValueError(f"{mode}: emc_hz must be a rate")
        elif self._emc_rates and mode.emc_hz not in self._emc_rates:
            raise ValueError(f"{mode}: EMC {mode.emc_hz} Hz not in possible_rates")

    def apply(self, mode: PowerMode) -> PowerMode:
        """Switch to `mode` and verify it; returns it. On failure the board is put back into
        a known state and SwitchError (naming the files, and that state) is raised."""
        self.validate(mode)
        with self._lock:
            if self.baseline.needs_restore_before_save():
                # A corrupt saved baseline: the board holds some dead daemon's mode. Saving
                # that as the "baseline" would pin it for good, so go to the known-good
                # state first, and write nothing until that worked.
                report = self.baseline.restore()
                if not report.ok:
                    raise DeviceError(f"board not in a known state, no switch made: {report}")
            if not self.baseline.pending:
                try:
                    self.baseline.save(self.knobs(), self.board.key)
                except OSError as exc:
                    # No saved baseline, no write: a crash could not be undone.
                    raise DeviceError(
                        f"cannot save the baseline to {self.baseline.path}: {exc}"
                    ) from None
            problems = self._switch(mode)
            if not problems:
                self._last_verified = mode
                log.info("power mode %s applied", mode)
                return mode
            log.error("switch to %s failed: %s", mode, "; ".join(problems))
            left_in, left_mode, more = self._recover()
            raise SwitchError(mode, problems + more, left_in, left_mode)

    def _switch(self, mode: PowerMode) -> list[str]:
        """Write and verify; the problems found (empty: the mode is in force)."""
        try:
            self._write_mode(mode)
        except SysfsWriteError as exc:
            return [f"write {exc.value!r} to {exc.path} refused: {exc.strerror}"]
        except (SysfsReadError, ValueError) as exc:
            return [f"before writing: {exc}"]
        return self._verify(mode)

    def _recover(self) -> tuple[str, PowerMode | None, list[str]]:
        previous = self._last_verified
        if previous is not None:
            problems = self._switch(previous)
            if not problems:
                log.warning("back in the previous mode %s", previous)
                return "previous", previous, []
            log.error("re-applying %s failed too: %s", previous, "; ".join(problems))
            more = [f"re-applying previous mode: {p}" for p in problems]
        else:
            more = []
        report = self.restore_baseline()
        if report.ok:
            return "baseline", None, more
        return "unknown", None, more + [f"restoring baseline: {p}" for p in report.problems]

    def restore_baseline(self, timeout_s: float = 1.0) -> RestoreReport:
        """Put the saved admin state back (job ended, SIGTERM, start-up after a crash)."""
        with self._lock:
            report = self.baseline.restore(timeout_s)
            self._last_verified = None
            return report

    def _target_cpus(self, mode: PowerMode) -> list[int]:
        return sorted(self.board.cpus)[: mode.cores]

    def _is_online(self, cpu: int) -> bool:
        path = self._online_file(cpu)
        return path is None or sysfs.read_text(path) == "1"

    def freq_writes(
        self, cur_min: int, cur_max: int, new_min: int, new_max: int
    ) -> list[tuple[Limit, int]]:
        """The order of a window's writes (a method so tests can break it on purpose)."""
        return limit_writes(cur_min, cur_max, new_min, new_max)

    def _set_window(self, window: _Window, freq: int) -> None:
        cur_min = sysfs.read_int(window.min_path)
        cur_max = sysfs.read_int(window.max_path)
        for which, value in self.freq_writes(cur_min, cur_max, freq, freq):
            sysfs.write_value(window.min_path if which == "min" else window.max_path, value)

    def _wait_clusters_readable(self, cpus: set[int]) -> None:
        """A cluster whose cores just came online answers reads again at once on a kernel;
        give slower trees up to the verify timeout before the window is read."""
        deadline = time.monotonic() + self.verify_timeout_s
        for cluster in self.board.clusters:
            if not cpus & set(cluster.cpus):
                continue
            window = self._cpu_windows[cluster.policy_dir]
            while True:
                try:
                    sysfs.read_text(window.min_path)
                    break
                except SysfsReadError:
                    if time.monotonic() >= deadline:
                        break  # _set_window reports it
                    time.sleep(self.poll_s)

    def _write_mode(self, mode: PowerMode) -> None:
        wanted = self._target_cpus(mode)
        # 1. Cores online first: an offline core's cluster cannot take a frequency.
        onlined = False
        for cpu in wanted:
            path = self._online_file(cpu)
            if path is not None and sysfs.read_text(path) != "1":
                sysfs.write_value(path, 1)
                onlined = True
        if onlined:
            self._wait_clusters_readable(set(wanted))
        # 2. Every cluster with an online core, including ones about to go offline, so that a
        # cluster brought back later does not come up at some stale frequency of its own.
        online = {cpu for cpu in self.board.cpus if self._is_online(cpu)}
        for cluster in self.board.clusters:
            if online & set(cluster.cpus):
                self._set_window(self._cpu_windows[cluster.policy_dir], mode.cpu_khz)
        # 3. GPU: keep it from power-gating, then pin.
        if self._railgate.exists() and sysfs.read_text(self._railgate) != "0":
            sysfs.write_value(self._railgate, 0)
        self._set_window(self._gpu, mode.gpu_hz)
        # 4. EMC: a rate written while DVFS owns the clock is ignored, so lock first.
        if self.board.emc_dir is not None:
            sysfs.write_value(self.board.emc_dir / "mrq_rate_locked", 1)
            sysfs.write_value(self.board.emc_dir / "rate", mode.emc_hz)
        # 5. Extra cores offline last, highest first.
        for cpu in sorted(self.board.cpus, reverse=True):
            if cpu in wanted:
                continue
            path = self._online_file(cpu)
            if path is not None and sysfs.read_text(path) != "0":
                sysfs.write_value(path, 0)

    # -- verification --------------------------------------------------------------------
    def _mismatches(self, mode: PowerMode) -> list[str]:
        bad: list[str] = []
        wanted = set(self._target_cpus(mode))
        mask_file = self.board.online_mask_file
        try:
            online = set(sysfs.parse_cpu_list(sysfs.read_text(mask_file)))
            if online != wanted:
                bad.append(
                    f"{mask_file}: online CPUs {sysfs.format_cpu_list(online)}, "
                    f"want {sysfs.format_cpu_list(wanted)}"
                )
        except (SysfsReadError, ValueError) as exc:
            bad.append(str(exc))
        windows = [
            self._cpu_windows[c.policy_dir] for c in self.board.clusters if wanted & set(c.cpus)
        ]
        targets = [(w, mode.cpu_khz) for w in windows] + [(self._gpu, mode.gpu_hz)]
        for window, freq in targets:
            bad += self._window_mismatches(window, freq)
        if self.board.emc_dir is not None:
            emc = self.board.emc_dir
            bad += self._value_mismatch(emc / "mrq_rate_locked", 1)
            bad += self._value_mismatch(emc / "rate", mode.emc_hz, self._emc_rates)
        return bad

    def _window_mismatches(self, window: _Window, freq: int) -> list[str]:
        return (
            self._value_mismatch(window.min_path, freq)
            + self._value_mismatch(window.max_path, freq)
            # cur reads the real clock, which may sit a little off the table: compare the
            # nearest table entry (a wrong frequency is a whole table step away).
            + self._value_mismatch(window.cur_path, freq, window.available)
        )

    @staticmethod
    def _value_mismatch(path: Path, want: int, table: Sequence[int] = ()) -> list[str]:
        try:
            got = sysfs.read_int(path)
        except SysfsReadError as exc:
            return [str(exc)]
        if (_nearest(got, table) if table else got) != want:
            return [f"{path} reads {got}, want {want}"]
        return []

    def _verify(self, mode: PowerMode) -> list[str]:
        deadline = time.monotonic() + self.verify_timeout_s
        while True:
            bad = self._mismatches(mode)
            if not bad:
                time.sleep(self.confirm_s)
                bad = self._mismatches(mode)
                if not bad:
                    return []
            if time.monotonic() >= deadline:
                return bad
            time.sleep(self.poll_s)

    # -- external changes ------------------------------------------------------------------
    def pinned_values(self) -> list[tuple[Path, int, tuple[int, ...]]]:
        """(file, value, table) for every knob the verified mode pins; a found value is
        compared after snapping it to `table` when one is given (BPMP rounds EMC rates)."""
        mode = self._last_verified
        if mode is None:
            return []
        wanted = set(self._target_cpus(mode))
        out: list[tuple[Path, int, tuple[int, ...]]] = []
        for cpu in self.board.cpus:
            path = self._online_file(cpu)
            if path is not None:
                out.append((path, int(cpu in wanted), ()))
        for cluster in self.board.clusters:
            if wanted & set(cluster.cpus):
                w = self._cpu_windows[cluster.policy_dir]
                out += [(w.min_path, mode.cpu_khz, ()), (w.max_path, mode.cpu_khz, ())]
        out += [(self._gpu.min_path, mode.gpu_hz, ()), (self._gpu.max_path, mode.gpu_hz, ())]
        if self._railgate.exists():
            out.append((self._railgate, 0, ()))
        if self.board.emc_dir is not None:
            out.append((self.board.emc_dir / "mrq_rate_locked", 1, ()))
            out.append((self.board.emc_dir / "rate", mode.emc_hz, self._emc_rates))
        return out

    def external_changes(self) -> list[ExternalChange]:
        """Pinned files that something else rewrote since the last verified switch. One read
        per file, no waiting: cheap enough for every control tick. Empty while the board is
        at its baseline (nothing pinned). Takes no lock: a switch in progress is the only
        writer, and the caller (the control path) does not call both at once."""
        dev = sysfs.DeviceRoot(self.board.root)
        out: list[ExternalChange] = []
        for path, want, table in self.pinned_values():
            try:
                text = sysfs.read_text(path)
                got = int(text)
            except SysfsReadError as exc:
                out.append(ExternalChange(dev.rel(path), str(want), f"unreadable ({exc.reason})"))
                continue
            except ValueError:
                out.append(ExternalChange(dev.rel(path), str(want), repr(text)))
                continue
            if (_nearest(got, table) if table else got) != want:
                out.append(ExternalChange(dev.rel(path), str(want), str(got)))
        return out

    def yield_board(self, changes: Sequence[ExternalChange]) -> RestoreReport:
        """`on_external_change = "yield"`: the files another tool changed are its now; every
        other pinned value goes back to the baseline, and nothing stays pinned. The next
        switch saves a fresh baseline (with the other tool's values in it)."""
        with self._lock:
            skip = frozenset(c.file for c in changes)
            report = self.baseline.restore(skip=skip)
            self._last_verified = None
            return report

    def reapply(self) -> PowerMode | None:
        """Write the verified mode again (after an external change); None if none is pinned."""
        with self._lock:
            mode = self._last_verified
            return None if mode is None else self.apply(mode)

    # -- reading -------------------------------------------------------------------------
    def current(self) -> PowerMode:
        """The effective mode read back from the hardware: online cores, the clocks that run
        (cur files, snapped to the frequency tables) and the EMC rate (0: not driven)."""
        try:
            cores = len(sysfs.parse_cpu_list(sysfs.read_text(self.board.online_mask_file)))
        except ValueError as exc:
            raise DeviceError(f"{self.board.online_mask_file}: {exc}") from None
        # cpu0 never goes offline, so its cluster always reports a clock.
        first = next((c for c in self.board.clusters if 0 in c.cpus), self.board.clusters[0])
        window = self._cpu_windows[first.policy_dir]
        cpu = _nearest(sysfs.read_int(window.cur_path), window.available)
        gpu = _nearest(sysfs.read_int(self._gpu.cur_path), self._gpu.available)
        emc = 0
        if self.board.emc_dir is not None:
            emc = _nearest(sysfs.read_int(self.board.emc_dir / "rate"), self._emc_rates)
        return PowerMode(cores, cpu, gpu, emc)
