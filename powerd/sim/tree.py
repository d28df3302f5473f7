"""Build the sysfs/debugfs/procfs file tree of an emulated Jetson under a root directory.

The tree follows the real layout (JETSON.md): NUL-terminated device-tree strings,
cpuN/cpufreq as symlinks to the cpufreq policies, the GPU devfreq directory of the
release (and its /sys/class/devfreq link with device/of_node/name), BPMP debugfs EMC
files, INA3221 hwmon channels under a hwmonN whose N is random, thermal zones, a fan.
Every symlink is relative, so the tree resolves inside its root. The state it writes is
the boot baseline: every core online, DVFS limits wide open, EMC unlocked.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

from powerd.sim.boards import (
    CPU_DIR,
    EMC_CLK_DIR,
    EMC_RATES_FILE,
    FAN_DIR,
    THERMAL_DIR,
    THERMAL_ZONES,
    SimBoard,
    get_sim_board,
)
from powerd.sim.trace import Trace


@dataclass(frozen=True)
class TreeLayout:
    """Where the emulator finds each part of a built tree (absolute paths under root)."""

    root: Path
    board: SimBoard
    cpu_dir: Path
    policies: dict[int, Path]  # first CPU of the cluster -> policy dir
    gpu_devfreq: Path
    gpu_device: Path
    emc_dir: Path
    emc_rates_file: Path
    hwmon: dict[str, Path]  # i2c device -> its hwmonN dir
    fan_pwm: Path | None
    thermal_zones: tuple[Path, ...]

    def policy_of(self, cpu: int) -> int:
        for cluster in self.board.clusters:
            if cpu in cluster:
                return cluster[0]
        raise ValueError(f"cpu{cpu} is in no cluster")


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(data)


def _symlink(link: Path, target: Path) -> None:
    """A relative link, so that it resolves under the emulated root, not the host's /."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _khz_list(values: list[int]) -> str:
    return " ".join(str(v) for v in values) + " \n"


def _release_line(l4t: str, board: SimBoard) -> str:
    parts = l4t.split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"L4T release must look like 35.4.1, got {l4t!r}")
    major, revision = parts[0], ".".join(parts[1:])
    return (
        f"# R{major} (release), REVISION: {revision}, GCID: 33958178, "
        f"BOARD: {board.release_board}, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n"
        "# KERNEL_VARIANT: oot\n"
    )


INA_UPDATE_MS = 6


def _hwmon_indices(board: SimBoard, seed: int, base: int | None) -> dict[str, int]:
    """hwmonN per device (and "fan"): N differs from boot to boot on real boards."""
    names = [*board.ina_devices, "fan"]
    rng = random.Random(seed)
    start = base if base is not None else rng.randrange(0, 8)
    indices = list(range(start, start + len(names)))
    if base is None:
        rng.shuffle(indices)
    return dict(zip(names, indices, strict=True))


def _nearest(value: int, table: list[int]) -> int:
    return value if value < 0 else min(table, key=lambda f: abs(f - value))


def _write_nvpmodel(root: Path, sb: SimBoard, cpu_khz: list[int], gpu_hz: list[int]) -> None:
    """/etc/nvpmodel.conf in the vendor's layout (PARAM blocks naming the files, then one
    POWER_MODEL block per mode) and /var/lib/nvpmodel/status naming the boot mode."""
    if not sb.nvp_modes:
        return
    gpu_dir = "/" + sb.gpu_devfreq
    lines = ["# emulated nvpmodel.conf", "< PARAM TYPE=FILE NAME=CPU_ONLINE >"]
    lines += [f"CORE_{c} /{CPU_DIR}/cpu{c}/online" for c in range(1, sb.ncpu)]
    for i, cluster in enumerate(sb.clusters):
        pol = f"/{CPU_DIR}/cpu{cluster[0]}/cpufreq"
        lines += [
            f"< PARAM TYPE=FILE NAME={sb.cpu_param_prefix}_{i} >",
            f"MIN_FREQ {pol}/scaling_min_freq",
            f"MAX_FREQ {pol}/scaling_max_freq",
        ]
    lines += [
        "< PARAM TYPE=FILE NAME=GPU >",
        f"MIN_FREQ {gpu_dir}/min_freq",
        f"MAX_FREQ {gpu_dir}/max_freq",
        "< PARAM TYPE=FILE NAME=EMC >",
        "MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap",
    ]
    for mode in sb.nvp_modes:
        lines.append(f"< POWER_MODEL ID={mode.id} NAME={mode.name} >")
        lines += [f"CPU_ONLINE CORE_{c} {int(c < mode.cores)}" for c in range(1, sb.ncpu)]
        for i in range(len(sb.clusters)):
            lines.append(f"{sb.cpu_param_prefix}_{i} MIN_FREQ {cpu_khz[0]}")
            lines.append(
                f"{sb.cpu_param_prefix}_{i} MAX_FREQ {_nearest(mode.cpu_max_khz, cpu_khz)}"
            )
        lines += [
            "GPU MIN_FREQ 0",
            f"GPU MAX_FREQ {_nearest(mode.gpu_max_hz, gpu_hz)}",
            "EMC MAX_FREQ 0",
        ]
    lines.append(f"< PM_CONFIG DEFAULT={sb.nvp_modes[0].id} >")
    _write(root / "etc/nvpmodel.conf", "\n".join(lines) + "\n")
    _write(root / "var/lib/nvpmodel/status", f"pmode:{sb.nvp_modes[0].id:04d} fmode:quiet\n")


