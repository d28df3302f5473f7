"""Temperatures (thermal zones) and fan PWM: read-only context for throttling checks."""

from __future__ import annotations

import re
from pathlib import Path

from powerd.device import sysfs
from powerd.device.errors import SysfsReadError

THERMAL_DIR = "/sys/devices/virtual/thermal"
FAN_HWMON = "/sys/devices/platform/pwm-fan/hwmon"
GATED_MILLIDEG = -256000  # a power-gated sensor (e.g. CV cluster idle) reports this


def _zone_index(path: Path) -> int:
    m = re.search(r"(\d+)$", path.name)
    return int(m.group(1)) if m else -1


def read_temperatures(root: Path | str) -> dict[str, float]:
    """Zone type -> degrees C, skipping gated and unreadable sensors. A repeated type gets
    its zone index appended ("cpu-thermal", "cpu-thermal.5")."""
    dev = sysfs.DeviceRoot(root)
    temps: dict[str, float] = {}
    for zone in sorted(dev.path(THERMAL_DIR).glob("thermal_zone*"), key=_zone_index):
        try:
            kind = sysfs.read_text(zone / "type")
            milli = sysfs.read_int(zone / "temp")
        except SysfsReadError:
            continue
        if milli == GATED_MILLIDEG:
            continue
        name = kind if kind not in temps else f"{kind}.{_zone_index(zone)}"
        temps[name] = milli / 1000.0
    return temps


def read_fan_pwm(root: Path | str) -> int | None:
    """Fan PWM duty (0-255), or None without a pwm-fan."""
    dev = sysfs.DeviceRoot(root)
    for pwm in sorted(dev.path(FAN_HWMON).glob("hwmon*/pwm1")):
        try:
            return sysfs.read_int(pwm)
        except SysfsReadError:
            continue
    return None
