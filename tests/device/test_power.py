"""INA3221 reading (rails, NC and shunt-sum channels, hwmonN globbing) and the sampler."""

import threading
import time
from pathlib import Path

import pytest

from powerd.device.controller import Controller
from powerd.device.detect import detect_board
from powerd.device.errors import DeviceError
from powerd.device.power import PowerReader, PowerSampler, discover_rails
from powerd.modes import PowerMode
from powerd.sim.emulator import Emulator
from tests.waiting import poll_until


def make_ina(root: Path, device: str, hwmon: int, channels: dict[int, tuple[str, int, int]]):
    """A hand-built INA3221: channel -> (label, mV, mA)."""
    ddir = root / "sys/bus/i2c/devices" / device
    hdir = ddir / "hwmon" / f"hwmon{hwmon}"
    hdir.mkdir(parents=True)
    (ddir / "name").write_text("ina3221\n")
    for k, (label, mv, ma) in channels.items():
        (hdir / f"in{k}_label").write_text(label + "\n")
        (hdir / f"in{k}_input").write_text(f"{mv}\n")
        (hdir / f"curr{k}_input").write_text(f"{ma}\n")
    return hdir


def test_nc_and_shunt_sum_channels_are_skipped(tmp_path: Path) -> None:
    make_ina(
        tmp_path,
        "1-0040",
        2,
        {1: ("VDD_GPU_SOC", 5000, 2000), 2: ("VDD_CPU_CV", 5000, 1000), 3: ("NC", 5000, 900)},
    )
    make_ina(
        tmp_path,
        "1-0041",
        5,
        {1: ("VDDQ_VDD2_1V8AO", 5000, 400), 7: ("sum of shunt voltages", 5000, 3000)},
    )
    other = tmp_path / "sys/bus/i2c/devices/1-0050"
    other.mkdir(parents=True)
    (other / "name").write_text("eeprom\n")
    reader = PowerReader(tmp_path)
    assert [r.name for r in reader.rails] == ["VDD_GPU_SOC", "VDD_CPU_CV", "VDDQ_VDD2_1V8AO"]
    assert reader.total_rail is None
    assert reader.read_w() == pytest.approx(10.0 + 5.0 + 2.0)  # the sum of the rails
    assert reader.read_rails() == pytest.approx(
        {"VDD_GPU_SOC": 10.0, "VDD_CPU_CV": 5.0, "VDDQ_VDD2_1V8AO": 2.0}
    )


def test_nc_means_the_token_not_a_substring(tmp_path: Path) -> None:
    make_ina(tmp_path, "1-0040", 0, {1: ("VDD_SYNC_X", 1000, 1000), 2: ("NC_2", 1000, 1000)})
    assert [r.name for r in discover_rails(tmp_path)] == ["VDD_SYNC_X"]


@pytest.mark.parametrize("total", ["VDD_IN", "POM_5V_IN"])
def test_input_rail_is_the_total(tmp_path: Path, total: str) -> None:
    make_ina(
        tmp_path,
        "1-0040",
        1,
        {1: (total, 5000, 3000), 2: ("VDD_CPU_GPU_CV", 5000, 1200), 3: ("VDD_SOC", 5000, 600)},
    )
    reader = PowerReader(tmp_path)
    assert reader.total_rail is not None and reader.total_rail.name == total
    assert reader.read_w() == pytest.approx(15.0)
    assert sum(reader.read_rails().values()) == pytest.approx(15.0 + 6.0 + 3.0)


def test_no_ina3221_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="no INA3221 power rails"):
        PowerReader(tmp_path)


def test_hwmon_index_is_globbed_and_rediscovered(tmp_path: Path) -> None:
    hdir = make_ina(tmp_path, "1-0040", 3, {1: ("VDD_IN", 5000, 2000)})
    reader = PowerReader(tmp_path)
    assert reader.read_w() == pytest.approx(10.0)
    hdir.rename(hdir.with_name("hwmon9"))  # the driver was rebound: another N
    assert reader.read_w() == pytest.approx(10.0)
    assert "hwmon9" in str(reader.total_rail.voltage_path)  # type: ignore[union-attr]


@pytest.mark.parametrize("index", [0, 7])
def test_emulated_agx_total_is_the_trace_power(make_emulated_board, index: int) -> None:
    emu: Emulator = make_emulated_board("orin-agx", noise_frac=0.0, hwmon_index=index)
    assert (emu.root / f"sys/bus/i2c/devices/1-0040/hwmon/hwmon{index}").is_dir()
    reader = PowerReader(emu.root)
    assert sorted(r.name for r in reader.rails) == sorted(
        ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"]
    )
    want = emu.trace.lookup(emu.effective_mode()).power_w
    # Only rounding to whole mA (about 5 mW per rail) separates the two.
    assert reader.read_w() == pytest.approx(want, abs=0.05)


