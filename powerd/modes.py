"""PowerMode: the unit powerd reasons about. Shared by the client and the daemon."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

FIELDS = ("cores", "cpu_khz", "gpu_hz", "emc_hz")


@dataclass(frozen=True, order=True)
class PowerMode:
    """Online CPU cores and pinned CPU/GPU/EMC frequencies, in native sysfs units."""

    cores: int
    cpu_khz: int
    gpu_hz: int
    emc_hz: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.cores, self.cpu_khz, self.gpu_hz, self.emc_hz)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PowerMode:
        return cls(**{k: int(d[k]) for k in FIELDS})

    # Whole MHz, truncated: the one way every table, log line and message writes a clock
    # (114.75 MHz reads 114 everywhere, never 115 in one place and 114 in another).
    @property
    def cpu_mhz(self) -> int:
        return self.cpu_khz // 1000

    @property
    def gpu_mhz(self) -> int:
        return self.gpu_hz // 1_000_000

    @property
    def emc_mhz(self) -> int:
        return self.emc_hz // 1_000_000

    def __str__(self) -> str:
        return f"{self.cores}c/cpu {self.cpu_mhz} MHz/gpu {self.gpu_mhz} MHz/emc {self.emc_mhz} MHz"
