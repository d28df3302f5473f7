"""Per-board facts as data: what to expect on each Jetson, and where to look for it.

Discovery on the device is the truth (clusters from `related_cpus`, GPU from
/sys/class/devfreq); these tables are the fallback and the first places to look.
Adding a board is adding a row, not a branch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# GPU devfreq directories by SoC generation and release (JETSON.md).
_ORIN_GPU_DIRS = (
    "/sys/devices/17000000.ga10b/devfreq/17000000.ga10b",  # JetPack 5
    "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",  # JetPack 6
    "/sys/devices/platform/17000000.gpu/devfreq/17000000.gpu",
)
_XAVIER_GPU_DIRS = ("/sys/devices/17000000.gv11b/devfreq/17000000.gv11b",)
_NANO_GPU_DIRS = ("/sys/devices/57000000.gpu/devfreq/57000000.gpu",)

# of_node names that mark a devfreq device as the GPU (robust discovery).
GPU_OF_NODE_NAMES = ("ga10b", "gv11b", "gp10b", "gpu")

# BPMP debugfs: EMC pinning via mrq_rate_locked + rate (Orin and Xavier). The Jetson Nano
# (tegra210) has no BPMP; its EMC override interface differs and is not driven by powerd.
_BPMP_EMC_DIR = "/sys/kernel/debug/bpmp/debug/clk/emc"
_BPMP_EMC_RATES = "/sys/kernel/debug/bpmp/debug/emc/possible_rates"


def _clusters(*ranges: tuple[int, int]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(range(lo, hi + 1)) for lo, hi in ranges)


@dataclass(frozen=True)
class BoardSpec:
    """What one Jetson model is expected to look like."""

    name: str
    model_pattern: str  # regex, searched case-insensitively in the device-tree model string
    soc: str
    clusters: tuple[tuple[int, ...], ...]  # expected CPU ids per cpufreq policy
    gpu_devfreq_dirs: tuple[str, ...]
    gpu_of_node_names: tuple[str, ...]
    total_rails: tuple[str, ...]  # INA3221 rail that is the board total, if any
    emc_dirs: tuple[str, ...] = (_BPMP_EMC_DIR,)
    emc_rates_files: tuple[str, ...] = (_BPMP_EMC_RATES,)

    @property
    def ncpu(self) -> int:
        return sum(len(c) for c in self.clusters)

    def matches(self, model: str) -> bool:
        return re.search(self.model_pattern, model, re.IGNORECASE) is not None


# Order matters only where one pattern is a prefix of another ("Orin Nano" before "Nano").
BOARDS: tuple[BoardSpec, ...] = (
    BoardSpec(
        name="orin-agx",
        model_pattern=r"AGX Orin|Orin AGX",
        soc="tegra234",
        clusters=_clusters((0, 3), (4, 7), (8, 11)),  # 32GB module: 8 cores; discovery wins
        gpu_devfreq_dirs=_ORIN_GPU_DIRS,
        gpu_of_node_names=("ga10b", "gpu"),
        total_rails=(),  # module power = sum of the rails
    ),
    BoardSpec(
        name="orin-nx",
        model_pattern=r"Orin NX",
        soc="tegra234",
        clusters=_clusters((0, 3), (4, 7)),
        gpu_devfreq_dirs=_ORIN_GPU_DIRS,
        gpu_of_node_names=("ga10b", "gpu"),
        total_rails=("VDD_IN",),
    ),
    BoardSpec(
        name="orin-nano",
        model_pattern=r"Orin Nano",
        soc="tegra234",
        clusters=_clusters((0, 3), (4, 5)),
        gpu_devfreq_dirs=_ORIN_GPU_DIRS,
        gpu_of_node_names=("ga10b", "gpu"),
        total_rails=("VDD_IN",),
    ),
    BoardSpec(
        name="xavier-agx",
        model_pattern=r"AGX Xavier|Xavier AGX",
        soc="tegra194",
        clusters=_clusters((0, 1), (2, 3), (4, 5), (6, 7)),
        gpu_devfreq_dirs=_XAVIER_GPU_DIRS,
        gpu_of_node_names=("gv11b",),
        total_rails=(),
    ),
    BoardSpec(
        name="xavier-nx",
        model_pattern=r"Xavier NX",
        soc="tegra194",
        clusters=_clusters((0, 1), (2, 3), (4, 5)),
        gpu_devfreq_dirs=_XAVIER_GPU_DIRS,
        gpu_of_node_names=("gv11b",),
        total_rails=("VDD_IN",),
    ),
    BoardSpec(
        name="nano",
        model_pattern=r"Jetson Nano|Nano Developer Kit",
        soc="tegra210",
        clusters=_clusters((0, 3)),
        gpu_devfreq_dirs=_NANO_GPU_DIRS,
        gpu_of_node_names=("gpu", "gp10b"),
        total_rails=("POM_5V_IN",),
        emc_dirs=(),
        emc_rates_files=(),
    ),
)

# An unlisted model on a known SoC: no expected clusters (discovery only), the SoC's paths.
_GENERIC: dict[str, BoardSpec] = {
    "tegra234": BoardSpec(
        "tegra234", r"$^", "tegra234", (), _ORIN_GPU_DIRS, GPU_OF_NODE_NAMES, ("VDD_IN",)
    ),
    "tegra194": BoardSpec(
        "tegra194", r"$^", "tegra194", (), _XAVIER_GPU_DIRS, GPU_OF_NODE_NAMES, ("VDD_IN",)
    ),
    "tegra210": BoardSpec(
        "tegra210",
        r"$^",
        "tegra210",
        (),
        _NANO_GPU_DIRS,
        GPU_OF_NODE_NAMES,
        ("POM_5V_IN",),
        emc_dirs=(),
        emc_rates_files=(),
    ),
}

# Any of these is the board total when present (JETSON.md: "Rule").
TOTAL_RAIL_NAMES = ("VDD_IN", "POM_5V_IN")


def find_board_spec(model: str, soc: str) -> BoardSpec | None:
    """The spec whose model pattern and SoC match, else the SoC's generic spec, else None."""
    for spec in BOARDS:
        if spec.soc == soc and spec.matches(model):
            return spec
    return _GENERIC.get(soc)