def test_emulated_nano_total_is_vdd_in(emulated_nano: Emulator) -> None:
    reader = PowerReader(emulated_nano.root)
    assert reader.total_rail is not None and reader.total_rail.name == "VDD_IN"
    rails = reader.read_rails()
    assert rails["VDD_CPU_GPU_CV"] + rails["VDD_SOC"] < rails["VDD_IN"]
    want = emulated_nano.trace.lookup(emulated_nano.effective_mode()).power_w
    assert reader.read_w() == pytest.approx(want, rel=0.06)  # 1% noise: 6 sigma


def test_power_follows_the_effective_mode_with_a_transient(make_emulated_board) -> None:
    """time_scale 1: a 0.3 s settling time constant, visible between samples."""
    emu: Emulator = make_emulated_board("orin-agx", time_scale=1.0, noise_frac=0.0)
    reader = PowerReader(emu.root)
    high = reader.read_w()
    ctl = Controller(detect_board(emu.root), verify_timeout_s=1.0)
    low = PowerMode(2, 268800, 114750000, 204000000)
    ctl.apply(low)
    target = emu.trace.lookup(low).power_w
    assert high > target + 20
    time.sleep(0.1)
    mid = reader.read_w()
    assert target + 1 < mid < high - 1  # still settling
    time.sleep(1.5)
    assert reader.read_w() == pytest.approx(target, abs=0.2)


class FlakyReader:
    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def read_w(self) -> float:
        with self.lock:
            self.calls += 1
            n = self.calls
        if n % 3 == 0:
            raise DeviceError("i2c read timed out")
        if n % 5 == 0:
            raise ValueError("garbage")
        return float(n)


