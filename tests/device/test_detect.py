import shutil
from pathlib import Path

import pytest

from powerd.device.detect import detect_board, find_gpu_devfreq
from powerd.device.errors import DeviceError
from powerd.device.sysfs import DeviceRoot
from powerd.sim.trace import Trace
from powerd.sim.tree import build_tree


def test_orin_agx_jetpack5(sim_root: Path, agx_trace: Trace) -> None:
    build_tree(sim_root, "orin-agx", agx_trace)
    board = detect_board(sim_root)
    assert board.name == "orin-agx"
    assert board.model == "NVIDIA Jetson AGX Orin Developer Kit"
    assert board.soc == "tegra234"
    assert board.l4t == "35.4.1"
    assert board.cpus == tuple(range(12))
    assert [c.cpus for c in board.clusters] == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert [c.name for c in board.clusters] == ["policy0", "policy4", "policy8"]
    assert board.gpu_dir == sim_root / "sys/devices/17000000.ga10b/devfreq/17000000.ga10b"
    assert board.emc_dir == sim_root / "sys/kernel/debug/bpmp/debug/clk/emc"
    assert board.emc_rates_file is not None
    assert board.key == "nvidia-jetson-agx-orin-developer-kit-l4t35.4.1"


def test_orin_nano_jetpack6(sim_root: Path, nano_trace: Trace) -> None:
    build_tree(sim_root, "orin-nano", nano_trace)
    board = detect_board(sim_root)
    assert board.name == "orin-nano"
    assert board.l4t == "36.3.0"
    assert [c.cpus for c in board.clusters] == [(0, 1, 2, 3), (4, 5)]
    assert board.gpu_dir == (
        sim_root / "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"
    )
    assert board.key.endswith("-l4t36.3.0")
    assert board.describe()["gpu_devfreq"].startswith("/sys/devices/platform/bus@0/")


def test_key_changes_with_the_release(sim_root: Path, nano_trace: Trace) -> None:
    build_tree(sim_root / "a", "orin-nano", nano_trace, l4t="36.2.0")
    build_tree(sim_root / "b", "orin-nano", nano_trace, l4t="36.3.0")
    a, b = detect_board(sim_root / "a"), detect_board(sim_root / "b")
    assert a.l4t == "36.2.0" and a.key != b.key


def test_model_from_proc_when_sysfs_firmware_is_missing(sim_root: Path, nano_trace) -> None:
    build_tree(sim_root, "orin-nano", nano_trace)
    dt = sim_root / "sys/firmware/devicetree/base"
    proc = sim_root / "proc/device-tree"
    proc.unlink()
    shutil.copytree(dt, proc)
    (dt / "model").unlink()
    assert detect_board(sim_root).name == "orin-nano"


def test_clusters_come_from_related_cpus_not_the_table(sim_root: Path, agx_trace) -> None:
    """A 32GB AGX Orin module has 8 cores in 2 clusters: discovery must win over the table."""
    build_tree(sim_root, "orin-agx", agx_trace)
    cpu = sim_root / "sys/devices/system/cpu"
    for n in range(8, 12):
        shutil.rmtree(cpu / f"cpu{n}")
    shutil.rmtree(cpu / "cpufreq/policy8")
    (cpu / "present").write_text("0-7\n")
    board = detect_board(sim_root)
    assert board.ncpu == 8
    assert [c.cpus for c in board.clusters] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_gpu_found_through_class_devfreq_of_node(sim_root: Path, nano_trace) -> None:
    """No known directory: the /sys/class/devfreq entry whose of_node is the GPU (not the
    decoy vic device) is found."""
    build_tree(sim_root, "orin-nano", nano_trace)
    gpu = find_gpu_devfreq(DeviceRoot(sim_root), candidates=())
    assert gpu.name == "17000000.gpu"
    assert (gpu / "available_frequencies").is_file()
    with pytest.raises(DeviceError, match="GPU devfreq directory not found"):
        find_gpu_devfreq(DeviceRoot(sim_root), candidates=(), of_node_names=("gv11b",))


def test_missing_release_file_leaves_l4t_unknown(sim_root: Path, nano_trace) -> None:
    build_tree(sim_root, "orin-nano", nano_trace)
    (sim_root / "etc/nv_tegra_release").unlink()
    board = detect_board(sim_root)
    assert board.l4t is None and board.key.endswith("-l4tunknown")


def test_release_line_parsing(sim_root: Path, nano_trace) -> None:
    build_tree(sim_root, "orin-nano", nano_trace)
    (sim_root / "etc/nv_tegra_release").write_text(
        "# R32 (release), REVISION: 7.4, GCID: 33514132, BOARD: t210ref, EABI: aarch64\n"
    )
    assert detect_board(sim_root).l4t == "32.7.4"


def test_not_a_jetson_empty_root(sim_root: Path) -> None:
    with pytest.raises(DeviceError, match="not a Jetson.*device-tree model"):
        detect_board(sim_root)


def test_not_a_jetson_other_soc(sim_root: Path) -> None:
    dt = sim_root / "sys/firmware/devicetree/base"
    dt.mkdir(parents=True)
    (dt / "model").write_bytes(b"Raspberry Pi 4 Model B Rev 1.4\x00")
    (dt / "compatible").write_bytes(b"raspberrypi,4-model-b\x00brcm,bcm2711\x00")
    with pytest.raises(DeviceError, match="bcm2711.*not a tegra"):
        detect_board(sim_root)


def test_jetson_without_gpu_devfreq_says_what_is_missing(sim_root: Path, agx_trace) -> None:
    build_tree(sim_root, "orin-agx", agx_trace)
    shutil.rmtree(sim_root / "sys/devices/17000000.ga10b")
    with pytest.raises(DeviceError, match="GPU devfreq directory not found"):
        detect_board(sim_root)


def test_missing_emc_debugfs_is_tolerated(sim_root: Path, agx_trace) -> None:
    build_tree(sim_root, "orin-agx", agx_trace)
    shutil.rmtree(sim_root / "sys/kernel/debug")
    board = detect_board(sim_root)
    assert board.emc_dir is None and board.emc_rates_file is None
