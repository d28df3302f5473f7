"""What each emulated board's file tree looks like.

Deliberately separate from powerd.device.boards: the emulator states the facts of
JETSON.md on its own, so a wrong guess in the device layer shows up as a failing test
instead of being mirrored by the emulator.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SimRail:
    """One INA3221 channel. Its share of the board power is a weight that depends on the
    mode (each term is the knob's value over its maximum, 0..1); `total` marks the board
    input rail, which carries the whole power."""

    label: str
    device: str  # i2c device, e.g. "1-0040"
    channel: int  # 1..3
    base: float = 0.0
    gpu: float = 0.0
    cpu: float = 0.0  # scaled by online cores x CPU frequency
    emc: float = 0.0
    total: bool = False
    millivolts: int = 5000


@dataclass(frozen=True)
class SimNvpMode:
    """One `< POWER_MODEL >` block of the emulated /etc/nvpmodel.conf. Frequencies are
    targets (the tree snaps them to the trace's tables); -1 means no cap, like nvpmodel."""

    id: int
    name: str
    cores: int
    cpu_max_khz: int = -1
    gpu_max_hz: int = -1


@dataclass(frozen=True)
class SimBoard:
    name: str
    model: str
    compatible: tuple[str, ...]
    default_l4t: str
    release_board: str  # BOARD: field of /etc/nv_tegra_release
    clusters: tuple[tuple[int, ...], ...]
    gpu_device: str  # GPU platform device dir, relative to root
    gpu_node: str  # device-tree node (under /sys/firmware/devicetree/base) of the GPU
    i2c_bus_dir: str  # parent of the i2c devices, relative to root
    rails: tuple[SimRail, ...]
    nc_channels: tuple[tuple[str, int], ...] = ()  # (device, channel) labelled "NC"
    shunt_sum_devices: tuple[str, ...] = ()  # devices that expose in7 "sum of shunt voltages"
    governor: str = "schedutil"
    gpu_governor: str = "nvhost_podgov"
    cpu_param_prefix: str = "CPU_A78"  # nvpmodel.conf PARAM names: CPU_A78_0, CPU_A78_1, ...
    # the first mode is the one in force at boot (the tree's wide-open limits)
    nvp_modes: tuple[SimNvpMode, ...] = ()

    @property
    def ncpu(self) -> int:
        return sum(len(c) for c in self.clusters)

    @property
    def gpu_name(self) -> str:
        return self.gpu_device.rsplit("/", 1)[-1]

    @property
    def gpu_devfreq(self) -> str:
        return f"{self.gpu_device}/devfreq/{self.gpu_name}"

    @property
    def ina_devices(self) -> tuple[str, ...]:
        devs = [r.device for r in self.rails] + [d for d, _ in self.nc_channels]
        return tuple(dict.fromkeys(devs))


ORIN_AGX = SimBoard(
    name="orin-agx",
    model="NVIDIA Jetson AGX Orin Developer Kit",
    compatible=("nvidia,p3737-0000+p3701-0000", "nvidia,p3701-0000", "nvidia,tegra234"),
    default_l4t="35.4.1",
    release_board="t186ref",
    clusters=((0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)),
    # JetPack 5 names the GPU device after its ga10b node.
    gpu_device="sys/devices/17000000.ga10b",
    gpu_node="ga10b@17000000",
    i2c_bus_dir="sys/devices/platform/c240000.i2c/i2c-1",
    rails=(
        SimRail("VDD_GPU_SOC", "1-0040", 1, base=0.25, gpu=0.35, emc=0.05),
        SimRail("VDD_CPU_CV", "1-0040", 2, base=0.08, cpu=0.30),
        SimRail("VIN_SYS_5V0", "1-0040", 3, base=0.20, emc=0.03),
        SimRail("VDDQ_VDD2_1V8AO", "1-0041", 1, base=0.04, emc=0.12),
    ),
    nc_channels=(("1-0041", 2),),
    shunt_sum_devices=("1-0041",),
    nvp_modes=(
        SimNvpMode(0, "MAXN", 12),
        SimNvpMode(1, "MODE_15W", 4, 1113600, 420750000),
        SimNvpMode(2, "MODE_30W", 8, 1728000, 624750000),
        SimNvpMode(3, "MODE_50W", 12, 1497600, 828750000),
    ),
)

ORIN_NANO = SimBoard(
    name="orin-nano",
    model="NVIDIA Orin Nano Developer Kit",
    compatible=("nvidia,p3768-0000+p3767-0005", "nvidia,p3767-0005", "nvidia,tegra234"),
    default_l4t="36.3.0",
    release_board="generic",
    clusters=((0, 1, 2, 3), (4, 5)),
    # JetPack 6: the GPU sits under bus@0 and is named after its "gpu" node.
    gpu_device="sys/devices/platform/bus@0/17000000.gpu",
    gpu_node="bus@0/gpu@17000000",
    i2c_bus_dir="sys/devices/platform/bus@0/c240000.i2c/i2c-1",
    rails=(
        SimRail("VDD_IN", "1-0040", 1, total=True),
        SimRail("VDD_CPU_GPU_CV", "1-0040", 2, base=0.25, gpu=0.20, cpu=0.15),
        SimRail("VDD_SOC", "1-0040", 3, base=0.15, emc=0.08),
    ),
    nvp_modes=(
        SimNvpMode(0, "15W", 6),
        SimNvpMode(1, "7W", 4, 960000, 408000000),
    ),
)

SIM_BOARDS: dict[str, SimBoard] = {b.name: b for b in (ORIN_AGX, ORIN_NANO)}

THERMAL_ZONES = (
    # (type, offset in degrees C over the power-driven estimate; None: power-gated sensor)
    ("cpu-thermal", 1.0),
    ("gpu-thermal", 0.0),
    ("cv0-thermal", None),
    ("cv1-thermal", None),
    ("cv2-thermal", None),
    ("soc0-thermal", -1.0),
    ("soc1-thermal", -0.5),
    ("soc2-thermal", -1.5),
    ("tj-thermal", 2.0),
)

EMC_CLK_DIR = "sys/kernel/debug/bpmp/debug/clk/emc"
EMC_RATES_FILE = "sys/kernel/debug/bpmp/debug/emc/possible_rates"
CPU_DIR = "sys/devices/system/cpu"
THERMAL_DIR = "sys/devices/virtual/thermal"
FAN_DIR = "sys/devices/platform/pwm-fan"


def get_sim_board(board: str | SimBoard) -> SimBoard:
    if isinstance(board, SimBoard):
        return board
    try:
        return SIM_BOARDS[board]
    except KeyError:
        raise ValueError(f"unknown emulated board {board!r}: one of {sorted(SIM_BOARDS)}") from None