def test_sampler_survives_read_errors() -> None:
    sampler = PowerSampler(FlakyReader(), interval_s=0.005)
    with sampler:
        deadline = time.monotonic() + 5
        while sampler.errors < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sampler.running
    assert not sampler.running
    assert sampler.errors >= 6 and sampler.last_error
    samples = sampler.samples_between(0, time.monotonic())
    assert len(samples) >= 6
    times = [t for t, _ in samples]
    assert times == sorted(times)
    assert all(w % 3 and w % 5 for _, w in samples)  # failed reads left no sample
    latest = sampler.latest()
    assert latest is not None and latest == samples[-1]
    t_mid = times[len(times) // 2]
    assert all(t >= t_mid for t, _ in sampler.samples_between(t_mid, time.monotonic()))


def test_sampler_ring_buffer_and_mean(emulated_nano: Emulator) -> None:
    sampler = PowerSampler(PowerReader(emulated_nano.root), interval_s=0.01, capacity=8)
    sampler.start()
    t0 = time.monotonic()
    time.sleep(0.3)
    sampler.stop()
    assert len(sampler.samples_between(0, time.monotonic())) == 8  # bounded
    want = emulated_nano.target_power_w()
    assert sampler.mean_between(t0, time.monotonic()) == pytest.approx(want, rel=0.03)
    assert sampler.mean_between(0, 1) is None


class BurstReader:
    """Board power with a short burst (an inference batch) in every period: busy only in
    [4, 6) ms of each 10 ms, idle otherwise."""

    def __init__(self, period_s: float):
        self.period_s = period_s
        self.t0 = time.monotonic()

    def read_w(self) -> float:
        phase = (time.monotonic() - self.t0) % self.period_s
        return 20.0 if 0.4 * self.period_s <= phase < 0.6 * self.period_s else 10.0


def test_sampling_at_the_burst_period_still_sees_the_bursts() -> None:
    """Bursts that repeat at exactly the sampling period: a fixed-rate sampler reads them at
    one phase (here: the gaps, every time); the dithered one reads both levels."""
    reader = BurstReader(0.01)
    sampler = PowerSampler(reader, interval_s=0.01)
    with sampler:
        assert poll_until(lambda: len(sampler.samples_between(0.0, 1e12)) >= 150, 10.0)
    levels = [w for _, w in sampler.samples_between(0.0, 1e12)]
    busy = sum(w == 20.0 for w in levels)
    assert busy >= 5 and len(levels) - busy >= 5, (busy, len(levels))


def test_the_sensor_lag_is_twice_the_slowest_chip_s_update_interval(tmp_path: Path) -> None:
    a = make_ina(tmp_path, "1-0040", 3, {1: ("VDD_GPU_SOC", 5000, 1000)})
    b = make_ina(tmp_path, "1-0041", 4, {1: ("VDDQ_VDD2_1V8AO", 5000, 200)})
    assert PowerReader(tmp_path).lag_s is None  # an older kernel: not known
    (a / "update_interval").write_text("6\n")
    (b / "update_interval").write_text("9\n")
    reader = PowerReader(tmp_path)
    assert reader.update_interval_s == pytest.approx(0.009)
    assert reader.lag_s == pytest.approx(0.018)
    (b / "update_interval").write_text("garbage\n")  # unreadable: the other chip's
    assert PowerReader(tmp_path).lag_s == pytest.approx(0.012)


def test_the_sensor_lag_counts_only_the_chip_of_the_total_rail(tmp_path: Path) -> None:
    total = make_ina(tmp_path, "1-0040", 3, {1: ("VDD_IN", 5000, 2000)})
    other = make_ina(tmp_path, "1-0041", 4, {1: ("VDD_SOC", 5000, 200)})
    (total / "update_interval").write_text("2\n")
    (other / "update_interval").write_text("140\n")  # never read for the total
    assert PowerReader(tmp_path).lag_s == pytest.approx(0.004)


class ClockReader:
    """Records when it was read."""

    def __init__(self) -> None:
        self.reads: list[float] = []

    def read_w(self) -> float:
        self.reads.append(time.monotonic())
        return 10.0


def test_an_extra_reading_is_taken_when_asked_between_regular_ones() -> None:
    reader = ClockReader()
    with PowerSampler(reader, interval_s=2.0) as sampler:  # regular readings 1-3 s apart
        assert poll_until(lambda: len(reader.reads) >= 1, 5.0)
        at = time.monotonic() + 0.05
        assert sampler.sample_at(at)
        assert poll_until(lambda: len(reader.reads) >= 2, 5.0)
        assert sampler.requested == 1
        # on time (a thread wake-up late at most), never early
        assert at <= reader.reads[1] < at + 0.5
        assert sampler.samples_between(at, at + 0.5)


def test_extra_readings_asked_for_close_together_are_taken_once() -> None:
    reader = ClockReader()
    with PowerSampler(reader, interval_s=2.0) as sampler:
        assert poll_until(lambda: len(reader.reads) >= 1, 5.0)
        at = time.monotonic() + 0.1
        # a burst of 1 ms batches: one reading, not one per batch
        took = [sampler.sample_at(at + k * 0.001) for k in range(20)]
        assert took[0] and not any(took[1:])
        assert sampler.sample_at(at + 0.6)  # a quarter interval later: a reading of its own
        assert poll_until(lambda: sampler.requested == 2, 5.0)
        time.sleep(0.1)
        assert len(reader.reads) == 3  # the first regular one and the two asked for


def test_emulated_power_shows_a_load_step_one_conversion_after_it(make_emulated_board) -> None:
    """The emulated INA3221 shows a new load when the first conversion begun after the step
    ends, and says how long a conversion takes; the periodic refresh plays no part here."""
    emu: Emulator = make_emulated_board(
        "orin-agx", noise_frac=0.0, power_interval_s=60.0, sensor_update_ms=40
    )
    reader = PowerReader(emu.root)
    assert reader.lag_s == pytest.approx(0.08)
    before = reader.read_w()
    emu.set_load(lambda mode: before + 5.0)
    t = time.monotonic()
    assert reader.read_w() == pytest.approx(before, abs=0.05)  # the step is not converted yet
    assert poll_until(lambda: abs(reader.read_w() - (before + 5.0)) < 0.05, 5.0)
    assert time.monotonic() - t >= 0.04  # not before one whole conversion


class SetReader:
    """Reads whatever the test set last."""

    def __init__(self) -> None:
        self.watts = 10.0

    def read_w(self) -> float:
        return self.watts


def test_a_reading_over_the_watched_level_sets_the_event_until_unwatched() -> None:
    reader = SetReader()
    sampler = PowerSampler(reader, interval_s=1.0)  # not started: readings by hand
    alarm = threading.Event()
    sampler.watch(12.0, alarm)
    for watts in (10.0, 11.9, 12.0):
        reader.watts = watts
        sampler.sample_once()
        assert not alarm.is_set(), watts  # at or under the level: no wake-up
    reader.watts = 12.4
    sampler.sample_once()
    assert alarm.is_set()
    alarm.clear()
    sampler.sample_once()
    assert alarm.is_set()  # every reading over the level, not only the first
    alarm.clear()
    sampler.watch(None)
    reader.watts = 30.0
    sampler.sample_once()
    assert not alarm.is_set()
    assert [w for _, w in sampler.samples_between(0, time.monotonic())] == [
        10.0,
        11.9,
        12.0,
        12.4,
        12.4,
        30.0,
    ]
