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

    def __str__(self) -> str:
        return (
            f"{self.cores}c/cpu {self.cpu_khz // 1000} MHz/gpu {self.gpu_hz // 1_000_000} MHz"
            f"/emc {self.emc_hz // 1_000_000} MHz"
        )
