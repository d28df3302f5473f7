"""The daemon's view of the board: detection, mode space, controller and power sampler,
opened together from the config's `[device] root` (one root path, no global fake paths)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from powerd.config import Config
from powerd.device.controller import Controller
from powerd.device.detect import BoardInfo, detect_board
from powerd.device.errors import DeviceError
from powerd.device.modespace import ModeSpace, discover_mode_space
from powerd.device.power import PowerReader, PowerSampler
from powerd.modes import PowerMode

log = logging.getLogger("powerd.hardware")


class HardwareError(Exception):
    """The board cannot be used (not a Jetson, missing interfaces, bad [device] config)."""


class Hardware:
    def __init__(
        self, board: BoardInfo, space: ModeSpace, controller: Controller, sampler: PowerSampler
    ):
        self.board = board
        self.space = space
        self.controller = controller
        self.sampler = sampler

    @classmethod
    def open(cls, cfg: Config) -> Hardware:
        root = cfg.device.root
        try:
            board = detect_board(root)
            controller = Controller(
                board, cfg.device.verify_timeout_ms / 1000.0, state_dir=cfg.state.dir
            )
            if controller.baseline.pending:
                # the previous daemon died holding the board: give it back before anything else
                log.warning("found a saved baseline from a previous run: restoring it")
                report = controller.restore_baseline()
                if not report.ok:
                    log.error("baseline restore incomplete: %s", report)
            space = discover_mode_space(board, cfg.device.core_counts, cfg.device.emc_rates_hz)
            reader = PowerReader(root)
        except DeviceError as exc:
            raise HardwareError(f"cannot drive the board under root {root!r}: {exc}") from None
        sampler = PowerSampler(reader, cfg.power.sample_interval_ms / 1000.0).start()
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
        return cls(board, space, controller, sampler)

    @property
    def current_mode(self) -> PowerMode | None:
        """The mode powerd has pinned and verified; None while the board is at its baseline."""
        return self.controller.last_verified

    def apply(self, mode: PowerMode) -> None:
        if mode != self.controller.last_verified:
            self.controller.apply(mode)

    def restore(self) -> None:
        if not self.controller.baseline.pending:
            return
        report = self.controller.restore_baseline()
        if report.ok:
            log.info("baseline restored")
        else:
            log.error("baseline restore incomplete: %s", report)

    def power_between(self, t0: float, t1: float) -> Sequence[tuple[float, float]]:
        return self.sampler.samples_between(t0, t1)

    def latest_power(self) -> float | None:
        s = self.sampler.latest()
        return None if s is None else s[1]

    def close(self) -> None:
        self.sampler.stop()
