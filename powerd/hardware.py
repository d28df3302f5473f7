"""The daemon's view of the board: detection, mode space, controller and power sampler,
opened together from the config's `[device] root` (one root path, no global fake paths)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from powerd.config import Config
from powerd.device import nvpmodel
from powerd.device.baseline import RestoreReport
from powerd.device.controller import Controller, ExternalChange
from powerd.device.detect import BoardInfo, detect_board
from powerd.device.errors import DeviceError
from powerd.device.lock import BoardLock
from powerd.device.modespace import ModeSpace, discover_mode_space
from powerd.device.power import PowerReader, PowerSampler
from powerd.device.sysfs import DeviceRoot
from powerd.modes import PowerMode

log = logging.getLogger("powerd.hardware")


class HardwareError(Exception):
    """The board cannot be used (not a Jetson, missing interfaces, bad [device] config)."""


class Hardware:
    # A failed restore is retried on idle ticks, backing off from 2 s to 60 s between tries.
    RETRY_FIRST_S = 2.0
    RETRY_MAX_S = 60.0

    # a `powerd restore` in progress holds the board lock for a second or two
    LOCK_WAIT_S = 5.0

    def __init__(
        self,
        board: BoardInfo,
        space: ModeSpace,
        controller: Controller,
        sampler: PowerSampler,
        lock: BoardLock | None = None,
    ):
        self.lock = lock
        self.board = board
        self.space = space
        self.controller = controller
        self.sampler = sampler
        self._retry_delay_s = self.RETRY_FIRST_S
        self._next_retry = 0.0
        # read once (it may run `nvpmodel -q`): status must not wait on a subprocess
        active = nvpmodel.active_mode(DeviceRoot(board.root))
        self.nvpmodel: dict[str, object] | None = active.as_dict() if active else None

    @classmethod
    def open(cls, cfg: Config) -> Hardware:
        lock = BoardLock(cfg.state.dir)
        try:
            got = lock.acquire(cls.LOCK_WAIT_S)
        except OSError as exc:
            raise HardwareError(f"cannot take the board lock {lock.path}: {exc}") from None
        if not got:
            raise HardwareError(
                f"another process (pid {lock.holder() or '?'}) holds the board lock "
                f"{lock.path}: a second powerd, or a `powerd restore` that did not finish"
            )
        try:
            return cls._open_locked(cfg, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def _open_locked(cls, cfg: Config, lock: BoardLock) -> Hardware:
        root = cfg.device.root
        try:
            board = detect_board(root)
            controller = Controller(
                board, cfg.device.verify_timeout_ms / 1000.0, state_dir=cfg.state.dir
            )
            if controller.baseline.pending:
                # the previous daemon died holding the board: give it back before anything else
                log.warning("found a saved baseline from a previous run: restoring it")
                controller.restore_baseline()  # logs what it did, or what is left pending
            space = discover_mode_space(board, cfg.device.core_counts, cfg.device.emc_rates_hz)
            reader = PowerReader(root)
        except DeviceError as exc:
            raise HardwareError(f"cannot drive the board under root {root!r}: {exc}") from None
        sampler = PowerSampler(reader, cfg.power.sample_interval_ms / 1000.0).start()
        lag = reader.lag_s
        log.info(
            "power: %d rails, read every %g ms; %s",
            len(reader.rails),
            cfg.power.sample_interval_ms,
            "the chips do not report their update_interval: a reading is taken to show a "
            "load from one sampling period after it starts"
            if lag is None
            else f"a reading shows a load {lag * 1000:.1f} ms after it starts (2 x the "
            "chips' update_interval): short inference batches get a reading of their own",
        )
        log.info(
            "board %s (L4T %s): %d power modes (%d core counts x %d CPU x %d GPU x %d EMC)",
            board.model,
            board.l4t,
            space.size,
            len(space.cores),
            len(space.cpu_khz),
            len(space.gpu_hz),
            len(space.emc_hz),
        )
        return cls(board, space, controller, sampler, lock)

    @property
    def current_mode(self) -> PowerMode | None:
        """The mode powerd has pinned and verified; None while the board is at its baseline."""
        return self.controller.last_verified

    def apply(self, mode: PowerMode) -> None:
        if mode != self.controller.last_verified:
            self.controller.apply(mode)

    def restore(self) -> RestoreReport | None:
        """Give the board back (None: nothing was pending). A failure is logged, kept in
        `restore_problem`, and retried by `retry_restore` on idle ticks."""
        if not self.controller.baseline.pending:
            return None
        report = self.controller.restore_baseline()
        self._schedule_retry(report)
        return report

    def _schedule_retry(self, report: RestoreReport) -> None:
        if report.ok:
            self._retry_delay_s = self.RETRY_FIRST_S
            self._next_retry = 0.0
        else:
            self._next_retry = time.monotonic() + self._retry_delay_s
            self._retry_delay_s = min(self.RETRY_MAX_S, self._retry_delay_s * 2)

    @property
    def restore_problem(self) -> str | None:
        """Why the board is not back at its baseline although it should be (for
        `powerctl status`); None when no restore is owed or the last one worked."""
        baseline = self.controller.baseline
        return baseline.problem if baseline.pending else None

    def baseline_status(self) -> dict[str, object]:
        """For `powerctl status --json` ("baseline" key): whether a restore is owed, why
        the last one failed, what a partial baseline lacks, the admin's nvpmodel mode."""
        b = self.controller.baseline
        return {
            "pending": b.pending,
            "restore_problem": self.restore_problem,
            "partial": list(b.saved_unreadable),
            "nvpmodel": b.saved_nvpmodel or self.nvpmodel,
        }

    def retry_restore(self, now: float | None = None) -> RestoreReport | None:
        """Call on the control path's idle ticks (no job holds the board): retries a failed
        restore, with back-off. None when nothing is owed or it is not time yet."""
        if self.restore_problem is None:
            return None
        if (time.monotonic() if now is None else now) < self._next_retry:
            return None
        log.info("retrying the restore that failed: %s", self.restore_problem)
        return self.restore()

    def external_changes(self) -> list[ExternalChange]:
        """Pinned knob files something else rewrote (see Controller.external_changes).
        Cheap: one read per pinned file, no waiting."""
        changes = self.controller.external_changes()
        for change in changes:  # the control path warns once per fight, not per round
            log.debug("external change to a pinned value: %s", change)
        return changes

    def yield_board(self, changes: Sequence[ExternalChange]) -> RestoreReport:
        """`on_external_change = "yield"`: leave the changed files to the other tool, put
        every other pinned value back, pin nothing until the next apply."""
        report = self.controller.yield_board(changes)
        self._schedule_retry(report)
        return report

    def reapply(self) -> PowerMode | None:
        """`on_external_change = "reapply"`: write the pinned mode again."""
        return self.controller.reapply()

    @property
    def sensor_lag_s(self) -> float | None:
        """How soon after a load step every power reading shows it (None: not known)."""
        reader = self.sampler.reader
        return reader.lag_s if isinstance(reader, PowerReader) else None

    def sample_during(self, start: float, expected_s: float | None) -> None:
        """One extra power reading inside a piece of GPU work that began at `start` and is
        expected to last `expected_s` (None: not known yet): the middle of the part of it
        the sensor shows. Regular readings, 100 ms apart, mostly miss 15 ms batches."""
        lag = self.sensor_lag_s
        if lag is None:
            return
        span = expected_s - lag if expected_s is not None and expected_s > lag else lag
        self.sampler.sample_at(start + lag + 0.5 * span)

    def power_between(self, t0: float, t1: float) -> Sequence[tuple[float, float]]:
        return self.sampler.samples_between(t0, t1)

    def latest_power(self) -> float | None:
        s = self.sampler.latest()
        return None if s is None else s[1]

    def close(self) -> None:
        self.sampler.stop()
        if self.lock is not None:
            self.lock.release()
