"""The mode space: every (cores, cpu_khz, gpu_hz, emc_hz) the board offers, from its tables."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from functools import cached_property

import numpy as np

from powerd.device.detect import BoardInfo
from powerd.device.errors import DeviceError, SysfsReadError
from powerd.device.sysfs import read_int, read_int_list
from powerd.modes import PowerMode

log = logging.getLogger(__name__)


def _ascending_unique(values: Sequence[int], what: str) -> list[int]:
    out = sorted({int(v) for v in values})
    if not out:
        raise DeviceError(f"empty {what} list")
    return out


class ModeSpace:
    """The Cartesian product of four ascending axes, in a fixed order (cores slowest)."""

    def __init__(
        self,
        cores: Sequence[int],
        cpu_khz: Sequence[int],
        gpu_hz: Sequence[int],
        emc_hz: Sequence[int],
    ):
        self.cores = _ascending_unique(cores, "core count")
        self.cpu_khz = _ascending_unique(cpu_khz, "CPU frequency")
        self.gpu_hz = _ascending_unique(gpu_hz, "GPU frequency")
        self.emc_hz = _ascending_unique(emc_hz, "EMC rate")

    @property
    def size(self) -> int:
        return len(self.cores) * len(self.cpu_khz) * len(self.gpu_hz) * len(self.emc_hz)

    def __len__(self) -> int:
        return self.size

    @cached_property
    def _modes(self) -> tuple[PowerMode, ...]:
        axes = (self.cores, self.cpu_khz, self.gpu_hz, self.emc_hz)
        return tuple(PowerMode(*t) for t in itertools.product(*axes))

    @cached_property
    def _index(self) -> dict[PowerMode, int]:
        return {m: i for i, m in enumerate(self._modes)}

    @cached_property
    def _array(self) -> np.ndarray:
        arr = np.array([m.as_tuple() for m in self._modes], dtype=np.int64).reshape(-1, 4)
        arr.setflags(write=False)  # shared by every caller: nobody may edit it in place
        return arr

    def modes(self) -> list[PowerMode]:
        return list(self._modes)

    def as_array(self) -> np.ndarray:
        """(N, 4) int64, rows in the order of `modes()`; cached and read-only."""
        return self._array

    def max_mode(self) -> PowerMode:
        return PowerMode(self.cores[-1], self.cpu_khz[-1], self.gpu_hz[-1], self.emc_hz[-1])

    def min_mode(self) -> PowerMode:
        return PowerMode(self.cores[0], self.cpu_khz[0], self.gpu_hz[0], self.emc_hz[0])

    def contains(self, mode: PowerMode) -> bool:
        return mode in self._index

    def __contains__(self, mode: object) -> bool:
        return isinstance(mode, PowerMode) and self.contains(mode)

    def index(self, mode: PowerMode) -> int:
        try:
            return self._index[mode]
        except KeyError:
            raise ValueError(f"{mode} is not in the mode space") from None

    def describe(self) -> dict[str, list[int]]:
        return {
            "cores": list(self.cores),
            "cpu_khz": list(self.cpu_khz),
            "gpu_hz": list(self.gpu_hz),
            "emc_hz": list(self.emc_hz),
        }

    def __repr__(self) -> str:
        return (
            f"ModeSpace({len(self.cores)} core counts x {len(self.cpu_khz)} CPU x "
            f"{len(self.gpu_hz)} GPU x {len(self.emc_hz)} EMC = {self.size} modes)"
        )


def cpu_frequencies(board: BoardInfo) -> list[int]:
    """Frequencies every cluster offers (the controller pins all clusters alike).

    A cluster whose cores are all offline cannot be read on a real kernel (EBUSY); it is
    skipped as long as another cluster answers.
    """
    common: set[int] | None = None
    for cluster in board.clusters:
        try:
            freqs = set(read_int_list(cluster.policy_dir / "scaling_available_frequencies"))
        except SysfsReadError as exc:
            log.warning("cluster %s: %s", cluster.name, exc)
            continue
        common = freqs if common is None else common & freqs
    if not common:
        raise DeviceError(
            "no CPU frequency offered by every cluster (scaling_available_frequencies)"
        )
    return sorted(common)


def gpu_frequencies(board: BoardInfo) -> list[int]:
    freqs = read_int_list(board.gpu_dir / "available_frequencies")
    if not freqs:
        raise DeviceError(f"{board.gpu_dir / 'available_frequencies'} lists no frequencies")
    return sorted(set(freqs))


def emc_rates(board: BoardInfo, configured_hz: Sequence[int] = ()) -> list[int]:
    """debugfs possible_rates (kHz) -> Hz, else the config's list, else the current rate.

    [0] when the board's EMC cannot be driven (no BPMP debugfs): emc_hz 0 means "left to
    DVFS" and the controller never touches EMC.
    """
    if board.emc_dir is None:
        if configured_hz:
            log.warning("emc_rates_hz configured but EMC debugfs is missing: EMC not driven")
        return [0]
    if board.emc_rates_file is not None:
        try:
            rates = read_int_list(board.emc_rates_file)
            if rates:
                return sorted({r * 1000 for r in rates})
        except SysfsReadError as exc:
            log.warning("%s", exc)
    if configured_hz:
        return sorted(set(configured_hz))
    current = read_int(board.emc_dir / "rate")
    log.warning("no EMC rate list (debugfs or [device] emc_rates_hz): only %d Hz", current)
    return [current]


def discover_mode_space(
    board: BoardInfo,
    core_counts: Sequence[int] = (),
    emc_rates_hz: Sequence[int] = (),
) -> ModeSpace:
    """The board's mode space, narrowed by the config's core_counts / emc_rates_hz."""
    ncpu = board.ncpu
    if core_counts:
        bad = sorted(c for c in core_counts if not 1 <= c <= ncpu)
        if bad:
            raise DeviceError(f"[device] core_counts {bad} outside 1..{ncpu} (CPUs on this board)")
        cores = list(core_counts)
    else:
        cores = list(range(1, ncpu + 1))
    return ModeSpace(
        cores, cpu_frequencies(board), gpu_frequencies(board), emc_rates(board, emc_rates_hz)
    )