def build_tree(
    root: Path | str,
    board: str | SimBoard,
    trace: Trace,
    l4t: str | None = None,
    *,
    seed: int = 0,
    hwmon_index: int | None = None,
) -> TreeLayout:
    """Write the tree of `board` under `root` with the trace's frequencies as the tables.

    `hwmon_index`: first hwmonN number (None: random from `seed`).
    """
    sb = get_sim_board(board)
    root = Path(root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    release = l4t or sb.default_l4t
    cpu_khz, gpu_hz, emc_hz = trace.axis("cpu_khz"), trace.axis("gpu_hz"), trace.axis("emc_hz")
    if max(trace.axis("cores")) > sb.ncpu:
        raise ValueError(f"trace {trace.name} uses more cores than {sb.name} has ({sb.ncpu})")
    if any(r % 1000 for r in emc_hz):
        raise ValueError(f"trace {trace.name}: EMC rates must be whole kHz")

    # Identity.
    dt = root / "sys/firmware/devicetree/base"
    _write(dt / "model", sb.model + "\x00")
    _write(dt / "compatible", "".join(c + "\x00" for c in sb.compatible))
    _symlink(root / "proc/device-tree", dt)
    _write(root / "etc/nv_tegra_release", _release_line(release, sb))

    # CPUs and cpufreq.
    cpu_dir = root / CPU_DIR
    all_cpus = f"0-{sb.ncpu - 1}\n"
    for name in ("present", "possible", "online"):
        _write(cpu_dir / name, all_cpus)
    _write(cpu_dir / "offline", "\n")
    _write(cpu_dir / "kernel_max", f"{sb.ncpu - 1}\n")
    policies: dict[int, Path] = {}
    for cluster in sb.clusters:
        pol = cpu_dir / "cpufreq" / f"policy{cluster[0]}"
        policies[cluster[0]] = pol
        cpus = " ".join(str(c) for c in cluster) + "\n"
        files = {
            "related_cpus": cpus,
            "affected_cpus": cpus,
            "cpuinfo_min_freq": f"{cpu_khz[0]}\n",
            "cpuinfo_max_freq": f"{cpu_khz[-1]}\n",
            "cpuinfo_transition_latency": "500000\n",
            "scaling_available_frequencies": _khz_list(cpu_khz),
            "scaling_available_governors": "userspace ondemand performance schedutil \n",
            "scaling_governor": f"{sb.governor}\n",
            "scaling_driver": "tegra194\n",
            "scaling_min_freq": f"{cpu_khz[0]}\n",
            "scaling_max_freq": f"{cpu_khz[-1]}\n",
            "scaling_cur_freq": f"{cpu_khz[-1]}\n",
        }
        for fname, text in files.items():
            _write(pol / fname, text)
        for cpu in cluster:
            cdir = cpu_dir / f"cpu{cpu}"
            cdir.mkdir(parents=True, exist_ok=True)
            if cpu != 0:  # cpu0 cannot be taken offline: no online file, like on the boards
                _write(cdir / "online", "1\n")
            _symlink(cdir / "cpufreq", pol)

    # GPU devfreq (+ a decoy devfreq device, so discovery must check the of_node name).
    dt_gpu = dt / sb.gpu_node
    _write(dt_gpu / "name", sb.gpu_node.rsplit("/", 1)[-1].split("@")[0] + "\x00")
    gpu_device = root / sb.gpu_device
    gpu_devfreq = root / sb.gpu_devfreq
    _write(gpu_device / "railgate_enable", "1\n")
    _symlink(gpu_device / "of_node", dt_gpu)
    devfreq_files = {
        "available_frequencies": " ".join(str(f) for f in gpu_hz) + "\n",
        "available_governors": "wmark_active nvhost_podgov userspace performance simple_ondemand\n",
        "governor": f"{sb.gpu_governor}\n",
        "min_freq": f"{gpu_hz[0]}\n",
        "max_freq": f"{gpu_hz[-1]}\n",
        "cur_freq": f"{gpu_hz[-1]}\n",
        "target_freq": f"{gpu_hz[-1]}\n",
    }
    for fname, text in devfreq_files.items():
        _write(gpu_devfreq / fname, text)
    _symlink(gpu_devfreq / "device", gpu_device)
    _symlink(root / "sys/class/devfreq" / sb.gpu_name, gpu_devfreq)
    vic = root / "sys/devices/platform/15340000.vic"
    _write(dt / "vic@15340000/name", "vic\x00")
    _symlink(vic / "of_node", dt / "vic@15340000")
    _write(vic / "devfreq/15340000.vic/available_frequencies", "115200000 729600000\n")
    _write(vic / "devfreq/15340000.vic/cur_freq", "115200000\n")
    _symlink(vic / "devfreq/15340000.vic/device", vic)
    _symlink(root / "sys/class/devfreq/15340000.vic", vic / "devfreq/15340000.vic")

    # EMC (BPMP debugfs): DVFS owns the clock at boot and runs it at the top rate under load.
    emc_dir = root / EMC_CLK_DIR
    _write(emc_dir / "rate", f"{emc_hz[-1]}\n")
    _write(emc_dir / "min_rate", f"{emc_hz[0]}\n")
    _write(emc_dir / "max_rate", f"{emc_hz[-1]}\n")
    _write(emc_dir / "mrq_rate_locked", "0\n")
    _write(root / EMC_RATES_FILE, " ".join(str(r // 1000) for r in emc_hz) + "\n")
    _write(root / "sys/kernel/nvpmodel_emc_cap/emc_iso_cap", "0\n")

    _write_nvpmodel(root, sb, cpu_khz, gpu_hz)

    # INA3221 power monitors.
    indices = _hwmon_indices(sb, seed, hwmon_index)
    hwmon: dict[str, Path] = {}
    for device in sb.ina_devices:
        ddir = root / sb.i2c_bus_dir / device
        _write(ddir / "name", "ina3221\n")
        _symlink(root / "sys/bus/i2c/devices" / device, ddir)
        hdir = ddir / "hwmon" / f"hwmon{indices[device]}"
        _write(hdir / "name", "ina3221\n")
        # the driver's default conversion cycle: 3 channels x 1 sample x (1.1 + 1.1) ms,
        # reported in whole ms (the emulator writes its own, scaled, when it starts)
        _write(hdir / "update_interval", f"{INA_UPDATE_MS}\n")
        _symlink(root / "sys/class/hwmon" / hdir.name, hdir)
        hwmon[device] = hdir
        for rail in sb.rails:
            if rail.device == device:
                _write(hdir / f"in{rail.channel}_label", rail.label + "\n")
                _write(hdir / f"in{rail.channel}_input", f"{rail.millivolts}\n")
                _write(hdir / f"curr{rail.channel}_input", "0\n")
                _write(hdir / f"in{rail.channel + 3}_input", "0\n")  # shunt voltage
        for nc_dev, channel in sb.nc_channels:
            if nc_dev == device:
                _write(hdir / f"in{channel}_label", "NC\n")
        if device in sb.shunt_sum_devices:
            _write(hdir / "in7_label", "sum of shunt voltages\n")
            _write(hdir / "in7_input", "0\n")
            _write(hdir / "curr4_input", "0\n")

    # Thermal zones and fan.
    zones = []
    for i, (kind, offset) in enumerate(THERMAL_ZONES):
        zdir = root / THERMAL_DIR / f"thermal_zone{i}"
        _write(zdir / "type", kind + "\n")
        _write(zdir / "temp", ("-256000" if offset is None else "40000") + "\n")
        zones.append(zdir)
    fan_hw = root / FAN_DIR / "hwmon" / f"hwmon{indices['fan']}"
    _write(fan_hw / "name", "pwmfan\n")
    _write(fan_hw / "pwm1", "0\n")
    _symlink(root / "sys/class/hwmon" / fan_hw.name, fan_hw)

    return TreeLayout(
        root=root,
        board=sb,
        cpu_dir=cpu_dir,
        policies=policies,
        gpu_devfreq=gpu_devfreq,
        gpu_device=gpu_device,
        emc_dir=emc_dir,
        emc_rates_file=root / EMC_RATES_FILE,
        hwmon=hwmon,
        fan_pwm=fan_hw / "pwm1",
        thermal_zones=tuple(zones),
    )


def find_layout(root: Path | str, board: str | SimBoard) -> TreeLayout:
    """The layout of a tree `build_tree` made earlier (hwmonN found by globbing)."""
    sb = get_sim_board(board)
    root = Path(root).absolute()
    if not (root / sb.gpu_devfreq).is_dir():
        raise FileNotFoundError(f"no {sb.name} tree under {root} (run build_tree first)")
    hwmon = {}
    for device in sb.ina_devices:
        found = sorted((root / sb.i2c_bus_dir / device / "hwmon").glob("hwmon*"))
        if not found:
            raise FileNotFoundError(f"no hwmon dir for INA3221 {device} under {root}")
        hwmon[device] = found[0]
    fans = sorted((root / FAN_DIR / "hwmon").glob("hwmon*/pwm1"))
    zones = sorted(
        (root / THERMAL_DIR).glob("thermal_zone*"), key=lambda p: int(p.name[len("thermal_zone") :])
    )
    return TreeLayout(
        root=root,
        board=sb,
        cpu_dir=root / CPU_DIR,
        policies={c[0]: root / CPU_DIR / "cpufreq" / f"policy{c[0]}" for c in sb.clusters},
        gpu_devfreq=root / sb.gpu_devfreq,
        gpu_device=root / sb.gpu_device,
        emc_dir=root / EMC_CLK_DIR,
        emc_rates_file=root / EMC_RATES_FILE,
        hwmon=hwmon,
        fan_pwm=fans[0] if fans else None,
        thermal_zones=tuple(zones),
    )
