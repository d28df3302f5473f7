from pathlib import Path

from powerd.device.thermal import read_fan_pwm, read_temperatures
from powerd.sim.emulator import Emulator


def test_emulated_zones_skip_gated_sensors(emulated_agx: Emulator) -> None:
    temps = read_temperatures(emulated_agx.root)
    assert {"cpu-thermal", "gpu-thermal", "tj-thermal"} <= set(temps)
    assert not any(k.startswith("cv") for k in temps)  # -256000: power-gated
    assert all(20.0 < t < 110.0 for t in temps.values())
    pwm = read_fan_pwm(emulated_agx.root)
    assert pwm is not None and 0 <= pwm <= 255


def test_duplicates_unreadable_and_no_fan(tmp_path: Path) -> None:
    base = tmp_path / "sys/devices/virtual/thermal"
    for i, (kind, temp) in enumerate(
        [("cpu-thermal", "45500"), ("cpu-thermal", "47000"), ("bad", "n/a"), ("x", "-256000")]
    ):
        (base / f"thermal_zone{i}").mkdir(parents=True)
        (base / f"thermal_zone{i}/type").write_text(kind + "\n")
        (base / f"thermal_zone{i}/temp").write_text(temp + "\n")
    (base / "thermal_zone10").mkdir()  # no files at all
    assert read_temperatures(tmp_path) == {"cpu-thermal": 45.5, "cpu-thermal.1": 47.0}
    assert read_fan_pwm(tmp_path) is None
